"""Multi-process training through jax.distributed on one host: 2 processes x 2 CPU devices (gloo collectives).

The 2-process run must give the 1-process, 4-device run's loss curve and final parameters (same global batch), only
process 0 may write logs and predictions, and a checkpoint written by the 2 processes must restore in 2 processes
and continue to the same result.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import local_multiprocess  # noqa: E402  pylint: disable=wrong-import-position

TINY_CONFIG = textwrap.dedent("""
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
      c.data.eval_splits = ("val",)
      c.select.split = "val"             # model selection on the one split this run evaluates
      c.eval_batch_size = 40
      c.total_steps = 4
      c.checkpoint_every_steps = 2
      return c
""")


def _history(workdir):
  with open(os.path.join(workdir, "train_history.jsonl")) as f:
    return [json.loads(line) for line in f]


def _params(workdir, step=None):
  from evqa_jax.runs.checkpointing import load_checkpoint_arrays
  got_step, state = load_checkpoint_arrays(workdir, step)
  return got_step, state


def _flat(tree):
  import jax
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("multihost")
  cfg = root / "tiny_ovqa.py"
  cfg.write_text(TINY_CONFIG)
  one, two = str(root / "one_process"), str(root / "two_processes")
  train = [os.path.join(REPO, "launch/train.py"), f"--config={cfg}"]
  # The 1-process reference (4 devices) runs alongside the 2-process job.
  ref = subprocess.Popen([sys.executable, *train, f"--workdir={one}"], cwd=REPO,
                         env=local_multiprocess.process_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
  codes, outs = local_multiprocess.launch([*train, f"--workdir={two}"], 2, devices_per_process=2, timeout=400,
                                          echo=False)
  ref_out = ref.communicate(timeout=400)[0]
  assert ref.returncode == 0, ref_out[-3000:]
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
  return {"root": root, "train": train, "one": one, "two": two, "outs": outs, "ref_out": ref_out}


def test_two_processes_match_one_process(runs):
  h1, h2 = _history(runs["one"]), _history(runs["two"])
  assert [r["step"] for r in h1] == [r["step"] for r in h2] == [1, 2, 3, 4]
  for a, b in zip(h1, h2):
    for key in ("loss", "grad_norm", "accuracy", "lr"):
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
  assert all(np.isfinite(r["loss"]) for r in h2)
  s1, p1 = _params(runs["one"])
  s2, p2 = _params(runs["two"])
  assert s1 == s2 == 4
  f1, f2 = _flat(p1), _flat(p2)
  assert f1.keys() == f2.keys()
  for k in f1:
    np.testing.assert_allclose(f2[k], f1[k], rtol=1e-5, atol=1e-5, err_msg=k)
  # The trained parameters moved: the comparison is not between two untouched initialisations.
  _, p_start = _params(runs["two"], 2)
  moved = [k for k, v in _flat(p_start["trainable"]).items() if not np.array_equal(v, _flat(p2["trainable"])[k])]
  assert moved


def test_only_process_zero_writes(runs):
  out0, out1 = runs["outs"]
  assert "step 4/4" in out0 and "eval val @ step 4" in out0
  assert "step 4/4" not in out1 and "eval val" not in out1 and "trainable /" not in out1
  two = runs["two"]
  assert len(_history(two)) == 4  # one writer, not one per process
  preds = os.path.join(two, "eval", "val_step4", "predictions.csv")
  with open(preds) as f:
    rows = f.read().splitlines()
  assert rows[0] == "index,prediction" and len(rows) == 1 + 100  # every val example once: eval in lockstep
  with open(os.path.join(two, "eval", "val_metrics.json")) as f:
    m2 = json.load(f)
  with open(os.path.join(runs["one"], "eval", "val_metrics.json")) as f:
    m1 = json.load(f)
  assert m2["total"] == pytest.approx(m1["total"]) and m2["mAcc"] == pytest.approx(m1["mAcc"])
  data_dir = os.path.join(two, "checkpoints", "4", "data")
  assert sorted(os.listdir(data_dir)) == ["process_0-of-2.json", "process_1-of-2.json"] or \
      {"process_0-of-2.json", "process_1-of-2.json"} <= set(os.listdir(data_dir))


def test_checkpoint_of_two_processes_restores_in_two(runs):
  """Drop step 4's checkpoint: the rerun restores step 2 in 2 processes and trains steps 3-4 to the same result."""
  two, again = runs["two"], str(runs["root"] / "two_processes_resumed")
  shutil.copytree(two, again)
  shutil.rmtree(os.path.join(again, "checkpoints", "4"))
  codes, outs = local_multiprocess.launch([*runs["train"], f"--workdir={again}"], 2, devices_per_process=2,
                                          timeout=400, echo=False)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
  assert "at step 2" in outs[0] and "Resumed" in outs[0]
  assert _history(again) == _history(two)
  _, p_a = _params(two)
  _, p_b = _params(again)
  fa, fb = _flat(p_a), _flat(p_b)
  for k in fa:
    np.testing.assert_array_equal(fb[k], fa[k], err_msg=k)


def test_evaluate_in_two_processes_equals_one_process(runs):
  """launch/evaluate.py as 2 processes (2 CPU devices each, gloo; what `--distributed` runs on a pod slice) on the
  2-process run's workdir: its metrics and predictions equal the 1-process evaluation (4 devices) and training's own
  evaluation of that step; only process 0 writes."""
  root = runs["root"]
  one, two = str(root / "evaluated_by_one"), str(root / "evaluated_by_two")
  shutil.copytree(runs["two"], one)
  shutil.copytree(runs["two"], two)
  evaluate = [os.path.join(REPO, "launch/evaluate.py"), runs["train"][1], "--checkpoint=last"]
  ref = subprocess.Popen([sys.executable, *evaluate, f"--workdir={one}"], cwd=REPO,
                         env=local_multiprocess.process_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
  codes, outs = local_multiprocess.launch([*evaluate, f"--workdir={two}"], 2, devices_per_process=2, timeout=400,
                                          echo=False)
  ref_out = ref.communicate(timeout=400)[0]
  assert ref.returncode == 0, ref_out[-3000:]
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
  assert "eval val @ last (step4)" in outs[0] and "eval val" not in outs[1]
  with open(os.path.join(one, "evaluate_step4.json")) as f:
    by_one = json.load(f)
  with open(os.path.join(two, "evaluate_step4.json")) as f:
    by_two = json.load(f)
  assert by_two["step"] == 4 and by_two == by_one
  with open(os.path.join(runs["two"], "eval", "val_metrics.json")) as f:
    trained = json.load(f)
  assert by_two["eval"]["val"] == {k: v for k, v in trained.items() if k != "step"}
  preds = [open(os.path.join(d, "eval", "val_step4", "predictions.csv")).read() for d in (one, two, runs["two"])]
  assert preds[0] == preds[1] == preds[2] and len(preds[1].splitlines()) == 1 + 100


# Process 0 holds a gs:// workdir's lease, here one that another run has taken over; process 1 holds nothing.
LOST_LOCK_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    jax.distributed.initialize(args["coordinator"], int(args["num_processes"]), int(args["process_id"]))
    from evqa_jax.runs import safeguards

    class Lease:
      def __init__(self, lost):
        self.lost = lost

      def lost_to(self):
        return self.lost

    wd = "gs://bucket/run"
    main = jax.process_index() == 0
    safeguards.WorkdirLease(wd, Lease(None) if main else None).check(last_step=2)  # held: every process goes on
    if main:
      lease = safeguards.WorkdirLease(wd, Lease({"host": "other-host", "pid": 4242, "token": "t"}))
    else:
      with safeguards.workdir_lock(wd) as lease:  # touches no storage off process 0
        pass
    try:
      lease.check(last_step=2)
    except safeguards.LockLostError as e:
      print("raised:", e, flush=True)
""")


def test_a_lost_lock_stops_every_process(tmp_path):
  """Only process 0 holds a gs:// lock: its finding that the lock was taken over is broadcast, and every process
  raises the same LockLostError at the same check (none is left waiting in a collective)."""
  script = tmp_path / "lost_lock.py"
  script.write_text(LOST_LOCK_SCRIPT)
  codes, outs = local_multiprocess.launch([str(script)], 2, devices_per_process=1, timeout=120, echo=False)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
  raised = [[line for line in out.splitlines() if line.startswith("raised:")] for out in outs]
  assert raised[0] == raised[1] and len(raised[0]) == 1, outs
  assert raised[0][0].startswith("raised: workdir gs://bucket/run: this run lost its lock "
                                 "gs://bucket/run/.workdir.lock, now held by host other-host, pid 4242 (")
  assert raised[0][0].endswith("the last step safely written is 2 (its checkpoint)")
