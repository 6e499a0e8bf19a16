"""VIOLIN metric (REFERENCE.md section 2): accuracy over all statements of one split; plain numpy.

Every clip carries three (positive, negative) statement pairs. A positive statement is judged correct when the model's
probability that it is entailed is >= 0.5, a negative one when that probability is < 0.5, compared in float32 as the
authors' `validate()` compares its float32 sigmoid outputs (0.49999999 rounds to 0.5 and counts as entailed).
Accuracy pools the statements of the scored split (six per clip); the authors score one split (test unless told),
never several pooled. A clip without a prediction counts all its statements wrong.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

THRESHOLD = 0.5


def statement_correct(pos_probs: np.ndarray, neg_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(positive correct, negative correct) element-wise: p_pos >= 0.5 and p_neg < 0.5."""
  pos = np.asarray(pos_probs, dtype=np.float32)
  neg = np.asarray(neg_probs, dtype=np.float32)
  return pos >= np.float32(THRESHOLD), neg < np.float32(THRESHOLD)


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
                   splits: Optional[Iterable[str]] = ("test",)) -> dict[str, Any]:
  """Accuracy per split and over the chosen splits.

  Args:
    clips: the annotation {clip_id: {"split": ..., "statement": [[pos, neg] x 3], ...}}.
    predictions: {clip_id: [[p_pos, p_neg] x num_pairs]} (already validated); clips missing here are wrong.
    splits: splits to score; default ("test",), the authors' scored split. None = every split of `clips` (the
      top-level numbers then pool them, which no published number does).

  Returns:
    {"accuracy", "real_accuracy", "fake_accuracy": percent over the chosen splits (all statements, positives,
     negatives), "num_statements", "num_correct", "num_real_correct", "num_fake_correct", "num_clips",
     "num_missing_clips", "splits": {split: the same keys}}.
  """
  if splits is None:
    splits = list(dict.fromkeys(c["split"] for c in clips.values()))
  splits = list(splits)
  counts = ("num_statements", "num_correct", "num_real_correct", "num_fake_correct", "num_clips", "num_missing_clips")
  per = {s: dict.fromkeys(counts, 0) for s in splits}
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
    row["num_real_correct"] += int(pos_ok.sum())
    row["num_fake_correct"] += int(neg_ok.sum())
    row["num_correct"] += int(pos_ok.sum() + neg_ok.sum())

  def rates(row):
    half = row["num_statements"] / 2
    pct = lambda k, n: 100.0 * row[k] / n if n else math.nan
    return dict(row, accuracy=pct("num_correct", row["num_statements"]), real_accuracy=pct("num_real_correct", half),
                fake_accuracy=pct("num_fake_correct", half))

  out: dict[str, Any] = rates({k: sum(row[k] for row in per.values()) for k in counts})
  out["splits"] = {s: rates(row) for s, row in per.items()}
  return out
