"""What keeps a training run from reporting success with something missing or wrong.

- `workdir_lock`: one run per workdir at a time (a second one is refused, naming the holder's pid); on gs:// the
  lock is a lease another run can take over from a stalled holder, and `WorkdirLease.check` (before every write that
  would collide) stops this run with `LockLostError` once that happened.
- `state_checksums` / `verify_checksums`: a checksum per array of the train state, stored with every checkpoint
  and checked on restore, so a flipped byte inside array data is a damaged checkpoint (the trainer's fall-back to
  the previous checkpoint applies), not a silently wrong weight.
- `UnverifiedCheckpointError`: a checkpoint without checksums (arrays or data iterator state) is refused unless
  config.checkpoint.allow_unverified; `payload_checksum` guards the iterator state file the same way.
- `completed_eval` / `last_history_row`: what a resumed (or rerun, finished) workdir already holds, so an evaluation
  due at the restored step is redone when it did not finish, and final_metrics.json never loses eval/train.
"""

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log

LOCK_FILE = ".workdir.lock"


class LockLostError(RuntimeError):
  """Another run took this run's workdir lock over: this run stops before writing anything more into the workdir."""


class WorkdirLease:
  """What `workdir_lock` yields: `check(last_step)` before each write that a second run in the workdir would collide
  with (checkpoints, history, evaluation files, final metrics).

  A local workdir's fcntl lock cannot be lost, so there `check` does nothing. A gs:// workdir's lease can: process 0
  holds it (`remote_lock`'s `Lease`); in a multi-process job process 0's answer is broadcast, so that every process
  raises the same LockLostError at the same call instead of the others waiting in a collective for process 0."""

  def __init__(self, workdir: str, lease=None):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_FILE)
    self.remote = io_lib.is_uri(workdir)
    self._lease = lease  # process 0 of a gs:// run; None elsewhere

  def check(self, last_step) -> None:
    """Raises LockLostError when another run holds the lock now. `last_step`: the step of the newest checkpoint
    this run wrote or resumed from (None: none), named in the error. Called at the same points by every process."""
    if not self.remote:
      return
    lost = self._lease.lost_to() if self._lease is not None else None
    if jax.process_count() > 1:
      lost = _broadcast_holder(lost)
    if lost is not None:
      raise LockLostError(lost_message(self.workdir, self.path, lost, last_step))


def lost_message(workdir: str, path: str, holder: dict, last_step) -> str:
  """The one-line error of a run whose lock `path` is now held by `holder` ({} when the object is gone)."""
  now = _holder_words(holder)
  done = (f"the last step safely written is {last_step} (its checkpoint)" if last_step is not None
          else "this run wrote no checkpoint")
  return (f"workdir {workdir}: this run lost its lock {path}, {now} (a run takes a lock over that its holder did "
          f"not renew for {LEASE_SECONDS:.0f} s: this one stalled or was cut off from storage); stopped before writing "
          f"anything more, so that the two runs do not mix their checkpoints; {done}")


def _holder_words(holder: dict) -> str:
  if holder.get("host") is not None or holder.get("pid") is not None:
    return f"now held by host {holder.get('host')}, pid {holder.get('pid')}"
  return "now deleted or unreadable"


_HOST_BYTES = 256


def _broadcast_holder(holder):
  """Process 0's `holder` (a dict, or None while the lock is held) on every process: one small collective."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  host = np.zeros(_HOST_BYTES, np.uint8)
  head = np.array([0, -1, 0], np.int32)  # lost, pid (-1: unknown), host length (-1: unknown)
  if holder is not None:
    name = str(holder.get("host") or "").encode()[:_HOST_BYTES]
    host[:len(name)] = np.frombuffer(name, np.uint8)
    pid = holder.get("pid")
    head[:] = (1, pid if isinstance(pid, int) and 0 <= pid < 2**31 else -1,
               len(name) if holder.get("host") is not None else -1)
  out = multihost_utils.broadcast_one_to_all({"head": head, "host": host})
  lost, pid, length = (int(v) for v in out["head"])
  if not lost:
    return None
  got = {}
  if length >= 0:
    got["host"] = bytes(np.asarray(out["host"][:length], np.uint8)).decode(errors="replace")
  if pid >= 0:
    got["pid"] = pid
  return got


@contextlib.contextmanager
def workdir_lock(workdir: str):
  """Holds <workdir>/.workdir.lock (process 0 of a job) for the run, yielding a `WorkdirLease`; RuntimeError when
  another run holds it.

  A local workdir takes an fcntl lock, which the system drops when its process dies. A gs://... workdir takes a
  lease object instead (`remote_lock`)."""
  if jax.process_index() != 0:
    yield WorkdirLease(workdir)
    return
  path = os.path.join(workdir, LOCK_FILE)
  try:
    with (remote_lock(path, LEASE_SECONDS, HEARTBEAT_SECONDS) if io_lib.is_uri(workdir)
          else io_lib.file_lock(path, wait=False)) as held:
      yield WorkdirLease(workdir, held if io_lib.is_uri(workdir) else None)
  except io_lib.LockedError as e:
    raise RuntimeError(f"workdir {workdir} is in use by another training run ({e}); wait for it to finish or use "
                       "another --workdir (two runs in one workdir would mix their checkpoints and history)") from None


# A remote lock's holder rewrites it every HEARTBEAT_SECONDS; one left unchanged for LEASE_SECONDS is stale.
HEARTBEAT_SECONDS = 30.0
LEASE_SECONDS = 120.0


def _read_lock(path: str):
  """The lock object's holder {host, pid, token, time}, None when there is no object, {} when its content is not
  such a holder (torn by a concurrent rewrite, damaged, or another program's)."""
  try:
    holder = json.loads(io_lib.epath_of(path).read_text())
  except FileNotFoundError:
    return None
  except ValueError:
    return {}
  if (not isinstance(holder, dict) or not isinstance(holder.get("token"), str)
      or not isinstance(holder.get("time"), (int, float)) or isinstance(holder.get("time"), bool)):
    return {}
  return holder


# An unreadable lock is read again this many times, this far apart, before it counts (`_read_lock_settled`).
UNREADABLE_TRIES = 5
UNREADABLE_WAIT_SECONDS = 0.2


def _read_lock_settled(path: str):
  """`_read_lock`, read again while the content is unreadable. A read that meets the holder's rewrite can see part of
  the object on a store that is not atomic the way Cloud Storage is (the emulator the tests use, some gateways):
  one torn read must not pass for another holder (a contender naming "host None", a holder stopping its own run)."""
  for i in range(UNREADABLE_TRIES):
    holder = _read_lock(path)
    if holder is None or holder:
      return holder
    if i + 1 < UNREADABLE_TRIES:
      time.sleep(UNREADABLE_WAIT_SECONDS)
  return holder


def _create_lock(path: str, holder: dict) -> bool:
  """Creates the lock object only when none exists, atomically; False when one does.

  On gs:// gcsfs sends the write with `ifGenerationMatch=0`: Cloud Storage applies it only when no live object has
  that name and answers 412 otherwise (gcsfs: FileExistsError), so of two runs creating the lock at once exactly
  one succeeds (tests/test_gcs.py races two runs against an emulator that enforces the precondition)."""
  import fsspec  # pylint: disable=g-import-not-at-top
  fs, key = fsspec.core.url_to_fs(path)
  data = json.dumps(holder).encode()
  try:
    fs.pipe_file(key, data, mode="create")
  except FileExistsError:
    return False
  except TypeError:
    if "gs" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)):
      raise RuntimeError(f"{path}: the installed gcsfs cannot write an object only when "
                         "absent (pipe_file mode='create'), which the workdir lock needs; install the gcsfs that "
                         "setup.py pins (pip install -e '.[gcs]', or '.[tpu]' / '.[gpu]')") from None
    # Another filesystem without create-only writes: check, then write (not atomic).
    if fs.exists(key):
      return False
    fs.pipe_file(key, data)
  return True


def _process_gone(holder: dict) -> bool:
  """The holder ran on this host and its process no longer exists (a killed run restarted on the same machine)."""
  if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
    return False
  try:
    os.kill(holder["pid"], 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  return False


class Lease:
  """What `remote_lock` yields: whether this process still holds the lock object.

  `lost`: None while held; once the heartbeat (or `lost_to`) finds another holder's token in the object, or no object,
  that holder's {host, pid, ...} ({} when the object is gone). A lost lease stays lost: its heartbeat has stopped."""

  def __init__(self, path: str, token: str):
    self.path, self.token = path, token
    self.lost = None

  def _seen(self, holder) -> None:
    if holder is None or holder.get("token") != self.token:
      self.lost = holder or {}

  def lost_to(self):
    """The holder that took the lock over, read afresh from the object (None while it is this process's). A failed
    read is no answer: the heartbeat's last finding stands (a storage hiccup does not stop a run)."""
    try:
      holder = _read_lock_settled(self.path)
    except Exception as e:  # pylint: disable=broad-except
      log.warning(f"{self.path}: could not read the lock ({type(e).__name__}: {e}); going on with what the "
                 "heartbeat last saw", every_process=True)
      return self.lost
    if self.lost is None:
      self._seen(holder)
    elif holder and holder.get("token") != self.token:
      self.lost = holder  # the run that took it over (the heartbeat may have seen the object gone in between)
    return self.lost


@contextlib.contextmanager
def remote_lock(path: str, lease: float = LEASE_SECONDS, heartbeat: float = HEARTBEAT_SECONDS):
  """A lock on an object store (gs://...), where fcntl does not reach: the object `path` holding {host, pid, token,
  time}, created only when absent and rewritten by its holder every `heartbeat` seconds. Yields a `Lease`.

  A holder whose process is gone (same host), or whose object stayed unchanged for `lease` seconds, is stale: its
  lock is taken over, so a preempted or killed job restarts without a manual step (at most `lease` seconds later).
  A holder that keeps beating raises io_lib.LockedError naming its host and pid. The lock is deleted on exit, unless
  another run has taken it over meanwhile (the heartbeat then stops and records it in `Lease.lost`)."""
  me = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
  seen, since, announced, unreadable_since = None, time.monotonic(), False, None
  while True:
    holder = _read_lock_settled(path)
    if holder is None:
      if _create_lock(path, dict(me, time=time.time())):
        break
      continue
    if holder.get("token") == me["token"]:
      break  # our create landed, but its answer was lost and the client's retry was refused: the lock is ours
    if not holder:
      # Content that stays unreadable (damaged, or another program's) names no host, pid or time to judge it by:
      # stale once it has stayed so for `lease` seconds, like a holder that stopped beating.
      if unreadable_since is None:
        unreadable_since = time.monotonic()
        log.info(f"{path} is unreadable (not a lock this code wrote): waiting up to {lease:.0f} s before taking it "
                 "over", every_process=True)
      if time.monotonic() - unreadable_since > lease:
        log.info(f"{path}: taking over the lock that stayed unreadable for {lease:.0f} s", every_process=True)
        io_lib.epath_of(path).unlink(missing_ok=True)
        seen, unreadable_since = None, None
        continue
      time.sleep(min(heartbeat / 3, 5.0))
      continue
    unreadable_since = None
    if holder != seen:
      if seen is not None:
        raise io_lib.LockedError(f"{path} is held by host {holder.get('host')}, pid {holder.get('pid')}")
      seen, since = holder, time.monotonic()
    age = time.time() - holder["time"]
    if _process_gone(holder) or age > lease or time.monotonic() - since > lease:
      log.info(f"{path}: taking over the stale lock of host {holder.get('host')}, pid {holder.get('pid')}",
               every_process=True)
      io_lib.epath_of(path).unlink(missing_ok=True)
      seen = None
      continue
    if not announced:
      announced = True
      log.info(f"{path} is held by host {holder.get('host')}, pid {holder.get('pid')}: waiting up to {lease:.0f} s "
               "for it to beat (a live run) or not (a stale lock)", every_process=True)
    time.sleep(min(heartbeat / 3, 5.0))
  held = Lease(path, me["token"])
  stop = threading.Event()

  def beat():
    while not stop.wait(heartbeat):
      try:
        held._seen(_read_lock_settled(path))  # pylint: disable=protected-access
        if held.lost is not None:
          log.warning(f"{path} no longer holds this run's lock ({_holder_words(held.lost)}); the run stops "
                     "before its next write", every_process=True)
          return
        io_lib.epath_of(path).write_text(json.dumps(dict(me, time=time.time())))
      except Exception as e:  # pylint: disable=broad-except  (a storage hiccup must not end the heartbeat)
        log.warning(f"{path}: could not renew the lock ({type(e).__name__}: {e}); trying again in "
                   f"{heartbeat:.0f} s", every_process=True)

  thread = threading.Thread(target=beat, name="workdir-lock-heartbeat", daemon=True)
  thread.start()
  try:
    yield held
  finally:
    stop.set()
    thread.join()
    if held.lost is None and (_read_lock_settled(path) or {}).get("token") == me["token"]:
      io_lib.epath_of(path).unlink(missing_ok=True)


# Odd multipliers: a change in one element always changes the sum (mod 2^32). Integer sums are exact and
# order-free, so the checksum does not depend on the mesh or the sharding that wrote or reads the state, nor on
# whether the device or the host computes it.
_MULT = 2654435761
# States up to this size, held whole by this process, are summed on the host: numpy takes milliseconds where
# compiling the device program (one reduction per array) took 1-3 s on CPU, paid at every run's first checkpoint.
# Larger states, and arrays spread over processes, are summed on their devices.
HOST_CHECKSUM_MAX_BYTES = 64 * 2**20


def _leaf_checksum(x, xp=jnp):
  """The checksum of one array: in a jitted program (xp=jnp), or in numpy on the host (xp=np; uint32 arithmetic
  wraps mod 2^32 alike, so the number is the same)."""
  if x.dtype == np.bool_:
    bits = x.astype(xp.uint32)
  else:
    unsigned = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32}[x.dtype.itemsize]
    bits = (jax.lax.bitcast_convert_type(x, unsigned) if xp is jnp
            else np.ascontiguousarray(x).view(unsigned)).astype(xp.uint32)
  flat = bits.reshape(-1)
  weights = (xp.arange(flat.size, dtype=xp.uint32) * xp.uint32(_MULT)) | xp.uint32(1)
  return xp.sum(flat * weights, dtype=xp.uint32)


@jax.jit
def _checksums(leaves):
  return [_leaf_checksum(x) for x in leaves]


def state_checksums(state, host_max_bytes: int = HOST_CHECKSUM_MAX_BYTES) -> dict:
  """{array path: uint32 checksum of its bits} for every array of a (sharded) train state: on the host when the
  state is small and held whole by this process (`host_max_bytes`), else by one jitted program on its devices."""
  paths, leaves = zip(*jax.tree_util.tree_leaves_with_path(state)) if jax.tree.leaves(state) else ((), ())
  keys = [jax.tree_util.keystr(p) for p in paths]
  on_host = (all(getattr(x, "is_fully_addressable", True) for x in leaves)
             and sum(x.nbytes for x in leaves) <= host_max_bytes)
  if on_host:
    return {k: int(_leaf_checksum(np.asarray(x), np)) for k, x in zip(keys, leaves)}
  sums = _checksums(list(leaves))
  return {k: int(np.asarray(s.addressable_data(0))) for k, s in zip(keys, sums)}


class ChecksumMismatchError(RuntimeError):
  """A restored array differs from the one that was saved (damaged checkpoint data)."""


class UnverifiedCheckpointError(RuntimeError):
  """A checkpoint without the checksums that would show it is intact (refused unless the user allows it)."""


ALLOW_UNVERIFIED = "config.checkpoint.allow_unverified=True"


def unverified(step_dir: str, what: str) -> UnverifiedCheckpointError:
  return UnverifiedCheckpointError(
      f"checkpoint {step_dir} has no checksums for {what} (its meta/ is missing or was written by an older "
      f"version), so damage in it would go unnoticed; refused. To use it anyway, pass --{ALLOW_UNVERIFIED} "
      "(unsafe), or delete that step")


def _canonical(key: str) -> str:
  """One spelling per array path: a named tuple's field (`.mu`, the live optimiser state) and a dict key (`['mu']`,
  the same state restored as plain containers) name the same array."""
  return re.sub(r"\.([A-Za-z_]\w*)", r"['\1']", key)


def verify_checksums(state, expected, step_dir: str, allow_unverified: bool = False) -> None:
  """Raises ChecksumMismatchError naming the first damaged array, UnverifiedCheckpointError when there are no
  checksums (unless `allow_unverified`)."""
  if not expected:
    if allow_unverified:
      return
    raise unverified(step_dir, "its arrays")
  got = {_canonical(k): v for k, v in state_checksums(state).items()}
  expected = {_canonical(k): v for k, v in expected.items()}
  bad = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
  if bad:
    raise ChecksumMismatchError(f"checkpoint {step_dir}: {len(bad)} array(s) do not match their saved checksum "
                                f"(first: {bad[0]}); the checkpoint data is damaged")


def payload_checksum(payload: dict) -> str:
  """sha256 of a JSON payload (its "sha256" field left out) in one canonical spelling: stored inside the data
  iterator's state file, so a flipped bit in it is a damaged checkpoint, not a silently skipped batch."""
  import hashlib  # pylint: disable=g-import-not-at-top
  body = {k: v for k, v in payload.items() if k != "sha256"}
  return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Config keys that name a path even without a separator in the value (data.dir=records, init_from=model.pth).
_PATH_KEY = re.compile(r"(^|_)(dir|path|paths|file|files|from|source|root|csv|json|vocab)$")


def config_inputs(config, prefix: str = "config") -> dict:
  """{"config.<key>": path} of every input path a config names: each string (or list of strings) that is a URI,
  or names an existing file or folder and looks like a path (a separator, `~`, or a key such as `dir`, `init_from`,
  `source`); cache folders (keys naming a cache), which runs write, are left out."""
  out = {}
  for key, value in (config.items() if hasattr(config, "items") else ()):
    name = f"{prefix}.{key}"
    if hasattr(value, "items"):
      out.update(config_inputs(value, name))
      continue
    if "cache" in key:
      continue
    for v in (value if isinstance(value, (list, tuple)) else [value]):
      if not isinstance(v, str) or not v:
        continue
      if io_lib.is_uri(v) or (("/" in v or v.startswith("~") or _PATH_KEY.search(key))
                              and os.path.lexists(os.path.expanduser(v))):
        out.setdefault(name, []).append(v)
  return out


def check_workdir_paths(config, workdir: str) -> None:
  """Before a run writes anything: refuses a workdir that is, holds or lies inside an input the config names (naming
  the config key: `--workdir=P --config.pretrained.dir=P` would overwrite the model's config.json), a gs:// workdir or
  input whose bucket cannot be used (`io.check_storage`), and a local workdir holding a symbolic link that leads
  outside it (train_history.jsonl, eval/, config.json, checkpoints/: writes would follow it)."""
  io_lib.check_outputs(config_inputs(config), {"--workdir": workdir}, inside_inputs=True)
  if not io_lib.is_uri(workdir) and os.path.isdir(workdir):
    io_lib.check_links_inside(workdir)


def completed_eval(workdir: str, split: str, step: int):
  """The results of split's evaluation at `step` when <workdir>/eval/<split>_metrics.json holds it, else None."""
  path = os.path.join(workdir, "eval", f"{split}_metrics.json")
  try:
    saved = io_lib.load_json(path, "evaluation metrics", finite=False)
  except (OSError, ValueError):
    return None
  if not isinstance(saved, dict) or saved.get("step") != step:
    return None
  return {k: v for k, v in saved.items() if k != "step"}


def last_history_row(path: str) -> dict:
  """The last row of train_history.jsonl ({} when there is none), as the training loop logged it."""
  try:
    lines = [line for line in io_lib.epath_of(path).read_text().split("\n") if line.strip()]
  except OSError:
    return {}
  return json.loads(lines[-1]) if lines else {}
