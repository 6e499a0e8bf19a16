"""launch/behaviour_check.py --compare on hand-made runs: equal runs, a last-digit difference, timing fields ignored,
a run on one side only, single runs, and directories holding no run."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(d, loss=0.5, steps_per_sec=1.0):
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "final_metrics.json"), "w") as f:
    json.dump({"step": 2, "eval": {"test": {"mAcc": 71.34493670886076}}, "train": {"steps_per_sec": steps_per_sec}}, f)
  with open(os.path.join(d, "train_history.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "loss": 0.75, "steps_per_sec": steps_per_sec}) + "\n")
    f.write(json.dumps({"step": 2, "loss": loss}) + "\n")


def _compare(a, b):
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "behaviour_check.py"), "--compare", str(a),
                         str(b)], capture_output=True, text=True, cwd=ROOT, check=False)
  return proc.returncode, proc.stdout


@pytest.fixture
def sides(tmp_path):
  a, b = tmp_path / "before", tmp_path / "after"
  for name in ("eps_0.0", "B", "ovqa_small"):  # a RUNS name and two sweep points
    _run(str(a / name), steps_per_sec=1.0)
    _run(str(b / name), steps_per_sec=2.5)  # timing differs: not a difference
  return a, b


def test_any_two_directories_of_runs_compare_equal_in_order(sides):
  rc, out = _compare(*sides)
  assert rc == 0
  assert out.splitlines() == ["ovqa_small: equal", "B: equal", "eps_0.0: equal"]  # RUNS' order, then sorted


def test_a_last_digit_difference_and_a_missing_run_fail(sides):
  a, b = sides
  _run(str(b / "B"), loss=0.5000001)
  _run(str(a / "C"))
  _run(str(a / "D"))
  os.makedirs(b / "D")  # still training: no final_metrics.json yet
  rc, out = _compare(a, b)
  assert rc == 1
  assert "B: 1 differences\n    /train_history.jsonl[1]/loss: 0.5 != 0.5000001\n" in out
  assert "C: missing in after" in out and "D: missing in after" in out and "eps_0.0: equal" in out


def test_single_runs_and_empty_directories(tmp_path):
  _run(str(tmp_path / "x"))
  _run(str(tmp_path / "y"))
  assert _compare(tmp_path / "x", tmp_path / "y") == (0, ".: equal\n")
  os.makedirs(tmp_path / "empty1")
  os.makedirs(tmp_path / "empty2")
  rc, out = _compare(tmp_path / "empty1", tmp_path / "empty2")
  assert rc == 1 and out.startswith("no run")
