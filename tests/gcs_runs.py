"""A task's run with its records and workdir on gs:// (the emulator of tests/gcs_emulator.py), compared with the
same run on local disk: the shared body of tests/test_gcs_tasks.py (VIOLIN, against a local `launch/train.py` run)
and tests/test_mesh_sharding_evqa.py (E-VQA, against the trainer's 4 x 2 run in that test's own process)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_for(gcs_env: dict, cache) -> dict:
  """The environment of a `launch/*.py` subprocess: the emulator's variables, the repository on PYTHONPATH, its own
  EVQA_CACHE (where its staged copies go; the suite's XLA compilation cache is inherited), unbuffered output (read
  while it runs)."""
  env = dict(os.environ, **gcs_env)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"
  env["EVQA_CACHE"] = str(cache)
  return env


def run_script(args, env, what: str, timeout: float = 400) -> str:
  """Runs `python <args>` in the repository; asserts exit status 0 (with the output's end); -> its output."""
  proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-4000:]}"
  return proc.stdout


def files(root) -> dict:
  """{relative path: bytes} of every file under `root` (local or gs://)."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  out = {}

  def walk(folder, prefix):
    for child in folder.iterdir():
      if child.is_dir():
        walk(child, prefix + child.name + "/")
      else:
        out[prefix + child.name] = child.read_bytes()

  walk(io.epath_of(root), "")
  return out


def upload_world(config, bucket: str, name: str) -> str:
  """Builds `config`'s synthetic world (on first use, as launch/train.py does) and uploads its records to
  gs://bucket/name/records; -> that URL."""
  from data_prep import worlds  # pylint: disable=g-import-not-at-top
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  cwd = os.getcwd()
  os.chdir(REPO)  # the configs name their worlds relative to the repository
  try:
    worlds.ensure_synthetic_world(config)
  finally:
    os.chdir(cwd)
  remote = f"gs://{bucket}/{name}/records"
  io.upload(os.path.join(REPO, config.data.dir), remote)
  return remote


def train_on_gcs_equals(local: str, gcs_env: dict, cache, config_args, bucket: str, name: str, step: int,
                        predictions) -> tuple:
  """Trains `config_args` (`--config=...` and overrides) with records and workdir on gs://bucket/name and asserts
  that it equals the finished run in the local folder `local`: final metrics, the metric log, and every file of
  its step-`step` evaluation (`predictions`, files or non-empty folders, among them; JSON compared as data, the rest
  byte for byte).
  -> (the gs:// workdir, its final metrics, the subprocess environment, the gs:// run's config arguments)."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from launch import overrides  # pylint: disable=g-import-not-at-top
  config = overrides.load_config(os.path.join(REPO, config_args[0].removeprefix("--config=")))
  remote_records = upload_world(config, bucket, name)
  remote = f"gs://{bucket}/{name}/run"
  env = env_for(gcs_env, cache)
  on_gcs = [*config_args, f"--config.data.dir={remote_records}", f"--workdir={remote}"]
  run_script(["launch/train.py", *on_gcs], env, "the run on gs://")
  assert not os.path.exists(os.path.join(REPO, "gs:")), "a gs:// path was used as a local folder"

  final = json.loads(io.epath_of(f"{remote}/final_metrics.json").read_text())
  assert final == json.loads(io.epath_of(f"{local}/final_metrics.json").read_text())
  assert io.epath_of(f"{remote}/train_history.jsonl").read_text() == \
      io.epath_of(f"{local}/train_history.jsonl").read_text()
  got, want = files(f"{remote}/eval/test_step{step}"), files(f"{local}/eval/test_step{step}")
  assert sorted(got) == sorted(want), (sorted(got), sorted(want))
  for name in predictions:  # a file, or a folder with files in it
    assert any(rel == name or rel.startswith(name + "/") for rel in got), (name, sorted(got))
  for rel in want:
    if rel.endswith(".json"):
      assert json.loads(got[rel]) == json.loads(want[rel]), rel
    else:
      assert got[rel] == want[rel], rel
  return remote, final, env, on_gcs
