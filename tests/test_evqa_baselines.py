"""benchmarks/evqa_trivial_baselines.py: the per-question-kind breakdown of a run, on a hand-made case."""

import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
  spec = importlib.util.spec_from_file_location("evqa_trivial_baselines",
                                                os.path.join(REPO, "benchmarks", "evqa_trivial_baselines.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_by_question_kind_hand_computed(tmp_path):
  bench = _module()
  records, pred = tmp_path / "records", tmp_path / "pred"
  records.mkdir()
  pred.mkdir()
  assert bench.by_question_kind(str(records), str(pred)) == {}  # not the synthetic world: nothing to break down
  (records / "synthetic_question_types.json").write_text(json.dumps(
      {"a": "shape_of_colour", "b": "shape_of_colour", "c": "motion_of_object"}))
  (pred / "per_entry.json").write_text(json.dumps({
      "a": {"correct": True, "IoU": 1.0, "J": 0.5, "F": 1.0},
      "b": {"correct": False, "IoU": 0.5, "J": 0.25, "F": 0.0},
      "c": {"correct": True, "IoU": 0.0, "J": 1.0, "F": 0.5}}))
  out = bench.by_question_kind(str(records), str(pred))
  assert out == {"motion_of_object": {"n": 1, "accuracy": 100.0, "tIoU": 0.0, "J": 100.0, "F": 50.0},
                 "shape_of_colour": {"n": 2, "accuracy": 50.0, "tIoU": 75.0, "J": 37.5, "F": 50.0}}
  (pred / "per_entry.json").write_text(json.dumps({"zzz": {"correct": True, "IoU": 1.0, "J": 1.0, "F": 1.0}}))
  with pytest.raises(KeyError, match="'zzz'"):
    bench.by_question_kind(str(records), str(pred))
