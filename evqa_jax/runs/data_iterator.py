"""The data iterator's part of a checkpoint: an Orbax handler that stores a DataIterator's position (item "data").

    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state),
        data=data_iterator.checkpoint_args_save(it)))          # item name "data"
    ...
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_train_state),
        data=data_iterator.checkpoint_args_restore(it)))       # `it` = iter(loader) of a fresh loader
    it = restored["data"]                                      # the same object, positioned at the next batch

`checkpoint_args_save` captures the position when it is called (safe with async Orbax saves). Every process writes
`data/process_{p}-of-{P}.json` (p, P = the loader's process_index/count) holding the number of global batches
consumed and the loader's plan, with a sha256 of both that every restore verifies. The position is a batch count, so
a checkpoint restores into a loader with another worker_count or process_count; the source, batch size, seed and
num_epochs must match (checked, with a clear error).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from etils import epath
import orbax.checkpoint as ocp

from evqa_jax import io as io_lib
from evqa_jax.data import pipeline
from evqa_jax.runs import safeguards

# Stored in every state file; the spelling of the module that first wrote it, kept so older checkpoints restore.
_STATE_FORMAT = "evqa_jax.data.pipeline/1"


def _verified_payload(path, allow_unverified: bool) -> dict:
  """The iterator state in `path`, its checksum verified (the training safeguards' rule for every restored item)."""
  payload = io_lib.load_json(path, "data iterator state")
  if not isinstance(payload, dict):
    raise ValueError(f"data iterator state {path} is not a JSON object")
  if "sha256" not in payload:
    if not allow_unverified:
      raise safeguards.unverified(os.fspath(epath.Path(path).parent.parent), f"its data iterator state ({path})")
  elif payload["sha256"] != safeguards.payload_checksum(payload):
    raise safeguards.ChecksumMismatchError(f"data iterator state {path} does not match its saved checksum; the "
                                           "checkpoint is damaged (resuming from it would skip or repeat batches)")
  return payload


class DataIteratorHandler(ocp.CheckpointHandler):
  """Orbax handler for a DataIterator: one JSON file per process, holding the step and the plan."""

  def save(self, directory: epath.Path, args: "DataIteratorSave"):
    payload = dict(args.payload)
    payload["sha256"] = safeguards.payload_checksum(payload)  # verified on restore: a flipped bit is no skipped batch
    name = f"process_{payload['process_index']}-of-{payload['process_count']}.json"
    (epath.Path(directory) / name).write_text(json.dumps(payload, indent=2, sort_keys=True))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore") -> pipeline.DataIterator:
    it = args.item
    if not isinstance(it, pipeline.DataIterator):
      raise TypeError(f"checkpoint item 'data' restores into a DataIterator (iter(make_train_loader(...))), "
                      f"got {type(it).__name__}")
    directory = epath.Path(directory)
    own = directory / f"process_{it.plan.process_index}-of-{it.plan.process_count}.json"
    files = [own] if own.exists() else sorted(directory.glob("process_*-of-*.json"))
    if not files:
      raise FileNotFoundError(f"no data iterator state (process_*-of-*.json) in {directory}")
    payloads = [_verified_payload(f, args.allow_unverified) for f in files]
    steps = {p["step"] for p in payloads}
    if len(steps) != 1:
      raise ValueError(f"data iterator states in {directory} disagree on the step: {sorted(steps)}")
    payload = payloads[0]
    if payload.get("format") != _STATE_FORMAT:
      raise ValueError(f"{files[0]}: not an evqa_jax data iterator state (format {payload.get('format')!r})")
    if payload["plan"] != it.plan.identity():
      raise ValueError(f"{files[0]}: the checkpointed data pipeline differs from the one being restored:\n"
                       f"  checkpoint: {payload['plan']}\n  loader:     {it.plan.identity()}")
    it.set_step(int(payload["step"]))
    it.start_prefetch()
    return it

  def structure(self, directory):
    del directory
    return None

  def metadata(self, directory):
    del directory
    return None

  def finalize(self, directory):
    pass

  def close(self):
    pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  payload: dict


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  item: Any
  allow_unverified: bool = False


def checkpoint_args_save(iterator: pipeline.DataIterator) -> DataIteratorSave:
  """Orbax args for the checkpoint item "data"; captures the iterator's position now."""
  if not isinstance(iterator, pipeline.DataIterator):
    raise TypeError(f"checkpoint_args_save wants iter(make_train_loader(...)), got {type(iterator).__name__}")
  plan = iterator.plan
  return DataIteratorSave(payload={
      "format": _STATE_FORMAT,
      "step": iterator.step,
      "plan": plan.identity(),
      "process_index": plan.process_index,
      "process_count": plan.process_count,
      "worker_count": plan.worker_count,
  })


def checkpoint_args_restore(iterator: pipeline.DataIterator, allow_unverified: bool = False) -> DataIteratorRestore:
  """Orbax args for the checkpoint item "data": restores into `iterator` (a fresh one is fine). The state file's
  checksum is verified; a state without one is refused unless `allow_unverified`."""
  if not isinstance(iterator, pipeline.DataIterator):
    raise TypeError(f"checkpoint_args_restore wants iter(make_train_loader(...)), got {type(iterator).__name__}")
  return DataIteratorRestore(item=iterator, allow_unverified=allow_unverified)
