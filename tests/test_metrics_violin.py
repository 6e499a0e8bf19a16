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


def test_threshold_compared_in_float32():
  # 0.49999999 is 0.5 in float32 (the authors' sigmoid outputs): a positive is right, a negative wrong.
  pos_ok, neg_ok = violin.statement_correct([0.49999999, 0.4999999], [0.49999999, 0.4999999])
  np.testing.assert_array_equal(pos_ok, [True, False])
  np.testing.assert_array_equal(neg_ok, [False, True])


def _clip(split):
  return {"split": split, "statement": [["p1", "n1"], ["p2", "n2"], ["p3", "n3"]]}


def test_violin_metrics_per_split_and_missing_clips():
  clips = {"a": _clip("test"), "b": _clip("test"), "c": _clip("validate"), "d": _clip("train")}
  preds = {
      "a": [[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]],   # 3 of 6: pos1, neg1, pos2 (0.5); neg2 (0.5), pos3, neg3 wrong
      "c": [[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]],   # 6 of 6
  }
  out = violin.violin_metrics(clips, preds)  # default: the test split only, as the authors score
  assert list(out["splits"]) == ["test"]
  assert out["accuracy"] == pytest.approx(100 * 3 / 12)  # b missing -> its 6 statements wrong
  assert out["real_accuracy"] == pytest.approx(100 * 2 / 6) and out["fake_accuracy"] == pytest.approx(100 * 1 / 6)
  assert (out["num_real_correct"], out["num_fake_correct"], out["num_missing_clips"]) == (2, 1, 1)
  every = violin.violin_metrics(clips, preds, splits=None)
  assert every["splits"]["validate"]["accuracy"] == 100.0 and every["splits"]["train"]["accuracy"] == 0.0
  assert every["splits"]["test"]["accuracy"] == pytest.approx(25.0)
  assert every["num_statements"] == 24 and every["num_correct"] == 9 and every["num_clips"] == 4
