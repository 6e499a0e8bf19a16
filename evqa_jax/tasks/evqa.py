"""E-VQA: evidence-backed video QA (answer + temporal segments + masklets), ST-Evidence-Gen and -MCQ.

Records: data_prep/st_evidence.py (frames [T, H, W, 3] at 6 fps, frame_mask, frame_times, frame_indices, masks
[T, H, W], segments [S, 2] s, candidates, answer_index, orig_size, MCQ fields). The records directory also holds the
ground truth in the official evaluators' layout (metadata.json["ground_truth"][split]: <split>.csv, gt_masks/,
<split>_mcq.json), and evaluation scores our prediction files with the same evaluators a user runs.

Model: evqa_jax/models/evqa_model.py. Loss = w_answer * CE(answer) + w_temporal * BCE(per-frame evidence)
+ w_mask_bce * BCE(masks, every pixel of every real frame) + w_dice * (1 - soft dice of the whole masklet).

Decoding (generative, ST-Evidence-Gen):
  answer: the letter of argmax over the options.
  segments: frames whose evidence probability exceeds config.eval.temporal_threshold, grouped into runs of
    consecutive sampled frames; a run over sampled frames k0..k1 spans [start(k0), end(k1)] seconds where a frame's
    span reaches half-way to its sampled neighbours (start(0) = its time, end(last) = its time + 1 / fps), so with
    every 6-fps frame present a run of frames f0..f1 gives exactly [f0 / 6, (f1 + 1) / 6]. With no frame above the
    threshold the evidence is the run around the most likely frame of frames at least config.eval.temporal_relative
    times as likely (every benchmark entry has some evidence).
  masks: for every frame predicted as evidence, the mask (logit > logit(mask_threshold)) at the frames' resolution,
    resized (nearest) to the source video's size `orig_size` when the records were stored smaller, written as
    pred_masks/<entry_id>/masks/<frame at 6 fps :05d>.png (0/255).
MCQ (ST-Evidence-MCQ), same trained model: QA = argmax option; temporal = the candidate segment set with the largest
  (mean evidence logit of frames inside) - (mean of frames outside); spatial = the candidate mask with the largest
  soft IoU with the predicted mask probabilities on the reference frame (the sampled frame nearest to it).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from PIL import Image

from evqa_jax import io as io_lib
from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.evaluate import json_safe
from evqa_jax.models import encoders
from evqa_jax.models import evqa_model
from evqa_jax.tasks import base

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
NUM_MCQ_OPTIONS = 4
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class IndexedSource:
  """A random-access source that adds the record's position as `index` (E-VQA records carry no index field)."""

  def __init__(self, source):
    self.source = source

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> dict:
    ex = dict(self.source[index])
    ex["index"] = np.int64(index)
    return ex

  def __repr__(self) -> str:
    return f"IndexedSource({self.source!r})"


def load_tokenizer(path: str):
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from transformers import AutoTokenizer
  if not os.path.isdir(path):
    raise FileNotFoundError(f"config.model.pretrained / tokenizer = {path!r} is not a directory holding a Hugging "
                            "Face tokenizer; nothing is downloaded at run time")
  return AutoTokenizer.from_pretrained(path)


# ------------------------------------------------------------------------------------------------ text inputs


def build_text(tokenizer, question: str, candidates, max_tokens: int, max_option_tokens: int, num_options: int,
               where: str = "example") -> dict:
  """[CLS] question [SEP] option_1 [SEP] ... option_C [SEP], padded to `max_tokens`.

  Returns input_ids, attention_mask, token_type_ids (0 question, 1 options), question_mask [L] (question tokens),
  option_mask [num_options, L] (each option's tokens), option_valid [num_options]. Options keep at most
  `max_option_tokens` sub-words; the question is truncated to what is left (error when nothing is).
  """
  if len(candidates) > num_options:
    raise ValueError(f"{where}: {len(candidates)} candidates but config.data.num_options = {num_options}")
  if len(candidates) < 2:
    raise ValueError(f"{where}: needs at least 2 candidates, got {list(candidates)}")
  opt_ids = []
  for c in candidates:
    ids = tokenizer(str(c), add_special_tokens=False)["input_ids"][:max_option_tokens]
    opt_ids.append(ids or [tokenizer.unk_token_id])
  q_ids = tokenizer(str(question).strip(), add_special_tokens=False)["input_ids"]
  budget = max_tokens - 2 - sum(len(o) + 1 for o in opt_ids)
  if budget < 1:
    raise ValueError(f"{where}: the {len(candidates)} options take {max_tokens - budget - 1} tokens, leaving no room "
                     f"for the question in config.data.max_tokens = {max_tokens}")
  q_ids = q_ids[:budget]
  ids = [tokenizer.cls_token_id] + q_ids + [tokenizer.sep_token_id]
  types = [0] * len(ids)
  question_mask = np.zeros(max_tokens, np.int32)
  question_mask[1:1 + len(q_ids)] = 1
  option_mask = np.zeros((num_options, max_tokens), np.int32)
  for k, o in enumerate(opt_ids):
    option_mask[k, len(ids):len(ids) + len(o)] = 1
    ids += o + [tokenizer.sep_token_id]
    types += [1] * (len(o) + 1)
  n = len(ids)
  out = {"input_ids": np.full(max_tokens, tokenizer.pad_token_id, np.int32),
         "attention_mask": np.zeros(max_tokens, np.int32), "token_type_ids": np.zeros(max_tokens, np.int32),
         "question_mask": question_mask, "option_mask": option_mask,
         "option_valid": (np.arange(num_options) < len(candidates)).astype(np.int32)}
  out["input_ids"][:n] = ids
  out["attention_mask"][:n] = 1
  out["token_type_ids"][:n] = types
  return out


# ------------------------------------------------------------------------------------------------ evidence


def frame_labels(frame_times, frame_mask, segments, fps: float) -> np.ndarray:
  """1 for a real frame whose centre (time + 0.5 / fps) lies in a segment [s, e], else 0. float32 [T]."""
  centre = np.asarray(frame_times, np.float64) + 0.5 / float(fps)
  segs = np.asarray(segments, np.float64).reshape(-1, 2)
  inside = np.any((centre[:, None] >= segs[None, :, 0]) & (centre[:, None] <= segs[None, :, 1]), axis=1)
  return (inside & (np.asarray(frame_mask) > 0)).astype(np.float32)


def decode_segments(frame_logits, frame_times, frame_mask, fps: float, threshold: float = 0.5,
                    relative: float = 0.5):
  """Per-frame evidence logits -> (segments [(start, end)] in seconds, runs [(k0, k1)] of sampled positions).

  See the module docstring for the frame spans. `threshold` is a probability. When no frame reaches it, the evidence
  is the run of consecutive frames around the most likely one whose probability is at least `relative` times its
  probability (relative = 1: that frame alone).
  """
  logits = np.asarray(frame_logits, np.float64)
  valid = np.asarray(frame_mask) > 0
  times = np.asarray(frame_times, np.float64)
  n = int(valid.sum())
  if n == 0:
    return [], []
  if not valid[:n].all():
    raise ValueError("decode_segments: frame_mask must mark a prefix of real frames")
  logits, times = logits[:n], times[:n]
  prob = 1.0 / (1.0 + np.exp(-logits))
  on = prob > threshold
  if not on.any():
    best = int(np.argmax(logits))
    keep = prob >= relative * prob[best]
    lo, hi = best, best
    while lo > 0 and keep[lo - 1]:
      lo -= 1
    while hi + 1 < n and keep[hi + 1]:
      hi += 1
    on[lo:hi + 1] = True
  half = 0.5 / float(fps)

  def start(k):
    return times[0] if k == 0 else 0.5 * (times[k - 1] + times[k]) + half

  def end(k):
    return times[k] + 2 * half if k == n - 1 else 0.5 * (times[k] + times[k + 1]) + half

  runs, k = [], 0
  while k < n:
    if on[k]:
      k1 = k
      while k1 + 1 < n and on[k1 + 1]:
        k1 += 1
      runs.append((k, k1))
      k = k1 + 1
    else:
      k += 1
  segments = [(round(float(start(a)), 4), round(float(end(b)), 4)) for a, b in runs]
  return segments, runs


def nearest_position(frame_indices, frame_mask, frame: int) -> int:
  """The sampled position whose 6-fps frame index is closest to `frame` (ties: the earlier one)."""
  idx = np.asarray(frame_indices, np.int64)
  valid = np.asarray(frame_mask) > 0
  dist = np.where(valid, np.abs(idx - int(frame)), np.iinfo(np.int64).max)
  return int(np.argmin(dist))


def resize_mask(mask: np.ndarray, size) -> np.ndarray:
  """bool [h, w] -> bool [H, W] (nearest); unchanged when the size already matches."""
  size = (int(size[0]), int(size[1]))
  if mask.shape == size:
    return mask
  return np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize((size[1], size[0]), Image.NEAREST)) > 127


def write_mask_png(path: str, mask: np.ndarray) -> None:
  with io_lib.atomic_path(path) as tmp:
    Image.fromarray(mask.astype(np.uint8) * 255).save(tmp, format="PNG")


def write_gen_predictions(entries: list[dict], out_dir: str) -> tuple[str, str]:
  """Writes the official ST-Evidence-Gen files; returns (predictions JSON path, pred_masks dir).

  entries: [{"entry_id", "video_id", "answer": letter, "segments": [(s, e)], "masks": {frame: bool [H, W]}}].
  """
  pred_json = os.path.join(out_dir, "predictions.json")
  mask_root = os.path.join(out_dir, "pred_masks")
  os.makedirs(mask_root, exist_ok=True)
  obj = {}
  for e in entries:
    obj[e["entry_id"]] = {"video_id": e["video_id"],
                          "parsed_response": {"answer": e["answer"], "segments": [list(s) for s in e["segments"]]}}
    mdir = os.path.join(mask_root, e["entry_id"], "masks")
    os.makedirs(mdir, exist_ok=True)
    for frame, mask in sorted(e["masks"].items()):
      write_mask_png(os.path.join(mdir, f"{int(frame):05d}.png"), mask)
  io_lib.write_json(pred_json, obj)
  return pred_json, mask_root


# ------------------------------------------------------------------------------------------------ task


class EVQATask(base.Task):
  main_metric = "accuracy"

  def __init__(self, config):
    super().__init__(config)
    dc, mc = config.data, config.model
    data_dir = os.path.expanduser(dc.dir)
    self.data_dir = data_dir
    if not os.path.exists(os.path.join(data_dir, "metadata.json")):
      if dc.synthetic:
        self._generate_synthetic(data_dir, dc.synthetic)
      else:
        raise FileNotFoundError(
            f"config.data.dir = {dc.dir!r} holds no converted E-VQA records (no metadata.json). Convert the release "
            f"first:\n  python -m data_prep.st_evidence --csv <ST-Evidence>/test.csv --frames <frames dir> --masks "
            f"<gt_masks dir> --mcq <mcq.json> --split test --out {dc.dir}\n"
            "or run the demo variant (--config=configs/evqa_gen.py:demo) on the built-in synthetic world.")
    self.metadata = records.load_metadata(data_dir)
    if self.metadata.get("task") != "evqa":
      raise ValueError(f"{data_dir}/metadata.json: task is {self.metadata.get('task')!r}, not 'evqa'")
    self.num_frames = int(self.metadata["num_frames"])
    self.frame_size = tuple(int(x) for x in self.metadata["frame_size"])
    self.modes = tuple(config.eval.modes)
    for m in self.modes:
      if m not in ("gen", "mcq"):
        raise ValueError(f"config.eval.modes = {self.modes}: each must be 'gen' or 'mcq'")
    if not self.modes:
      raise ValueError("config.eval.modes is empty: give 'gen', 'mcq' or both")
    self.main_metric = "accuracy" if "gen" in self.modes else "pooled"

    self.tokenizer = load_tokenizer(pretrained.resolve(mc.tokenizer or mc.pretrained))
    self.pretrained_dir = pretrained.resolve(mc.pretrained) if mc.pretrained else None
    frame_config = self._frame_config()
    self.frame_config = frame_config
    visual_dim = 2 * evqa_model.frame_feature_dim(mc.frame_encoder, frame_config)
    overrides = dict(num_visual_tokens=self.num_frames, visual_dim=visual_dim, use_adapters=mc.use_adapters,
                     adapter_reduction=mc.adapter_reduction, remat=mc.remat, dtype=_DTYPES[mc.dtype])
    if mc.dropout is not None:
      overrides.update(hidden_dropout_prob=mc.dropout, attention_probs_dropout_prob=mc.dropout,
                       adapter_dropout=mc.dropout)
    if mc.num_layers:
      overrides["num_hidden_layers"] = mc.num_layers
    cfg_cls = encoders.config_class(mc.encoder)
    if mc.shape:
      self.encoder_config = cfg_cls.from_dict(dict(mc.shape), **overrides)
    else:
      if self.pretrained_dir is None or not os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
        raise FileNotFoundError(f"config.model.pretrained = {mc.pretrained!r} has no config.json")
      self.encoder_config = cfg_cls.from_hf_dir(self.pretrained_dir, **overrides)
    self.model = evqa_model.EVQAModel(
        encoder=mc.encoder, encoder_config=self.encoder_config, frame_encoder=mc.frame_encoder,
        frame_config=frame_config, image_size=self.frame_size, temporal_dim=mc.temporal_dim, seg_dim=mc.seg_dim,
        seg_heads=mc.seg_heads, seg_mlp_dim=mc.seg_mlp_dim, num_queries=mc.num_queries, answer_dim=mc.answer_dim,
        use_evidence_readout=mc.evidence_readout, shape_window=mc.shape_window, shape_radius=mc.shape_radius,
        frame_descriptors=mc.frame_descriptors, factorized_masks=mc.factorized_masks,
        evidence_norm=mc.evidence_norm,
        question_heads=mc.question_heads, dtype=_DTYPES[mc.dtype])
    self._entries = {}
    self._text_cache = {}

  @staticmethod
  def _generate_synthetic(data_dir: str, preset: str) -> None:
    if os.path.basename(os.path.normpath(data_dir)) != "records":
      raise ValueError(f"config.data.dir = {data_dir!r}: the synthetic world writes <root>/raw and <root>/records, "
                       "so the data dir must end in /records")
    if preset not in ("default", "small"):
      raise ValueError(f"config.data.synthetic = {preset!r}: expected 'default' or 'small'")
    from data_prep import synthetic_evqa
    root = os.path.dirname(os.path.abspath(os.path.normpath(data_dir)))
    print(f"Generating the synthetic E-VQA world ({preset}) in {root} ...", flush=True)
    synthetic_evqa.generate(root, small=preset == "small", verbose=False)

  def _frame_config(self):
    mc = self.config.model
    if mc.frame_encoder == "conv":
      return dict(dim=mc.frame.dim, patch_size=mc.frame.patch_size, num_blocks=mc.frame.num_blocks,
                  output_stride=mc.frame.output_stride, temporal_shift=mc.frame.temporal_shift,
                  frame_difference=mc.frame.frame_difference)
    if mc.frame_encoder == "clip":
      from evqa_jax.models import clip_vision
      if mc.clip_shape:
        return clip_vision.CLIPVisionConfig.from_dict(dict(mc.clip_shape), dtype=_DTYPES[mc.dtype])
      path = pretrained.resolve(mc.clip_pretrained) if mc.clip_pretrained else ""
      if not path or not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"config.model.clip_pretrained = {mc.clip_pretrained!r} has no config.json: point "
                                "it at a local Hugging Face CLIP checkpoint (e.g. openai/clip-vit-base-patch16)")
      return clip_vision.CLIPVisionConfig.from_hf_dir(path, dtype=_DTYPES[mc.dtype])
    raise ValueError(f"config.model.frame_encoder = {mc.frame_encoder!r}: expected 'conv' or 'clip'")

  # -- data -----------------------------------------------------------------------------------------------------
  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    return IndexedSource(source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
                                                       on_corrupt=self.config.data.on_corrupt))

  def _text(self, question: str, candidates: tuple, where: str) -> dict:
    key = (question, candidates)
    if key not in self._text_cache:
      dc = self.config.data
      self._text_cache[key] = build_text(self.tokenizer, question, candidates, dc.max_tokens, dc.max_option_tokens,
                                         dc.num_options, where)
    return self._text_cache[key]

  def preprocess(self, example: dict, train: bool) -> dict:
    dc = self.config.data
    where = f"record {int(example['index'])} (entry {example['entry_id']}) of {self.data_dir}"
    candidates = tuple(str(c) for c in example["candidates"])
    out = dict(self._text(str(example["question"]), candidates, where))
    label = int(example["answer_index"])
    if not 0 <= label < len(candidates):
      raise ValueError(f"{where}: answer_index {label} is outside its {len(candidates)} candidates")
    frames = np.asarray(example["frames"], np.uint8)
    if frames.shape != (self.num_frames,) + self.frame_size + (3,):
      raise ValueError(f"{where}: frames have shape {frames.shape}, metadata.json says "
                       f"{(self.num_frames,) + self.frame_size + (3,)}")
    fps = float(example["fps"])
    frame_mask = np.asarray(example["frame_mask"]).astype(np.int32)
    times = np.asarray(example["frame_times"], np.float32)
    out.update(
        frames=frames, frame_mask=frame_mask, frame_times=times,
        frame_labels=frame_labels(times, frame_mask, example["segments"], fps),
        masks=np.asarray(example["masks"], np.uint8), has_masks=np.int32(bool(example["has_masks"])),
        label=np.int32(label), index=np.int32(example["index"]))
    if not train:
      has_mcq = bool(example["has_mcq"])
      segs = np.asarray(example["mcq_segments"], np.float32)
      if segs.shape[1] > dc.max_mcq_segments:
        raise ValueError(f"{where}: an MCQ temporal option has {segs.shape[1]} segments, more than "
                         f"config.data.max_mcq_segments = {dc.max_mcq_segments}")
      padded = np.zeros((NUM_MCQ_OPTIONS, dc.max_mcq_segments, 2), np.float32)
      padded[:, :segs.shape[1]] = segs
      ref = nearest_position(example["frame_indices"], frame_mask, int(example["mcq_frame"])) if has_mcq else 0
      out.update(has_mcq=np.int32(has_mcq), mcq_segments=padded,
                 mcq_segments_len=np.asarray(example["mcq_segments_len"], np.int32),
                 mcq_masks=np.asarray(example["mcq_masks"], np.uint8), mcq_ref=np.int32(ref),
                 fps=np.float32(fps))
    return out

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    dc = self.config.data
    t, (h, w), c, l = self.num_frames, self.frame_size, dc.num_options, dc.max_tokens
    return {"frames": jnp.zeros((1, t, h, w, 3), jnp.uint8), "frame_mask": jnp.ones((1, t), jnp.int32),
            "input_ids": jnp.zeros((1, l), jnp.int32), "attention_mask": jnp.ones((1, l), jnp.int32),
            "token_type_ids": jnp.zeros((1, l), jnp.int32), "question_mask": jnp.ones((1, l), jnp.int32),
            "option_mask": jnp.ones((1, c, l), jnp.int32), "option_valid": jnp.ones((1, c), jnp.int32)}

  def init_params(self, rng):
    return self.model.init({"params": rng}, self._dummy_batch())["params"]

  def load_pretrained(self, params: dict) -> dict:
    mc = self.config.model
    params = dict(params)
    if self.pretrained_dir and os.path.exists(os.path.join(self.pretrained_dir, "config.json")) and not mc.shape:
      lm, report = encoders.load_hf_params(mc.encoder, self.encoder_config, self.pretrained_dir, params["lm"])
      print(f"Loaded {mc.encoder} weights from {self.pretrained_dir}: {len(report.loaded)} loaded, "
            f"{len(report.missing)} from init, {len(report.unused)} checkpoint keys unused", flush=True)
      params["lm"] = lm
    if mc.frame_encoder == "clip" and mc.clip_pretrained:
      from evqa_jax.models import clip_vision
      fe = dict(params["frame_encoder"])
      clip, report = clip_vision.load_hf_params(self.frame_config, pretrained.resolve(mc.clip_pretrained), fe["clip"])
      print(f"Loaded CLIP vision weights: {len(report.loaded)} loaded, {len(report.missing)} from init", flush=True)
      fe["clip"] = clip
      params["frame_encoder"] = fe
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.model.trainable)

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

  # -- evaluation -----------------------------------------------------------------------------------------------
  def entries(self, split: str) -> list[dict]:
    """Per record of `split` (index order): entry_id, video_id, orig_size, frame_indices, has_mcq."""
    if split not in self._entries:
      src = self.source(split)
      table = []
      for i in range(len(src)):
        ex = src[i]
        table.append({"entry_id": str(ex["entry_id"]), "video_id": str(ex["video_id"]),
                      "orig_size": tuple(int(x) for x in ex["orig_size"]),
                      "frame_indices": np.asarray(ex["frame_indices"], np.int64), "fps": float(ex["fps"]),
                      "has_mcq": bool(ex["has_mcq"]), "num_candidates": len(ex["candidates"])})
      self._entries[split] = table
    return self._entries[split]

  def ground_truth(self, split: str) -> dict:
    gt = self.metadata.get("ground_truth", {}).get(split)
    if gt is None:
      raise FileNotFoundError(f"{self.data_dir}/metadata.json has no ground_truth entry for split {split!r}: "
                              "convert it with data_prep.st_evidence, which copies the evaluator ground truth")
    out = {}
    for key in ("csv", "gt_masks", "mcq"):
      out[key] = os.path.join(self.data_dir, gt[key]) if gt.get(key) else None
    return out

  def generative_entries(self, split: str, outputs: dict) -> list[dict]:
    """Decoded predictions (answer letter, segments, masks by 6-fps frame) of every output row."""
    table = self.entries(split)
    ec = self.config.eval
    h, w = self.frame_size
    out = []
    for row, idx in enumerate(outputs["index"]):
      info = table[int(idx)]
      n_opt = info["num_candidates"]
      letter = LETTERS[int(np.argmax(outputs["answer_logits"][row][:n_opt]))]
      segments, runs = decode_segments(outputs["frame_logits"][row], outputs["frame_times"][row],
                                       outputs["frame_mask"][row], info["fps"], ec.temporal_threshold,
                                       ec.temporal_relative)
      bits = np.unpackbits(outputs["masks"][row], axis=-1, count=h * w).reshape(-1, h, w).astype(bool)
      masks = {}
      for k0, k1 in runs:
        for k in range(k0, k1 + 1):
          masks[int(info["frame_indices"][k])] = resize_mask(bits[k], info["orig_size"])
      out.append({"entry_id": info["entry_id"], "video_id": info["video_id"], "answer": letter,
                  "segments": segments, "masks": masks})
    return out

  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    gt = self.ground_truth(split)
    metrics: dict[str, Any] = {}
    if "gen" in self.modes:
      from evqa_jax.evaluate import st_evidence as st_eval
      pred_json, mask_root = write_gen_predictions(self.generative_entries(split, outputs), out_dir)
      if gt["csv"] is None:
        raise FileNotFoundError(f"{self.data_dir}: no ground-truth CSV recorded for split {split!r}")
      gen, per_entry = st_eval.evaluate(gt["csv"], pred_json, gt["gt_masks"], mask_root if gt["gt_masks"] else None)
      io_lib.write_json(os.path.join(out_dir, "per_entry.json"), json_safe(per_entry))
      metrics.update(gen)
    if "mcq" in self.modes:
      mcq = self.evaluate_mcq(split, outputs, out_dir, gt["mcq"])
      prefix = "mcq_" if "gen" in self.modes else ""
      metrics.update({f"{prefix}{k}": v for k, v in mcq.items()})
    metrics = json_safe(metrics)
    io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return metrics

  def evaluate_mcq(self, split: str, outputs: dict, out_dir: str, gt_path: Optional[str]) -> dict:
    from evqa_jax.evaluate import st_evidence_mcq as mcq_eval
    from evqa_jax.metrics import st_evidence as st
    if gt_path is None:
      raise FileNotFoundError(f"{self.data_dir}: split {split!r} has no MCQ ground truth (convert it with --mcq)")
    table = self.entries(split)
    preds = {}
    for row, idx in enumerate(outputs["index"]):
      info = table[int(idx)]
      if not info["has_mcq"]:
        continue
      preds[info["entry_id"]] = {
          "qa": int(np.argmax(outputs["answer_logits"][row][:info["num_candidates"]])),
          "temporal": int(np.argmax(outputs["mcq_temporal_scores"][row])),
          "spatial": int(np.argmax(outputs["mcq_spatial_scores"][row]))}
    pred_path = os.path.join(out_dir, "mcq_predictions.json")
    io_lib.write_json(pred_path, preds)
    gt_answers, num_options = mcq_eval.read_gt(gt_path)
    return st.mcq_metrics(gt_answers, mcq_eval.read_predictions(pred_path, num_options))

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

