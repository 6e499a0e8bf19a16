"""What the commands print: the pretrained-weights line says what the new and unused tensors are, the console eval
line is short (every metric is in the metrics JSON), only metrics (not counts) are TensorBoard scalars, and
launch/train.py / launch/evaluate.py --help list every config file's variants."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evqa_jax import pretrained

from evqa_jax.models import encoders
from evqa_jax.models import bert
from evqa_jax.train import writers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def test_loaded_weights_line_names_the_new_and_the_unused_tensors(capsys):
  """MiniLM-L6 (6 layers, no MLM head, a pooler) into a 2-layer BERT with adapters and a visual prefix: as E-VQA's
  `:small` loads it."""
  path = pretrained.minilm_dir()
  cfg = bert.BertConfig.from_hf_dir(path, num_hidden_layers=2, use_adapters=True, num_visual_tokens=2, visual_dim=8)
  shapes = jax.eval_shape(lambda: bert.BertLM(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32), visual=jnp.zeros((1, 2, 8)),
      visual_mask=jnp.ones((1, 2), jnp.int32)))
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes["params"])
  encoders.load_encoder_weights("bert", cfg, path, params)
  assert capsys.readouterr().out == (
      f"Loaded bert weights from {path}: 37 loaded; 23 initialised here, not in the checkpoint (16 adapters, "
      "5 MLM head, 2 visual projection); 66 checkpoint keys unused (encoder.layer.2-5.*: layers past "
      "num_hidden_layers, pooler.*: no pooled output)\n")



def test_library_messages_are_printed_by_process_zero_unless_about_one_process(capsys, monkeypatch):
  """evqa_jax.log: the message alone on stdout (a warning prefixed), nothing on stderr (absl's root handler does not
  print it again); on another process only the messages about that process."""
  from evqa_jax import log
  log.info("Resumed from %s at step %d", "w/checkpoints", 4)
  log.warning("checkpoint %s is damaged", "w/3")
  monkeypatch.setattr(log, "process_index", lambda: 1)
  log.info("step 1/2 loss=1")
  log.warning("could not renew the lock", every_process=True)
  out, err = capsys.readouterr()
  assert (out, err) == ("Resumed from w/checkpoints at step 4\nWARNING: checkpoint w/3 is damaged\n"
                        "WARNING: could not renew the lock\n", "")


# An E-VQA generative evaluation's result (the 440-character console line of before).
EVQA = {"F": 8.2343, "J": 5.8036, "JF": 7.0189, "accuracy": 40.0, "format_errors_bad_mask_folder": 0,
        "format_errors_total": 0, "mIoP": 29.439, "mIoU": 29.439, "masks_scored": True, "num_correct": 4,
        "num_entries": 10, "tIoP@0.3": 30.0, "tIoP@0.5": 0.0, "tIoU@0.3": 30.0, "tIoU@0.5": 0.0, "t_mean": 29.439}


def test_eval_line_is_short_and_tensorboard_gets_metrics_only():
  keys = ("accuracy", "mIoU", "mIoP", "tIoU@0.5", "tIoP@0.5", "JF")
  line = writers.format_metrics("eval test @ step 2 (3.2s)", EVQA, keys, "eval/test_step2/metrics.json")
  assert line == ("eval test @ step 2 (3.2s): accuracy=40 mIoU=29.44 mIoP=29.44 tIoU@0.5=0 tIoP@0.5=0 JF=7.019 "
                  "(+5 more in eval/test_step2/metrics.json)")  # F, J, t_mean, tIoU@0.3, tIoP@0.3
  assert writers.metric_scalars("test", EVQA) == {
      "test/F": 8.2343, "test/J": 5.8036, "test/JF": 7.0189, "test/accuracy": 40.0, "test/mIoP": 29.439,
      "test/mIoU": 29.439, "test/tIoP@0.3": 30.0, "test/tIoP@0.5": 0.0, "test/tIoU@0.3": 30.0, "test/tIoU@0.5": 0.0,
      "test/t_mean": 29.439}  # no num_*, format_errors_* or the masks_scored flag
  assert writers.format_metrics("x", {"accuracy": 50.0, "num_clips": 3}) == "x: accuracy=50"


def test_each_task_prints_its_headline_metrics():
  from configs import evqa_gen, evqa_mcq
  from evqa_jax.projects.evqa import task as evqa_task
  from evqa_jax.projects.ovqa import task as ovqa_task
  assert ovqa_task.Task.console_metrics(None) == ("base", "common", "rare", "unseen", "total", "mAcc", "BNG")
  both = type("T", (), {"modes": ("gen", "mcq")})()
  assert evqa_task.Task.console_metrics(both) == ("accuracy", "mIoU", "mIoP", "tIoU@0.5", "tIoP@0.5", "JF",
                                                  "mcq_qa", "mcq_temporal", "mcq_spatial", "mcq_pooled")
  for module, modes in ((evqa_gen, ("gen",)), (evqa_mcq, ("mcq",))):
    assert tuple(module.get_config().eval.modes) == modes
  mcq = type("T", (), {"modes": ("mcq",)})()
  assert evqa_task.Task.console_metrics(mcq) == ("qa", "temporal", "spatial", "pooled")


@pytest.mark.parametrize("script", ["train.py", "evaluate.py"])
def test_help_lists_every_config_files_variants(script):
  from configs import common
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert out.returncode == 0 and "Try --helpfull" in out.stdout, out.stderr[-2000:]  # absl's own --help exits 1
  text = " ".join(out.stdout.split())  # absl wraps the flag help at 80 columns
  files = common.config_files()
  assert len(files) == 8 and "ovqa_msrvtt.py" in files
  for name in files:
    module = __import__(f"configs.{name[:-3]}", fromlist=["VARIANTS"])
    assert f"configs/{name}: {', '.join(sorted(module.VARIANTS))}" in text, name
  assert ("configs/ovqa_msrvtt.py: allinone, authors_eps, baseline, bf16, cvqa, cvqa_mlp, demo, justask, mlmhead, "
          "mlmhead_trained, nbrworld, paper, released, scale, shapes_only, small, tiny, violet, xxlarge") in text


def test_training_eval_line_and_tensorboard_scalars(tmp_path):
  """A 2-step `:tiny` OVQA run: the eval line shows Table 2's columns and where the rest is; the eval scalars in
  TensorBoard are exactly the metrics of eval/test_metrics.json (its counts are not)."""
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/ovqa_msrvtt.py:tiny",
                        f"--workdir={workdir}", "--config.total_steps=2", "--config.checkpoint_every_steps=2"],
                       cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  lines = [line for line in out.stdout.splitlines() if line.startswith("eval ")]
  num = r"-?\d+(\.\d+)?(e-?\d+)?"
  assert len(lines) == 1 and re.fullmatch(
      rf"eval test @ step 2 \(\d+\.\ds\): base={num} common={num} rare={num} unseen={num} total={num} mAcc={num} "
      rf"BNG={num} \(\+1 more in eval/test_step2/metrics.json\)", lines[0]), lines  # the one more: non_base
  results = json.loads((workdir / "eval" / "test_metrics.json").read_text())
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(workdir / "tensorboard"))
  acc.Reload()
  tags = {t for t in acc.Tags()["scalars"] if t.startswith("test/")}
  assert tags == {f"test/{k}" for k in ("base", "common", "rare", "unseen", "total", "mAcc", "BNG", "non_base")}
  assert any(k.startswith("num_") for k in results)  # the counts are in the JSON
