"""E-VQA model: answer + temporal evidence + spatial evidence from one forward pass.

  frames [b, T, H, W, 3] --frame encoder--> patch features [b, T, P, D]
      (FrameEncoder: small conv net trained from scratch, motion-aware through frame differences and a temporal
       shift; or ClipFrameEncoder: a CLIP ViT)
  pooled per-frame features concat(mean, max) [b, T, 2D] = the visual prefix tokens of the cross-modal encoder
  cross-modal encoder: BertLM (frozen MiniLM/BERT + adapters) over
      [T visual tokens] [CLS] question [SEP] option_1 [SEP] ... option_C [SEP]
      (question token type 0, options token type 1)
  -> h_vis [b, T, H] (visual positions), q [b, 2H] (QuestionPool: mean + multi-head attention pooling over the
     question tokens),
     option_hidden [b, C, H] (mean over each option's tokens)
  segmentation head  -> grid_logits [b, T, gh, gw] -> mask_logits [b, T, H, W] (bilinear upsampling); the patch
                        features are FiLM-conditioned on q, the evidence queries come from q and h_vis
  temporal head      -> frame_logits [b, T] from h_vis, q, the pooled frame features, the statistics of each
                        frame's question-conditioned mask logits (is the object asked about visible here?) and,
                        with frame_descriptors, what that mask shows per frame (silhouette, place, size, motion)
  (factorized_masks)    mask_logits <- logit(sigmoid(frame_logits) * sigmoid(mask_logits))
  answer head        -> answer_logits [b, C]

Option scoring: one pass holds all C options; each option is scored from its own tokens' pooled hidden state (which
has attended to the video tokens, the question and the other options), conditioned on an evidence readout vector:
the mask-weighted patch feature of the predicted evidence, the predicted object's motion and (shape_window > 0) its
silhouette (`evidence_heads.evidence_readout`). One pass instead of C passes costs 1/C of the compute; the readout ties the
answer to the evidence the model shows, which is the point of E-VQA.
"""

import dataclasses
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
from evqa_jax.models import encoders
from evqa_jax.models import evidence_heads
from evqa_jax.projects.evqa import frame_encoder as frame_encoder_lib


def masked_mean(hidden, mask):
  """hidden `[b, L, H]`, mask `[..., L]` (leading dims `[b, ...]`) -> `[b, ..., H]`."""
  mask = mask.astype(hidden.dtype)
  if mask.ndim == 2:
    return jnp.einsum("bl,blh->bh", mask, hidden) / jnp.maximum(jnp.sum(mask, -1, keepdims=True), 1.0)
  return jnp.einsum("bcl,blh->bch", mask, hidden) / jnp.maximum(jnp.sum(mask, -1, keepdims=True), 1.0)


class Model(nn.Module):
  """See the module docstring. Built as `Model(**config.model, encoder_config=..., clip_config=..., image_size=...)`:
  the fields down to `evidence_norm` are `config.model`; the rest come from the checkpoints and the records.

  Attributes:
    encoder: cross-modal encoder name in `evqa_jax.models.encoders` ("bert").
    num_layers: > 0: keep only the first N encoder layers.
    use_adapters, adapter_reduction: adapters in every encoder layer.
    dropout: encoder and adapter dropout (None: the checkpoint's).
    dtype: compute dtype name ("float32", "bfloat16").
    frame_encoder: "conv" or "clip".
    frame: kwargs of the conv `FrameEncoder` (frame_encoder="conv").
    temporal_dim, seg_dim, seg_heads, seg_mlp_dim, num_queries, answer_dim: head sizes.
    evidence_readout: condition the answer head on the evidence readout (else on zeros).
    shape_window, shape_radius: the readout's silhouette lattice (S x S samples over +-radius grid cells; 0 = none).
    frame_descriptors: give the temporal head what the mask shows in each frame (`evidence_heads.frame_descriptors`).
    factorized_masks: mask_logits = logit(p(frame is evidence) * p(pixel is the object)): the segmentation head only
      has to find the object on screen, the temporal head decides which frames are evidence
      (`evidence_heads.factorized_mask_logits`). grid_logits stay the segmentation head's own.
    question_heads: attention-pooling heads of the question summary q (`evidence_heads.QuestionPool`).
    evidence_norm: "joint" (one LayerNorm over the readout) or "grouped" (`evidence_heads.AnswerHead`).
    encoder_config: the encoder checkpoint's architecture with the visual prefix (num_visual_tokens = T,
      visual_dim = 2 * frame feature dim); `lm_config` adds this model's layer, adapter, dropout and dtype fields.
    clip_config: the `CLIPVisionConfig` (frame_encoder="clip").
    image_size: (H, W) of the frames; masks are produced at this size.
  """
  encoder: str = "bert"
  num_layers: int = 0
  use_adapters: bool = True
  adapter_reduction: int = 8
  dropout: Optional[float] = 0.1
  dtype: str = "float32"
  remat: str = "none"
  frame_encoder: str = "conv"
  frame: Optional[Any] = None
  temporal_dim: int = 128
  seg_dim: int = 64
  seg_heads: int = 4
  seg_mlp_dim: int = 128
  num_queries: int = 2
  answer_dim: int = 128
  evidence_readout: bool = True
  shape_window: int = 0
  shape_radius: float = 0.0
  frame_descriptors: bool = False
  factorized_masks: bool = False
  question_heads: int = 4
  evidence_norm: str = "joint"
  encoder_config: Any = None
  clip_config: Any = None
  image_size: Tuple[int, int] = (64, 64)

  @property
  def frame_config(self):
    """kwargs of `FrameEncoder` (conv) or the `CLIPVisionConfig` (clip)."""
    return dict(self.frame or {}) if self.frame_encoder == "conv" else self.clip_config

  @property
  def lm_config(self):
    """`encoder_config` with this model's layer count, adapter, dropout and dtype settings."""
    overrides = encoders.lm_overrides(self.use_adapters, self.adapter_reduction, self.dropout, self.dtype,
                                        self.remat)
    if self.num_layers:
      overrides["num_hidden_layers"] = self.num_layers
    return dataclasses.replace(self.encoder_config, **overrides)

  def setup(self):
    dtype = encoders.dtype(self.dtype)
    frame_config = self.frame_config
    if self.frame_encoder == "conv":
      self.vision = frame_encoder_lib.FrameEncoder(**frame_config, image_size=tuple(self.image_size),
                                                   dtype=dtype, name="frame_encoder")
    elif self.frame_encoder == "clip":
      from evqa_jax.models import clip_vision
      if frame_config.image_size != self.image_size[0] or self.image_size[0] != self.image_size[1]:
        raise ValueError(f"config.model.frame_encoder = 'clip' needs square frames of the CLIP image size "
                         f"{frame_config.image_size}, got {tuple(self.image_size)} (convert the records with "
                         f"--frame-size {frame_config.image_size} {frame_config.image_size})")
      self.vision = clip_vision.ClipFrameEncoder(frame_config, name="frame_encoder")
    else:
      raise ValueError(f"config.model.frame_encoder = {self.frame_encoder!r}: expected 'conv' or 'clip'")
    self.lm = encoders.ENCODERS[self.encoder](self.lm_config, name="lm")
    self.question_pool = evidence_heads.QuestionPool(self.question_heads, dtype=dtype, name="question_pool")
    self.temporal_head = evidence_heads.TemporalHead(self.temporal_dim, dtype=dtype, name="temporal_head")
    self.seg_head = evidence_heads.SegmentationHead(
        grid=self.vision.grid, out_size=tuple(self.image_size), dim=self.seg_dim, num_heads=self.seg_heads,
        mlp_dim=self.seg_mlp_dim, num_queries=self.num_queries, dtype=dtype, name="seg_head")
    self.answer_head = evidence_heads.AnswerHead(
        self.answer_dim, evidence_norm=self.evidence_norm,
        feature_dim=frame_feature_dim(self.frame_encoder, frame_config), dtype=dtype, name="answer_head")

  def __call__(self, batch, deterministic: bool = True):
    """batch: frames [b, T, H, W, 3] uint8, frame_mask [b, T], input_ids / attention_mask / token_type_ids /
    question_mask [b, L], option_mask [b, C, L], option_valid [b, C].

    Returns {"answer_logits": [b, C], "frame_logits": [b, T], "grid_logits": [b, T, gh, gw],
             "mask_logits": [b, T, H, W]} (float32).
    """
    frame_mask = batch["frame_mask"]
    if self.frame_encoder == "conv":
      feats = self.vision(batch["frames"], frame_mask)
    else:
      feats = self.vision(batch["frames"])
    pooled = frame_encoder_lib.pool_frames(feats, frame_mask)
    t = pooled.shape[1]
    out = self.lm(batch["input_ids"], batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                  visual=pooled, visual_mask=frame_mask, deterministic=deterministic)
    hidden = out["hidden"]
    h_vis = nn.with_logical_constraint(hidden[:, :t], ("batch", "frames", "embed"))
    h_txt = hidden[:, t:]
    q = self.question_pool(h_txt, batch["question_mask"])
    option_hidden = masked_mean(h_txt, batch["option_mask"])

    grid_logits, mask_logits = self.seg_head(feats, q, h_vis)
    geometry = evidence_heads.mask_geometry(grid_logits, self.vision.grid, self.shape_window, self.shape_radius)
    descriptors = None
    if self.frame_descriptors:
      descriptors = evidence_heads.frame_descriptors(geometry, frame_mask, self.vision.grid)
    frame_logits = self.temporal_head(h_vis, q, pooled, evidence_heads.mask_statistics(grid_logits), descriptors)
    if self.factorized_masks:
      mask_logits = evidence_heads.factorized_mask_logits(frame_logits, mask_logits)
    if self.evidence_readout:
      evidence = evidence_heads.evidence_readout(feats, geometry, frame_logits, frame_mask)
    else:
      evidence = jnp.zeros((feats.shape[0], evidence_heads.readout_dim(feats.shape[-1], self.shape_window)),
                           feats.dtype)
    answer_logits = self.answer_head(option_hidden, evidence, batch["option_valid"])
    return {"answer_logits": answer_logits, "frame_logits": frame_logits, "grid_logits": grid_logits,
            "mask_logits": mask_logits}


def frame_feature_dim(frame_encoder: str, frame_config: Optional[Any]) -> int:
  """D of the patch features (the visual prefix tokens have 2D)."""
  if frame_encoder == "conv":
    return int(frame_encoder_lib.FrameEncoder(**(frame_config or {})).dim)  # the config's, or the field's default
  return int(frame_config.hidden_size)
