"""VIOLIN metric (REFERENCE.md section 2): accuracy over all statements; plain numpy.

Every clip carries three (positive, negative) statement pairs. A positive statement is judged correct when the model's
probability that it is entailed is >= 0.5, a negative one when that probability is < 0.5. Accuracy pools all
statements (six per clip). A clip without a prediction counts all its statements wrong.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

THRESHOLD = 0.5


def statement_correct(pos_probs: np.ndarray, neg_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(positive correct, negative correct) element-wise: p_pos >= 0.5 and p_neg < 0.5."""
  pos = np.asarray(pos_probs, dtype=np.float64)
  neg = np.asarray(neg_probs, dtype=np.float64)
  return pos >= THRESHOLD, neg < THRESHOLD


def violin_accuracy(pos_probs: np.ndarray, neg_probs: np.ndarray) -> float:
  """Accuracy in percent over all statements.

  Args:
    pos_probs: entailment probability of each positive statement, any shape (e.g. [clips, 3]).
    neg_probs: entailment probability of each negative statement, any shape.
  """
  pos_ok, neg_ok = statement_correct(pos_probs, neg_probs)
  n = pos_ok.size + neg_ok.size
  if n == 0:
    return math.nan
  return 100.0 * float(pos_ok.sum() + neg_ok.sum()) / n


def violin_metrics(clips: Mapping[str, Mapping[str, Any]], predictions: Mapping[str, Sequence[Sequence[float]]],
                   splits: Optional[Iterable[str]] = None) -> dict[str, Any]:
  """Accuracy per split and pooled over the chosen splits.

  Args:
    clips: the annotation {clip_id: {"split": ..., "statement": [[pos, neg] x 3], ...}}.
    predictions: {clip_id: [[p_pos, p_neg] x num_pairs]} (already validated); clips missing here are wrong.
    splits: splits to score; default every split in `clips` (in order of first appearance).

  Returns:
    {"accuracy": pooled percent over the chosen splits,
     "num_statements", "num_correct", "num_clips", "num_missing_clips": pooled counts,
     "splits": {split: {"accuracy", "num_statements", "num_correct", "num_clips", "num_missing_clips"}}}.
  """
  if splits is None:
    splits = list(dict.fromkeys(c["split"] for c in clips.values()))
  splits = list(splits)
  per = {s: {"num_statements": 0, "num_correct": 0, "num_clips": 0, "num_missing_clips": 0} for s in splits}
  for clip_id, clip in clips.items():
    split = clip["split"]
    if split not in per:
      continue
    n_pairs = len(clip["statement"])
    row = per[split]
    row["num_clips"] += 1
    row["num_statements"] += 2 * n_pairs
    pred = predictions.get(clip_id)
    if pred is None:
      row["num_missing_clips"] += 1
      continue
    probs = np.asarray(pred, dtype=np.float64).reshape(n_pairs, 2)
    pos_ok, neg_ok = statement_correct(probs[:, 0], probs[:, 1])
    row["num_correct"] += int(pos_ok.sum() + neg_ok.sum())
  out: dict[str, Any] = {"splits": {}}
  for s, row in per.items():
    out["splits"][s] = dict(row, accuracy=100.0 * row["num_correct"] / row["num_statements"]
                            if row["num_statements"] else math.nan)
  for key in ("num_statements", "num_correct", "num_clips", "num_missing_clips"):
    out[key] = sum(row[key] for row in per.values())
  out["accuracy"] = 100.0 * out["num_correct"] / out["num_statements"] if out["num_statements"] else math.nan
  return out
