"""VIOLIN with a cross-modal encoder: one BERT-family LM over [video tokens; [CLS] statement [SEP] subtitles [SEP]].

The "modern alternative" to the authors' baseline (baseline.py): instead of frozen text features fused by
LSTMs, a single bidirectional LM (`BertLM` / `DebertaV2LM` through `evqa_jax.models.encoders`, with the FrozenBiLM
visual prefix and, when the encoder config says so, adapters) reads the frames and both texts jointly, and a
classification head on the statement's [CLS] state gives the entailment logit.

Sequence (what the LM sees), visual tokens first as in the encoders' contract:
  visual:  T frame features -> [visual_in: Linear(feature_dim, visual_dim) when they differ] -> the LM's visual_proj
  text:    [CLS] statement [SEP] subtitles [SEP], packed without inner padding, token type 0 for "[CLS] statement
           [SEP]" and 1 for "subtitles [SEP]" (what a Hugging Face tokenizer gives for the pair (statement,
           subtitles)); built here from the separately tokenised statement ("[CLS] s [SEP]" + padding) and
           subtitles ("[CLS] sub [SEP]" + padding, whose leading [CLS] is dropped).
  logit:   h = hidden at the text's [CLS] (index T of the full sequence) -> cls_head: Dense(H) -> tanh -> Dropout ->
           Dense(1)  (BERT's pooler + classifier shape).

Ablations: use_subtitles=False gives "[CLS] statement [SEP]" only. use_video=False masks every visual slot (the
slots keep their positions, so the text positions are the same in every variant; masked keys change nothing).
single_frame=True keeps the middle valid frame (index (len-1)//2, or len//2 with middle_frame="authors") in slot 0
and masks the other slots.

Parameter tree: `text_encoder/...` (the LM, named so that the VIOLIN task's `load_pretrained` fills it with the
pretrained checkpoint), `visual_in/` (only when feature_dim != visual_dim), `cls_head/{dense,out}`. The parameters
to train are those matching `TRAINABLE_PATTERNS` (visual projections, adapters, LayerNorms, the head); the rest of
the LM stays frozen.
"""

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
from evqa_jax.models import encoders
from evqa_jax.projects.violin.baseline import middle_frame_index

# Regexes (re.search on the 'a/b/c' parameter path) of the parameters that train; everything else is frozen.
TRAINABLE_PATTERNS = ("visual_proj", "visual_in", "adapter", "LayerNorm", "cls_head")


def pack_statement_subtitles(statement_ids, statement_mask, subtitle_ids=None, subtitle_mask=None):
  """Joins "[CLS] s [SEP]" and "[CLS] sub [SEP]" (each right-padded) into "[CLS] s [SEP] sub [SEP]".

  statement_ids/mask `[batch, Ls]`, subtitle_ids/mask `[batch, Lu]` ->
  (ids, mask, token_type_ids), each `[batch, Ls + Lu - 1]`, right-padded with id 0 / mask 0 / type 0.
  Without subtitles the statement alone is returned (types all 0).
  """
  statement_mask = statement_mask.astype(jnp.int32)
  if subtitle_ids is None:
    return statement_ids * statement_mask, statement_mask, jnp.zeros_like(statement_ids)
  subtitle_mask = subtitle_mask.astype(jnp.int32)
  batch, ls = statement_ids.shape
  lu = subtitle_ids.shape[1]
  s_len = jnp.sum(statement_mask, axis=1)
  u_len = jnp.maximum(jnp.sum(subtitle_mask, axis=1) - 1, 0)   # subtitle tokens after its [CLS]
  pos = jnp.arange(ls + lu - 1)[None, :]
  in_statement = pos < s_len[:, None]
  sub_pos = pos - s_len[:, None] + 1                            # index into subtitle_ids
  in_subtitle = ~in_statement & (sub_pos >= 1) & (sub_pos <= u_len[:, None])
  s_tok = jnp.take_along_axis(statement_ids, jnp.clip(pos, 0, ls - 1).repeat(batch, 0), axis=1)
  u_tok = jnp.take_along_axis(subtitle_ids, jnp.clip(sub_pos, 0, lu - 1), axis=1)
  ids = jnp.where(in_statement, s_tok, jnp.where(in_subtitle, u_tok, 0)).astype(statement_ids.dtype)
  mask = (in_statement | in_subtitle).astype(jnp.int32)
  types = in_subtitle.astype(jnp.int32)
  return ids, mask, types


class ClassificationHead(nn.Module):
  """`[batch, H]` -> `[batch]` float32 logits: Dense(H) -> tanh -> Dropout -> Dense(1) (BERT pooler + classifier)."""
  hidden_size: int
  dropout: float = 0.1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    init = nn.initializers.normal(0.02)
    h = nn.Dense(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name="dense",
                 kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
    h = nn.Dropout(self.dropout)(jnp.tanh(h), deterministic=deterministic)
    out = nn.Dense(1, dtype=self.dtype, param_dtype=self.param_dtype, name="out",
                   kernel_init=nn.with_logical_partitioning(init, ("mlp", None)),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))(h)
    return out[:, 0].astype(jnp.float32)


class ViolinCrossModal(nn.Module):
  """Cross-modal LM + [CLS] classification head for VIOLIN.

  Attributes:
    encoder: name in `evqa_jax.models.encoders` ("bert", "deberta_v2").
    encoder_config: that encoder's config; `num_visual_tokens` must be >= the number of frames given when
      use_video, `visual_dim` is the LM's visual projection input (frames of another width go through visual_in).
    use_video / use_subtitles / single_frame / middle_frame: the input ablations (see the module docstring).
    dropout: before the head's output layer.
    use_adapters, dtype: the LM's adapters and compute dtype name; None keeps `encoder_config`'s (see `lm_config`).

  Call with a batch dict: statement_ids / statement_mask `[b, Ls]` (one statement each) or `[b, 2, Ls]` (the pair:
  positive, negative, sharing the clip's context), subtitle_ids / subtitle_mask `[b, Lu]`, video `[b, T, D]`,
  video_mask `[b, T]` -> pre-sigmoid logits `[b]` or `[b, 2]`.
  """
  encoder: str = "bert"
  encoder_config: Any = None
  use_video: bool = True
  use_subtitles: bool = True
  single_frame: bool = False
  dropout: float = 0.1
  middle_frame: str = "lower"
  use_adapters: Optional[bool] = None
  dtype: Optional[str] = None

  @property
  def lm_config(self):
    """`encoder_config` with this model's adapter and dtype settings (those that are set)."""
    overrides = {}
    if self.use_adapters is not None:
      overrides["use_adapters"] = self.use_adapters
    if self.dtype is not None:
      overrides["dtype"] = encoders.dtype(self.dtype)
    return dataclasses.replace(self.encoder_config, **overrides) if overrides else self.encoder_config

  def _get(self, batch, name, ndim, leading):
    if name not in batch or batch[name] is None:
      raise ValueError(f"{type(self).__name__}: batch field {name!r} is required (use_video={self.use_video}, "
                       f"use_subtitles={self.use_subtitles}) but missing")
    x = batch[name]
    if x.ndim != ndim or tuple(x.shape[:len(leading)]) != tuple(leading):
      raise ValueError(f"{type(self).__name__}: batch field {name!r} has shape {tuple(x.shape)}, expected {ndim} dims "
                       f"starting with {tuple(leading)}")
    return x

  def _visual(self, batch, rows: int, repeat: int):
    """-> (visual [rows, T, visual_dim], visual_mask [rows, T]) or (None, None) for a text-only LM."""
    cfg = self.lm_config
    t = cfg.num_visual_tokens
    if t == 0:
      if self.use_video:
        raise ValueError("ViolinCrossModal: use_video=True but encoder_config.num_visual_tokens is 0")
      return None, None
    b = rows // repeat
    if not self.use_video:
      return jnp.zeros((rows, t, cfg.visual_dim), cfg.dtype), jnp.zeros((rows, t), jnp.int32)
    video = self._get(batch, "video", 3, (b,))
    video_mask = self._get(batch, "video_mask", 2, video.shape[:2])
    frames = video.shape[1]
    if frames > t:
      raise ValueError(f"ViolinCrossModal: batch field 'video' has {frames} frames but "
                       f"encoder_config.num_visual_tokens is {t}")
    lengths = jnp.sum(video_mask.astype(jnp.int32), axis=1)
    if self.single_frame:
      idx = middle_frame_index(lengths, self.middle_frame)
      video = jnp.take_along_axis(video, idx[:, None, None], axis=1)
      lengths = jnp.minimum(lengths, 1)
      frames = 1
    mask = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.int32)
    video = jnp.pad(video, ((0, 0), (0, t - frames), (0, 0)))
    # Padded slots are masked keys in the LM; zeroing them also keeps NaN/inf padding out of the sums.
    video = jnp.where(mask[..., None] > 0, video, 0).astype(jnp.float32)
    if video.shape[-1] != cfg.visual_dim:
      video = nn.Dense(cfg.visual_dim, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="visual_in",
                       kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
                       bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(video)
    if repeat > 1:
      video, mask = jnp.repeat(video, repeat, axis=0), jnp.repeat(mask, repeat, axis=0)
    return video, mask

  def _text(self, batch):
    """-> (ids, mask, token_type_ids) `[b * per_clip, Ls + Lu - 1]` of "[CLS] statement [SEP] subtitles [SEP]",
    b, per_clip (2 for pairs, rows 2i / 2i+1 = positive / negative of clip i; 1 for single statements), paired."""
    if self.encoder_config is None:
      raise ValueError(f"{type(self).__name__}: encoder_config is required")
    if self.single_frame and not self.use_video:
      raise ValueError(f"{type(self).__name__}: single_frame=True needs use_video=True")
    statement_ids = batch.get("statement_ids")
    if statement_ids is None or statement_ids.ndim not in (2, 3):
      raise ValueError(f"{type(self).__name__}: batch field 'statement_ids' must be [b, Ls] or [b, 2, Ls], got "
                       f"{None if statement_ids is None else tuple(statement_ids.shape)}")
    paired = statement_ids.ndim == 3
    b = statement_ids.shape[0]
    per_clip = statement_ids.shape[1] if paired else 1
    statement_mask = self._get(batch, "statement_mask", statement_ids.ndim, statement_ids.shape)
    ls = statement_ids.shape[-1]
    # Pairs -> rows 2i (positive) and 2i+1 (negative) of clip i, so a clip's rows stay on the same shard.
    statement_ids = statement_ids.reshape(b * per_clip, ls)
    statement_mask = statement_mask.reshape(b * per_clip, ls)
    sub_ids = sub_mask = None
    if self.use_subtitles:
      sub_ids = self._get(batch, "subtitle_ids", 2, (b,))
      sub_mask = self._get(batch, "subtitle_mask", 2, sub_ids.shape)
      sub_ids, sub_mask = jnp.repeat(sub_ids, per_clip, axis=0), jnp.repeat(sub_mask, per_clip, axis=0)
    ids, mask, types = pack_statement_subtitles(statement_ids, statement_mask, sub_ids, sub_mask)
    return ids, mask, types, b, per_clip, paired

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    ids, mask, types, b, per_clip, paired = self._text(batch)
    cfg = self.lm_config
    visual, visual_mask = self._visual(batch, b * per_clip, per_clip)

    lm = encoders.ENCODERS[self.encoder](cfg, name="text_encoder")
    kwargs = {} if visual is None else {"visual": visual, "visual_mask": visual_mask}
    hidden = lm(ids, mask, token_type_ids=types, deterministic=deterministic, **kwargs)["hidden"]
    t = 0 if visual is None else visual.shape[1]
    cls_state = hidden[:, t]

    head = ClassificationHead(cfg.hidden_size, self.dropout, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                              name="cls_head")
    logits = head(cls_state, deterministic)
    return logits.reshape((b, per_clip) if paired else (b,))
