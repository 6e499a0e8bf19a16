"""train_and_evaluate on the OVQA demo (`:demo,small`: MiniLM-L6 + GNN verbalizer on the small synthetic world).

One run on 8 simulated devices with mesh data x model = 4 x 2 (in this process) and the same run on 1 device (a
subprocess with its own XLA_FLAGS) must give the same loss curve; the metrics the trainer wrote must equal those of
the command-line evaluator re-scoring the written predictions.csv.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

import device_parity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
CONFIG = textwrap.dedent(f"""
    from configs import ovqa_msrvtt

    def get_config(arg=None):
      c = ovqa_msrvtt.get_config("demo,small")
      c.total_steps = {STEPS}
      c.checkpoint_every_steps = {STEPS}
      if arg == "mesh42":
        c.mesh_shape = (4, 2)
      else:                      # the 1-device reference only needs the loss curve
        c.data.eval_splits = ()
      return c
""")


def _load_config(path, arg):
  spec = importlib.util.spec_from_file_location("ovqa_test_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("train_ovqa")
  cfg = root / "ovqa_demo_small.py"
  cfg.write_text(CONFIG)
  one = str(root / "one_device")
  ref = device_parity.start_one_device_run(f"{cfg}:one", one)
  import jax
  from data_prep import worlds
  from evqa_jax.train import train_and_evaluate
  assert jax.device_count() == 8
  eight = str(root / "eight_devices")
  cwd = os.getcwd()
  os.chdir(REPO)  # the demo config names its data directory relative to the repository
  try:
    config = _load_config(str(cfg), "mesh42")
    worlds.ensure_synthetic_world(config)  # the launch side's job; the library never builds data
    result = train_and_evaluate(config, eight)
  finally:
    os.chdir(cwd)
  device_parity.finish(ref)
  return {"one": one, "eight": eight, "result": result}


def test_train_and_evaluate_gives_real_numbers(runs):
  result, eight = runs["result"], runs["eight"]
  history = device_parity.history(eight)
  assert [r["step"] for r in history] == list(range(1, STEPS + 1))
  for row in history:
    assert math.isfinite(row["loss"]) and row["loss"] > 0 and math.isfinite(row["grad_norm"])
    assert 0.0 <= row["accuracy"] <= 1.0
  # The first loss is near log |V_train| (untrained answer scores are close to uniform), not 0 or huge.
  with open(os.path.join(REPO, "data", "synthetic_ovqa_small", "records", "vocab.json")) as f:
    n_train = len(json.load(f)["vocab_train"])
  assert 0.3 * math.log(n_train) < history[0]["loss"] < 3.0 * math.log(n_train)
  assert result["step"] == STEPS and result["train"]["loss"] == history[-1]["loss"]

  with open(os.path.join(eight, "eval", "test_metrics.json")) as f:
    written = json.load(f)
  assert written["step"] == STEPS
  for key in ("base", "common", "rare", "unseen", "total", "mAcc", "BNG"):
    assert 0.0 <= written[key] <= 100.0 or key == "BNG", (key, written[key])
  assert written["num_samples_total"] == 200
  assert written["BNG"] == pytest.approx(written["base"] - written["non_base"])

  pred_dir = os.path.join(eight, "eval", f"test_step{STEPS}")
  rescored = os.path.join(str(runs["eight"]), "rescored.json")
  records = os.path.join(REPO, "data", "synthetic_ovqa_small", "records")
  subprocess.run([sys.executable, "-m", "evqa_jax.evaluate.ovqa", "--train-csv", os.path.join(records, "train.csv"),
                  "--test-csv", os.path.join(records, "test.csv"), "--pred", os.path.join(pred_dir, "predictions.csv"),
                  "--out", rescored], cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=REPO))
  with open(rescored) as f:
    cli = json.load(f)
  for key in ("base", "common", "rare", "unseen", "non_base", "total", "mAcc", "BNG"):
    assert written[key] == pytest.approx(cli[key], abs=1e-9), key
  for key in [k for k in cli if k.startswith("num_")]:
    assert written[key] == cli[key], key
  with open(os.path.join(pred_dir, "predictions.csv")) as f:
    rows = f.read().splitlines()
  assert rows[0] == "index,prediction" and len(rows) == 201
  assert sorted(int(r.split(",")[0]) for r in rows[1:]) == list(range(200))


def test_one_device_and_eight_devices_give_the_same_loss_curve(runs):
  device_parity.assert_same_loss_curve(runs["one"], runs["eight"], STEPS, keys=("loss", "grad_norm", "accuracy"))
