"""VIOLIN evaluation: predictions.json in the official evaluator's format ({clip_id: [[p_pos, p_neg] per pair]}),
read, validated and scored exactly as `python -m evqa_jax.evaluate.violin --gt ... --split split` does."""

import os

import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax.evaluate import json_safe
from evqa_jax.evaluate import violin as violin_eval
from evqa_jax.metrics import violin as violin_metrics


def predictions_json(clips: dict, clip_ids: list, outputs: dict) -> dict:
  """Per-record outputs (clip, pair, p_pos, p_neg, each `[N]`) -> the evaluator's {clip_id: [[p_pos, p_neg] x pairs]};
  incomplete clips are left out (the evaluator then counts them wrong)."""
  per_clip: dict[str, dict[int, list]] = {}
  for c, j, pp, pn in zip(outputs["clip"], outputs["pair"], outputs["p_pos"], outputs["p_neg"]):
    per_clip.setdefault(clip_ids[int(c)], {})[int(j)] = [float(pp), float(pn)]
  out = {}
  for clip_id, pairs in per_clip.items():
    n = len(clips[clip_id]["statement"])
    if sorted(pairs) == list(range(n)):
      out[clip_id] = [pairs[j] for j in range(n)]
    else:
      log.warning(f"clip {clip_id} has predictions for pairs {sorted(pairs)} of {n}; left out (counted wrong)")
  return out


def accuracy_by_type(clips: dict, statement_types: dict, split: str, preds: dict) -> dict:
  """Synthetic world only: accuracy per statement type (visual / dialogue / combined) and negative kind."""
  groups: dict[str, list] = {}
  for clip_id, clip in clips.items():
    if clip["split"] != split or clip_id not in statement_types:
      continue
    probs = preds.get(clip_id)
    for j, (stype, neg_kind) in enumerate(statement_types[clip_id]):
      pair = probs[j] if probs is not None else [0.0, 1.0]  # a missing clip counts wrong, as the evaluator
      for key in (stype, f"neg_{neg_kind}"):
        groups.setdefault(key, []).append(pair)
  out = {}
  for key, pairs in sorted(groups.items()):
    arr = np.asarray(pairs, np.float64)
    out[f"accuracy_{key}"] = violin_metrics.violin_accuracy(arr[:, 0], arr[:, 1])
  return out


def evaluate(inp, split: str, outputs: dict, out_dir: str) -> dict:
  """`inp`: the project's input.Input (annotation clips, clip ids, statement types). Writes out_dir/predictions.json
  and out_dir/metrics.json; returns the metrics."""
  io_lib.makedirs(out_dir)
  pred_path = os.path.join(out_dir, "predictions.json")
  io_lib.write_json(pred_path, predictions_json(inp.clips, inp.clip_ids, outputs))
  preds = violin_eval.read_predictions(pred_path, inp.clips)
  full = violin_metrics.violin_metrics(inp.clips, preds, [split])
  metrics = {k: full[k] for k in ("accuracy", "num_statements", "num_correct", "num_clips", "num_missing_clips")}
  if inp.statement_types is not None:
    metrics.update(accuracy_by_type(inp.clips, inp.statement_types, split, preds))
  metrics = json_safe(metrics)
  io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
  return metrics
