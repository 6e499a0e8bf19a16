"""VIOLET (evqa_jax/models/violet.py) and its Video Swin Transformer (evqa_jax/models/video_swin.py).

References: the Video Swin blocks against a NumPy forward written from the Swin / Video Swin equations (arXiv:2103.14030,
arXiv:2106.13230) as github.com/tsujuifu/pytorch_violet's video_swin.py computes them (windows found by coordinates,
the shifted-window mask from the regions of the rolled volume, the relative position bias from the coordinate
differences); the cross-modal transformer, the QA head, its loss and gradients against transformers' BertModel with the
same weights; the loader on a tiny checkpoint with the authors' names and shapes (VIOLET_QAOE.state_dict())."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evqa_jax.models import bert, hf_utils, video_swin, violet
from backbone_inputs import StubInput

SWIN = video_swin.VideoSwinConfig(embed_dim=8, depths=(2, 2), num_heads=(2, 4), window_size=(2, 4, 4))
TEXT = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16)
FRAMES = np.random.RandomState(1).randint(0, 256, (2, 3, 32, 32, 3)).astype(np.uint8)
IDS = np.array([[1, 5, 6, 7, 0], [1, 9, 0, 0, 0]])


def _random(module, *args, seed=0, scale=0.3):
  """Random parameters of `module` (shapes from jax.eval_shape: nothing compiled): N(0, scale) everywhere, LayerNorm
  scales 1 + N(0, scale), so no term (biases, the bias table) hides at its init value."""
  shapes = hf_utils.flatten_params(hf_utils.params_of(jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)))
  rng = np.random.RandomState(seed)
  return hf_utils.unflatten_params({k: (k.endswith("/scale") + scale * rng.standard_normal(v.shape)).astype(np.float32)
                                    for k, v in shapes.items()})


# ------------------------------------------------------------------------------------------ NumPy Video Swin


def _ln(x, p, eps=1e-5):
  m = x.mean(-1, keepdims=True)
  return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * p["scale"] + p["bias"]


def _gelu(x):
  from scipy.special import erf  # pylint: disable=g-import-not-at-top
  return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _dense(x, p):
  return x @ p["kernel"] + p.get("bias", 0.0)


def np_block(x, p, heads, cfg_window, shift):
  """One Swin block: z = x + W-MSA(LN(x)) over (shifted) windows of the zero-padded volume, out = z + MLP(LN(z)).
  Token i of the rolled volume sits in window floor(r / w) at offset r mod w, r = (q - s) mod P its rolled coordinate;
  two tokens of one window attend with bias B[offset_i - offset_j] and, in a shifted block, -100 when they come from
  different regions (r < P - w, P - w <= r < P - s, r >= P - s along some axis)."""
  b, *size, c = x.shape
  window = [min(s, w) for s, w in zip(size, cfg_window)]
  shift = [0 if s <= w else sh for s, w, sh in zip(size, cfg_window, shift)]
  padded = [int(math.ceil(s / w)) * w for s, w in zip(size, window)]
  y = np.zeros((b, *padded, c), np.float64)
  y[:, :size[0], :size[1], :size[2]] = _ln(x, p["norm1"])
  coords = np.stack(np.meshgrid(*[np.arange(n) for n in padded], indexing="ij"), -1).reshape(-1, 3)
  rolled = (coords - np.array(shift)) % np.array(padded)  # where each token sits after roll(-shift)
  win_id = rolled // np.array(window)
  offset = rolled % np.array(window)
  region = np.stack([np.where(rolled[:, i] < padded[i] - window[i], 0, np.where(rolled[:, i] < padded[i] - shift[i],
                                                                               1, 2)) if shift[i] else
                     np.zeros(len(rolled), int) for i in range(3)], -1)
  a = p["attn"]
  hd = c // heads
  flat = y.reshape(b, -1, c)
  qkv = np.einsum("bnc,cthd->tbhnd", flat, a["kernel"]) + a["bias"][:, None, :, None, :]
  q, k, v = qkv[0] * hd ** -0.5, qkv[1], qkv[2]
  wd, wh, ww = cfg_window
  rel = offset[:, None, :] - offset[None, :, :] + np.array([wd - 1, wh - 1, ww - 1])
  bias = a["relative_position_bias_table"][rel[..., 0] * (2 * wh - 1) * (2 * ww - 1) + rel[..., 1] * (2 * ww - 1)
                                           + rel[..., 2]].transpose(2, 0, 1)  # [heads, n, n]
  same = (win_id[:, None, :] == win_id[None, :, :]).all(-1)
  cross = (region[:, None, :] != region[None, :, :]).any(-1) & any(shift)
  scores = np.einsum("bhqd,bhkd->bhqk", q, k) + bias + np.where(cross, -100.0, 0.0)
  scores = np.where(same, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum("bhqk,bhkd,hdc->bqc", probs, v, a["proj_kernel"]) + a["proj_bias"]
  out = out.reshape(b, *padded, c)[:, :size[0], :size[1], :size[2]]
  z = x + out
  return z + _dense(_gelu(_dense(_ln(z, p["norm2"]), p["fc1"])), p["fc2"])


def np_merge(x, p):
  """Patch merging: each 2x2 neighbourhood's four tokens concatenated (x00, x10, x01, x11), LN, linear 4C -> 2C."""
  b, d, h, w, c = x.shape
  x = np.pad(x, ((0, 0), (0, 0), (0, h % 2), (0, w % 2), (0, 0)))
  cat = np.concatenate([x[:, :, i::2, j::2] for i, j in ((0, 0), (1, 0), (0, 1), (1, 1))], -1)
  return _ln(cat, p["norm"]) @ p["reduction"]["kernel"]


def np_swin(frames, p, cfg):
  """Patch embedding (one zero frame appended in time, (2, 4, 4) patches at stride (1, 4, 4), LN), the stages, LN."""
  x = (frames / 255.0 - np.array(violet.MEAN)) / np.array(violet.STD)
  x = np.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0), (0, 0)))
  kd, kh, kw = cfg.patch_size
  b, t1, h, w, c = x.shape
  patches = np.stack([x[:, i:i + kd] for i in range(t1 - kd + 1)], 1)  # [b, T, kd, H, W, C]
  patches = patches.reshape(b, t1 - kd + 1, kd, h // kh, kh, w // kw, kw, c)
  x = np.einsum("btdhiwjc,dijco->bthwo", patches, p["patch_embed"]["proj"]["kernel"]) + p["patch_embed"]["proj"]["bias"]
  x = _ln(x, p["patch_embed"]["norm"])
  half = tuple(s // 2 for s in cfg.window_size)
  for i, depth in enumerate(cfg.depths):
    for j in range(depth):
      x = np_block(x, p[f"layers_{i}"][f"blocks_{j}"], cfg.num_heads[i], cfg.window_size, (0, 0, 0) if j % 2 == 0
                   else half)
    if i < len(cfg.depths) - 1:
      x = np_merge(x, p[f"layers_{i}"]["downsample"])
  return _ln(x, p["norm"])


def test_shifted_block_matches_numpy_reference():
  """A shifted block whose time axis (3 frames, window 2) is padded to 4 and whose 8x8 grid (window 4, shift 2) has
  all nine regions: rel. position bias, the -100 mask across regions and the roll back, against the equations."""
  x = np.random.RandomState(2).standard_normal((2, 3, 8, 8, 8)).astype(np.float32)
  half = (1, 2, 2)
  mask = video_swin.compute_mask(4, 8, 8, (2, 4, 4), half)
  block = video_swin.SwinBlock3D(SWIN, 8, 2, half)
  params = _random(block, x, mask)
  ours = np.asarray(jax.jit(lambda p, x: block.apply({"params": p}, x, mask))(params, x))
  ref = np_block(x.astype(np.float64), params, 2, SWIN.window_size, half)
  np.testing.assert_allclose(ours, ref, atol=5e-6, rtol=0)  # measured 8.9e-7 (values up to 7.0); the bias table x0.999 moves 4.5e-4
  # The mask matters here (the same block without it is far off), so the bound above checks it.
  assert np.abs(np.asarray(jax.jit(lambda p, x: block.apply({"params": p}, x, None))(params, x)) - ref).max() > 1e-2


def test_visual_tokens_match_numpy_reference():
  """EncImg: the whole Video Swin (patch embedding with its appended frame, plain and shifted blocks, patch merging,
  the final LayerNorm) on 3 frames of 32x32 -> [2, 3, 4, 4, 16], then emb_cls prepended to each frame's 16 tokens,
  emb_pos[:17] and emb_len[:3] added, LayerNorm (eps 1e-5) -> [2, 51, 16]."""
  model = _model(7)
  params = _random(model, _batch(), scale=0.2)
  ours = np.asarray(jax.jit(lambda p, f: model.apply({"params": p}, f, method=model.visual_tokens))(params, FRAMES))
  f = np_swin(FRAMES.astype(np.float64), params["swin"], SWIN).reshape(2, 3, 16, 16)
  f = np.concatenate([np.broadcast_to(params["emb_cls"], (2, 3, 1, 16)), f], 2)
  f = f + params["emb_pos"][:, :, :17] + params["emb_len"][:, :3]
  ref = _ln(f, params["img_norm"]).reshape(2, 51, 16)
  np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)  # measured 1.5e-6 (values up to 3.7); emb_len x0.999 moves 2.4e-3


def test_relative_position_index_and_mask_by_hand():
  """The bias-table row of two tokens (d, h, w) offsets apart and the mask's regions, counted by hand."""
  index = video_swin.relative_position_index((2, 3, 3))
  # token 0 = (0, 0, 0), token 17 = (1, 2, 2): offset (-1, -2, -2) -> ((-1 + 1) * 25 + (-2 + 2) * 5 + (-2 + 2)) = 0
  assert index[0, 17] == 0 and index[17, 0] == (2 * 25 + 4 * 5 + 4) and index[5, 5] == 1 * 25 + 2 * 5 + 2
  mask = video_swin.compute_mask(4, 4, 4, (2, 2, 2), (1, 1, 1))
  assert mask.shape == (8, 8, 8) and set(np.unique(mask)) == {0.0, -100.0}
  assert (mask[0] == 0).all()  # the first window lies in one region
  assert (mask[-1] != 0).sum() == 8 * 8 - 8  # the last: every token its own region (2x2x2 corners)


# ------------------------------------------------------------------------------------------ VIOLET vs transformers


def _model(out_size=7):
  return violet.Violet(SWIN, bert.BertConfig(**TEXT), out_size, max_patches=16)


def _batch():
  return {"frames": jnp.asarray(FRAMES), "question_ids": jnp.asarray(IDS)}


def test_cross_modal_head_loss_and_grads_match_transformers_bert():
  """go_cross: BERT's embeddings of the question and BERT's encoder over [visual tokens; text] (transformers'
  BertModel, the same weights), the [CLS] row of the text through fc, the cross-entropy, and the gradients of the
  encoder, the embeddings and the head: VIOLET_QAOE.forward + CrossEntropyLoss to float32 precision."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model = _model(7)
  params = _random(model, _batch(), scale=0.1)
  labels = np.array([3, 5])

  # The cross-modal part reads the visual tokens as they are (EncImg's output, [b, T(1 + hw), hidden]): random ones
  # here, so that nothing of the Video Swin is compiled (its parity is the tests above).
  visual = np.random.RandomState(7).standard_normal((2, 3 * 17, 16)).astype(np.float32)

  def loss_fn(p):  # the cross-modal transformer at the text's [CLS], fc, the cross-entropy
    out = model.apply({"params": p}, model.apply({"params": p}, jnp.asarray(visual), jnp.asarray(IDS),
                                                 method=model.cross), method=model.fc)
    return -jnp.mean(jax.nn.log_softmax(out)[jnp.arange(2), labels]), out

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)

  ref = transformers.BertModel(transformers.BertConfig(**TEXT), add_pooling_layer=False).eval()
  missing = ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in _hf_state(params, model).items()}, strict=False)
  assert not missing.unexpected_keys and all("position_ids" in k for k in missing.missing_keys)
  fc1, fc3 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 7)
  with torch.no_grad():
    for lin, name in ((fc1, "fc_1"), (fc3, "fc_3")):
      lin.weight.copy_(torch.tensor(np.asarray(params[name]["kernel"]).T))
      lin.bias.copy_(torch.tensor(np.asarray(params[name]["bias"])))
  ids = torch.tensor(IDS)
  feat = torch.cat([torch.tensor(visual), ref.embeddings(ids)], 1)
  mask = torch.cat([torch.ones(2, visual.shape[1]), (ids != 0).float()], 1)
  out = ref.encoder(feat, attention_mask=(1.0 - mask[:, None, None, :]) * -10000.0)["last_hidden_state"]
  ref_logits = fc3(torch.relu(fc1(out[:, visual.shape[1]])))
  ref_loss = torch.nn.functional.cross_entropy(ref_logits, torch.tensor(labels))
  ref_loss.backward()
  np.testing.assert_allclose(np.asarray(logits), ref_logits.detach().numpy(), atol=5e-7, rtol=0)  # measured 8.9e-8
  np.testing.assert_allclose(float(loss), float(ref_loss.detach()), atol=2e-7, rtol=0)  # measured 0
  np.testing.assert_allclose(np.asarray(grads["fc_3"]["kernel"]), fc3.weight.grad.numpy().T, atol=5e-7, rtol=0)  # 7.5e-8
  q = ref.encoder.layer[0].attention.self.query.weight.grad.numpy()  # [out, in] -> ours [in, heads, head_dim]
  np.testing.assert_allclose(np.asarray(grads["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]),
                             q.T.reshape(16, 2, 8), atol=5e-7, rtol=0)
  w = ref.embeddings.word_embeddings.weight.grad.numpy()
  np.testing.assert_allclose(np.asarray(grads["embeddings"]["word_embeddings"]["embedding"]), w, atol=5e-7, rtol=0)  # 6.0e-8


def _hf_state(params, model):
  """Our text embeddings + encoder -> a transformers BertModel state dict (their names, "trsfr." -> "encoder.")."""
  out = {}
  for key, value in _their_state(params, model).items():
    if key.startswith("enc_txt.emb_txt."):
      out["embeddings." + key[len("enc_txt.emb_txt."):]] = value
    elif key.startswith("trsfr."):
      out["encoder." + key[len("trsfr."):]] = value
  return out


# ------------------------------------------------------------------------------------------ VIOLET+ and the loader


def _their_state(params, model):
  """Our params -> a state dict with the authors' names and shapes (the loader's rules inverted by their shapes)."""
  flat = hf_utils.flatten_params(params)
  rules = violet.checkpoint_rules(model)
  state = {}
  for ours, rule in rules.items():
    key = rule.keys[0]
    v = np.asarray(flat[ours])
    if key.endswith("qkv.weight"):
      v = v.reshape(v.shape[0], -1).T
    elif key.endswith("qkv.bias") or "attention.self" in key and key.endswith(".bias"):
      v = v.reshape(-1)
    elif key.endswith("attn.proj.weight") or "attention.output.dense.weight" in key:
      v = v.reshape(-1, v.shape[-1]).T
    elif "attention.self" in key and key.endswith(".weight"):
      v = v.reshape(v.shape[0], -1).T
    elif key.endswith("proj.weight") and v.ndim == 5:
      v = v.transpose(4, 3, 0, 1, 2)
    elif ours.endswith("kernel"):
      v = v.T
    state[key] = np.ascontiguousarray(v)
  for i, depth in enumerate(model.swin_config.depths):
    for j in range(depth):
      state[f"enc_img.swin.layers.{i}.blocks.{j}.attn.relative_position_index"] = \
          video_swin.relative_position_index(model.swin_config.window_size)
  return state


def test_checkpoint_round_trip(tmp_path):
  """A tiny VIOLET_QAOE state dict (their names and shapes, "module." prefix of DataParallel) as .pt (a pickle: only
  with trust_pickles, or read as plain tensors) and .safetensors loads back to the same parameters; a head of another
  width stays at init; a checkpoint of another window is refused, naming the buffer."""
  torch = pytest.importorskip("torch")
  model = _model(7)
  init = _random(model, _batch(), seed=4)
  source = _random(model, _batch(), seed=5)
  state = _their_state(source, model)
  assert state["enc_img.swin.layers.0.blocks.0.attn.qkv.weight"].shape == (24, 8)
  assert state["enc_img.swin.patch_embed.proj.weight"].shape == (8, 3, 2, 4, 4)
  assert state["trsfr.layer.1.attention.self.query.weight"].shape == (16, 16)
  pt = os.path.join(tmp_path, "ckpt_violet_msvd-qa_5.pt")
  torch.save({f"module.{k}": torch.tensor(v) for k, v in state.items()}, pt)
  loaded, report = violet.load_checkpoint(model, pt, init)
  assert not report.missing and not report.unused
  for key, value in hf_utils.flatten_params(source).items():
    np.testing.assert_array_equal(hf_utils.flatten_params(loaded)[key], value, err_msg=key)
  from safetensors.numpy import save_file
  st = os.path.join(tmp_path, "violet.safetensors")
  save_file(state, st)
  loaded_st, _ = violet.load_checkpoint(model, st, init)
  np.testing.assert_array_equal(loaded_st["swin"]["norm"]["scale"], source["swin"]["norm"]["scale"])
  # Another answer count: fc_3 keeps its init, everything else loads (their load_ckpt's shape test).
  other = _model(5)
  other_init = _random(other, _batch(), seed=6)
  loaded5, report5 = violet.load_checkpoint(other, pt, other_init)
  assert set(report5.missing) == {"fc_3/kernel", "fc_3/bias"}
  np.testing.assert_array_equal(loaded5["fc_3"]["kernel"], other_init["fc_3"]["kernel"])
  np.testing.assert_array_equal(loaded5["fc_1"]["kernel"], source["fc_1"]["kernel"])
  bad = dict(state)
  bad["enc_img.swin.layers.0.blocks.1.attn.relative_position_index"] = video_swin.relative_position_index((2, 3, 3))
  save_file(bad, os.path.join(tmp_path, "bad.safetensors"))
  with pytest.raises(ValueError, match=r"bad.safetensors: enc_img.swin.layers.0.blocks.1.attn.relative_position_index"):
    violet.load_checkpoint(model, os.path.join(tmp_path, "bad.safetensors"), init)


# ------------------------------------------------------------------------------------------ the OVQA backbone


def test_backbone_open_head_scores_frozen_answer_encodings():
  """`:violet,tiny,baseline` (VIOLET+): logits = fc(feature) . e over the frozen answer encoder's encodings (MiniLM's
  word embeddings, mean over sub-words), the same from the per-split precomputed encodings as from the tokens, padded
  slots at the minimum; the encoder is out of the trained parameters; the question's mask is ids != 0."""
  import re
  from configs import ovqa_msrvtt
  from evqa_jax.projects.ovqa import backbones
  config = ovqa_msrvtt.get_config("violet,tiny,baseline")
  bb = backbones.build(config)
  answers = ["dog", "ice cream", "red"]
  stub = StubInput(config, answers)
  model = bb.build_model(stub)
  ids, mask = bb.answer_tokens(None, answers, 8)
  aux = {"answer_tokens": jnp.asarray(ids), "answer_token_mask": jnp.asarray(mask),
         "answer_mask": jnp.asarray(np.arange(8) < 3), "is_base": jnp.zeros((8,), bool)}
  rs = np.random.RandomState(0)
  q = bb.text_inputs(stub, {"question": "what is the dog doing?", "index": 0})["question_ids"]
  assert q.shape == (25,) and q[0] == 101 and (q[q != 0][-1] == 102) and (q == 0).sum() > 0
  batch = {"frames": jnp.asarray(rs.randint(0, 256, (2, 5, 32, 32, 3)), jnp.uint8),
           "question_ids": jnp.asarray(np.stack([q, q]))}
  shapes = hf_utils.params_of(jax.eval_shape(model.init, jax.random.PRNGKey(0), bb.dummy_batch(), aux))
  params = bb.load_pretrained(jax.tree.map(lambda x: rs.normal(0, 0.1, x.shape).astype(x.dtype), shapes))

  @jax.jit
  def run(p, aux):
    cached = bb.precompute_aux({"answer_encoder": p["answer_encoder"]}, aux)
    out = model.network.apply({"params": p["violet"]}, batch)
    return model.apply({"params": p}, batch, aux), model.apply({"params": p}, batch, cached), cached, out

  logits, from_cache, cached, out = run(params, aux)
  logits = np.asarray(logits)
  assert logits.shape == (2, 8) and np.all(logits[:, 3:] == np.finfo(np.float32).min)
  enc = np.asarray(cached["answer_encodings"])
  table = np.asarray(params["answer_encoder"]["word_embeddings"])
  cream = bb.answer_spec.tokenizer("ice cream", add_special_tokens=False)["input_ids"]
  np.testing.assert_allclose(enc[1], table[cream].mean(0), atol=1e-7, rtol=0)
  np.testing.assert_allclose(logits[:, :3], np.asarray(out) @ enc[:3].T, atol=1e-5, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(from_cache), logits)
  flat = hf_utils.flatten_params(params)
  trained = [k for k in flat if any(re.search(p, k) for p in bb.trainable_patterns)]
  assert sorted(set(flat) - set(trained)) == ["answer_encoder/word_embeddings"]


@pytest.mark.parametrize("dataset,batch,topk", [("msvd", 10, 1000), ("msrvtt", 12, 1500), ("tgif", 10, 1540),
                                                ("activitynet", 8, 1654)])
def test_configs_follow_the_ovqa_appendix(dataset, batch, topk):
  """`:violet` per dataset: OVQA appendix B (5 frames at 224, 32x32 patches, AdamW (0.9, 0.98) lr 1.2e-5 wd 1e-3, the
  per-GPU batch and CVQA answer set of the dataset), the authors' 25 question tokens and constant lr."""
  import importlib
  from evqa_jax.projects.ovqa import backbones
  config = importlib.import_module(f"configs.ovqa_{dataset}").get_config("violet,cvqa")
  assert config.model.backbone == "violet" and config.model.head == "cvqa"
  assert (config.data.num_frames, config.data.frame_size, config.data.max_tokens) == (5, 224, 25)
  assert (config.batch_size, config.data.cvqa_topk) == (batch, topk)
  o = config.optim
  assert (o.name, o.lr, o.b1, o.b2, o.weight_decay, o.decay, o.warmup_fraction) == ("adam", 1.2e-5, 0.9, 0.98, 1e-3,
                                                                                   "constant", 0.0)
  config.pretrained.init_from = "none"
  swin, text = backbones.backbone_class("violet")(config).configs()
  assert swin.stride == 32 and swin.num_features == text.hidden_size == 768
