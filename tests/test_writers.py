"""TensorBoard event files without TensorFlow (evqa_jax.train.writers), read back by tensorboard's own EventAccumulator.

The training run is `launch/train.py` in a subprocess that reports, at its end, whether any module imported
TensorFlow: the process of a training job must not (it used to, through clu's summary writer).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_resume import TINY_CONFIG  # the 2-layer, 32-wide BERT run of the resume tests (6 steps)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _accumulator(logdir):
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
  acc.Reload()
  return acc


def _scalars(acc, tag):
  return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_event_file_round_trip(tmp_path):
  from evqa_jax.train import writers
  from tensorboard.plugins.hparams import metadata
  logdir = str(tmp_path / "tb")
  w = writers.SummaryWriter(logdir)
  w.write_hparams({"trainable_params": 1234, "devices": 8})
  w.write_scalars(1, {"train/loss": 2.5, "train/lr": 0.1})
  w.write_scalars(4, {"train/loss": 1.25, "train/lr": 0.05, "val/count": 7})
  w.close()
  assert os.listdir(logdir) == [os.path.basename(w.path)] and "tfevents" in w.path
  acc = _accumulator(logdir)
  assert sorted(acc.Tags()["scalars"]) == ["train/loss", "train/lr", "val/count"]
  assert _scalars(acc, "train/loss") == [(1, 2.5), (4, 1.25)]
  # TensorBoard scalars are float32: 0.1 comes back as float32(0.1).
  assert _scalars(acc, "train/lr") == [(1, float(np.float32(0.1))), (4, float(np.float32(0.05)))]
  assert _scalars(acc, "val/count") == [(4, 7.0)]
  content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
  hparams = metadata.parse_session_start_info_plugin_data(content).hparams
  assert {k: v.number_value for k, v in hparams.items()} == {"trainable_params": 1234.0, "devices": 8.0}


def test_logging_only_writer_writes_no_file(tmp_path):
  from evqa_jax.train import writers
  w = writers.SummaryWriter(str(tmp_path / "tb"), write_events=False)
  w.write_hparams({"a": 1})
  w.write_scalars(1, {"train/loss": 1.0})
  w.close()
  assert not os.path.exists(tmp_path / "tb")


def test_launch_train_logs_to_tensorboard_without_importing_tensorflow(tmp_path):
  cfg = tmp_path / "tiny_ovqa.py"
  cfg.write_text(TINY_CONFIG)
  workdir = str(tmp_path / "run")
  script = textwrap.dedent(f"""
      import runpy, sys
      sys.argv = ["launch/train.py", "--config={cfg}", "--workdir={workdir}"]
      try:
        runpy.run_path("launch/train.py", run_name="__main__")
      except SystemExit as e:
        if e.code:
          raise
      print("TENSORFLOW_IMPORTED", "tensorflow" in sys.modules)
  """)
  env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  assert "TENSORFLOW_IMPORTED False" in proc.stdout, proc.stdout[-2000:]

  with open(os.path.join(workdir, "train_history.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  acc = _accumulator(os.path.join(workdir, "tensorboard"))
  for key in ("loss", "grad_norm", "accuracy", "lr"):
    assert _scalars(acc, f"train/{key}") == [(r["step"], float(np.float32(r[key]))) for r in rows], key
