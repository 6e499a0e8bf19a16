"""VIOLIN statement accuracy on hand-computed cases."""

import math

import numpy as np
import pytest

from evqa_jax.metrics import violin


def test_threshold_is_inclusive_for_positives_exclusive_for_negatives():
  pos = np.array([0.5, 0.49, 0.9])
  neg = np.array([0.5, 0.49, 0.1])
  pos_ok, neg_ok = violin.statement_correct(pos, neg)
  np.testing.assert_array_equal(pos_ok, [True, False, True])
  np.testing.assert_array_equal(neg_ok, [False, True, True])
  assert violin.violin_accuracy(pos, neg) == pytest.approx(100 * 4 / 6)
  assert math.isnan(violin.violin_accuracy([], []))


def _clip(split):
  return {"split": split, "statement": [["p1", "n1"], ["p2", "n2"], ["p3", "n3"]]}


def test_violin_metrics_per_split_and_missing_clips():
  clips = {"a": _clip("test"), "b": _clip("test"), "c": _clip("validate"), "d": _clip("train")}
  preds = {
      "a": [[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]],   # 3 of 6: pos1, neg1, pos2 (0.5); neg2 (0.5), pos3, neg3 wrong
      "c": [[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]],   # 6 of 6
  }
  out = violin.violin_metrics(clips, preds)
  assert out["splits"]["test"]["accuracy"] == pytest.approx(100 * 3 / 12)  # b missing -> its 6 statements wrong
  assert out["splits"]["test"]["num_missing_clips"] == 1
  assert out["splits"]["validate"]["accuracy"] == 100.0
  assert out["splits"]["train"]["accuracy"] == 0.0
  assert out["accuracy"] == pytest.approx(100 * 9 / 24)
  assert out["num_statements"] == 24 and out["num_correct"] == 9 and out["num_clips"] == 4
  only_test = violin.violin_metrics(clips, preds, splits=["test"])
  assert list(only_test["splits"]) == ["test"] and only_test["accuracy"] == pytest.approx(25.0)
