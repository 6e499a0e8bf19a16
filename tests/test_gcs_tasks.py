"""VIOLIN and E-VQA end to end on gs:// (tests/test_gcs.py does OVQA, killed and resumed): the tests' `:small` run
of configs/violin.py and `:tiny` run of configs/evqa_gen.py (the small world, the smallest model: every prediction
file, masks included) with its records and workdir on a Cloud Storage API served on 127.0.0.1
(tests/gcs_emulator.py), equal to the same run on local disk: metrics, the metric log and the prediction files
(E-VQA's predicted mask PNGs included); VIOLIN's is scored again with launch/evaluate.py on gs://.
"""

import json
import os
import subprocess
import sys

import pytest

import gcs_emulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "evqa-tasks"


@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator.running(BUCKET) as env, gcs_emulator.this_process_pointed_at(env):
    yield env


def _env(gcs_env, cache):
  env = dict(os.environ, **gcs_env)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  env["EVQA_CACHE"] = str(cache)
  return env


def _popen(args, env):
  return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _wait(proc, what, timeout=400):
  out = proc.communicate(timeout=timeout)[0]
  assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
  return out


def _files(root) -> dict:
  """{relative path: bytes} of every file under `root` (local or gs://)."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  base = io.epath_of(root)
  out = {}

  def walk(folder, prefix):
    for child in folder.iterdir():
      if child.is_dir():
        walk(child, prefix + child.name + "/")
      else:
        out[prefix + child.name] = child.read_bytes()

  walk(base, "")
  return out


def _run_on_gcs_equals_local(gcs_env, tmp_path, config_arg, name, step, predictions, evaluate=True):
  """Trains `config_arg` locally and on gs:// (records uploaded from the local world) side by side, compares, and
  (with `evaluate`) checks that launch/evaluate.py on the gs:// run scores what training did; returns the gs:// run's
  final metrics."""
  import importlib  # pylint: disable=g-import-not-at-top
  from data_prep import worlds  # pylint: disable=g-import-not-at-top
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  path, _, variant = config_arg.partition(":")
  config = importlib.import_module("configs." + os.path.splitext(os.path.basename(path))[0]).get_config(variant)
  cwd = os.getcwd()
  os.chdir(REPO)  # the config's data.dir is relative to the repository
  try:
    worlds.ensure_synthetic_world(config)  # the small world, generated on first use
  finally:
    os.chdir(cwd)
  records = os.path.join(REPO, config.data.dir)
  remote_records = f"gs://{BUCKET}/{name}/records"
  io.upload(records, remote_records)

  env = _env(gcs_env, tmp_path / "cache")
  local, remote = str(tmp_path / "local"), f"gs://{BUCKET}/{name}/run"
  on_gcs = [f"--config={config_arg}", f"--config.data.dir={remote_records}", f"--workdir={remote}"]
  # One after the other: the run on gs:// then finds the local run's steps in the suite's compilation cache.
  _wait(_popen(["launch/train.py", f"--config={config_arg}", f"--workdir={local}"], env), "the local run")
  _wait(_popen(["launch/train.py", *on_gcs], env), "the run on gs://")
  assert not os.path.exists(os.path.join(REPO, "gs:")), "a gs:// path was used as a local folder"

  final = json.loads(io.epath_of(f"{remote}/final_metrics.json").read_text())
  assert final == json.loads(io.epath_of(f"{local}/final_metrics.json").read_text())
  assert io.epath_of(f"{remote}/train_history.jsonl").read_text() == \
      io.epath_of(f"{local}/train_history.jsonl").read_text()
  got, want = _files(f"{remote}/eval/test_step{step}"), _files(f"{local}/eval/test_step{step}")
  assert sorted(got) == sorted(want) and set(predictions) <= set(got), (sorted(got), sorted(want))
  for rel in want:
    if rel.endswith(".json"):
      assert json.loads(got[rel]) == json.loads(want[rel]), rel
    else:
      assert got[rel] == want[rel], rel

  if evaluate:
    _wait(_popen(["launch/evaluate.py", *on_gcs, "--checkpoint=last"], env), "launch/evaluate.py on gs://")
    scored = json.loads(io.epath_of(f"{remote}/evaluate_step{step}.json").read_text())
    assert scored["step"] == step and scored["eval"]["test"] == final["eval"]["test"]
  return final


def test_violin_run_on_gcs_equals_local(gcs, tmp_path):
  final = _run_on_gcs_equals_local(gcs, tmp_path, "configs/violin.py:small", "violin", 4, ["predictions.json"])
  assert 0 <= final["eval"]["test"]["accuracy"] <= 100


def test_evqa_gen_run_on_gcs_equals_local(gcs, tmp_path):
  # launch/evaluate.py on gs:// is OVQA's (tests/test_gcs.py) and VIOLIN's (above): the same restore and writers, and
  # one more E-VQA process would add its start-up and compiles to the suite. The trainer's final evaluation here
  # writes every E-VQA prediction file (mask PNGs included) to gs://.
  final = _run_on_gcs_equals_local(gcs, tmp_path, "configs/evqa_gen.py:tiny", "evqa", 2, ["predictions.json"],
                                   evaluate=False)
  test = final["eval"]["test"]
  assert 0 <= test["accuracy"] <= 100 and 0 <= test["J"] <= 100
