"""VIOLET (Fu et al., "VIOLET: End-to-End Video-Language Transformers with Masked Visual-token Modeling",
arXiv:2111.12681) and its open-ended QA head, in Flax; VIOLET+ (the OVQA paper, arXiv:2308.09363) scores the same
feature against frozen answer embeddings.

The model of github.com/tsujuifu/pytorch_violet (model.py `EncImg`, `EncTxt`, `VIOLET_Base`; main_qaoe.py
`VIOLET_QAOE`), step for step:
- frames `[B, T, H, W, 3]` uint8 (the records' pixels, host->device as bytes) -> / 255 (torchvision's ToTensor) ->
  Normalize(ImageNet mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)) -> the Video Swin Transformer
  (models/video_swin.py) -> `[B, T, h*w, 768]` (h = H/32, w = W/32);
- `emb_cls` `[1, 1, 1, 768]` prepended to every frame's h*w tokens, plus `emb_pos[:, :, :1 + h*w]` (the authors' table
  holds 1 + 14^2 rows) and `emb_len[:, :T]` (6 rows: at most 6 frames), then LayerNorm (eps 1e-5) -> `[B, T(1+hw), 768]`;
- text: BERT's embeddings over the question ids (positions 0..L-1, token type 0, LayerNorm eps 1e-12, dropout), mask
  `ids != 0` (their str2txt);
- the cross-modal transformer: BERT-base's 12 encoder layers (models/bert.py's BertEncoder) over [video; text], keys
  masked by [ones; text mask];
- the QA head reads the output at the first text slot ([CLS], index T(1+hw)) and applies `fc`: Dropout(0.1) ->
  Linear(768, 1536) -> ReLU -> Linear(1536, k) over the top-k train answers (head "cvqa"; their CrossEntropyLoss).
- VIOLET+ (the OVQA backbone's head "open", evqa_jax/projects/ovqa/backbones/violet.py): the same MLP, its last
  Linear as wide as the frozen answer encoder's embeddings, gives the answer feature m; logits = m . a for each answer
  embedding a of the active vocabulary (Eq. 8 of the OVQA paper, no bias or temperature, as FrozenBiLM+ and JustAsk+
  score), optionally through the GNN soft verbalizer. The OVQA authors did not release their VIOLET+ code; this is
  the reading of their paper that keeps VIOLET's own head, as All-in-one+ keeps All-in-one's classifier.

Parameters (flat names; `checkpoint_rules` maps the authors' state dict onto them): `swin/...` (video_swin),
`emb_cls`, `emb_pos`, `emb_len`, `img_norm`, `embeddings/...` and `encoder/layer_{i}/...` (bert.py's names),
`fc_1`, `fc_3` (their `fc.1`, `fc.3`).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import bert
from evqa_jax.models import hf_utils
from evqa_jax.models import layers
from evqa_jax.models import video_swin

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def normalize_frames(frames, dtype=jnp.float32):
  """uint8 `[..., 3]` RGB -> ToTensor (/ 255) then ImageNet Normalize, as VIOLET's EncImg."""
  x = frames.astype(jnp.float32) / 255.0
  return ((x - jnp.asarray(MEAN, jnp.float32)) / jnp.asarray(STD, jnp.float32)).astype(dtype)


class Violet(nn.Module):
  """`Violet(swin_config, text_config, out_size)`: VIOLET_QAOE without its loss.

  __call__(batch, deterministic=True) -> `[b, out_size]`: fc over the text [CLS] row of the cross-modal transformer
  (out_size: k, the top-k answers, for VIOLET's classifier; the answer encoder's width for VIOLET+'s answer feature).
  batch: `frames` uint8 `[b, T, H, W, 3]`, `question_ids` `[b, L]` int (mask: ids != 0).
  """
  swin_config: video_swin.VideoSwinConfig
  text_config: bert.BertConfig
  out_size: int
  max_frames: int = 6  # emb_len rows
  max_patches: int = 14 ** 2  # emb_pos rows - 1
  head_dropout: float = 0.1

  def setup(self):
    cfg, sc = self.text_config, self.swin_config
    if sc.num_features != cfg.hidden_size:
      raise ValueError(f"VIOLET: the Video Swin's {sc.num_features} features must equal the cross-modal "
                       f"transformer's hidden size {cfg.hidden_size}")
    if self.out_size < 1:
      raise ValueError(f"VIOLET: the head's output size must be >= 1, got {self.out_size}")
    h, dt, pdt = cfg.hidden_size, cfg.dtype, cfg.param_dtype
    self.swin = video_swin.SwinTransformer3D(sc)
    self.emb_cls = self.param("emb_cls", layers.normal(0.02, (None, None, None, "embed")), (1, 1, 1, h), pdt)
    self.emb_pos = self.param("emb_pos", layers.normal(0.02, (None, None, None, "embed")),
                              (1, 1, 1 + self.max_patches, h), pdt)
    self.emb_len = self.param("emb_len", layers.normal(0.02, (None, None, None, "embed")), (1, self.max_frames, 1, h),
                              pdt)
    self.img_norm = layers.layer_norm("img_norm", dt, epsilon=1e-5, param_dtype=pdt)
    self.embeddings = bert.BertEmbeddings(cfg)
    self.encoder = bert.BertEncoder(cfg)
    self.fc_dropout = nn.Dropout(self.head_dropout)
    self.fc_1 = layers.encoder_dense(cfg, 2 * h, ("embed", "mlp"), "fc_1")
    self.fc_3 = layers.encoder_dense(cfg, self.out_size, ("mlp", None), "fc_3")

  def visual_tokens(self, frames, deterministic: bool = True):
    """uint8 frames `[b, T, H, W, 3]` -> `[b, T(1 + hw), hidden]` (EncImg)."""
    cfg = self.text_config
    b, t = frames.shape[:2]
    if t > self.max_frames:
      raise ValueError(f"VIOLET: {t} frames but emb_len holds {self.max_frames} (config.data.num_frames)")
    f = self.swin(normalize_frames(frames, cfg.dtype), deterministic)
    _, _, hh, ww, _ = f.shape
    if hh * ww > self.max_patches:
      raise ValueError(f"VIOLET: {hh}x{ww} patches per frame but emb_pos holds {self.max_patches} "
                       "(config.data.frame_size too large)")
    f = f.reshape(b, t, hh * ww, cfg.hidden_size)
    f = jnp.concatenate([jnp.broadcast_to(self.emb_cls.astype(f.dtype), (b, t, 1, cfg.hidden_size)), f], axis=2)
    f = f + self.emb_pos[:, :, :1 + hh * ww].astype(f.dtype) + self.emb_len[:, :t].astype(f.dtype)
    return self.img_norm(f).reshape(b, t * (1 + hh * ww), cfg.hidden_size)

  def feature(self, batch, deterministic: bool = True):
    """-> `[b, hidden]`: the cross-modal transformer's output at the text's [CLS] (go_feat + go_cross)."""
    return self.cross(self.visual_tokens(batch["frames"], deterministic), batch["question_ids"], deterministic)

  def cross(self, img, ids, deterministic: bool = True):
    """Visual tokens `[b, V, hidden]` and question ids `[b, L]` -> the cross-modal output at the text's [CLS]."""
    txt = self.embeddings(ids, jnp.zeros_like(ids), None, deterministic)
    x = jnp.concatenate([img, txt.astype(img.dtype)], axis=1)
    mask = jnp.concatenate([jnp.ones(img.shape[:2], jnp.int32), (ids != 0).astype(jnp.int32)], axis=1)
    mask_bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
    cls = jnp.full((ids.shape[0],), img.shape[1], jnp.int32)
    _, out = self.encoder(nn.with_logical_constraint(x, ("batch", "length", "embed")), mask_bias, deterministic,
                          mask_index=cls)
    return out

  def fc(self, x, deterministic: bool = True):
    """Their `fc`: Dropout(0.1) -> Linear(h, 2h) -> ReLU -> Linear(2h, out_size)."""
    return self.fc_3(nn.relu(self.fc_1(self.fc_dropout(x, deterministic=deterministic))))

  def __call__(self, batch, deterministic: bool = True):
    return self.fc(self.feature(batch, deterministic), deterministic)


# ------------------------------------------------------------------------------------------ weight import


def checkpoint_rules(model: Violet) -> dict:
  """Our flat param path -> rule over the authors' state dict (`VIOLET_QAOE.state_dict()`, or the pretraining
  checkpoint `VIOLET_Pretrain`'s: its fc / fc_mtm / fc_mvm heads are then unused)."""
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = dict(video_swin.load_rules(model.swin_config, ours="swin/", theirs="enc_img.swin."))
  for name in ("emb_cls", "emb_pos", "emb_len"):
    rules[name] = rule((f"enc_img.{name}",))
  rules["img_norm/scale"] = rule(("enc_img.norm.weight",))
  rules["img_norm/bias"] = rule(("enc_img.norm.bias",))
  for ours, r in bert.hf_rules(model.text_config).items():
    if ours.startswith("embeddings/"):
      rules[ours] = hf_utils.Rule(tuple(f"enc_txt.emb_txt.{k[len('embeddings.'):]}" for k in r.keys), r.fn)
    elif ours.startswith("encoder/"):
      rules[ours] = hf_utils.Rule(tuple(f"trsfr.{k[len('encoder.'):]}" for k in r.keys), r.fn)
  for ours, theirs in (("fc_1", "fc.1"), ("fc_3", "fc.3")):
    rules[f"{ours}/kernel"] = rule((f"{theirs}.weight",), lin)
    rules[f"{ours}/bias"] = rule((f"{theirs}.bias",))
  return rules


# The tensors the architecture implies: a checkpoint without them is not VIOLET's (or not this size).
REQUIRED = (r"^swin/", r"^emb_(cls|pos|len)$", r"^img_norm/", r"^embeddings/", r"^encoder/")
IGNORED = (r"(^|\.)position_ids$", video_swin.BUFFERS)


def load_checkpoint(model: Violet, path: str, params: dict, trust_pickles: bool = False):
  """The authors' checkpoint (a state dict: their .pt / .pth, a pickle, read only with `trust_pickles` or as plain
  tensors; or .safetensors) -> (params, LoadReport). `params`: the initialised tree; what the checkpoint lacks keeps
  its value (the QA head of the pretraining checkpoint; `fc_3` when its width is not this head's: another answer
  count, or VIOLET+'s answer_dim). Keys are matched by name after stripping DataParallel's "module." prefix."""
  ckpt = hf_utils.strip_prefix(hf_utils.read_checkpoint(path, trust_pickles=trust_pickles), "module.")
  video_swin.check_buffers(model.swin_config, ckpt, "enc_img.swin.", path)
  flat = hf_utils.flatten_params(hf_utils.params_of(params))
  rules = checkpoint_rules(model)
  for key in ("fc_3/kernel", "fc_3/bias"):  # a head of another width is left at init (their load_ckpt's shape test)
    theirs = ckpt.get(rules[key].keys[0])
    if theirs is not None and np.shape(rules[key].apply([theirs])) != np.shape(flat[key]):
      del rules[key]
  out, report = hf_utils.assemble(flat, ckpt, rules, source=path, init=flat, ignore=IGNORED, required=REQUIRED)
  return hf_utils.unflatten_params(out), report
