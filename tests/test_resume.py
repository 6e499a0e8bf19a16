"""Exact resume: SIGKILL a training run at random steps, restart it, and get an uninterrupted run's bits.

Also: a damaged newest checkpoint (truncated files) and a half-written one before it are detected, reported, moved
aside, and the run continues from the last good one to the same final parameters and metric log.
"""

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOTAL_STEPS = 6
TINY_CONFIG = textwrap.dedent(f"""
    import ml_collections
    from configs import ovqa_msrvtt

    def get_config(arg=None):
      c = ovqa_msrvtt.get_config("demo,small")
      c.pretrained.dir = ""              # random weights: a 2-layer, 32-wide BERT with MiniLM's tokenizer
      c.pretrained.tokenizer = "pkg:minilm"
      c.pretrained.shape = ml_collections.ConfigDict(dict(
          vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
          max_position_embeddings=64))
      c.verbalizer.variant = "A"
      c.data.eval_splits = ()
      c.total_steps = {TOTAL_STEPS}
      c.checkpoint_every_steps = 1
      c.checkpoint.max_to_keep = 3
      return c
""")


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _start(cfg, workdir):
  return subprocess.Popen([sys.executable, os.path.join(REPO, "launch/train.py"), f"--config={cfg}",
                           f"--workdir={workdir}"], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _rows(workdir) -> int:
  try:
    with open(os.path.join(workdir, "train_history.jsonl")) as f:
      return sum(1 for line in f if line.endswith("\n"))
  except FileNotFoundError:
    return 0


def _finish(proc, what):
  out = proc.communicate(timeout=400)[0]
  assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
  return out


def _read(path):
  with open(path) as f:
    return f.read()


def _final_state(workdir):
  from evqa_jax.runs.checkpointing import load_checkpoint_arrays
  import jax
  step, state = load_checkpoint_arrays(workdir)
  return step, {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state)}


def _assert_same_run(workdir, ref):
  assert _read(os.path.join(workdir, "train_history.jsonl")) == _read(os.path.join(ref, "train_history.jsonl"))
  s1, a = _final_state(ref)
  s2, b = _final_state(workdir)
  assert s1 == s2 == TOTAL_STEPS
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(b[k], a[k], err_msg=k)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  cfg = root / "tiny_ovqa.py"
  cfg.write_text(TINY_CONFIG)
  return {"root": root, "cfg": str(cfg), "ref": str(root / "uninterrupted"), "ref_proc": None}


def test_sigkill_at_random_steps_resumes_bit_identically(setup):
  seed = random.randrange(10**6)
  rng = random.Random(seed)
  kills = sorted(rng.sample(range(1, TOTAL_STEPS - 1), 2))
  ref_proc = _start(setup["cfg"], setup["ref"])  # the uninterrupted run, alongside
  work = str(setup["root"] / "killed")
  killed_at = []
  for target in kills:
    proc = _start(setup["cfg"], work)
    deadline = time.monotonic() + 400
    while _rows(work) < target and proc.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.3))  # anywhere in the step: mid-checkpoint, mid-log line, ...
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
      killed_at.append(_rows(work))
    proc.communicate(timeout=60)
  out = _finish(_start(setup["cfg"], work), "the final restart")
  _finish(ref_proc, "the uninterrupted run")
  assert killed_at, f"no kill landed (seed {seed})"
  assert "Resumed from" in out, out[-2000:]
  _assert_same_run(work, setup["ref"])
  # The log was written as it went: the restart saw rows logged before the kill.
  assert max(killed_at) >= 1, (seed, killed_at)


def test_damaged_checkpoints_fall_back_to_the_last_good_one(setup):
  ref = setup["ref"]
  if not os.path.exists(os.path.join(ref, "final_metrics.json")):  # run alone: make the uninterrupted run here
    _finish(_start(setup["cfg"], ref), "the uninterrupted run")
  work = str(setup["root"] / "damaged")
  shutil.copytree(ref, work)
  ckpts = os.path.join(work, "checkpoints")
  assert sorted(int(n) for n in os.listdir(ckpts) if n.isdigit()) == [4, 5, 6]
  # Step 6: every array file truncated to half its length. Step 5: half-written (array data files missing).
  truncated = 0
  for path in glob.glob(os.path.join(ckpts, "6", "state", "**", "*"), recursive=True):
    if os.path.isfile(path) and "d" in path.split(os.sep)[-2:-1]:
      size = os.path.getsize(path)
      with open(path, "r+b") as f:
        f.truncate(size // 2)
      truncated += 1
  assert truncated
  for d in glob.glob(os.path.join(ckpts, "5", "state", "**", "d"), recursive=True):
    shutil.rmtree(d)
  out = _finish(_start(setup["cfg"], work), "the restart over damaged checkpoints")
  assert "checkpoints/6 is damaged or incomplete" in out and "checkpoints/5 is damaged or incomplete" in out, out
  assert "Resumed from" in out and "at step 4" in out
  aside = sorted(os.listdir(os.path.join(work, "checkpoints_damaged")))
  assert [n.split(".")[0] for n in aside] == ["5", "6"]
  _assert_same_run(work, ref)
