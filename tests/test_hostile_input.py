"""Hostile input: every case stops with an error that names the thing at fault; nothing is silently dropped.

Cases run `train_and_evaluate` (in this process) on a copy of the small synthetic OVQA world that is damaged in one
way each, with a 2-layer, 32-wide random BERT so that the runs are cheap.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from evqa_jax.data import records
from evqa_jax.data import tfrecord

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = os.path.join(REPO, "data", "synthetic_ovqa_small", "records")
# Most cases train or start the same tiny config: its compiled steps are reused across tests.
pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")


def tiny_config(data_dir):
  from configs import ovqa_msrvtt
  c = ovqa_msrvtt.get_config("tiny")
  c.data.dir = str(data_dir)
  c.verbalizer.variant = "A"
  c.data.eval_splits = ()
  c.total_steps = 1
  c.checkpoint_every_steps = 1
  return c


def train(config, workdir):
  from evqa_jax.train import train_and_evaluate
  return train_and_evaluate(config, str(workdir))


@pytest.fixture(scope="module")
def world():
  if not os.path.exists(os.path.join(SMALL, "metadata.json")):
    from data_prep import synthetic_ovqa
    synthetic_ovqa.ensure_world(os.path.dirname(SMALL), preset="small")
  return SMALL


@pytest.fixture
def data(world, tmp_path):
  """A private copy of the small world's records."""
  out = tmp_path / "records"
  shutil.copytree(world, out)
  return out


def _train_shard(data_dir):
  return records.split_paths(str(data_dir), "train")[0]


def test_corrupt_tfrecord_names_file_and_offset(data, tmp_path):
  path = _train_shard(data)
  offsets = tfrecord.load_index(path)
  with open(path, "r+b") as f:  # flip one payload byte of every record: data CRC mismatch wherever it is read
    for off in offsets.tolist():
      f.seek(int(off) + tfrecord.HEADER_BYTES + 5)
      b = f.read(1)
      f.seek(int(off) + tfrecord.HEADER_BYTES + 5)
      f.write(bytes([b[0] ^ 0xFF]))
  with pytest.raises(Exception) as e:
    train(tiny_config(data), tmp_path / "w")
  msg = str(e.value)
  assert os.path.basename(path) in msg and "byte offset" in msg and "CRC" in msg, msg


def test_truncated_record_file_fails_at_start(data, tmp_path):
  path = _train_shard(data)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) * 2 // 3)
  with pytest.raises(ValueError) as e:
    train(tiny_config(data), tmp_path / "w")
  msg = str(e.value)
  assert "damaged or truncated" in msg and os.path.basename(path) in msg and "'train'" in msg, msg
  assert not os.path.exists(tmp_path / "w" / "checkpoints"), "failed before any step"


def test_wrong_feature_dimension_names_field_and_record(data, tmp_path):
  meta_path = data / "metadata.json"
  meta = json.loads(meta_path.read_text())
  meta["splits"]["train"]["features"]["video"]["shape"] = [10, 512]  # records hold [10, 768]
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(Exception) as e:
    train(tiny_config(data), tmp_path / "w")
  msg = str(e.value)
  assert "'video'" in msg and "train-00000-of-00001.tfrecord" in msg and "record" in msg, msg


def test_frame_count_of_config_and_records_disagree(data, tmp_path):
  config = tiny_config(data)
  config.data.num_frames = 8
  with pytest.raises(ValueError, match=r"config.data.num_frames = 8 but the records .* hold 10 frames"):
    train(config, tmp_path / "w")


def test_empty_eval_split(data, tmp_path):
  spec = records.load_spec(str(data), "val")
  records.write_split(str(data), "val", [], spec)
  config = tiny_config(data)
  config.data.eval_splits = ("val",)
  with pytest.raises(ValueError, match=r"evaluation split 'val' of .* has no examples"):
    train(config, tmp_path / "w")


def test_empty_train_split(data, tmp_path):
  spec = records.load_spec(str(data), "train")
  records.write_split(str(data), "train", [], spec)
  with pytest.raises(ValueError, match=r"split 'train' of .* has no examples"):
    train(tiny_config(data), tmp_path / "w")


def test_answer_vocabulary_of_records_and_vocab_json_disagree(data, tmp_path):
  vocab_path = data / "vocab.json"
  vocab = json.loads(vocab_path.read_text())
  # Rename every train answer: the records' answers are then missing from V_train.
  vocab["vocab_train"] = [f"{a}_renamed" for a in vocab["vocab_train"]]
  vocab_path.write_text(json.dumps(vocab))
  with pytest.raises(ValueError) as e:
    train(tiny_config(data), tmp_path / "w")
  msg = str(e.value)
  assert "is not in V_train" in msg and "record" in msg and "vocab.json" in msg, msg


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
  """A workdir holding the tiny config's 1-step checkpoint; tests work on copies of it."""
  work = tmp_path_factory.mktemp("trained") / "w"
  result = train(tiny_config(world), work)
  assert result["step"] == 1 and np.isfinite(result["train"]["loss"])
  return work


def test_workdir_of_another_experiment(world, trained, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(trained, work)
  other = tiny_config(world)
  other.pretrained.shape.hidden_size = 48
  other.pretrained.shape.intermediate_size = 96
  with pytest.raises(ValueError, match=r"holds a checkpoint of another experiment.*pretrained\.shape\.hidden_size "
                                       r"\(checkpoint: 32, config: 48\)"):
    train(other, work)
  # Without config.json the identity stored inside the checkpoint still catches it.
  os.remove(work / "config.json")
  with pytest.raises(ValueError, match=r"checkpoints/1 was written by another experiment.*hidden_size"):
    train(other, work)


def _launch(*args):
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run([sys.executable, os.path.join(REPO, "launch/train.py"), *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)


def test_unknown_config_key_is_named(tmp_path):
  out = _launch("--config=configs/ovqa_msrvtt.py:demo,small", f"--workdir={tmp_path}",
                "--config.verbalizer.epss=0.3", "--config.seed=3")
  assert out.returncode == 2
  # One line naming the key, the config and the closest field; no traceback.
  assert ("error: --config.verbalizer.epss: configs/ovqa_msrvtt.py:demo,small has no field 'verbalizer.epss'; "
          "did you mean verbalizer.eps") in out.stderr, out.stderr[-2000:]
  assert "Traceback" not in out.stderr and not os.listdir(tmp_path)


def test_override_check_accepts_existing_keys():
  from launch import overrides
  argv = ["--config=configs/evqa_gen.py:demo", "--config.model.frame.temporal_shift=0.25", "--noconfig.model.use_adapters",
          "--config.eval.modes=('gen','mcq')"]
  assert overrides.check_overrides(argv) == []
  (error,) = overrides.check_overrides(argv + ["--config.model.frame.shift=1"])
  assert error.startswith("--config.model.frame.shift: configs/evqa_gen.py:demo has no field 'model.frame.shift'; "
                          "did you mean model.frame.temporal_shift"), error


def test_unknown_config_variant_is_named(tmp_path):
  out = _launch("--config=configs/ovqa_msrvtt.py:demo,smal", f"--workdir={tmp_path}")
  assert out.returncode == 2 and out.stderr.startswith(  # one line, no absl FATAL traceback (tests/test_config_loading.py)
      "error: --config=configs/ovqa_msrvtt.py:demo,smal: unknown variant(s) ['smal']; known: "), out.stderr[-2000:]
  assert len(out.stderr.splitlines()) == 1 and not os.listdir(tmp_path)


def test_nan_loss_stops_with_the_step_and_workdir(world, tmp_path):
  """A diverging run: with lr 1e30, the first Adam step moves every trainable weight by about 1e30, so the loss at
  step 1 (initial parameters) is finite and the one at step 2 is not. The run stops there, before any checkpoint or
  history row of step 2 is written."""
  c = tiny_config(world)
  c.optim.lr = 1e30
  c.optim.warmup_fraction = 0.0  # the first update uses the full lr (a warm-up would start it at 0)
  c.total_steps = 3
  c.checkpoint_every_steps = 3
  work = tmp_path / "w"
  with pytest.raises(FloatingPointError) as e:
    train(c, work)
  assert str(e.value) == f"loss is nan at step 2 (workdir {work})"
  rows = [json.loads(line) for line in (work / "train_history.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1] and np.isfinite(rows[0]["loss"])


def test_data_pipeline_changed_under_a_checkpoint(world, trained, tmp_path):
  """Batch size and seed are part of the experiment's identity (issue 39: the whole config is); the checkpointed
  data iterator was made for them too, so even with the identity gone (no config.json, no meta/, unverified
  checkpoints allowed) resuming with another batch size or seed stops instead of continuing at a different
  position."""
  work = tmp_path / "w"
  shutil.copytree(trained, work)
  for field, value in (("batch_size", 16), ("seed", 7)):
    c = tiny_config(world)
    setattr(c, field, value)
    with pytest.raises(ValueError, match=rf"holds a checkpoint of another experiment; it differs in {field} "):
      train(c, work)
  shutil.rmtree(work / "checkpoints" / "1" / "meta")
  for field, value in (("batch_size", 16), ("seed", 7)):
    os.remove(work / "config.json")  # (a refused start has written its own)
    c = tiny_config(world)
    c.total_steps = 2
    c.checkpoint.allow_unverified = True
    setattr(c, field, value)
    with pytest.raises(ValueError) as e:
      train(c, work)
    msg = str(e.value)
    assert msg.startswith(f"cannot resume from {work}/checkpoints/1: "), (field, msg)
    assert "the checkpointed data pipeline differs from the one being restored" in msg, (field, msg)
