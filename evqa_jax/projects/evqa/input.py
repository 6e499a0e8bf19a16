"""E-VQA input: records (frames, masks, segments, candidates, MCQ fields), the question + options text, the per-frame
evidence labels, and the records' ground-truth files for the evaluator.

Records: data_prep/st_evidence.py (frames [T, H, W, 3] at 6 fps, frame_mask, frame_times, frame_indices, masks
[T, H, W], segments [S, 2] s, candidates, answer_index, orig_size, MCQ fields). The records directory also holds the
ground truth in the official evaluators' layout (metadata.json["ground_truth"][split]: <split>.csv, gt_masks/,
<split>_mcq.json).
"""

from __future__ import annotations

import os

import numpy as np

from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.evaluate import st_evidence as st_eval

NUM_MCQ_OPTIONS = 4


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



def frame_labels(frame_times, frame_mask, segments, fps: float) -> np.ndarray:
  """1 for a real frame whose centre (time + 0.5 / fps) lies in a segment [s, e], else 0. float32 [T]."""
  centre = np.asarray(frame_times, np.float64) + 0.5 / float(fps)
  segs = np.asarray(segments, np.float64).reshape(-1, 2)
  inside = np.any((centre[:, None] >= segs[None, :, 0]) & (centre[:, None] <= segs[None, :, 1]), axis=1)
  return (inside & (np.asarray(frame_mask) > 0)).astype(np.float32)


def nearest_position(frame_indices, frame_mask, frame: int) -> int:
  """The sampled position whose 6-fps frame index is closest to `frame` (ties: the earlier one)."""
  idx = np.asarray(frame_indices, np.int64)
  valid = np.asarray(frame_mask) > 0
  dist = np.where(valid, np.abs(idx - int(frame)), np.iinfo(np.int64).max)
  return int(np.argmin(dist))



class Input:
  """Reads config.data.dir: `source`, `preprocess` for the trainer; `entries` and `ground_truth` for the evaluator."""

  def __init__(self, config):
    self.config = config
    dc = config.data
    data_dir = os.path.expanduser(dc.dir)
    self.data_dir = data_dir
    records.require_records(
        config, "E-VQA", "python -m data_prep.st_evidence --csv <ST-Evidence>/test.csv --frames <frames dir> --masks "
        f"<gt_masks dir> --mcq <mcq.json> --split test --out {dc.dir}", "configs/evqa_gen.py:demo")
    self.metadata = records.load_metadata(data_dir)
    if self.metadata.get("task") != "evqa":
      raise ValueError(f"{data_dir}/metadata.json: task is {self.metadata.get('task')!r}, not 'evqa'")
    self.num_frames = int(self.metadata["num_frames"])
    self.frame_size = tuple(int(x) for x in self.metadata["frame_size"])
    self.tokenizer = pretrained.load_tokenizer(config.pretrained)
    self._entries = {}
    self._text_cache = {}

  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    return source_lib.IndexedSource(source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
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

  def entries(self, split: str) -> list[dict]:
    """Per record of `split` (index order): entry_id, video_id, orig_size, frame_indices, fps, has_mcq,
    num_candidates, mask_name_digits (the GT masks' zero-padding; records converted before the field existed: 5, the
    release's)."""
    if split not in self._entries:
      src = self.source(split)
      table = []
      for i in range(len(src)):
        ex = src[i]
        table.append({"entry_id": str(ex["entry_id"]), "video_id": str(ex["video_id"]),
                      "orig_size": tuple(int(x) for x in ex["orig_size"]),
                      "frame_indices": np.asarray(ex["frame_indices"], np.int64), "fps": float(ex["fps"]),
                      "has_mcq": bool(ex["has_mcq"]), "num_candidates": len(ex["candidates"]),
                      "mask_name_digits": int(ex.get("mask_name_digits", st_eval.AUTHORS_MASK_DIGITS))})
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
