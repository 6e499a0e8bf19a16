"""The demo-result checker (launch/check_results.py) on a recorded 2-step `:tiny` run:
a rerun matches to the printed digits, a changed printed digit is caught and named, digits past the printed ones
are not compared. The demo tables themselves are rechecked only on request: `pytest -m demo`
(tests/test_demo_results.py)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import check_results as results  # noqa: E402  (launch/check_results.py)

COMMAND = ["python", "launch/train.py", "--config=configs/ovqa_msrvtt.py:tiny", "--workdir={workdir}",
           "--config.total_steps=2", "--config.checkpoint_every_steps=2"]
PRINTED = {"final_metrics.json": {"eval.test.mAcc": 2, "eval.test.total": 2, "eval.test.BNG": 2, "train.loss": 4}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Both trainings share a persistent XLA cache (the run-wide one of conftest.py when there is one, so other modules'
  `:tiny` trainings count too): the rerun computes every number anew but compiles nothing."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("xla_cache"))
  return dict(os.environ, PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, env):
  folder = tmp_path_factory.mktemp("results") / "tiny"
  out = subprocess.run([sys.executable, "launch/check_results.py", str(folder), "--record",
                        f"--printed={json.dumps(PRINTED)}", "--", *COMMAND], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return folder


def test_record_holds_command_commit_and_printed_files(recorded):
  rec = json.loads((recorded / "record.json").read_text())
  assert rec["command"] == COMMAND and rec["printed"] == PRINTED
  assert "commit" in rec and "dirty" in rec  # the checkout's code version (a git checkout runs the tests)
  assert rec["cpu"] == results.cpu_model()  # XLA's CPU code differs between processors
  final = json.loads((recorded / "final_metrics.json").read_text())
  assert final["step"] == 2 and 0.0 <= final["eval"]["test"]["mAcc"] <= 100.0


def test_check_names_a_different_cpu(recorded, tmp_path, capsys):
  folder = tmp_path / "other_cpu"
  folder.mkdir()
  rec = json.loads((recorded / "record.json").read_text())
  for name in rec["printed"]:
    (folder / name).write_text((recorded / name).read_text())
  (folder / "record.json").write_text(json.dumps(dict(rec, cpu="Some Other CPU")))
  assert results.check(str(folder), workdir=str(recorded)) == []  # the same files: no mismatch, but a note
  assert "note: recorded on CPU 'Some Other CPU', checking on" in capsys.readouterr().out
  assert results.check(str(recorded), workdir=str(recorded)) == []
  assert "recorded on CPU" not in capsys.readouterr().out


def test_rerun_matches_and_a_changed_digit_is_named(recorded, env, tmp_path):
  # The command line reruns the recorded command into a temporary workdir: a second, independent training.
  out = subprocess.run([sys.executable, "launch/check_results.py", str(recorded)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.strip().endswith(f"{recorded}: OK, every printed number matches")

  # Compare against the committed copy itself, changed in and beyond the printed digits.
  rerun = tmp_path / "rerun"
  rerun.mkdir()
  (rerun / "final_metrics.json").write_text((recorded / "final_metrics.json").read_text())
  final = json.loads((recorded / "final_metrics.json").read_text())
  assert results.compare(str(recorded), str(rerun)) == []
  test = final["eval"]["test"]
  test["total"] = float(f"{test['total']:.2f}")  # the digits past the printed two change: still equal
  test["mAcc"] += 0.01  # the last printed digit changes
  (rerun / "final_metrics.json").write_text(json.dumps(final))
  bad = results.compare(str(recorded), str(rerun))
  a, b = f"{test['mAcc'] - 0.01:.2f}", f"{test['mAcc']:.2f}"
  assert bad == [f"final_metrics.json eval.test.mAcc: committed {a}, rerun {b}"]
  out = subprocess.run([sys.executable, "launch/check_results.py", str(recorded), f"--workdir={rerun}"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and f"MISMATCH {bad[0]}" in out.stdout, out.stdout + out.stderr


def test_record_refuses_what_it_could_not_check(tmp_path):
  with pytest.raises(ValueError, match="no '{workdir}' argument"):
    results.record(str(tmp_path / "r"), ["python", "launch/train.py", "--workdir=runs/x"], PRINTED)
  work = tmp_path / "w"
  work.mkdir()
  (work / "final_metrics.json").write_text(json.dumps({"eval": {"test": {"mAcc": "n/a"}}}))
  with pytest.raises(KeyError, match="no key 'train.loss'"):
    results.record(str(tmp_path / "r"), COMMAND, {"final_metrics.json": {"train.loss": 4}}, workdir=str(work))
  with pytest.raises(TypeError, match="'eval.test.mAcc' is 'n/a', not a number"):
    results.record(str(tmp_path / "r"), COMMAND, {"final_metrics.json": {"eval.test.mAcc": 2}}, workdir=str(work))


def test_same_code_compares_code_paths_of_commits():
  version = results.code_version()
  if not version:
    pytest.skip("not a git checkout")
  head = {"commit": version["commit"], "dirty": False}
  assert results.same_code(head, dict(head))
  assert not results.same_code(head, dict(head, dirty=True))
  assert not results.same_code(head, {})
  assert not results.same_code(head, {"commit": "0" * 40, "dirty": False})
