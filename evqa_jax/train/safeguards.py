"""What keeps a training run from reporting success with something missing or wrong.

- `workdir_lock`: one run per workdir at a time (a second one is refused, naming the holder's pid).
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

import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib

LOCK_FILE = ".workdir.lock"


@contextlib.contextmanager
def workdir_lock(workdir: str):
  """Holds <workdir>/.workdir.lock (process 0 of a job) for the run; RuntimeError when another run holds it."""
  if jax.process_index() != 0:
    yield
    return
  try:
    with io_lib.file_lock(os.path.join(workdir, LOCK_FILE), wait=False):
      yield
  except io_lib.LockedError as e:
    raise RuntimeError(f"workdir {workdir} is in use by another training run ({e}); wait for it to finish or use "
                       "another --workdir (two runs in one workdir would mix their checkpoints and history)") from None


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
    with open(path) as f:
      lines = [line for line in f.read().split("\n") if line.strip()]
  except OSError:
    return {}
  return json.loads(lines[-1]) if lines else {}
