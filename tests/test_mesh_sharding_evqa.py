"""E-VQA: 1 device and the 4x2 mesh give the same losses (tests/mesh_equivalence.py); the 4 x 2 run is the
trainer's `train_and_evaluate`, evaluated, and its metrics equal the command-line scorer's on its written files.
Then the same run from `launch/train.py` with its records and workdir on gs:// (a Cloud Storage API on 127.0.0.1,
tests/gcs_emulator.py) equals it: metrics, the metric log and every prediction file, mask PNGs byte for byte.
(The pure data-parallel 8 x 1 mesh and the model-heavier 2 x 4 are OVQA's and VIOLIN's: every compile of the E-VQA
step costs about half a minute of the suite, and the gs:// run finds the 4 x 2 run's in the suite's compilation
cache.) A module of its own so that the xdist workers share the tasks' compiles."""

import json
import os

import numpy as np
import pytest

import gcs_emulator
import gcs_runs
import mesh_equivalence
from evqa_jax.evaluate import st_evidence as st_eval

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


BUCKET = "evqa-mesh"


def test_one_device_and_mesh_4x2_give_the_same_losses_and_evaluation_and_on_gcs(monkeypatch, tmp_path):
  config = mesh_equivalence.config_in_repo("evqa", monkeypatch)  # one encoder layer, a 16 x 16 patch grid
  workdir = tmp_path / "mesh42"
  result = mesh_equivalence.assert_meshes_give_the_same_losses(config, str(workdir), meshes=())
  steps = mesh_equivalence.STEPS
  with open(workdir / "train_history.jsonl") as f:
    history = [json.loads(line) for line in f]
  for row in history:  # every loss term is logged, finite
    for key in ("answer_ce", "temporal_bce", "mask_bce", "dice_loss", "grad_norm"):
      assert np.isfinite(row[key]), (row["step"], key)
  final = json.load(open(workdir / "final_metrics.json"))
  test = final["eval"]["test"]
  assert final["step"] == steps and np.isfinite(final["train"]["loss"])
  assert (final["best"]["step"], final["best"]["split"]) == (steps, "test") and final["best"]["eval"]["test"] == test
  for k in ("accuracy", "t_mean", "JF", "mIoU"):
    assert 0.0 <= test[k] <= 100.0 and test[k] == pytest.approx(result["eval"]["test"][k])
  records = os.path.abspath(config.data.dir)
  pred_dir = workdir / "eval" / f"test_step{steps}"
  cli = st_eval.main(["--gt-csv", os.path.join(records, "test.csv"), "--gt-masks", os.path.join(records, "gt_masks"),
                      "--pred", str(pred_dir / "predictions.json"), "--pred-masks", str(pred_dir / "pred_masks"),
                      "--out", str(tmp_path / "cli.json")])
  for k in ("accuracy", "t_mean", "J", "F"):
    assert cli[k] == pytest.approx(test[k])
  with open(os.path.join(records, "test.csv")) as f:
    n_test = sum(1 for _ in f) - 1
  assert len(json.load(open(pred_dir / "predictions.json"))) == n_test

  # launch/train.py on the same 4 x 2 mesh, records and workdir on gs://: the in-process run's results exactly. (Its
  # launch/evaluate.py on gs:// is OVQA's and VIOLIN's: the same restore and writers.)
  with gcs_emulator.running(BUCKET) as env, gcs_emulator.this_process_pointed_at(env):
    gcs_runs.train_on_gcs_equals(str(workdir), env, tmp_path / "cache",
                                 ["--config=configs/evqa_gen.py:tiny", "--config.mesh_shape=(4,2)"], BUCKET, "evqa",
                                 steps, ["predictions.json", "pred_masks"])
