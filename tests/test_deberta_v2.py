"""DeBERTa-v2 (evqa_jax.models.deberta_v2) against the transformers 5.24 PyTorch implementation and a PyTorch
re-computation of FrozenBiLM's visual prefix, adapters and enhanced mask decoder, on tiny random configs."""

import argparse
import dataclasses
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from evqa_jax.models import deberta_v2 as D  # pylint: disable=g-import-not-at-top

T, VDIM, B, L = 3, 12, 2, 9  # visual tokens, visual dim, batch, text length

# The paper architecture in miniature: log buckets (8 < sequence), share_att_key, conv after layer 0,
# LayerNorm'ed relative embeddings, no absolute positions in the input.
TINY = dict(vocab_size=61, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            hidden_act="gelu", max_position_embeddings=40, type_vocab_size=0, layer_norm_eps=1e-7,
            relative_attention=True, max_relative_positions=-1, position_buckets=8, pos_att_type=["p2c", "c2p"],
            share_att_key=True, position_biased_input=False, norm_rel_ebd="layer_norm", conv_kernel_size=3,
            conv_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
# Other branches: separate pos_key/pos_query projections, absolute positions and token types in the input,
# no bucketing (clipped distances), tanh conv, no LayerNorm on the relative embeddings.
VARIANT = dict(TINY, share_att_key=False, position_biased_input=True, type_vocab_size=2, position_buckets=-1,
               max_relative_positions=6, conv_act="tanh", norm_rel_ebd="none")


def _perturb(module, seed):
  """Non-trivial values everywhere (HF initialises LayerNorms to 1/0 and biases to 0)."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.add_(0.1 * torch.randn(p.shape, generator=g))


def _hf_mlm(cfg_dict, legacy, seed):
  torch.manual_seed(seed)
  model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(legacy=legacy, **cfg_dict)).eval()
  _perturb(model, seed)
  return model


class TorchAdapter(torch.nn.Module):
  """FrozenBiLM's adapter: x + up(dropout(relu(down(x))))."""

  def __init__(self, hidden, reduction=8):
    super().__init__()
    self.down = torch.nn.Linear(hidden, hidden // reduction)
    self.up = torch.nn.Linear(hidden // reduction, hidden)

  def forward(self, x):
    return x + self.up(torch.relu(self.down(x)))


def _inputs(cfg_dict, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, cfg_dict["vocab_size"], size=(B, L)).astype(np.int64)
  mask = np.ones((B, L), np.int64)
  mask[1, L - 3:] = 0  # padding in the second example
  ids[1, L - 3:] = 0
  video = rng.normal(size=(B, T, VDIM)).astype(np.float32)
  video_mask = np.ones((B, T), np.int64)
  video_mask[0, T - 1] = 0
  mask_pos = np.array([2, 4])  # [MASK] positions within the text
  return dict(ids=ids, mask=mask, video=video, video_mask=video_mask, mask_pos=mask_pos)


def _torch_reference(mlm, x, *, video=False, linear_video=None, adapters=None, pos_emb=None, emd=True):
  """FrozenBiLM's forward recomputed with transformers modules: inputs_embeds = concat(video proj, words), adapters
  by forward hooks on attention.output.dense / output.dense, EMD = the last layer twice with absolute positions added
  to the first query."""
  deberta = mlm.deberta
  handles = []
  if adapters is not None:
    for layer, (a_attn, a_ffn) in zip(deberta.encoder.layer, adapters):
      handles.append(layer.attention.output.dense.register_forward_hook(lambda m, i, o, a=a_attn: a(o)))
      handles.append(layer.output.dense.register_forward_hook(lambda m, i, o, a=a_ffn: a(o)))
  try:
    with torch.no_grad():
      ids, mask = torch.tensor(x["ids"]), torch.tensor(x["mask"])
      emb = deberta.embeddings.word_embeddings(ids)
      offset = 0
      if video:
        emb = torch.cat([linear_video(torch.tensor(x["video"])), emb], 1)
        mask = torch.cat([torch.tensor(x["video_mask"]), mask], 1)
        offset = T
      out = deberta(inputs_embeds=emb, attention_mask=mask, output_hidden_states=True)
      hidden = out.last_hidden_state
      dec = hidden
      if emd:
        enc = deberta.encoder
        prev = out.hidden_states[-2]
        att = enc.get_attention_mask(mask)
        rel = enc.get_rel_embedding()
        q = prev + pos_emb[:prev.shape[1]][None]
        for _ in range(2):
          q = enc.layer[-1](prev, att, query_states=q, rel_embeddings=rel)[0]
        dec = q
      head = mlm.lm_predictions.lm_head
      feats = head.LayerNorm(head.transform_act_fn(head.dense(dec)))
      logits = head(dec, deberta.embeddings.word_embeddings)
      idx = torch.tensor(x["mask_pos"]) + offset
      mask_feature = feats[torch.arange(B), idx]
  finally:
    for h in handles:
      h.remove()
  return dict(hidden=hidden.numpy(), logits=logits.numpy(), mask_feature=mask_feature.numpy())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """A tiny HF DeBERTa-v2 MLM + FrozenBiLM extras (linear_video, adapters, absolute positions), saved to disk."""
  root = tmp_path_factory.mktemp("deberta")
  mlm = _hf_mlm(TINY, legacy=False, seed=0)
  hf_dir = str(root / "hf")
  mlm.save_pretrained(hf_dir)
  torch.manual_seed(1)
  linear_video = torch.nn.Linear(VDIM, TINY["hidden_size"])
  adapters = [(TorchAdapter(TINY["hidden_size"]), TorchAdapter(TINY["hidden_size"]))
              for _ in range(TINY["num_hidden_layers"])]
  for a in adapters:
    for m in a:
      _perturb(m, 2)
  pos_emb = 0.5 * torch.randn(TINY["max_position_embeddings"], TINY["hidden_size"])
  # FrozenBiLM's DebertaV2ForMaskedLM.state_dict(): deberta.* (+ position_ids buffer, position_embeddings,
  # linear_video, adapters), lm_predictions.lm_head.* (+ its unused decoder), answer_embeddings / answer_bias.
  sd = {k: v.clone() for k, v in mlm.state_dict().items()}
  sd["deberta.embeddings.position_embeddings.weight"] = pos_emb.clone()
  sd["deberta.embeddings.position_ids"] = torch.arange(TINY["max_position_embeddings"])[None]
  sd["deberta.embeddings.linear_video.weight"] = linear_video.weight.detach().clone()
  sd["deberta.embeddings.linear_video.bias"] = linear_video.bias.detach().clone()
  for i, (a_attn, a_ffn) in enumerate(adapters):
    for where, a in (("attention.output.adapter", a_attn), ("output.adapter", a_ffn)):
      for k, v in a.state_dict().items():
        sd[f"deberta.encoder.layer.{i}.{where}.{k}"] = v.clone()
  sd["lm_predictions.lm_head.decoder.weight"] = torch.randn(TINY["vocab_size"], TINY["hidden_size"])
  sd["lm_predictions.lm_head.decoder.bias"] = sd["lm_predictions.lm_head.bias"].clone()
  sd["answer_embeddings.weight"] = torch.randn(7, TINY["hidden_size"])
  sd["answer_bias"] = torch.zeros(7)
  fb_path = str(root / "frozenbilm.pth")
  torch.save({"model": sd, "optimizer": {}, "epoch": 3,
              "args": argparse.Namespace(model_name="deberta-v2-xlarge", max_feats=T)}, fb_path)
  return dict(mlm=mlm, hf_dir=hf_dir, linear_video=linear_video, adapters=adapters, pos_emb=pos_emb,
              fb_path=fb_path, x=_inputs(TINY))


def _config(cfg_dict, **overrides):
  d = {k: v for k, v in cfg_dict.items()}
  return D.DebertaV2Config.from_dict(d, **overrides)


def _abstract_init(config):
  """model.init traced only (boxed ShapeDtypeStructs with logical names): no compile, no random numbers."""
  model = D.DebertaV2LM(config)
  kw = {}
  if config.num_visual_tokens:
    kw = dict(visual=jnp.zeros((1, config.num_visual_tokens, config.visual_dim)))
  return model, jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32),
                                                  jnp.ones((1, 4), jnp.int32), **kw))


def _init(config, seed=0):
  """Random init_params drawn in numpy (tests stay fast: a jitted Flax init costs seconds of compile)."""
  model, shapes = _abstract_init(config)
  rng = np.random.default_rng(seed)
  init = jax.tree.map(lambda s: (0.05 * rng.normal(size=s.shape)).astype(s.dtype), nn.meta.unbox(shapes))
  return model, init


def _run(model, params, x, *, video=False, mask_index=True, decode=False):
  """Eager apply: the tests share shapes, so JAX's per-op compile cache is reused across them."""
  kw = {}
  offset = 0
  if video:
    kw = dict(visual=jnp.asarray(x["video"]), visual_mask=jnp.asarray(x["video_mask"]))
    offset = T
  if mask_index:
    kw["mask_index"] = jnp.asarray(x["mask_pos"] + offset, jnp.int32)
  out = model.apply({"params": params}, jnp.asarray(x["ids"], jnp.int32), jnp.asarray(x["mask"], jnp.int32),
                    decode=decode, **kw)
  return jax.tree.map(np.asarray, out)


def _close(a, b, atol=1e-5, rtol=1e-5):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------------------------- tests


def test_log_buckets_match_torch():
  from transformers.models.deberta_v2 import modeling_deberta_v2 as M  # pylint: disable=g-import-not-at-top
  cfg = D.DebertaV2Config.xlarge()
  ours = D.relative_position_index(cfg, 512)
  q = torch.zeros(1, 512, 1)
  rel = M.build_relative_position(q, q, bucket_size=256, max_position=512)[0].numpy()
  np.testing.assert_array_equal(ours, np.clip(rel + 256, 0, 511))
  assert ours.min() == 1 and ours.max() == 511  # buckets reach -255 .. 255 at distance 511


@pytest.mark.parametrize("variant", ["paper", "variant"])
def test_hidden_states_match_hf_with_padding(world, variant):
  if variant == "paper":
    cfg_dict, mlm, path = TINY, world["mlm"], world["hf_dir"]
  else:
    cfg_dict, mlm = VARIANT, _hf_mlm(VARIANT, legacy=False, seed=5)
    path = os.path.join(os.path.dirname(world["hf_dir"]), "variant")
    mlm.deberta.save_pretrained(path)  # a bare DebertaV2Model: keys without "deberta.", no head
  config = D.DebertaV2Config.from_hf_dir(path)
  assert config.pos_att_type == ("p2c", "c2p") and config.position_buckets == cfg_dict["position_buckets"]
  model, init = _init(config)
  params, report = D.load_hf_params(config, path, init)
  assert not report.unused
  if variant == "paper":
    # transformers drops the absolute positions when position_biased_input is false; the EMD needs them.
    assert report.missing == ["deberta/embeddings/position_embeddings/embedding"]
    assert any("enhanced mask decoder" in n for n in report.notes)
  if variant == "variant":
    assert all(p.startswith("lm_predictions/") for p in report.missing) and report.missing
  x = _inputs(cfg_dict, seed=3)
  tt = np.zeros((B, L), np.int64)
  tt[:, 4:] = 1
  with torch.no_grad():
    kw = dict(token_type_ids=torch.tensor(tt)) if cfg_dict["type_vocab_size"] else {}
    ref = mlm.deberta(torch.tensor(x["ids"]), attention_mask=torch.tensor(x["mask"]), **kw).last_hidden_state.numpy()
  out = model.apply({"params": params}, jnp.asarray(x["ids"], jnp.int32), jnp.asarray(x["mask"]),
                    token_type_ids=jnp.asarray(tt, jnp.int32) if kw else None)
  assert out["hidden"].shape == (B, L, cfg_dict["hidden_size"])
  _close(out["hidden"], ref)  # padded positions included


@pytest.mark.parametrize("legacy", [False, True])
def test_mlm_logits_match_hf(world, tmp_path, legacy):
  mlm = world["mlm"] if not legacy else _hf_mlm(TINY, legacy=True, seed=7)
  if legacy:
    mlm.save_pretrained(str(tmp_path))
  path = world["hf_dir"] if not legacy else str(tmp_path)
  config = _config(TINY, enhanced_mask_decoder=False)  # transformers' DebertaV2ForMaskedLM has no EMD
  model, _ = _init(config)
  params, report = D.load_hf_params(config, path)  # nothing absent: no init_params needed
  assert not report.missing and not report.unused
  x = world["x"]
  with torch.no_grad():
    ref = mlm(torch.tensor(x["ids"]), attention_mask=torch.tensor(x["mask"])).logits.numpy()
  out = _run(model, params, x, decode=True)
  assert out["logits"].shape == (B, L, TINY["vocab_size"])
  _close(out["logits"], ref)
  # mask_feature is the head transform at the [MASK] row, consistent with the logits.
  emb = np.asarray(D.word_embeddings(params))
  bias = np.asarray(params["lm_predictions"]["lm_head"]["bias"])
  _close(out["mask_feature"] @ emb.T + bias, ref[np.arange(B), x["mask_pos"]])


def test_visual_prefix_matches_hf_inputs_embeds(world):
  config = _config(TINY, num_visual_tokens=T, visual_dim=VDIM, enhanced_mask_decoder=False)
  model, init = _init(config)
  params, report = D.load_hf_params(config, world["hf_dir"], init)
  assert sorted(report.missing) == ["deberta/embeddings/visual_proj/dense/bias",
                                    "deberta/embeddings/visual_proj/dense/kernel"]
  lv = world["linear_video"]
  vp = params["deberta"]["embeddings"]["visual_proj"]["dense"]
  vp["kernel"] = lv.weight.detach().numpy().T
  vp["bias"] = lv.bias.detach().numpy()
  ref = _torch_reference(world["mlm"], world["x"], video=True, linear_video=lv, emd=False)
  out = _run(model, params, world["x"], video=True, decode=True)
  assert out["hidden"].shape == (B, T + L, TINY["hidden_size"])
  _close(out["hidden"], ref["hidden"])
  _close(out["logits"], ref["logits"])
  _close(out["mask_feature"], ref["mask_feature"])


def test_adapters_match_torch_hooks(world):
  config = _config(TINY, use_adapters=True, enhanced_mask_decoder=False)
  model, init = _init(config)
  params, report = D.load_hf_params(config, world["hf_dir"], init)
  assert len(report.missing) == 8 * TINY["num_hidden_layers"]  # {attn, ffn} x {down, up} x {kernel, bias}
  enc = params["deberta"]["encoder"]
  for i, (a_attn, a_ffn) in enumerate(world["adapters"]):
    for tree, a in ((enc[f"layer_{i}"]["attention"]["output"]["adapter_attn"], a_attn),
                    (enc[f"layer_{i}"]["output"]["adapter_ffn"], a_ffn)):
      for name in ("down", "up"):
        lin = getattr(a, name)
        tree[name] = dict(kernel=lin.weight.detach().numpy().T, bias=lin.bias.detach().numpy())
  ref = _torch_reference(world["mlm"], world["x"], adapters=world["adapters"], emd=False)
  plain = _torch_reference(world["mlm"], world["x"], emd=False)
  assert np.abs(ref["hidden"] - plain["hidden"]).max() > 1e-2  # the adapters are far from the identity
  out = _run(model, params, world["x"])
  _close(out["hidden"], ref["hidden"])
  _close(out["mask_feature"], ref["mask_feature"])


def test_frozenbilm_checkpoint_and_enhanced_mask_decoder(world):
  config = _config(TINY, num_visual_tokens=T, visual_dim=VDIM, use_adapters=True)
  model, init = _init(config, seed=11)  # different values everywhere: the checkpoint must overwrite all of them
  params, report = D.load_frozenbilm_checkpoint(config, world["fb_path"], init)
  assert not report.missing
  assert report.unused == ["answer_bias", "answer_embeddings.weight"]
  p = params
  _close(p["deberta"]["embeddings"]["visual_proj"]["dense"]["kernel"], world["linear_video"].weight.detach().numpy().T)
  _close(p["deberta"]["embeddings"]["position_embeddings"]["embedding"], world["pos_emb"].numpy())
  _close(p["deberta"]["encoder"]["layer_2"]["output"]["adapter_ffn"]["up"]["bias"],
         world["adapters"][2][1].up.bias.detach().numpy())
  ref = _torch_reference(world["mlm"], world["x"], video=True, linear_video=world["linear_video"],
                         adapters=world["adapters"], pos_emb=world["pos_emb"], emd=True)
  out = _run(model, params, world["x"], video=True, decode=True)
  _close(out["hidden"], ref["hidden"])
  _close(out["logits"], ref["logits"])  # EMD over the whole sequence
  _close(out["mask_feature"], ref["mask_feature"])
  # Single-row EMD (decode=False) gives the same [MASK] feature.
  alone = _run(model, params, world["x"], video=True, decode=False)
  assert set(alone) == {"hidden", "mask_feature"}
  _close(alone["mask_feature"], ref["mask_feature"])
  # The EMD matters: without it the feature is different.
  no_emd = _torch_reference(world["mlm"], world["x"], video=True, linear_video=world["linear_video"],
                            adapters=world["adapters"], emd=False)
  assert np.abs(no_emd["mask_feature"] - ref["mask_feature"]).max() > 1e-2


def test_text_only_emd_from_bin_with_position_embeddings(world, tmp_path):
  """A Microsoft-style checkpoint (.bin with position_embeddings, lm_predictions head) drives the EMD."""
  sd = dict(world["mlm"].state_dict())
  sd["deberta.embeddings.position_embeddings.weight"] = world["pos_emb"]
  torch.save(sd, str(tmp_path / "pytorch_model.bin"))
  config = _config(TINY)
  model, _ = _init(config)
  params, report = D.load_hf_params(config, str(tmp_path))
  assert not report.missing and not report.unused
  ref = _torch_reference(world["mlm"], world["x"], pos_emb=world["pos_emb"], emd=True)
  out = _run(model, params, world["x"], decode=True)
  _close(out["logits"], ref["logits"])
  _close(out["mask_feature"], ref["mask_feature"])


DEBERTA_BF16_REL = 0.012


def test_bfloat16_logical_axes_and_dropout(world):
  config = _config(TINY, num_visual_tokens=T, visual_dim=VDIM, use_adapters=True)
  model, shapes = _abstract_init(config)
  # Every parameter carries logical axis names, one per dimension, from the contract's vocabulary.
  leaves = jax.tree_util.tree_leaves(shapes, is_leaf=lambda v: isinstance(v, nn.Partitioned))
  assert leaves and all(isinstance(v, nn.Partitioned) for v in leaves)
  vocab = {None, "embed", "mlp", "heads", "kv", "vocab"}
  assert all(len(v.names) == v.value.ndim and set(v.names) <= vocab for v in leaves)
  params, _ = D.load_frozenbilm_checkpoint(config, world["fb_path"], shapes)  # abstract init: nothing missing
  full = _run(model, params, world["x"], video=True)
  bf16_model = D.DebertaV2LM(dataclasses.replace(config, dtype=jnp.bfloat16))
  bf16 = jax.jit(lambda p, x: bf16_model.apply({"params": p}, x["ids"], x["mask"], visual=x["video"],
                                               visual_mask=x["video_mask"], mask_index=x["mask_pos"] + T))(
                                                   params, {k: jnp.asarray(v) for k, v in world["x"].items()})
  bf16 = jax.tree.map(np.asarray, bf16)
  assert bf16["hidden"].dtype == jnp.bfloat16 and bf16["mask_feature"].dtype == jnp.bfloat16
  # bf16 against fp32, max |difference| / max |fp32|: measured 0.0056 (hidden) and 0.0071 (mask feature); bound
  # 0.012, 1.7x the larger. bf16 keeps 8 significant bits (0.4% per rounding), so the bound cannot be much tighter
  # than a 1% change of the weights: every parameter scaled by 0.99 moves them by 0.019 and 0.017, which fails it.
  scaled = _run(model, jax.tree.map(lambda w: 0.99 * w, params), world["x"], video=True)  # eager ops: cached
  for k in ("hidden", "mask_feature"):
    a, b = full[k], bf16[k].astype(np.float32)
    assert np.abs(a - b).max() < DEBERTA_BF16_REL * np.abs(a).max(), k
    assert np.abs(scaled[k] - a).max() > 1.3 * DEBERTA_BF16_REL * np.abs(a).max(), k
  # Dropout (hidden, attention, adapters) is active only when not deterministic.
  ids, m = jnp.asarray(world["x"]["ids"], jnp.int32), jnp.asarray(world["x"]["mask"])
  train = lambda key: np.asarray(
      model.apply({"params": params}, ids, m, deterministic=False, rngs={"dropout": key})["hidden"])
  # rbg keys: threefry bit generation costs seconds of CPU compile per eager op.
  keys = [jax.random.key(i, impl="rbg") for i in (1, 2)]
  assert np.abs(train(keys[0]) - train(keys[1])).max() > 1e-3


def test_errors_name_the_culprit(world, tmp_path):
  config = _config(TINY, hidden_size=36, num_attention_heads=4, intermediate_size=48)
  with pytest.raises(ValueError, match="shape mismatch for parameter 'deberta/embeddings/"):
    D.load_hf_params(config, world["hf_dir"])  # shapes from jax.eval_shape when no init_params
  with pytest.raises(ValueError, match="p2p"):
    _config(TINY, pos_att_type="c2p|p2p")
  cfg = _config(TINY, num_visual_tokens=T, visual_dim=VDIM)
  model, init = _abstract_init(cfg)
  with pytest.raises(ValueError, match="num_visual_tokens"):
    jax.eval_shape(lambda: model.apply(init, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4)),
                                       visual=jnp.zeros((1, T + 1, VDIM))))
  with pytest.raises(ValueError, match="linear_video"):
    D.load_frozenbilm_checkpoint(cfg, world["hf_dir"], init)
  with pytest.raises(ValueError, match="only their shapes.*visual_proj"):
    D.load_hf_params(cfg, world["hf_dir"], init)
  bad = tmp_path / "config.json"
  bad.write_text(json.dumps({"model_type": "bert"}))
  with pytest.raises(ValueError, match="model_type"):
    D.DebertaV2Config.from_hf_dir(str(tmp_path))


def test_relative_rows_sliced_to_the_sequence():
  """A sequence shorter than the span projects only the relative rows it gathers; attention is unchanged."""
  xsmall = D.DebertaV2Config.from_dict(dict(TINY, position_buckets=256, max_position_embeddings=512,
                                            hidden_size=32, num_attention_heads=4))
  index, (lo, hi) = D.DebertaV2Encoder(xsmall).rel_index(74)
  assert (lo, hi) == (256 - 73, 256 + 74)  # |i - j| <= 73 reaches 147 of the 512 rows
  np.testing.assert_array_equal(index, D.relative_position_index(xsmall, 74) - lo)
  assert D.DebertaV2Encoder(xsmall).rel_index(600)[1] == (0, 512)  # longer than the span: every row

  cfg = _config(TINY)  # span 8: 16 relative rows; a 5-token sequence reaches 9 of them
  index, rows = D.DebertaV2Encoder(cfg).rel_index(5)
  assert rows == (8 - 4, 8 + 5)
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.standard_normal((2, 5, 32)), jnp.float32)
  rel = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
  mask = jnp.ones((2, 5, 5), bool)
  attn = D.DisentangledSelfAttention(cfg)
  params = attn.init(jax.random.key(0), hidden, hidden, mask, rel, jnp.asarray(index)[None], True, rows)
  full = attn.apply(params, hidden, hidden, mask, rel, jnp.asarray(D.relative_position_index(cfg, 5))[None], True)
  sliced = attn.apply(params, hidden, hidden, mask, rel, jnp.asarray(index)[None], True, rows)
  _close(sliced, full, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("cfg_dict,length", [
    (TINY, 5), (TINY, 20),  # log buckets 8 (max position 40): sequence shorter / longer than the bucket range
    (VARIANT, 1), (VARIANT, 9),  # clipped distances, no buckets: span 6, long clamped runs at both ends
    (dict(TINY, position_buckets=256, max_position_embeddings=512), 74)])  # xlarge's buckets, rows trimmed
def test_toeplitz_gather_equals_take_along_axis(cfg_dict, length):
  """The scatter-free relative gather copies exactly what take_along_axis copies (c2p index and p2c's transpose),
  over the trimmed rows `rel_index` gives; its gradient equals take_along_axis's scatter-add to float rounding."""
  index, (lo, hi) = D.DebertaV2Encoder(_config(cfg_dict)).rel_index(length)
  diag = D.toeplitz_diagonal(index)
  rng = np.random.default_rng(length)
  x = jnp.asarray(rng.standard_normal((2, 3, length, hi - lo)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((2, 3, length, length)), jnp.float32)
  value_and_vjp = lambda f: jax.jit(lambda x, g: (f(x), jax.vjp(f, x)[1](g)[0]))  # noqa: E731
  for idx, d in ((index, diag), (index.T, diag[::-1])):
    want, want_grad = value_and_vjp(lambda x, idx=idx: jnp.take_along_axis(x, jnp.asarray(idx)[None, None], -1))(x, g)
    got, got_grad = value_and_vjp(lambda x, d=d: D.toeplitz_gather(x, d))(x, g)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-6, rtol=1e-6)
  with pytest.raises(ValueError, match="not Toeplitz"):
    D.toeplitz_diagonal(np.arange(4).reshape(2, 2))


def test_encoder_gradient_has_no_scatter():
  """The encoder's gradient (relative attention through `rel_diag`) has no scatter; the same attention gradient
  through rel_index (take_along_axis, still used for the EMD's query rows) has one per gather. The attention with
  rel_diag equals the one with rel_index: forward bit-identical, gradients to 1e-6."""
  cfg = _config(TINY)
  emb = jnp.asarray(np.random.default_rng(0).standard_normal((2, 7, 32)), jnp.float32)
  valid = jnp.ones((2, 7), bool).at[1, 5:].set(False)
  enc = D.DebertaV2Encoder(cfg)
  params = jax.eval_shape(enc.init, jax.random.key(0), emb, valid)  # lowering needs only the shapes
  hlo = jax.jit(jax.grad(lambda p, e: enc.apply(p, e, valid)[0].sum(), argnums=(0, 1))).lower(params, emb).as_text()
  assert "scatter" not in hlo

  index, rows = enc.rel_index(7)
  rel = jnp.asarray(np.random.default_rng(1).standard_normal((16, 32)), jnp.float32)
  mask = valid[:, :, None] & valid[:, None, :]
  attn = D.DisentangledSelfAttention(cfg)
  p = attn.init(jax.random.key(0), emb, emb, mask, rel, jnp.asarray(index)[None], True, rows)

  def loss(p, e, rel, diag):
    out = attn.apply(p, e, e, mask, rel, None if diag else jnp.asarray(index)[None], True, rows, diag)
    return (out * jnp.cos(jnp.arange(out.size).reshape(out.shape))).sum(), out

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
  assert grad.lower(p, emb, rel, None).as_text().count("stablehlo.scatter") >= 2
  (got, got_out), (want, want_out) = grad(p, emb, rel, D.toeplitz_diagonal(index)), grad(p, emb, rel, None)
  np.testing.assert_array_equal(got_out, want_out)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)


def _gather_result_ranks(hlo: str):
  """Ranks of the results of every stablehlo.gather in a lowering's text."""
  ranks = []
  for line in hlo.splitlines():
    if "stablehlo.gather" in line or "\"stablehlo.gather\"" in line:
      result = line.rsplit("->", 1)[-1]
      ranks.append(result.split("tensor<", 1)[1].count("x"))
  return ranks


_BUCKETS = dict(TINY, position_buckets=256, max_position_embeddings=512)  # the real log buckets


@pytest.mark.parametrize("cfg_dict,length,gather", [(TINY, 7, "rows"), (VARIANT, 9, "rows"), (_BUCKETS, 74, "rows"),
                                                    (_BUCKETS, 74, "dpa")])
def test_relative_gather_rows_equals_scores(cfg_dict, length, gather):
  """relative_gather="rows" (`toeplitz_scores`: the projected relative rows gathered, one matmul, a skew) and "dpa"
  (the same terms as the bias of jax.nn.dot_product_attention, its XLA implementation on CPU) equal the scores gather
  in float32 within 1e-6, values and gradients (parameters, hidden states, relative embeddings), and their lowering
  gathers only weight-sized arrays (rank 3: [heads, head_dim, 2S - 1]), never the [b, heads, S, rows] scores.
  "dpa" refuses a training call with attention dropout by name (dot_product_attention has none)."""
  rows_cfg, scores_cfg = _config(cfg_dict, relative_gather=gather), _config(cfg_dict)
  enc = D.DebertaV2Encoder(scores_cfg)
  index, rows = enc.rel_index(length)
  diag = D.toeplitz_diagonal(index)
  rng = np.random.default_rng(length)
  emb = jnp.asarray(rng.standard_normal((2, length, 32)), jnp.float32)
  rel = jnp.asarray(rng.standard_normal((2 * scores_cfg.att_span, 32)), jnp.float32)
  valid = jnp.ones((2, length), bool).at[1, length - 2:].set(False)
  mask = valid[:, :, None] & valid[:, None, :]
  p = D.DisentangledSelfAttention(scores_cfg).init(jax.random.key(0), emb, emb, mask, rel, None, True, rows, diag)
  weight = jnp.cos(jnp.arange(2 * length * 32).reshape(2, length, 4, 8))

  def loss(cfg):
    def f(p, e, rel):
      out = D.DisentangledSelfAttention(cfg).apply(p, e, e, mask, rel, None, True, rows, diag)
      return (out * weight).sum(), out
    return jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))

  (got, got_out), (want, want_out) = loss(rows_cfg)(p, emb, rel), loss(scores_cfg)(p, emb, rel)
  np.testing.assert_allclose(got_out, want_out, atol=1e-6, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)
  assert max(_gather_result_ranks(loss(scores_cfg).lower(p, emb, rel).as_text())) == 4  # the scores' gathers
  assert set(_gather_result_ranks(loss(rows_cfg).lower(p, emb, rel).as_text())) <= {3}  # only the rows'
  if gather == "dpa":
    with pytest.raises(ValueError, match=r"relative_gather = 'dpa'.*attention_probs_dropout_prob = 0.1"):
      D.DisentangledSelfAttention(rows_cfg).apply(p, emb, emb, mask, rel, None, False, rows, diag,
                                                  rngs={"dropout": jax.random.key(1)})


def test_relative_gather_rows_in_the_whole_lm():
  """The whole LM (3 layers, conv, enhanced mask decoder) in float32 with relative_gather="rows" or "dpa" gives the
  hidden states and [MASK] features of the default within 1e-6; an unknown setting is refused by name."""
  cfg = dict(TINY, num_visual_tokens=0)
  ids = jnp.asarray(np.random.default_rng(3).integers(1, 61, (2, 11)), jnp.int32)
  att = jnp.ones((2, 11), jnp.int32).at[0, 9:].set(0)
  mask_index = jnp.asarray([4, 7], jnp.int32)
  params = D.init_variables(_config(cfg), jax.random.key(1))
  out = {g: D.DebertaV2LM(_config(cfg, relative_gather=g)).apply(params, ids, att, mask_index=mask_index)
         for g in ("scores", "rows", "dpa")}
  for key in ("hidden", "mask_feature"):
    _close(out["rows"][key], out["scores"][key], atol=1e-6, rtol=1e-6)
    _close(out["dpa"][key], out["scores"][key], atol=1e-6, rtol=1e-6)
  with pytest.raises(ValueError, match=r"relative_gather = 'diagonal'"):
    _config(cfg, relative_gather="diagonal")


def test_scan_layers_equals_unrolled(world):
  """scan_layers=True (the middle layers as one nn.scan over stacked params, remat inside) gives the unrolled
  model's hidden states, [MASK] features and parameter gradients in float32 after `stack_layers` (4 layers: two
  scanned; conv after layer 0, EMD on the last); `unstack_layers` inverts it; the checkpoint import stacks."""
  cfg = dict(TINY, num_hidden_layers=4, num_visual_tokens=0)
  ids = jnp.asarray(np.random.default_rng(3).integers(1, 61, (2, 11)), jnp.int32)
  att = jnp.ones((2, 11), jnp.int32).at[0, 9:].set(0)
  mask_index = jnp.asarray([4, 7], jnp.int32)
  flat, scanned = _config(cfg), _config(cfg, scan_layers=True, remat="full")
  params = _init(flat, seed=4)[1]["params"]
  stacked = D.stack_layers(params, scanned)
  enc = stacked["deberta"]["encoder"]
  assert sorted(k for k in enc if k.startswith("layer")) == ["layer_0", "layer_3", "layers"]
  assert enc["layers"]["layer"]["intermediate"]["dense"]["kernel"].shape == (2, 32, 48)
  _, shapes = _abstract_init(scanned)  # the scanned model's own init has the stacked tree
  assert jax.tree.map(np.shape, nn.meta.unbox(shapes)["params"]) == jax.tree.map(np.shape, stacked)
  jax.tree.map(np.testing.assert_array_equal, D.unstack_layers(stacked, scanned), params)

  def loss(config, p):
    out = D.DebertaV2LM(config).apply({"params": p}, ids, att, mask_index=mask_index)
    return jnp.sum(out["hidden"] ** 2) + jnp.sum(out["mask_feature"] * 3.0), out

  (l_flat, out_flat), g_flat = jax.value_and_grad(functools.partial(loss, flat), has_aux=True)(params)
  (l_scan, out_scan), g_scan = jax.value_and_grad(functools.partial(loss, scanned), has_aux=True)(stacked)
  for key in ("hidden", "mask_feature"):
    _close(out_scan[key], out_flat[key])
  _close(l_scan, l_flat)
  jax.tree.map(_close, D.unstack_layers(g_scan, scanned), g_flat)
  # The pretrained import of a scanned model is the unrolled import, stacked (3 layers: layer_1 scanned).
  tiny, tiny_scanned = _config(TINY, enhanced_mask_decoder=False), _config(TINY, enhanced_mask_decoder=False,
                                                                            scan_layers=True)
  want, _ = D.load_hf_params(tiny, world["hf_dir"])
  got, report = D.load_hf_params(tiny_scanned, world["hf_dir"])
  assert not report.missing and not report.unused
  jax.tree.map(np.testing.assert_array_equal, got, D.stack_layers(want, tiny_scanned))
