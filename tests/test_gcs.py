"""gs:// everywhere, against a real Cloud Storage API served on 127.0.0.1 (gcp-storage-emulator, tests/gcs_emulator.py):
gcsfs (etils.epath, Grain) and tensorstore (Orbax) talk HTTP to it as they would to storage.googleapis.com.

The end-to-end test trains a tiny OVQA run whose records, pretrained folder and workdir are all on gs://, kills it,
resumes it, scores it with launch/evaluate.py, and checks that every number equals the same run on local disk. Two
runs racing for one gs:// workdir: one trains, the other stops (the emulator enforces the lock's ifGenerationMatch=0
as Cloud Storage does, and records the requests). A run whose lock another run took over while it stalled stops
before its next write, leaving the newer holder's lock and its own last checkpoint. The others cover one path kind
each: the staged pretrained copy, the workdir lock, the history, TensorBoard events, answer graphs and the evaluator
CLI. VIOLIN on gs://: tests/test_gcs_tasks.py; E-VQA (4 x 2 mesh): tests/test_mesh_sharding_evqa.py; the converters writing to gs://: tests/test_gcs_convert.py.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gcs_emulator
from gcs_runs import env_for, run_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "evqa-test"
TOTAL_STEPS = 4
# The tests' tiny OVQA run (tests/test_resume.py), with its weights in a Hugging Face folder (`pretrained.dir`),
# so that staging the folder from gs:// and loading its config.json, weights and tokenizer all run.
TINY_CONFIG = textwrap.dedent(f"""
    from configs import ovqa_msrvtt

    def get_config(arg=None):
      c = ovqa_msrvtt.get_config("demo,small")
      c.verbalizer.variant = "B"         # the answer graphs are read too
      c.data.eval_splits = ("test",)
      c.total_steps = {TOTAL_STEPS}
      c.checkpoint_every_steps = 2
      c.checkpoint.max_to_keep = 2
      return c
""")


@pytest.fixture(scope="module")
def request_log(tmp_path_factory):
  return str(tmp_path_factory.mktemp("emulator") / "requests.jsonl")


@pytest.fixture(scope="module")
def gcs(request_log):
  """The emulator (recording every request it serves in `request_log`), and this process's environment pointed at
  it (gcsfs reads it when a filesystem is made)."""
  with gcs_emulator.running(BUCKET, request_log=request_log) as env, gcs_emulator.this_process_pointed_at(env):
    yield env


def _tiny_pretrained(folder) -> str:
  """A Hugging Face BERT folder (config.json, model.safetensors, MiniLM's tokenizer): 2 layers, 32 wide, random."""
  import shutil  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from evqa_jax import pretrained  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64)
  transformers.BertModel(cfg).save_pretrained(folder, safe_serialization=True)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    src = os.path.join(pretrained.minilm_dir(), name)
    if os.path.exists(src):
      shutil.copy(src, folder)
  return str(folder)


def _read(path):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  return io.epath_of(path).read_text()


def test_ovqa_run_on_gcs_killed_resumed_and_evaluated_equals_local(gcs, tmp_path):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  cfg = tmp_path / "tiny_gcs.py"
  cfg.write_text(TINY_CONFIG)
  weights = _tiny_pretrained(tmp_path / "bert_tiny")
  env = env_for(gcs, tmp_path / "cache")
  common = [f"--config={cfg}", f"--config.pretrained.dir={weights}"]

  # The local run; it also builds the small synthetic world when the checkout has none yet.
  local = str(tmp_path / "local")
  run_script(["launch/train.py", *common, f"--workdir={local}"], env, "the local run")
  data_dir = json.loads(_read(os.path.join(local, "config.json")))["config"]["data"]["dir"]
  io.upload(os.path.join(REPO, os.path.expanduser(data_dir)), f"gs://{BUCKET}/ovqa/records")
  io.upload(weights, f"gs://{BUCKET}/models/bert_tiny")

  remote = [f"--config={cfg}", f"--config.data.dir=gs://{BUCKET}/ovqa/records",
            f"--config.pretrained.dir=gs://{BUCKET}/models/bert_tiny", f"--workdir=gs://{BUCKET}/runs/tiny"]
  # Killed once it has logged step 3 (after the checkpoint of step 2), then resumed to the end.
  proc = subprocess.Popen([sys.executable, "launch/train.py", *remote], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  seen, deadline = [], time.time() + 240
  for line in proc.stdout:
    seen.append(line)
    if line.startswith(f"step 3/{TOTAL_STEPS}") or time.time() > deadline:
      break
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert any(line.startswith(f"step 3/{TOTAL_STEPS}") for line in seen), "".join(seen)[-4000:]
  assert "staged pretrained folder gs://" in "".join(seen)
  out = run_script(["launch/train.py", *remote], env, "the resumed run on gs://")
  assert "Resumed from gs://" in out and "taking over the stale lock" in out, out[-3000:]
  assert not os.path.exists(os.path.join(REPO, "gs:")), "a gs:// path was used as a local folder"

  wd = f"gs://{BUCKET}/runs/tiny"
  assert json.loads(_read(f"{wd}/final_metrics.json")) == json.loads(_read(f"{local}/final_metrics.json"))
  assert _read(f"{wd}/train_history.jsonl") == _read(f"{local}/train_history.jsonl")
  assert _read(f"{wd}/eval/test_step{TOTAL_STEPS}/predictions.csv") == \
      _read(f"{local}/eval/test_step{TOTAL_STEPS}/predictions.csv")
  assert not io.epath_of(f"{wd}/.workdir.lock").exists()  # released at the end

  run_script(["launch/evaluate.py", *remote, "--checkpoint=last"], env, "launch/evaluate.py on gs://")
  scored = json.loads(_read(f"{wd}/evaluate_step{TOTAL_STEPS}.json"))
  final = json.loads(_read(f"{local}/final_metrics.json"))
  assert scored["step"] == TOTAL_STEPS
  assert scored["eval"]["test"] == final["eval"]["test"]
  assert 0 < scored["eval"]["test"]["total"] <= 100


def test_local_copy_stages_once_and_replaces_a_changed_folder(gcs, tmp_path, monkeypatch):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("EVQA_CACHE", str(tmp_path / "cache"))
  src = f"gs://{BUCKET}/stage/folder"
  io.epath_of(f"{src}/config.json").write_text('{"a": 1}')
  io.epath_of(f"{src}/sub/w.bin").write_bytes(b"\x00" * 1000)
  local = io.local_copy(src, "test folder")
  assert local == os.path.join(str(tmp_path / "cache"), "staged", "gs", BUCKET, "stage", "folder")
  assert open(os.path.join(local, "config.json")).read() == '{"a": 1}'
  assert os.path.getsize(os.path.join(local, "sub", "w.bin")) == 1000
  mtime = os.path.getmtime(os.path.join(local, "config.json"))
  assert io.local_copy(src) == local and os.path.getmtime(os.path.join(local, "config.json")) == mtime  # reused
  io.epath_of(f"{src}/sub/w.bin").write_bytes(b"\x01" * 10)  # the remote folder changed: staged again
  assert open(os.path.join(io.local_copy(src), "sub", "w.bin"), "rb").read() == b"\x01" * 10
  io.epath_of(f"gs://{BUCKET}/stage/frozenbilm.pth").write_bytes(b"12345")  # a single file
  assert open(io.local_copy(f"gs://{BUCKET}/stage/frozenbilm.pth"), "rb").read() == b"12345"
  with pytest.raises(FileNotFoundError, match=f"gs://{BUCKET}/stage/none does not exist"):
    io.local_copy(f"gs://{BUCKET}/stage/none")
  assert io.local_copy("~/x") == os.path.expanduser("~/x")  # local paths pass through


def _refused_by_a_beating_holder(path, live):
  """A contender for `path` while its holder `live` (host other-host, pid 1) rewrites it once, 0.5 s in: refused,
  naming the holder."""
  import threading  # pylint: disable=g-import-not-at-top
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  beat = threading.Timer(0.5, lambda: io.epath_of(path).write_text(json.dumps(dict(live, time=time.time()))))
  beat.start()
  with pytest.raises(io.LockedError, match="held by host other-host, pid 1"):
    with safeguards.remote_lock(path, lease=30.0, heartbeat=3.0):
      pass
  beat.join()


def test_remote_workdir_lock(gcs):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  path = f"gs://{BUCKET}/lock/.workdir.lock"
  with safeguards.remote_lock(path):
    held = json.loads(io.epath_of(path).read_text())
    assert held["pid"] == os.getpid()
  assert not io.epath_of(path).exists()
  # A holder that keeps beating is a live run: refused, naming it.
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  live = {"host": "other-host", "pid": 1, "token": "t", "time": time.time()}
  io.epath_of(path).write_text(json.dumps(live))
  _refused_by_a_beating_holder(path, live)
  # A lock left by a process of this host that is gone (a killed run) is taken over at once.
  import socket  # pylint: disable=g-import-not-at-top
  io.epath_of(path).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "token": "t",
                                           "time": time.time()}))
  t0 = time.time()
  with safeguards.remote_lock(path, lease=30.0, heartbeat=3.0):
    assert json.loads(io.epath_of(path).read_text())["pid"] == os.getpid()
  assert time.time() - t0 < 10
  # One that stopped beating for longer than the lease is stale too.
  io.epath_of(path).write_text(json.dumps(dict(live, time=time.time() - 60)))
  with safeguards.remote_lock(path, lease=30.0, heartbeat=3.0):
    pass


def test_lock_object_is_created_only_when_absent(gcs, request_log):
  """The lock's create is a conditional write (ifGenerationMatch=0, seen at the server): a second create of the
  same object is refused with 412 and leaves the first holder in place."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  path = f"gs://{BUCKET}/create_only/.workdir.lock"
  assert safeguards._create_lock(path, {"pid": 1, "token": "a"})  # pylint: disable=protected-access
  assert not safeguards._create_lock(path, {"pid": 2, "token": "b"})  # pylint: disable=protected-access
  assert json.loads(io.epath_of(path).read_text())["token"] == "a"
  writes = [r for r in gcs_emulator.read_requests(request_log)
            if r.get("object") == "create_only/.workdir.lock" and r["method"] == "POST"]
  assert [("ifGenerationMatch=0" in r["path"], r["status"]) for r in writes] == [(True, 200), (True, 412)], writes


def test_lock_heartbeat_survives_a_failed_renewal(gcs, monkeypatch, capsys):
  """A storage error while renewing the lock is reported and retried: the heartbeat goes on (a heartbeat that died
  would let another run take the lock over as stale while this one still trains)."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  path = f"gs://{BUCKET}/beat/.workdir.lock"
  real, failures = io.epath_of, []

  class Flaky:
    def __init__(self, p):
      self.p = real(p)

    def write_text(self, text):
      if not failures:
        failures.append(1)
        raise ConnectionResetError("connection reset by peer (test)")
      return self.p.write_text(text)

    def __getattr__(self, name):
      return getattr(self.p, name)

  def beat_time():
    # The emulator is not atomic the way GCS is: a read that meets the heartbeat's write may see part of the object
    # (_read_lock's {}).
    for _ in range(50):
      holder = safeguards._read_lock(path)  # pylint: disable=protected-access
      if holder:
        return holder["time"]
      time.sleep(0.02)
    raise AssertionError(f"{path} stayed unreadable for 1 s")

  with safeguards.remote_lock(path, lease=30.0, heartbeat=0.2) as held:
    first = beat_time()
    monkeypatch.setattr(safeguards.io_lib, "epath_of", Flaky)
    deadline = time.time() + 20
    while time.time() < deadline and beat_time() == first:
      time.sleep(0.1)
    monkeypatch.setattr(safeguards.io_lib, "epath_of", real)
    assert failures and beat_time() > first  # renewed after the failure
    assert held.lost is None
    safeguards.WorkdirLease(f"gs://{BUCKET}/beat", held).check(last_step=None)  # the run goes on
  assert "could not renew the lock (ConnectionResetError" in capsys.readouterr().out
  assert not real(path).exists()


def test_lock_taken_over_is_recorded_and_left_to_its_new_holder(gcs, tmp_path):
  """The heartbeat finds another run's token (or no object): it records the loss, stops rewriting the object, and
  the run's check before a write raises LockLostError naming the new holder; on exit the newer lock stays."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  wd = f"gs://{BUCKET}/taken"
  path = f"{wd}/.workdir.lock"
  newer = {"host": "other-host", "pid": 4242, "token": "newer", "time": time.time()}
  with safeguards.remote_lock(path, lease=30.0, heartbeat=0.2) as held:
    lease = safeguards.WorkdirLease(wd, held)
    lease.check(last_step=None)
    io.epath_of(path).write_text(json.dumps(newer))
    deadline = time.time() + 20
    while held.lost is None and time.time() < deadline:
      time.sleep(0.05)
    assert held.lost == newer  # seen by the heartbeat
    time.sleep(0.6)  # three beats: none rewrites the newer holder's object
    assert json.loads(io.epath_of(path).read_text()) == newer
    with pytest.raises(safeguards.LockLostError) as e:
      lease.check(last_step=6)
  assert json.loads(io.epath_of(path).read_text()) == newer  # not deleted on exit either
  assert str(e.value) == (
      f"workdir {wd}: this run lost its lock {path}, now held by host other-host, pid 4242 (a run takes a lock over "
      "that its holder did not renew for 120 s: this one stalled or was cut off from storage); stopped before "
      "writing anything more, so that the two runs do not mix their checkpoints; the last step safely written is 6 "
      "(its checkpoint)")
  io.epath_of(path).unlink()

  # The object deleted under a holder: lost too, and not re-created.
  with safeguards.remote_lock(path, lease=30.0, heartbeat=0.2) as held:
    io.epath_of(path).unlink()
    deadline = time.time() + 20
    while held.lost is None and time.time() < deadline:
      time.sleep(0.05)
    assert held.lost == {}
    with pytest.raises(safeguards.LockLostError, match=r"now deleted or unreadable .* this run wrote no checkpoint"):
      safeguards.WorkdirLease(wd, held).check(last_step=None)
  assert not io.epath_of(path).exists()
  safeguards.WorkdirLease(str(tmp_path)).check(last_step=None)  # a local (fcntl) lock cannot be lost


def test_torn_or_foreign_lock_reads(gcs, monkeypatch, capsys):
  """A read of the lock object that meets a rewrite can see part of it on a store less atomic than Cloud Storage (the
  emulator does): it is read again, so that it neither stops the holder's run nor makes a contender name "host None"
  or take the lock over. Content that stays unreadable (foreign, damaged) is stale once it stayed so for the lease."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  path = f"gs://{BUCKET}/torn/.workdir.lock"
  real, torn = safeguards._read_lock, []  # pylint: disable=protected-access

  def read(p):
    if torn and torn[0] > 0:  # the next reads see a torn object
      torn[0] -= 1
      return {}
    return real(p)

  def holder_now():  # the test's own reads of a lock that is being rewritten may be torn too: read again
    for _ in range(50):
      holder = real(path)
      if holder:
        return holder
      time.sleep(0.02)
    raise AssertionError(f"{path} stayed unreadable for 1 s")

  monkeypatch.setattr(safeguards, "_read_lock", read)
  # The holder: torn reads in its heartbeat and in the check before a write are not a loss.
  with safeguards.remote_lock(path, lease=30.0, heartbeat=0.2) as held:
    first = holder_now()["time"]
    torn[:] = [safeguards.UNREADABLE_TRIES - 1]
    deadline = time.time() + 20
    while time.time() < deadline and (torn[0] or holder_now()["time"] == first):
      time.sleep(0.05)
    assert held.lost is None and holder_now()["time"] > first  # still beating
    torn[:] = [safeguards.UNREADABLE_TRIES - 1]
    assert held.lost_to() is None
  assert not io.epath_of(path).exists()

  # A contender facing a live holder: its second read is torn, its third sees the holder's next beat. It names the
  # holder; the holder's object is left in place.
  live = {"host": "other-host", "pid": 1, "token": "t", "time": time.time()}
  io.epath_of(path).write_text(json.dumps(live))
  reads = []

  def read_second_torn(p):
    reads.append(1)
    if len(reads) == 2:
      io.epath_of(path).write_text(json.dumps(dict(live, time=time.time())))  # the holder beats meanwhile
      return {}
    return real(p)

  monkeypatch.setattr(safeguards, "_read_lock", read_second_torn)
  with pytest.raises(io.LockedError) as e:
    with safeguards.remote_lock(path, lease=30.0, heartbeat=0.6):
      pass
  assert str(e.value) == f"{path} is held by host other-host, pid 1"
  assert json.loads(io.epath_of(path).read_text())["token"] == "t"
  # A first read torn is not a stale holder either: the contender waits, then names the holder that beats.
  reads.clear()
  monkeypatch.setattr(safeguards, "_read_lock", lambda p: reads.append(1) or ({} if len(reads) == 1 else real(p)))
  _refused_by_a_beating_holder(path, live)
  assert json.loads(io.epath_of(path).read_text())["token"] == "t"

  # Content no run of this code wrote (not JSON, JSON that is not a holder): taken over once the lease has passed.
  monkeypatch.setattr(safeguards, "_read_lock", real)
  for content in ("garbage", "[1, 2]", json.dumps({"host": "h", "pid": 2})):
    io.epath_of(path).write_text(content)
    capsys.readouterr()
    t0 = time.monotonic()
    with safeguards.remote_lock(path, lease=1.0, heartbeat=0.3):
      assert time.monotonic() - t0 >= 1.0
      assert holder_now()["pid"] == os.getpid()
    out = capsys.readouterr().out
    assert f"{path} is unreadable (not a lock this code wrote): waiting up to 1 s" in out, out
    assert f"{path}: taking over the lock that stayed unreadable for 1 s" in out, out
    assert not io.epath_of(path).exists()


RACE_CONFIG = textwrap.dedent("""
    import ml_collections
    from configs import ovqa_msrvtt

    def get_config(arg=None):
      c = ovqa_msrvtt.get_config("demo,small")
      c.pretrained.dir = ""              # random weights: nothing to stage
      c.pretrained.tokenizer = "pkg:minilm"
      c.pretrained.shape = ml_collections.ConfigDict(dict(
          vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
          max_position_embeddings=64))
      c.verbalizer.variant = "A"
      return c
""")

# launch/train.py, with the lock's create held back until both racers reach it: each has read no lock object, so
# both send their create-only write, and only the server's precondition can keep one of them out.
RACER = textwrap.dedent("""
    import os, runpy, sys, time
    from evqa_jax.runs import safeguards
    safeguards.HEARTBEAT_SECONDS = 1.0  # the winner rewrites the lock every second: the loser sees a live holder at once
    barrier, me = sys.argv[1], sys.argv[2]
    create = safeguards._create_lock

    def create_together(path, holder):
      open(os.path.join(barrier, me), "w").close()
      deadline = time.time() + 120
      while len(os.listdir(barrier)) < 2 and time.time() < deadline:
        time.sleep(0.02)
      return create(path, holder)

    safeguards._create_lock = create_together
    sys.argv = ["launch/train.py", *sys.argv[3:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_two_runs_racing_for_one_gcs_workdir(gcs, request_log, tmp_path):
  """Two launch/train.py runs start on one gs:// workdir at the same moment: exactly one takes the lock and trains,
  the other stops with the one-line "in use" error naming the winner."""
  import socket  # pylint: disable=g-import-not-at-top
  cfg, racer, barrier = tmp_path / "race.py", tmp_path / "racer.py", tmp_path / "barrier"
  cfg.write_text(RACE_CONFIG)
  racer.write_text(RACER)
  barrier.mkdir()
  env = env_for(gcs, tmp_path / "cache")
  wd = f"gs://{BUCKET}/race/run"
  procs = [subprocess.Popen([sys.executable, str(racer), str(barrier), name, f"--config={cfg}", f"--workdir={wd}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for name in ("a", "b")]
  try:
    deadline = time.time() + 300
    while all(p.poll() is None for p in procs) and time.time() < deadline:
      time.sleep(0.2)
    done = [p for p in procs if p.poll() is not None]
    assert len(done) == 1, "both racers ran to the end, or neither stopped: the lock let both in or kept both out"
    loser, winner = done[0], next(p for p in procs if p is not done[0])
    out = loser.communicate()[0]
    assert loser.returncode == 2, f"the first racer to stop exited with {loser.returncode}:\n{out[-3000:]}"
    assert winner.poll() is None, "the winner stopped too"
    # The winner rewrites the lock every second: read it as the runs do (a read torn by a rewrite is read again).
    from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
    assert safeguards._read_lock_settled(f"{wd}/.workdir.lock").get("pid") == winner.pid  # pylint: disable=protected-access
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, out[-3000:]
  assert f"workdir {wd} is in use by another training run" in errors[0], errors[0]
  assert f"held by host {socket.gethostname()}, pid {winner.pid}" in errors[0], errors[0]
  creates = [r for r in gcs_emulator.read_requests(request_log)
             if r.get("object") == "race/run/.workdir.lock" and "ifGenerationMatch=0" in r["path"]]
  assert sorted(r["status"] for r in creates) == [200, 412], creates  # both sent it; the server let one in


# launch/train.py stalled right after its step-2 checkpoint, heartbeat included (a GC pause, a network partition):
# while it stalls, the test makes another run the lock's holder, as a run that found the lock stale would.
STALLER = textwrap.dedent("""
    import os, runpy, sys, threading, time
    from evqa_jax.runs import checkpointing, safeguards
    safeguards.HEARTBEAT_SECONDS = 0.3
    signals = sys.argv[1]
    stalled, parked = threading.Event(), threading.Event()
    read = safeguards._read_lock

    def read_unless_stalled(path):
      while stalled.is_set():
        parked.set()
        time.sleep(0.02)
      return read(path)

    save = checkpointing.save_checkpoint

    def save_then_stall(mngr, step, *args, **kwargs):
      save(mngr, step, *args, **kwargs)
      if step == 2:
        stalled.set()
        parked.wait(30)  # the heartbeat waits in its next read: no rewrite of the lock is under way
        open(os.path.join(signals, "stalled"), "w").close()
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(signals, "taken")) and time.time() < deadline:
          time.sleep(0.02)
        stalled.clear()

    safeguards._read_lock = read_unless_stalled
    checkpointing.save_checkpoint = save_then_stall
    sys.argv = ["launch/train.py", *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_run_whose_lock_is_taken_over_stops_before_its_next_checkpoint(gcs, tmp_path):
  """A gs:// run stalls after its step-2 checkpoint and another run takes its lock over meanwhile: once it goes on,
  it stops at its next write (the history row of step 3, before the checkpoint of step 4) with the one-line
  LockLostError, and the newer holder's lock and the step-2 checkpoint are left as they were."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import checkpointing  # pylint: disable=g-import-not-at-top
  cfg, staller, signals = tmp_path / "race.py", tmp_path / "staller.py", tmp_path / "signals"
  cfg.write_text(RACE_CONFIG)
  staller.write_text(STALLER)
  signals.mkdir()
  wd = f"gs://{BUCKET}/takeover/run"
  lock = f"{wd}/.workdir.lock"
  proc = subprocess.Popen([sys.executable, str(staller), str(signals), f"--config={cfg}", f"--workdir={wd}"],
                          cwd=REPO, env=env_for(gcs, tmp_path / "cache"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 300
    while not (signals / "stalled").exists() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.1)
    assert (signals / "stalled").exists(), "the run did not reach its step-2 checkpoint"
    mine = json.loads(_read(lock))
    assert mine["pid"] == proc.pid
    newer = {"host": "other-host", "pid": 4242, "token": "newer-run", "time": time.time()}
    io.epath_of(lock).write_text(json.dumps(newer))
    (signals / "taken").touch()
    out = proc.communicate(timeout=120)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 2, out[-3000:]
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, out[-3000:]
  assert errors[0].startswith(f"error: LockLostError: workdir {wd}: this run lost its lock {lock}, now held by host "
                              "other-host, pid 4242 ("), errors[0]
  assert "the last step safely written is 2 (its checkpoint)" in errors[0]
  assert json.loads(_read(lock)) == newer  # neither renewed over nor deleted
  assert checkpointing.checkpoint_steps(f"{wd}/checkpoints") == [2]
  assert [json.loads(x)["step"] for x in _read(f"{wd}/train_history.jsonl").splitlines()] == [1, 2]
  assert not io.epath_of(f"{wd}/final_metrics.json").exists()
  step, arrays = checkpointing.load_checkpoint_arrays(wd)  # every array checked against its saved checksum
  assert step == 2 and int(arrays["step"]) == 2


def test_history_and_tensorboard_events_on_gcs(gcs, tmp_path):
  from evqa_jax.runs import history as history_lib  # pylint: disable=g-import-not-at-top
  from evqa_jax.train import writers  # pylint: disable=g-import-not-at-top
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  path = f"gs://{BUCKET}/hist/train_history.jsonl"
  h = history_lib.History(path, keep_up_to=0)
  for step in (1, 2, 3):
    h.append({"step": step, "loss": 1.0 / step})
  assert [json.loads(x)["step"] for x in _read(path).splitlines()] == [1, 2, 3]
  history_lib.History(path, keep_up_to=2)  # a resume at step 2 drops row 3
  assert [json.loads(x)["step"] for x in _read(path).splitlines()] == [1, 2]

  logdir = f"gs://{BUCKET}/tb"
  w = writers.SummaryWriter(logdir, remote_flush_seconds=3600)
  w.write_hparams({"a": 1})
  w.write_scalars(1, {"train/loss": 2.5})
  w.flush()  # one complete event file per flush: object stores have no append
  w.write_scalars(2, {"train/loss": 1.5})
  w.close()
  names = sorted(p.name for p in io.epath_of(logdir).iterdir())
  assert len(names) == 2 and all(n.startswith("events.out.tfevents.") for n in names), names
  local = tmp_path / "tb"
  os.makedirs(local)
  for n in names:
    (local / n).write_bytes(io.epath_of(f"{logdir}/{n}").read_bytes())
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(str(local))
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 2.5), (2, 1.5)]


def test_answer_graph_and_evaluator_cli_on_gcs(gcs, tmp_path):
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from evqa_jax.evaluate import ovqa as ovqa_eval  # pylint: disable=g-import-not-at-top
  from evqa_jax.graphs import answer_graph  # pylint: disable=g-import-not-at-top
  graph = answer_graph.AnswerGraph.__new__(answer_graph.AnswerGraph)
  graph.node_words, graph.num_answers = ["cat", "dog", "pet"], 2
  graph.senders, graph.receivers = np.array([0, 1, 2, 2], np.int32), np.array([2, 2, 0, 1], np.int32)
  graph.info, graph.node_features = {"k": 1}, None
  graph.save(f"gs://{BUCKET}/graphs/graph_train.npz")
  back = answer_graph.load_answer_graph(f"gs://{BUCKET}/graphs/graph_train.npz")
  assert back.node_words == graph.node_words and back.receivers.tolist() == [2, 2, 0, 1]

  files = {"train.csv": "question,answer\nq1,cat\nq2,cat\nq3,dog\n",
           "test.csv": "question,answer\nq1,cat\nq2,dog\nq3,fish\n",
           "pred.csv": "index,prediction\n0,cat\n1,cat\n2,fish\n"}
  for name, text in files.items():
    io.epath_of(f"gs://{BUCKET}/eval/{name}").write_text(text)
    (tmp_path / name).write_text(text)
  args = ["--train-csv", "{d}/train.csv", "--test-csv", "{d}/test.csv", "--pred", "{d}/pred.csv", "--out",
          "{d}/metrics.json"]
  remote = ovqa_eval.main([a.format(d=f"gs://{BUCKET}/eval") for a in args])
  local = ovqa_eval.main([a.format(d=tmp_path) for a in args])
  assert remote == local
  assert json.loads(_read(f"gs://{BUCKET}/eval/metrics.json")) == json.loads((tmp_path / "metrics.json").read_text())
  assert json.loads(_read(f"gs://{BUCKET}/eval/metrics.json"))["official"]["total"] == pytest.approx(2 / 3, abs=1e-4)


SWEEP_CONFIG = textwrap.dedent("""
    import ml_collections

    def get_config(arg=None):
      return ml_collections.ConfigDict(dict(seed=0, verbalizer=dict(variant="E", eps=0.7)))

    def get_sweep(name, arg=None):
      points = [{"name": f"eps_{e:.1f}", "overrides": {"verbalizer.eps": e}, "x": e} for e in (1.0, 0.5, 0.0)]
      return {"points": points, "columns": [("base", "B"), ("mAcc", "M")], "split": "test", "x_label": "eps"}
""")


def test_sweep_table_from_points_finished_on_gcs(gcs, tmp_path, monkeypatch, capsys):
  """The pod recipe's last sweep step: every point was trained on the pod into gs://; the sweep finds them finished
  (nothing is run) and writes the table and plot into the gs:// sweep workdir."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  from launch import sweeps as sweep_lib  # pylint: disable=g-import-not-at-top
  cfg = tmp_path / "toy_sweep.py"
  cfg.write_text(SWEEP_CONFIG)
  from evqa_jax.runs import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  root = f"gs://{BUCKET}/sweeps/eps"
  module = sweep_lib.load_config_module(str(cfg))
  points = {p["name"]: p for p in module.get_sweep("eps", None)["points"]}
  for e in (1.0, 0.5, 0.0):
    metrics = {"eval": {"test": {"base": 90.0 + e, "mAcc": 50.0 - 10.0 * e}}}
    io.write_json(f"{root}/eps_{e:.1f}/final_metrics.json", metrics)
    config = sweep_lib.point_config_dict(module, None, points[f"eps_{e:.1f}"])  # a finished point's own record
    io.write_json(f"{root}/eps_{e:.1f}/config.json", {"identity": workdir_lib.config_identity(config)})
  monkeypatch.setattr(sweep_lib, "_run_point", lambda cmd, env=None: pytest.fail(f"ran {cmd}"))
  sweep_lib.run_sweep(str(cfg), "eps", root)
  assert _read(f"{root}/eps.csv").splitlines() == ["point,B,M", "eps_1.0,91.00,40.00", "eps_0.5,90.50,45.00",
                                                    "eps_0.0,90.00,50.00"]
  assert io.epath_of(f"{root}/eps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  out = capsys.readouterr().out
  assert "[sweep] point 3 of 3: eps_0.0: done already, skipped" in out


def test_copy_and_move_between_local_and_gcs(gcs, tmp_path):
  """evqa_jax.io.copy (sweep --reuse copies a finished run's results with it): a folder to gs:// and back."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  src = tmp_path / "run"
  (src / "eval" / "test_step4").mkdir(parents=True)
  (src / "eval" / "test_step4" / "metrics.json").write_text('{"total": 1.5}\n')
  (src / "train_history.jsonl").write_text('{"step": 1}\n')
  io.copy(str(src), f"gs://{BUCKET}/copy/run")
  assert _read(f"gs://{BUCKET}/copy/run/eval/test_step4/metrics.json") == '{"total": 1.5}\n'
  io.copy(f"gs://{BUCKET}/copy/run", str(tmp_path / "back"))
  assert (tmp_path / "back" / "train_history.jsonl").read_text() == '{"step": 1}\n'
  assert (tmp_path / "back" / "eval" / "test_step4" / "metrics.json").read_text() == '{"total": 1.5}\n'
  # A damaged checkpoint is moved aside (checkpointing.restore_latest): on gs:// a copy and a removal.
  io.move(f"gs://{BUCKET}/copy/run", f"gs://{BUCKET}/copy/aside/run.1")
  assert not io.epath_of(f"gs://{BUCKET}/copy/run").exists()
  assert _read(f"gs://{BUCKET}/copy/aside/run.1/train_history.jsonl") == '{"step": 1}\n'
