"""VIOLIN on LXMERT (Table 3, row 18): LXMERT's encoder over the statement + subtitles and the frames, a head on its
pooled output.

The VIOLIN paper tests "a large-scale pre-trained model LXMERT that jointly learns multimodal features" but does not
say how a video enters a single-image model. The natural reading, taken here:
  language side  "[CLS] statement [SEP] subtitles [SEP]" (token types 0 / 1), packed as the cross-modal model packs it
                 (crossmodal.pack_statement_subtitles); LXMERT's language encoder reads it as it reads a VQA question;
  objects        one "object" per frame: the frame's feature (the detection features' per-frame 2048-d pooled regions
                 are what LXMERT's visn_fc was trained on), its position a box (x1, y1, x2, y2) in [0, 1]:
                 `frame_box="temporal"` (default): frame i of n valid frames spans x in [i/n, (i+1)/n], y in [0, 1]
                 (the time line laid along x, so the box encodes the frame's place in the clip);
                 `frame_box="whole"`: (0, 0, 1, 1) for every frame (no order; the frames are an unordered set).
                 Padded frame slots are masked objects.
  head           LXMERT's own fine-tuning head (`logit_fc` of its VQA / GQA / NLVR2 models): Dense(2H) -> GeLU ->
                 LayerNorm(1e-12) -> Dense(1), on the pooled output (pooler dense + tanh of the [CLS] state); one
                 logit per statement, trained with VIOLIN's paired loss. Dropout (`dropout`) before the head.
Ablations: use_subtitles=False gives "[CLS] statement [SEP]"; use_video=False feeds one all-zero object with a zero
box (a constant: no information about the clip); single_frame=True keeps the middle valid frame only (one object,
box per `frame_box` with n = 1).

Parameter tree: `text_encoder/` (the LXMERT encoder; the VIOLIN task's `load_pretrained` fills it from the local
Hugging Face LXMERT folder, `config.pretrained.dir`), `logit_fc/{dense_0,layer_norm,dense_1}`. Everything trains, as
in LXMERT's fine-tuning.
"""

import flax.linen as nn
import jax.numpy as jnp

from evqa_jax.models import encoders
from evqa_jax.models import layers
from evqa_jax.models import lxmert
from evqa_jax.projects.violin.baseline import middle_frame_index
from evqa_jax.projects.violin.crossmodal import ViolinCrossModal

FRAME_BOXES = ("temporal", "whole")


def frame_boxes(mask, kind: str):
  """`[b, T]` frame mask (valid frames first) -> `[b, T, 4]` boxes (x1, y1, x2, y2); zeros at padded slots."""
  if kind not in FRAME_BOXES:
    raise ValueError(f"frame_box = {kind!r}: expected one of {FRAME_BOXES}")
  mask = mask.astype(jnp.float32)
  if kind == "whole":
    box = jnp.ones(mask.shape + (4,), jnp.float32) * jnp.asarray([0.0, 0.0, 1.0, 1.0])
  else:
    n = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
    i = jnp.arange(mask.shape[1], dtype=jnp.float32)[None, :]
    box = jnp.stack([i / n, jnp.zeros_like(i / n), (i + 1) / n, jnp.ones_like(i / n)], axis=-1)
  return box * mask[..., None]


class LxmertHead(nn.Module):
  """`[b, H]` -> `[b]` float32 logits: Dense(2H) -> GeLU -> LayerNorm -> Dense(1) (LXMERT's `logit_fc`)."""
  config: lxmert.LxmertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    h = layers.encoder_dense(cfg, 2 * cfg.hidden_size, ("embed", "mlp"), "dense_0")(x)
    h = layers.encoder_layer_norm(cfg, "layer_norm")(layers.ACTIVATIONS["gelu"](h))
    return layers.encoder_dense(cfg, 1, ("mlp", None), "dense_1")(h)[:, 0].astype(jnp.float32)


class ViolinLxmert(ViolinCrossModal):
  """LXMERT + head for VIOLIN (see the module docstring). Fields as ViolinCrossModal's (encoder "lxmert",
  `encoder_config` an LxmertConfig whose visual_feat_dim is the frames' width), plus `frame_box`; `dropout` is on the
  pooled output before the head. Batch and outputs as ViolinCrossModal's."""
  encoder: str = "lxmert"
  frame_box: str = "temporal"
  dropout: float = 0.0

  def _objects(self, batch, rows: int, repeat: int):
    """-> (features [rows, N, D], boxes [rows, N, 4], mask [rows, N])."""
    cfg = self.lm_config
    b = rows // repeat
    if not self.use_video:
      return (jnp.zeros((rows, 1, cfg.visual_feat_dim), jnp.float32), jnp.zeros((rows, 1, cfg.visual_pos_dim)),
              jnp.ones((rows, 1), jnp.int32))
    video = self._get(batch, "video", 3, (b,))
    video_mask = self._get(batch, "video_mask", 2, video.shape[:2])
    if video.shape[-1] != cfg.visual_feat_dim:
      raise ValueError(f"ViolinLxmert: batch field 'video' has {video.shape[-1]}-d frames but the LXMERT config's "
                       f"visual_feat_dim is {cfg.visual_feat_dim}")
    lengths = jnp.sum(video_mask.astype(jnp.int32), axis=1)
    if self.single_frame:
      video = jnp.take_along_axis(video, middle_frame_index(lengths, self.middle_frame)[:, None, None], axis=1)
      lengths = jnp.minimum(lengths, 1)
    mask = (jnp.arange(video.shape[1])[None, :] < lengths[:, None]).astype(jnp.int32)
    video = jnp.where(mask[..., None] > 0, video, 0).astype(jnp.float32)  # keeps NaN/inf padding out of the sums
    boxes = frame_boxes(mask, self.frame_box)
    if repeat > 1:
      video, boxes, mask = (jnp.repeat(x, repeat, axis=0) for x in (video, boxes, mask))
    return video, boxes, mask

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    ids, mask, types, b, per_clip, paired = self._text(batch)
    cfg = self.lm_config
    feats, boxes, objects_mask = self._objects(batch, b * per_clip, per_clip)
    out = encoders.ENCODERS[self.encoder](cfg, name="text_encoder")(
        ids, mask, token_type_ids=types, visual=feats, visual_pos=boxes, visual_mask=objects_mask,
        deterministic=deterministic)
    pooled = nn.Dropout(self.dropout)(out["pooled"], deterministic=deterministic)
    logits = LxmertHead(cfg, name="logit_fc")(pooled)
    return logits.reshape((b, per_clip) if paired else (b,))
