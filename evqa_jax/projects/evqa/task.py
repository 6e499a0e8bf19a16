"""E-VQA: evidence-backed video QA (answer + temporal segments + masklets), ST-Evidence-Gen and -MCQ.

Input (records, question + options text, per-frame evidence labels): input.py. Model: model.py, built from
`config.model`. Loss = w_answer * CE(answer) + w_temporal * BCE(per-frame evidence) + w_mask_bce * BCE(masks, every
pixel of every real frame) + w_dice * (1 - soft dice of the whole masklet). Evaluation: evaluator.py (the official
prediction files of both benchmarks, scored by the official evaluators).

MCQ (ST-Evidence-MCQ), same trained model: temporal = the candidate segment set with the largest (mean evidence logit
of frames inside) - (mean of frames outside); spatial = the candidate mask with the largest soft IoU with the predicted
mask probabilities on the reference frame (the sampled frame nearest to it). Both are computed in `predict`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from evqa_jax import log
from evqa_jax import pretrained

from evqa_jax.models import encoders
from evqa_jax.projects import base
from evqa_jax.projects.evqa import evaluator
from evqa_jax.projects.evqa import input as input_lib
from evqa_jax.projects.evqa import model as model_lib


def clip_config(config):
  """The frozen CLIP vision tower's config: config.pretrained.clip_shape, else clip_dir's config.json."""
  from evqa_jax.models import clip_vision
  pc, dtype = config.pretrained, encoders.dtype(config.model.dtype)
  if pc.clip_shape:
    return clip_vision.CLIPVisionConfig.from_dict(dict(pc.clip_shape), dtype=dtype)
  path = pretrained.resolve(pc.clip_dir) if pc.clip_dir else ""
  if not path or not os.path.exists(os.path.join(path, "config.json")):
    raise FileNotFoundError(f"config.pretrained.clip_dir = {pc.clip_dir!r} has no config.json: point it at a local "
                            "Hugging Face CLIP checkpoint (e.g. openai/clip-vit-base-patch16)")
  return clip_vision.CLIPVisionConfig.from_hf_dir(path, dtype=dtype)


class Task(base.Task):
  main_metric = "accuracy"

  def __init__(self, config):
    super().__init__(config)
    mc = config.model
    self.input = input_lib.Input(config)
    self.modes = tuple(config.eval.modes)
    for m in self.modes:
      if m not in ("gen", "mcq"):
        raise ValueError(f"config.eval.modes = {self.modes}: each must be 'gen' or 'mcq'")
    if not self.modes:
      raise ValueError("config.eval.modes is empty: give 'gen', 'mcq' or both")
    self.main_metric = "accuracy" if "gen" in self.modes else "pooled"
    if mc.frame_encoder not in ("conv", "clip"):
      raise ValueError(f"config.model.frame_encoder = {mc.frame_encoder!r}: expected 'conv' or 'clip'")
    clip = clip_config(config) if mc.frame_encoder == "clip" else None
    visual_dim = 2 * model_lib.frame_feature_dim(mc.frame_encoder, dict(mc.frame) if clip is None else clip)
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    encoder_config = encoders.encoder_config(mc.encoder, config.pretrained, num_visual_tokens=self.input.num_frames,
                                               visual_dim=visual_dim)
    self.model = model_lib.Model(**mc.to_dict(), encoder_config=encoder_config, clip_config=clip,
                                 image_size=self.input.frame_size)
    self.encoder_config = self.model.lm_config

  # -- data (input.py) ------------------------------------------------------------------------------------------
  def source(self, split: str):
    return self.input.source(split)

  def preprocess(self, example: dict, train: bool) -> dict:
    return self.input.preprocess(example, train)

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    dc = self.config.data
    t, (h, w), c, l = self.input.num_frames, self.input.frame_size, dc.num_options, dc.max_tokens
    return {"frames": jnp.zeros((1, t, h, w, 3), jnp.uint8), "frame_mask": jnp.ones((1, t), jnp.int32),
            "input_ids": jnp.zeros((1, l), jnp.int32), "attention_mask": jnp.ones((1, l), jnp.int32),
            "token_type_ids": jnp.zeros((1, l), jnp.int32), "question_mask": jnp.ones((1, l), jnp.int32),
            "option_mask": jnp.ones((1, c, l), jnp.int32), "option_valid": jnp.ones((1, c), jnp.int32)}

  def init_params(self, rng):
    return self.model.init({"params": rng}, self._dummy_batch())["params"]

  def load_pretrained(self, params: dict) -> dict:
    mc, pc = self.config.model, self.config.pretrained
    params = dict(params)
    if not pc.shape:  # an explicit shape means random weights, even when a checkpoint directory is named
      params["lm"] = encoders.load_encoder_weights(mc.encoder, self.encoder_config, self.pretrained_dir,
                                                     params["lm"])
    if mc.frame_encoder == "clip" and pc.clip_dir:
      from evqa_jax.models import clip_vision
      fe = dict(params["frame_encoder"])
      clip, report = clip_vision.load_hf_params(self.model.clip_config, pretrained.resolve(pc.clip_dir), fe["clip"])
      log.info(f"Loaded CLIP vision weights from {pc.clip_dir}: {report.summary()}")
      fe["clip"] = clip
      params["frame_encoder"] = fe
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.trainable)

  def _apply(self, params, batch, rng, train: bool):
    rngs = {"dropout": rng} if train else {}
    return self.model.apply({"params": params}, batch, deterministic=not train, rngs=rngs)

  def loss(self, params, batch, aux, rng, train: bool = True):
    del aux
    lc = self.config.loss
    out = self._apply(params, batch, rng, train)
    b = batch["label"].shape[0]
    row = jnp.ones((b,), jnp.float32) if "_valid" not in batch else (batch["_valid"] > 0).astype(jnp.float32)
    n_rows = jnp.maximum(jnp.sum(row), 1.0)

    logits = out["answer_logits"]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    ce = jnp.sum(ce * row) / n_rows
    acc = jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * row) / n_rows

    fmask = (batch["frame_mask"] > 0).astype(jnp.float32) * row[:, None]
    n_frames = jnp.maximum(jnp.sum(fmask), 1.0)
    tl = batch["frame_labels"]
    tbce = jnp.sum(optax.sigmoid_binary_cross_entropy(out["frame_logits"], tl) * fmask) / n_frames
    tacc = jnp.sum(((out["frame_logits"] > 0) == (tl > 0.5)) * fmask) / n_frames

    mrow = fmask * (batch["has_masks"] > 0).astype(jnp.float32)[:, None]  # [b, T]
    gt = batch["masks"].astype(jnp.float32)
    ml = out["mask_logits"]
    mbce = jnp.sum(optax.sigmoid_binary_cross_entropy(ml, gt).mean(axis=(-2, -1)) * mrow) / jnp.maximum(
        jnp.sum(mrow), 1.0)
    prob = jax.nn.sigmoid(ml) * mrow[..., None, None]
    gt = gt * mrow[..., None, None]
    inter = jnp.sum(prob * gt, axis=(1, 2, 3))
    denom = jnp.sum(prob, axis=(1, 2, 3)) + jnp.sum(gt, axis=(1, 2, 3))
    dice_rows = row * (batch["has_masks"] > 0)
    dice = jnp.sum((1.0 - (2.0 * inter + 1.0) / (denom + 1.0)) * dice_rows) / jnp.maximum(jnp.sum(dice_rows), 1.0)

    total = lc.answer * ce + lc.temporal * tbce + lc.mask_bce * mbce + lc.dice * dice
    return total, {"answer_ce": ce, "answer_accuracy": acc, "temporal_bce": tbce, "temporal_frame_accuracy": tacc,
                   "mask_bce": mbce, "dice_loss": dice}

  def predict(self, params, batch, aux) -> dict:
    del aux
    out = self._apply(params, batch, None, train=False)
    ec = self.config.eval
    logit_th = float(np.log(ec.mask_threshold / (1.0 - ec.mask_threshold)))
    masks = out["mask_logits"] > logit_th
    b, t, h, w = masks.shape
    packed = jnp.packbits(masks.reshape(b, t, h * w), axis=-1)
    result = {"answer_logits": out["answer_logits"], "frame_logits": out["frame_logits"], "masks": packed,
              "frame_times": batch["frame_times"], "frame_mask": batch["frame_mask"]}
    if "mcq_segments" in batch:
      result["mcq_temporal_scores"] = mcq_temporal_scores(
          out["frame_logits"], batch["frame_times"], batch["frame_mask"], batch["fps"], batch["mcq_segments"],
          batch["mcq_segments_len"])
      result["mcq_spatial_scores"] = mcq_spatial_scores(out["mask_logits"], batch["mcq_ref"], batch["mcq_masks"])
    return result

  # -- evaluation (evaluator.py) --------------------------------------------------------------------------------
  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    return evaluator.evaluate(self.input, split, outputs, out_dir, self.config.eval)

  def console_metrics(self) -> tuple:
    gen = ("accuracy", "mIoU", "mIoP", "tIoU@0.5", "tIoP@0.5", "JF") if "gen" in self.modes else ()
    prefix = "mcq_" if "gen" in self.modes else ""  # evaluator.evaluate's keys when both modes are scored
    mcq = tuple(prefix + k for k in ("qa", "temporal", "spatial", "pooled")) if "mcq" in self.modes else ()
    return gen + mcq

  def describe(self) -> str:
    mc = self.config.model
    return (f"E-VQA ({mc.frame_encoder} frame encoder + {mc.encoder} cross-modal encoder, "
            f"eval {'+'.join(self.modes)})")


def mcq_temporal_scores(frame_logits, frame_times, frame_mask, fps, segments, segments_len):
  """Mean evidence logit inside each candidate segment set minus the mean outside.

  frame_logits/frame_times/frame_mask `[b, T]`, fps `[b]`, segments `[b, 4, S, 2]`, segments_len `[b, 4]` ->
  `[b, 4]`; a candidate covering no real frame scores -1e9.
  """
  centre = frame_times + 0.5 / fps[:, None]
  s, e = segments[..., 0], segments[..., 1]
  seg_valid = jnp.arange(segments.shape[2])[None, None] < segments_len[..., None]  # [b, 4, S]
  inside = (centre[:, None, None, :] >= s[..., None]) & (centre[:, None, None, :] <= e[..., None])
  inside = jnp.any(inside & seg_valid[..., None], axis=2) & (frame_mask[:, None, :] > 0)  # [b, 4, T]
  outside = (~inside) & (frame_mask[:, None, :] > 0)
  x = frame_logits[:, None, :]
  n_in = jnp.sum(inside, -1)
  n_out = jnp.sum(outside, -1)
  mean_in = jnp.sum(jnp.where(inside, x, 0.0), -1) / jnp.maximum(n_in, 1)
  mean_out = jnp.sum(jnp.where(outside, x, 0.0), -1) / jnp.maximum(n_out, 1)
  return jnp.where(n_in > 0, mean_in - mean_out, -1e9)


def mcq_spatial_scores(mask_logits, ref, candidates):
  """Soft IoU of the predicted mask probabilities on frame `ref` with each candidate mask.

  mask_logits `[b, T, H, W]`, ref `[b]` int, candidates `[b, 4, H, W]` 0/1 -> `[b, 4]`.
  """
  p = jax.nn.sigmoid(jnp.take_along_axis(mask_logits, ref[:, None, None, None].astype(jnp.int32), axis=1))  # [b,1,H,W]
  c = candidates.astype(jnp.float32)
  inter = jnp.sum(p * c, axis=(-2, -1))
  union = jnp.sum(p + c - p * c, axis=(-2, -1))
  return inter / jnp.maximum(union, 1e-6)

