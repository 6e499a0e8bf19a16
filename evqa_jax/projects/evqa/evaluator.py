"""E-VQA evaluation: decodes the model's outputs into the official prediction files and scores them with the same
evaluators a user runs (`python -m evqa_jax.evaluate.st_evidence`, `... st_evidence_mcq`).

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
    pred_masks/<entry_id>/masks/<frame at 6 fps>.png (0/255), named as the entry's ground-truth masks (records field
    mask_name_digits: "00012.png" for the release), since the official evaluator pairs PNGs by exact file name.
    The layout is the authors' own (<root>/<entry_id>/masks/, no "mask_folder" key): the official script reads it
    with `--pred_mask_dir <eval dir>/pred_masks`, ours with `--pred-masks <eval dir>/pred_masks`.
MCQ (ST-Evidence-MCQ): QA = argmax option; temporal / spatial = argmax of the scores the task's predict computed.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
from PIL import Image

from evqa_jax import io as io_lib
from evqa_jax.evaluate import json_safe
from evqa_jax.evaluate import st_evidence as st_eval

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


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

  entries: [{"entry_id", "video_id", "answer": letter, "segments": [(s, e)], "masks": {frame: bool [H, W]},
  "mask_name_digits": zero-padding of the PNG names (default 5, the release's)}].
  """
  pred_json = os.path.join(out_dir, "predictions.json")
  mask_root = os.path.join(out_dir, "pred_masks")
  io_lib.makedirs(mask_root)
  obj = {}
  for e in entries:
    obj[e["entry_id"]] = {"video_id": e["video_id"],
                          "parsed_response": {"answer": e["answer"], "segments": [list(s) for s in e["segments"]]}}
    mdir = os.path.join(mask_root, io_lib.check_id(e["entry_id"], f"predictions in {out_dir}", "entry id"), "masks")
    io_lib.makedirs(mdir)
    digits = e.get("mask_name_digits", st_eval.AUTHORS_MASK_DIGITS)
    for frame, mask in sorted(e["masks"].items()):
      write_mask_png(os.path.join(mdir, st_eval.mask_file_name(frame, digits)), mask)
  io_lib.write_json(pred_json, obj)
  return pred_json, mask_root


def generative_entries(inp, split: str, outputs: dict, ec) -> list[dict]:
  """Decoded predictions (answer letter, segments, masks by 6-fps frame) of every output row. `inp`: input.Input;
  `ec`: config.eval."""
  table = inp.entries(split)
  h, w = inp.frame_size
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
                "segments": segments, "masks": masks, "mask_name_digits": info["mask_name_digits"]})
  return out


def evaluate(inp, split: str, outputs: dict, out_dir: str, ec) -> dict:
  """Writes the prediction files of `ec.modes` (config.eval.modes: "gen", "mcq") and out_dir/metrics.json; returns
  the metrics. `inp`: input.Input (entries, ground truth)."""
  io_lib.makedirs(out_dir)
  gt = inp.ground_truth(split)
  modes = tuple(ec.modes)
  metrics: dict[str, Any] = {}
  if "gen" in modes:
    pred_json, mask_root = write_gen_predictions(generative_entries(inp, split, outputs, ec), out_dir)
    if gt["csv"] is None:
      raise FileNotFoundError(f"{inp.data_dir}: no ground-truth CSV recorded for split {split!r}")
    gen, per_entry = st_eval.evaluate(gt["csv"], pred_json, gt["gt_masks"], mask_root if gt["gt_masks"] else None)
    io_lib.write_json(os.path.join(out_dir, "per_entry.json"), json_safe(per_entry))
    metrics.update(gen)
  if "mcq" in modes:
    mcq = evaluate_mcq(inp, split, outputs, out_dir, gt["mcq"])
    prefix = "mcq_" if "gen" in modes else ""
    metrics.update({f"{prefix}{k}": v for k, v in mcq.items()})
  metrics = json_safe(metrics)
  io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
  return metrics


def evaluate_mcq(inp, split: str, outputs: dict, out_dir: str, gt_path: Optional[str]) -> dict:
  """Writes out_dir/mcq_predictions.json ({entry_id: {qa, temporal, spatial}}) and scores it against `gt_path`."""
  from evqa_jax.evaluate import st_evidence_mcq as mcq_eval
  from evqa_jax.metrics import st_evidence as st
  if gt_path is None:
    raise FileNotFoundError(f"{inp.data_dir}: split {split!r} has no MCQ ground truth (convert it with --mcq)")
  table = inp.entries(split)
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
