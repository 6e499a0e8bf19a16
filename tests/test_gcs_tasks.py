"""VIOLIN end to end on gs:// (tests/test_gcs.py does OVQA, killed and resumed; tests/test_mesh_sharding_evqa.py
E-VQA, on the 4 x 2 mesh): the tests' `:small` run of configs/violin.py with its records and workdir on a Cloud
Storage API served on 127.0.0.1 (tests/gcs_emulator.py), equal to the same run on local disk (metrics, the metric
log and the prediction files), and scored again with launch/evaluate.py on gs://.
"""

import json

import gcs_emulator
import gcs_runs
import pytest

BUCKET = "evqa-tasks"


@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator.running(BUCKET) as env, gcs_emulator.this_process_pointed_at(env):
    yield env


def test_violin_run_on_gcs_equals_local(gcs, tmp_path):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  config_args = ["--config=configs/violin.py:small"]
  local, step = str(tmp_path / "local"), 4
  # One after the other: the run on gs:// then finds the local run's steps in the suite's compilation cache.
  gcs_runs.run_script(["launch/train.py", *config_args, f"--workdir={local}"],
                      gcs_runs.env_for(gcs, tmp_path / "cache"), "the local run")
  remote, final, env, on_gcs = gcs_runs.train_on_gcs_equals(local, gcs, tmp_path / "cache", config_args, BUCKET,
                                                            "violin", step, ["predictions.json"])
  assert 0 <= final["eval"]["test"]["accuracy"] <= 100
  # launch/evaluate.py on the gs:// run (restore from gs://, records from gs://) scores what training did.
  gcs_runs.run_script(["launch/evaluate.py", *on_gcs, "--checkpoint=last"], env, "launch/evaluate.py on gs://")
  scored = json.loads(io.epath_of(f"{remote}/evaluate_step{step}.json").read_text())
  assert scored["step"] == step and scored["eval"]["test"] == final["eval"]["test"]
