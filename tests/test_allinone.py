"""All-in-one (evqa_jax/models/allinone.py, evqa_jax/projects/ovqa/backbones/allinone.py): the vision tower against
transformers' ViTModel with the same weights, the temporal token rolling and the VQA head against NumPy references
written from the authors' code (github.com/showlab/all-in-one: temporal_roll.py TemporalRoll(v=0),
allinone_module.py openend_vqa's vqa_classifier), and the whole model (forward, cross-entropy, gradients) against a
PyTorch reference written from their allinone_module.py `infer` / base_vision_transformer.py (read, not copied: their
module names are kept, so its state dict is a checkpoint in their layout), loaded through our by-name loader from a
Lightning-style .ckpt and from a safetensors export."""

import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = torch.nn.functional

from evqa_jax import io as io_lib  # noqa: E402
from evqa_jax.models import allinone as lib  # noqa: E402
from evqa_jax.models import hf_utils  # noqa: E402
from evqa_jax.projects.ovqa.backbones import allinone as backbone_lib  # noqa: E402
from backbone_inputs import StubInput  # noqa: E402

CFG = lib.AllInOneConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                         patch_size=8, num_frames=3, max_text_len=12)  # 16 patches: l = 17 image tokens, fold 2
K = 7  # classes


# ------------------------------------------------------------------------------------------ NumPy references


def roll_reference(x, n_segment, n_div=8):
  """TemporalRoll(v=0).forward, statement by statement in NumPy (torch slicing semantics, `-0:` included)."""
  nt, l, c = x.shape
  x = x.reshape(nt // n_segment, n_segment, l, c)
  fold = l // n_div
  out = np.zeros_like(x)
  out[:, :, 0] = x[:, :, 0]
  out[:, :, 1:fold + 1] = np.roll(x[:, :, 1:fold + 1], 1, 1)
  out[:, :, -fold:] = np.roll(x[:, :, -fold:], -1, 1)
  out[:, :, 1 + fold:-fold] = x[:, :, 1 + fold:-fold]
  return out.reshape(nt, l, c)


@pytest.mark.parametrize("length", [17, 197, 5])
def test_temporal_roll_matches_authors(length):
  """Tokens 1..fold one frame forward, the last fold one frame back (fold = l // 8: 2 at 17, 24 at ViT-B/16's 197),
  class token and middle in place; at l = 5 (fold 0) their `-0:` slice rolls every token back. Exact."""
  x = np.random.RandomState(length).randn(2 * 3, length, 4).astype(np.float32)
  ours = np.asarray(lib.temporal_roll(jnp.asarray(x), 3))
  np.testing.assert_array_equal(ours, roll_reference(x, 3))
  if length == 17:  # spelled out: token 1 of frame 0 comes from frame 2, token 16 of frame 0 from frame 1
    np.testing.assert_array_equal(ours[0, 1], x[2, 1])
    np.testing.assert_array_equal(ours[0, 16], x[1, 16])
    np.testing.assert_array_equal(ours[0, 8], x[0, 8])


def test_vqa_head_matches_numpy():
  """Linear -> LayerNorm(eps 1e-5) -> exact-erf GELU -> Linear, in NumPy float64, to 1e-6."""
  rs = np.random.RandomState(0)
  head = backbone_lib.VQAClassifier(32, K)
  x = rs.randn(3, 32).astype(np.float32)
  params = hf_utils.params_of(jax.jit(head.init)(jax.random.PRNGKey(0), jnp.asarray(x)))
  params = jax.tree.map(lambda p: np.asarray(p) + 0.1 * rs.randn(*np.shape(p)).astype(np.float32), params)
  out = np.asarray(jax.jit(head.apply)({"params": params}, jnp.asarray(x)))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  h = x @ p["fc1"]["kernel"] + p["fc1"]["bias"]
  h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * p["norm"]["scale"] + p["norm"]["bias"]
  h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
  np.testing.assert_allclose(out, h @ p["fc2"]["kernel"] + p["fc2"]["bias"], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------ the PyTorch reference


class RefBlock(torch.nn.Module):
  """timm's Block as base_vision_transformer.py has it: fused qkv with bias, masked_fill(-inf), LayerNorm eps 1e-6."""

  def __init__(self, dim, heads):
    super().__init__()
    self.heads = heads
    self.norm1, self.norm2 = torch.nn.LayerNorm(dim, eps=1e-6), torch.nn.LayerNorm(dim, eps=1e-6)
    self.attn = torch.nn.Module()
    self.attn.qkv, self.attn.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
    self.mlp = torch.nn.Module()
    self.mlp.fc1, self.mlp.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

  def forward(self, x, mask):
    b, n, c = x.shape
    qkv = self.attn.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
    attn = attn.masked_fill(~mask.bool()[:, None, None, :], float("-inf")).softmax(dim=-1)
    x = x + self.attn.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
    return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class RefAllInOne(torch.nn.Module):
  """AllinoneTransformerSS.infer + compute_openend_vqa (eval mode), their parameter names."""

  def __init__(self, cfg, classes):
    super().__init__()
    d = cfg.hidden_size
    self.cfg = cfg
    bert_cfg = transformers.BertConfig(vocab_size=cfg.vocab_size, hidden_size=d, num_attention_heads=4,
                                       max_position_embeddings=cfg.max_text_len)
    self.text_embeddings = transformers.models.bert.modeling_bert.BertEmbeddings(bert_cfg)
    self.token_type_embeddings = torch.nn.Embedding(2, d)
    self.transformer = torch.nn.Module()
    t = self.transformer
    t.patch_embed = torch.nn.Module()
    t.patch_embed.proj = torch.nn.Conv2d(3, d, cfg.patch_size, cfg.patch_size)
    t.cls_token = torch.nn.Parameter(0.02 * torch.randn(1, 1, d))
    t.pos_embed = torch.nn.Parameter(0.02 * torch.randn(1, cfg.num_patches + 1, d))
    t.temporal_embed = torch.nn.Parameter(0.02 * torch.randn(1, cfg.num_frames, d))
    t.blocks = torch.nn.ModuleList([RefBlock(d, cfg.num_attention_heads) for _ in range(cfg.num_hidden_layers)])
    t.norm = torch.nn.LayerNorm(d, eps=1e-6)
    self.pooler = torch.nn.Module()
    self.pooler.dense = torch.nn.Linear(d, d)
    self.vqa_classifier = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(d, d // 2),
                                              torch.nn.LayerNorm(d // 2), torch.nn.GELU(), torch.nn.Linear(d // 2, classes))

  def roll(self, x):
    nt, l, c = x.size()
    n = self.cfg.num_frames
    x = x.view(nt // n, n, l, c)
    fold = l // 8
    out = torch.zeros_like(x)
    out[:, :, 0] = x[:, :, 0]
    out[:, :, 1:fold + 1] = torch.roll(x[:, :, 1:fold + 1], 1, 1)
    out[:, :, -fold:] = torch.roll(x[:, :, -fold:], -1, 1)
    out[:, :, 1 + fold:-fold] = x[:, :, 1 + fold:-fold]
    return out.view(nt, l, c)

  def forward(self, frames, text_ids, text_masks):
    cfg, t, n = self.cfg, self.transformer, self.cfg.num_frames
    text_embeds = self.text_embeddings(text_ids)
    img = frames.float().permute(0, 1, 4, 2, 3) / 255.0  # their ClipToTensor + Normalize
    mean = torch.tensor(lib.IMAGENET_MEAN).view(1, 1, 3, 1, 1)
    std = torch.tensor(lib.IMAGENET_STD).view(1, 1, 3, 1, 1)
    img = ((img - mean) / std).reshape(-1, 3, cfg.image_size, cfg.image_size)
    x = t.patch_embed.proj(img).flatten(2).transpose(1, 2)
    b = x.shape[0]
    pos = t.pos_embed[:, 1:, :].expand(b, -1, -1)
    pos = pos.reshape(b // n, -1, pos.size(-1)) + t.temporal_embed.repeat_interleave(cfg.num_patches, 1)
    pos = pos.reshape(-1, cfg.num_patches, pos.size(-1))
    x = torch.cat((t.cls_token.expand(b, -1, -1), x), dim=1)
    x = x + torch.cat((t.pos_embed[:, 0, :][:, None, :].expand(b, -1, -1), pos), dim=1)
    image_masks = torch.ones(x.shape[:2], dtype=torch.long)
    text_embeds = text_embeds + self.token_type_embeddings(torch.zeros_like(text_masks))
    text_embeds = torch.repeat_interleave(text_embeds, n, dim=0)
    text_masks = torch.repeat_interleave(text_masks, n, dim=0)
    image_embeds = x + self.token_type_embeddings(torch.full_like(image_masks, 1))
    x = torch.cat([text_embeds, image_embeds], dim=1)
    co_masks = torch.cat([text_masks, image_masks], dim=1)
    lt = text_embeds.shape[1]
    for blk in t.blocks:
      x = torch.cat((x[:, :lt], self.roll(x[:, lt:])), dim=1)
      x = blk(x, co_masks)
    x = t.norm(x)
    x = x.view(x.size(0) // n, -1, x.size(-2), x.size(-1)).mean(dim=1)
    cls_feats = torch.tanh(self.pooler.dense(x[:, 0]))
    return x, self.vqa_classifier(cls_feats)


@pytest.fixture(scope="module")
def reference():
  torch.manual_seed(0)
  ref = RefAllInOne(CFG, K).eval()
  with torch.no_grad():  # non-trivial LayerNorms and biases, so their import is checked too
    for name, p in ref.named_parameters():
      if "norm" in name.lower() or name.endswith("bias") or "vqa_classifier.2" in name:
        p.add_(0.1 * torch.randn_like(p))
  rs = np.random.RandomState(1)
  frames = rs.randint(0, 256, (2, CFG.num_frames, CFG.image_size, CFG.image_size, 3)).astype(np.uint8)
  ids = np.array([[2, 11, 12, 13, 3, 0, 0, 0], [2, 21, 22, 3, 0, 0, 0, 0]], np.int64)
  labels = np.array([3, 5])
  return ref, frames, ids, labels


def _model():
  return backbone_lib.Model(backbone="allinone", head="cvqa", vit=CFG, num_classes=K)


def _init_params(model):
  frames = jnp.zeros((1, CFG.num_frames, CFG.image_size, CFG.image_size, 3), jnp.uint8)
  batch = {"frames": frames, "text_ids": jnp.zeros((1, 8), jnp.int32), "text_mask": jnp.ones((1, 8), jnp.int32)}
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch, {"answer_mask": jnp.ones((K,), bool)})
  return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), hf_utils.params_of(shapes))


def _load(ref, tmp_path, fmt):
  """The reference's state dict written in the authors' layout (.ckpt: Lightning's {"state_dict", ...}), read back by
  name into our parameters."""
  sd = {k: v.detach().clone() for k, v in ref.state_dict().items()}
  sd["text_embeddings.position_ids"] = torch.arange(CFG.max_text_len)[None]  # their BertEmbeddings buffer
  sd["mlm_score.bias"] = torch.zeros(CFG.vocab_size)  # a pretraining head the VideoQA model does not read
  if fmt == "ckpt":
    path = os.path.join(tmp_path, "all-in-one-tiny.ckpt")
    torch.save({"state_dict": sd, "epoch": 3, "global_step": 10, "pytorch-lightning_version": "1.5.0"}, path)
  else:
    from safetensors.numpy import save_file
    path = os.path.join(tmp_path, "all-in-one-tiny.safetensors")
    save_file({k: v.numpy() for k, v in sd.items()}, path)
  model = _model()
  params, report = backbone_lib.load_checkpoint(model, path, _init_params(model))
  return model, params, report


@pytest.fixture(scope="module")
def loaded(reference, tmp_path_factory):
  """(model, params, report) of each format, loaded once."""
  d = str(tmp_path_factory.mktemp("allinone_ckpt"))
  return {fmt: _load(reference[0], d, fmt) for fmt in ("ckpt", "safetensors")}


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_loader_round_trip(reference, loaded, fmt):
  """Every parameter comes from the checkpoint (their names and shapes), none of theirs is left but the ignored
  buffer and pretraining head; the fused qkv splits into our q/k/v exactly."""
  ref = reference[0]
  _, params, report = loaded[fmt]
  assert not report.missing and not report.unused
  flat = hf_utils.flatten_params(params)
  qkv = ref.transformer.blocks[1].attn.qkv.weight.detach().numpy()
  np.testing.assert_array_equal(flat["allinone/blocks_1/attn/k_proj/kernel"].reshape(32, 32), qkv[32:64].T)
  np.testing.assert_array_equal(flat["vqa_classifier/fc2/bias"], ref.vqa_classifier[4].bias.detach().numpy())


def test_bad_checkpoint_is_named(tmp_path):
  """Another model's weights, and a .ckpt holding pickled objects (Lightning's hyper_parameters as a Namespace),
  are refused naming the file; the pickle is read only with trust_pickles."""
  import argparse
  path = str(tmp_path / "other.safetensors")
  from safetensors.numpy import save_file
  save_file({"encoder.weight": np.zeros((2, 2), np.float32)}, path)
  with pytest.raises(ValueError, match="other.safetensors: not an All-in-one checkpoint"):
    lib.read_checkpoint(path)
  ckpt = str(tmp_path / "hparams.ckpt")
  torch.save({"state_dict": {"transformer.patch_embed.proj.weight": torch.zeros(2),
                             "text_embeddings.word_embeddings.weight": torch.ones(2)},
              "hyper_parameters": argparse.Namespace(lr=1e-4)}, ckpt)
  with pytest.raises(io_lib.UnsafeInputError, match="hparams.ckpt: the PyTorch checkpoint holds pickled Python"):
    lib.read_checkpoint(ckpt)
  assert sorted(lib.read_checkpoint(ckpt, trust_pickles=True)) == [
      "text_embeddings.word_embeddings.weight", "transformer.patch_embed.proj.weight"]


def test_model_forward_loss_and_gradients_match_reference(reference, loaded):
  """Logits, cross-entropy and the gradient of every parameter (mapped through the same by-name rules) against the
  PyTorch reference in float32: logits and loss to 1e-6 (measured 1.2e-7 and 0; one fc2 kernel x1.001 moves the
  logits 6.5e-5), each gradient to 5e-6 * its max|grad| + 1e-9 (measured <= 7.8e-7 relative)."""
  ref, frames, ids, labels = reference
  model, params, _ = loaded["ckpt"]
  mask = (ids > 0).astype(np.int32)
  batch = {"frames": jnp.asarray(frames), "text_ids": jnp.asarray(ids, jnp.int32), "text_mask": jnp.asarray(mask)}
  vocab = {"answer_mask": jnp.ones((K,), bool)}

  def loss_fn(p):
    logits = model.apply({"params": p}, batch, vocab)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(labels)[:, None], 1).mean()
    return ce, logits

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  ref.zero_grad()
  _, ref_logits = ref(torch.from_numpy(frames), torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64)))
  ref_loss = F.cross_entropy(ref_logits, torch.from_numpy(labels))
  ref_loss.backward()
  np.testing.assert_allclose(np.asarray(logits), ref_logits.detach().numpy(), atol=1e-6, rtol=0)
  np.testing.assert_allclose(float(loss), float(ref_loss.detach()), atol=1e-6, rtol=0)
  ref_grads = {k: p.grad.numpy() for k, p in ref.named_parameters()}
  flat = hf_utils.flatten_params(jax.tree.map(np.asarray, grads))
  theirs, _ = hf_utils.assemble(flat, ref_grads, backbone_lib.checkpoint_rules(model), source="reference grads")
  assert set(theirs) == set(flat)
  for k in flat:
    scale = np.abs(theirs[k]).max()
    np.testing.assert_allclose(flat[k], theirs[k], atol=5e-6 * scale + 1e-9, rtol=0, err_msg=k)


def test_vision_tower_matches_transformers_vit():
  """Patch embedding + ViT blocks + final norm + pooler (on the image's class token) against transformers'
  ViTModel (gelu, LayerNorm eps 1e-6, qkv bias) with the same random weights, one frame (rolling is the identity
  over T = 1), to 2e-6 (measured 1.3e-6 on values up to 3.7, about 5 float32 ulps)."""
  cfg = lib.AllInOneConfig(**{**CFG.__dict__, "num_frames": 1, "dtype": "float32", "param_dtype": "float32"})
  torch.manual_seed(1)
  vit_cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                   image_size=32, patch_size=8, hidden_act="gelu", layer_norm_eps=1e-6,
                                   qkv_bias=True)
  hf = transformers.ViTModel(vit_cfg, add_pooling_layer=True).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      p.add_(0.1 * torch.randn_like(p))
  s = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  ours = {"transformer.patch_embed.proj.weight": s["embeddings.patch_embeddings.projection.weight"],
          "transformer.patch_embed.proj.bias": s["embeddings.patch_embeddings.projection.bias"],
          "transformer.cls_token": s["embeddings.cls_token"], "transformer.pos_embed": s["embeddings.position_embeddings"],
          "transformer.temporal_embed": np.zeros((1, 1, 32), np.float32),
          "transformer.norm.weight": s["layernorm.weight"], "transformer.norm.bias": s["layernorm.bias"],
          "pooler.dense.weight": s["pooler.dense.weight"], "pooler.dense.bias": s["pooler.dense.bias"]}
  names = {  # transformers >= 5 names, then the 4.x ones
      f"layers.{{}}.": dict(q="attention.q_proj", k="attention.k_proj", v="attention.v_proj", o="attention.o_proj",
                           ln1="layernorm_before", ln2="layernorm_after", fc1="mlp.fc1", fc2="mlp.fc2"),
      f"encoder.layer.{{}}.": dict(q="attention.attention.query", k="attention.attention.key",
                                  v="attention.attention.value", o="attention.output.dense", ln1="layernorm_before",
                                  ln2="layernorm_after", fc1="intermediate.dense", fc2="output.dense")}
  hf_key = lambda i, kind, part: next(k for k in (p.format(i) + n[kind] + "." + part for p, n in names.items())
                                      if k in s)
  for i in range(2):
    t = f"transformer.blocks.{i}."
    for part in ("weight", "bias"):
      ours[t + "attn.qkv." + part] = np.concatenate([s[hf_key(i, n, part)] for n in "qkv"])
      for theirs, kind in (("attn.proj", "o"), ("norm1", "ln1"), ("norm2", "ln2"), ("mlp.fc1", "fc1"),
                           ("mlp.fc2", "fc2")):
        ours[f"{t}{theirs}.{part}"] = s[hf_key(i, kind, part)]
  model = lib.AllInOne(cfg)
  frames = np.random.RandomState(2).randint(0, 256, (2, 1, 32, 32, 3)).astype(np.uint8)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.asarray(frames), jnp.zeros((2, 4), jnp.int32),
                          jnp.ones((2, 4), jnp.int32))
  init = {k: np.zeros(v.shape, v.dtype) for k, v in hf_utils.flatten_params(hf_utils.params_of(shapes)).items()}
  rules = {k: v for k, v in lib.checkpoint_rules(cfg).items() if "text_embeddings" not in k}
  flat, report = hf_utils.assemble(init, ours, rules, source="hf vit", init=init)
  assert sorted(report.missing) == ["text_embeddings/LayerNorm/bias", "text_embeddings/LayerNorm/scale",
                                    "text_embeddings/position_embeddings/embedding",
                                    "text_embeddings/token_type_embeddings/embedding",
                                    "text_embeddings/word_embeddings/embedding", "token_type_embeddings/embedding"]

  def tower(mdl, fr):
    x = mdl.visual_embed(fr)
    for blk in mdl.blocks:
      x = blk(x, jnp.zeros((1, 1, 1, x.shape[1])), True)
    x = mdl.norm(x)
    return x, jnp.tanh(mdl.pooler(x[:, 0]))

  hidden, pooled = jax.jit(lambda p, fr: model.apply({"params": p}, fr, method=tower))(
      hf_utils.unflatten_params(flat), jnp.asarray(frames))
  pixels = (frames[:, 0].astype(np.float32) / 255.0 - np.asarray(lib.IMAGENET_MEAN, np.float32)) / np.asarray(
      lib.IMAGENET_STD, np.float32)
  with torch.no_grad():
    out = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2).copy()))
  np.testing.assert_allclose(np.asarray(hidden), out.last_hidden_state.numpy(), atol=2e-6, rtol=0)
  np.testing.assert_allclose(np.asarray(pooled), out.pooler_output.numpy(), atol=2e-6, rtol=0)


# ------------------------------------------------------------------------------------------ the OVQA backbone


@pytest.mark.parametrize("head", ["open", "cvqa"])
def test_backbone_heads_and_frozen_answer_encoder(head):
  """`:allinone,tiny`: head "open" scores the classifier's output against the frozen answer encoder (MiniLM's word
  embeddings, mean over sub-words) and gives the same logits from the per-split precomputed encodings as from the
  tokens; the encoder is out of the trained parameters. Head "cvqa": k logits, the padded slots at the minimum."""
  from configs import ovqa_msrvtt
  from evqa_jax.projects.ovqa import backbones
  config = ovqa_msrvtt.get_config("allinone,tiny" + (",cvqa" if head == "cvqa" else ",baseline"))
  bb = backbones.build(config)
  answers = ["dog", "ice cream", "red"]
  model = bb.build_model(StubInput(config, answers))
  ids, mask = bb.answer_tokens(None, answers, 8)
  aux = {"answer_tokens": jnp.asarray(ids), "answer_token_mask": jnp.asarray(mask),
         "answer_mask": jnp.asarray(np.arange(8) < 3), "is_base": jnp.zeros((8,), bool)}
  rs = np.random.RandomState(0)
  batch = {"frames": jnp.asarray(rs.randint(0, 256, (2, 3, 32, 32, 3)), jnp.uint8),
           "text_ids": jnp.asarray(rs.randint(1000, 2000, (2, 40)), jnp.int32), "text_mask": jnp.ones((2, 40), jnp.int32)}
  shapes = hf_utils.params_of(jax.eval_shape(model.init, jax.random.PRNGKey(0), bb.dummy_batch(), aux))
  params = bb.load_pretrained(jax.tree.map(lambda x: rs.normal(0, 0.1, x.shape).astype(x.dtype), shapes))

  @jax.jit
  def both(p, aux):  # logits from the tokens and from the per-split precomputed encodings, one compile
    cached = bb.precompute_aux({"answer_encoder": p["answer_encoder"]}, aux) if head == "open" else aux
    return model.apply({"params": p}, batch, aux), model.apply({"params": p}, batch, cached), cached

  logits, from_cache, cached = both(params, aux)
  logits = np.asarray(logits)
  assert logits.shape == (2, 8) and np.all(logits[:, 3:] == np.finfo(np.float32).min)
  assert np.ptp(logits[:, :3]) > 0.01
  if head == "cvqa":
    assert not bb.precomputes_aux and "answer_encoder" not in params
    return
  import re
  flat = hf_utils.flatten_params(params)
  trained = [k for k in flat if any(re.search(p, k) for p in bb.trainable_patterns)]
  assert sorted(set(flat) - set(trained)) == ["answer_encoder/word_embeddings"]
  table = np.asarray(flat["answer_encoder/word_embeddings"])
  tok = bb.answer_spec.tokenizer
  cream = tok("ice cream", add_special_tokens=False)["input_ids"]
  assert "answer_tokens" not in cached
  np.testing.assert_allclose(np.asarray(cached["answer_encodings"])[1], table[cream].mean(0), atol=1e-7, rtol=0)
  np.testing.assert_array_equal(np.asarray(from_cache), logits)


def test_clip_answer_encoder_matches_hugging_face(tmp_path):
  """`config.model.answer_encoder = "clip"` from a local folder (a tiny CLIPTextModelWithProjection; MiniLM's
  tokenizer standing in for CLIP's, [SEP] as the end-of-text id): each answer's projected end-of-text feature, as
  Hugging Face computes it, to 1e-5; padding rows empty."""
  from evqa_jax.projects.ovqa.backbones import answer_encoders
  torch.manual_seed(0)
  cfg = transformers.CLIPTextConfig(vocab_size=30522, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, max_position_embeddings=12, projection_dim=8,
                                    eos_token_id=102)
  hf = transformers.CLIPTextModelWithProjection(cfg).eval()
  hf.save_pretrained(str(tmp_path))
  config = ml_collections.ConfigDict(dict(
      model=dict(answer_encoder="clip"), data=dict(answer_max_subwords=5),
      pretrained=dict(answer_dir=str(tmp_path), answer_tokenizer="pkg:minilm", answer_shape=None)))
  spec = answer_encoders.build(config)
  assert (spec.kind, spec.dim, spec.token_len) == ("clip", 8, 7)
  ids, mask = spec.tokens(["dog", "ice cream"], 4)
  assert ids[0, 0] == 101 and list(ids[0, 1:3]) == [spec.tokenizer("dog", add_special_tokens=False)["input_ids"][0], 102]
  assert not mask[2:].any()
  module = spec.module()
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.asarray(ids), jnp.asarray(mask))
  params = spec.load(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), hf_utils.params_of(shapes)))
  out = np.asarray(jax.jit(module.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  with torch.no_grad():
    ref = hf(input_ids=torch.from_numpy(ids[:2].astype(np.int64)),
             attention_mask=torch.from_numpy(mask[:2].astype(np.int64))).text_embeds.numpy()
  np.testing.assert_allclose(out[:2], ref, atol=1e-5, rtol=0)
