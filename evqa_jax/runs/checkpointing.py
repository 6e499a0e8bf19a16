"""Checkpoint I/O: one Orbax CheckpointManager saves {train state, data iterator, experiment identity} together.

A restarted job continues at the exact next batch. A checkpoint that does not read back (truncated, half-written)
is reported, moved to <workdir>/checkpoints_damaged/ and the previous one is used; a checkpoint of another
experiment or data pipeline raises CheckpointMismatchError instead. Every process takes part (a shared filesystem).
"""

import logging as std_logging
import os
import time

from absl import logging
from etils import epath
from flax import traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax.runs import data_iterator, safeguards
from evqa_jax.runs import workdir as workdir_lib


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


class KeepSteps:
  """Orbax preservation policy: keep the checkpoints of the steps in `steps` (a set the trainer updates: the best
  step of model selection), whatever their age."""

  def __init__(self):
    self.steps = set()

  def should_preserve(self, checkpoints, *, context):
    del context
    return [c.step in self.steps for c in checkpoints]


def replica_parallel(config) -> bool:
  """Whether saves split each replicated array between its replicas (Orbax's replica-parallel save):
  config.checkpoint.replica_parallel, or when unset (None), only with several processes. Each replica writes a slice,
  so with several hosts the writing spreads over them; in one process that process writes every slice anyway, and each
  slice is a small compiled program per array shape and device: hundreds for a train state on 8 devices, ~25 s of
  the first save of the tiny E-VQA model on a 4 x 2 CPU mesh, for nothing."""
  value = config.checkpoint.replica_parallel
  return jax.process_count() > 1 if value is None else bool(value)


# The jax.Array handlers this module registers, one per `use_replica_parallel` value (reused, so a switch back is
# recognised by identity through Orbax's public registry).
_ARRAY_HANDLERS = {}


def _use_replica_parallel(enabled: bool) -> None:
  """Orbax keeps one jax.Array handler per process (StandardSave takes no registry of its own): registers a handler
  with `use_replica_parallel=enabled` unless the registered one is already this module's for `enabled`. Orbax logs
  "Type handler registry type ... overriding jax.Array" at every replacement: the absl logger is held at ERROR for
  that one call. (Orbax's own default handler also writes array_metadatas/, its metadata of PRNG-key arrays, which a
  train state does not hold; that store is not public.)"""
  current = ocp.type_handlers.get_type_handler(jax.Array)
  if current is _ARRAY_HANDLERS.get(enabled):
    return
  handler = _ARRAY_HANDLERS.setdefault(enabled, ocp.type_handlers.ArrayHandler(use_replica_parallel=enabled))
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  absl_logger.setLevel(std_logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_logger.setLevel(level)


def make_checkpoint_manager(workdir: str, config, keep: KeepSteps | None = None) -> ocp.CheckpointManager:
  """The workdir's manager: the newest config.checkpoint.max_to_keep checkpoints, plus those `keep` names; saves are
  replica-parallel or not as `replica_parallel(config)` says."""
  _use_replica_parallel(replica_parallel(config))
  policies = ocp.checkpoint_managers
  preserve = policies.LatestN(n=config.checkpoint.max_to_keep)
  if keep is not None:
    preserve = policies.AnyPreservationPolicy([preserve, keep])
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False, preservation_policy=preserve)
  return ocp.CheckpointManager(os.path.join(io_lib.absolute(workdir), "checkpoints"), options=options,
                               item_names=("state", "data", "meta"))


class CheckpointMismatchError(ValueError):
  """The checkpoint belongs to another experiment or data pipeline (not a damaged one: never skipped)."""


def save_checkpoint(mngr: ocp.CheckpointManager, step: int, state, train_iter, identity: dict) -> None:
  checksums = safeguards.state_checksums(state)  # verified on restore: damaged array data is not used silently
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=data_iterator.checkpoint_args_save(train_iter),
      meta=ocp.args.JsonSave({"step": int(step), "identity": identity, "checksums": checksums})))


def _restore_step(mngr, step: int, state, train_iter, identity: dict, allow_unverified: bool = False):
  """Restores `step` into (state, train_iter), every item verified: the experiment identity, a checksum per array and
  the iterator state's checksum and step. The state is read first: a damaged state never touches the iterator."""
  step_dir = os.path.join(os.fspath(mngr.directory), str(step))
  meta = {}
  if io_lib.epath_of(os.path.join(step_dir, "meta")).is_dir():
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict) or "identity" not in meta:
      raise RuntimeError(f"{step_dir}/meta holds no experiment identity")
    diffs = workdir_lib.identity_diffs(identity, meta["identity"])
    if diffs:
      raise CheckpointMismatchError(
          f"checkpoint {step_dir} was written by another experiment; it differs in {'; '.join(diffs)}. "
          "Use a new --workdir or delete that one")
  elif not allow_unverified:
    raise safeguards.unverified(step_dir, "its arrays, experiment identity and data iterator state")
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(state))))
  safeguards.verify_checksums(restored["state"], meta.get("checksums"), step_dir, allow_unverified)
  try:
    mngr.restore(step, args=ocp.args.Composite(
        data=data_iterator.checkpoint_args_restore(train_iter, allow_unverified)))
  except ValueError as e:
    if "differs from the one being restored" in str(e):  # batch size, seed or dataset changed
      raise CheckpointMismatchError(f"cannot resume from {step_dir}: {e}") from e
    raise
  if meta and train_iter.step != meta.get("step", step):  # each train step takes one batch
    raise safeguards.ChecksumMismatchError(f"checkpoint {step_dir}: the data iterator state is at batch "
                                           f"{train_iter.step}, the train state at step {meta.get('step', step)}")
  return restored["state"]


def restore_latest(mngr: ocp.CheckpointManager, state, make_iter, identity: dict | None = None,
                   allow_unverified: bool = False):
  """Restores the newest checkpoint that reads back completely -> (step or None, state or None, data iterator).

  `make_iter()` gives a fresh training iterator (positioned at the start); the one returned is positioned at the
  restored step. A checkpoint that fails to read (truncated or missing files, a half-written step) is reported,
  moved to <workdir>/checkpoints_damaged/ (so the step can be written again) and the previous one is tried. A
  checkpoint of another experiment or data pipeline raises CheckpointMismatchError instead, and one without checksums
  UnverifiedCheckpointError (unless `allow_unverified`: config.checkpoint.allow_unverified).
  """
  identity = identity if identity is not None else {}
  damaged = []
  result = None
  for step in sorted(mngr.all_steps(), reverse=True):
    it = make_iter()
    try:
      result = (step, _restore_step(mngr, step, state, it, identity, allow_unverified), it)
      break
    except (CheckpointMismatchError, safeguards.UnverifiedCheckpointError):
      it.close()
      raise
    except Exception as e:  # pylint: disable=broad-except
      it.close()  # a half-restored iterator may hold prefetched batches of the wrong position
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      step_dir = os.path.join(os.fspath(mngr.directory), str(step))
      logging.warning("checkpoint %s is unreadable (%s)", step_dir, reason)
      if jax.process_index() == 0:
        log.warning(f"checkpoint {step_dir} is damaged or incomplete ({reason[:300]}); "
                   "falling back to the previous checkpoint")
      damaged.append(step)
  if damaged:
    workdir_lib.sync("evqa_jax:damaged_found")
    if jax.process_index() == 0:
      aside = os.path.join(os.path.dirname(os.fspath(mngr.directory)), "checkpoints_damaged")
      io_lib.makedirs(aside)
      for step in damaged:
        target = os.path.join(aside, f"{step}.{int(time.time())}")
        io_lib.move(os.path.join(os.fspath(mngr.directory), str(step)), target)
        log.info(f"moved the damaged checkpoint of step {step} to {target}")
    workdir_lib.sync("evqa_jax:damaged_moved")
    mngr.reload()
  return result if result is not None else (None, None, make_iter())


def checkpoint_steps(ckpt_dir: str) -> list:
  """The sorted steps of the finished checkpoints in `ckpt_dir` (local or gs://...); [] when there is none. A step a
  running trainer is still writing (gs://: no commit marker yet; local: a temporary folder) is not one."""
  root = io_lib.epath_of(ckpt_dir)
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and ocp.step.is_path_finalized(p))


def load_checkpoint_arrays(workdir: str, step: int | None = None, allow_unverified: bool = False) -> tuple[int, dict]:
  """(step, numpy train state {step, trainable, frozen, opt_state}) of a workdir's checkpoint (default: newest).

  Host-side and device-independent: for inspecting or comparing runs, whatever mesh wrote them. Every array is
  verified against the checksums saved with it (ChecksumMismatchError); a checkpoint without them raises
  UnverifiedCheckpointError unless `allow_unverified` (config.checkpoint.allow_unverified); an array holding a NaN or
  an infinity in its params is an error naming it (weights given to `init_from` or scored are never damaged silently).
  """
  ckpt_dir = os.path.join(io_lib.absolute(workdir), "checkpoints")
  chosen = None
  while True:  # a run still training deletes old steps (max_to_keep): "newest" is looked up again, once
    retry = step is None and chosen is None
    steps = checkpoint_steps(ckpt_dir)
    if not steps:
      raise FileNotFoundError(f"{ckpt_dir} holds no checkpoint")
    chosen = steps[-1] if step is None else step
    try:
      return chosen, _load_step_arrays(os.path.join(ckpt_dir, str(chosen)), allow_unverified)
    except Exception as e:  # pylint: disable=broad-except
      if chosen in checkpoint_steps(ckpt_dir):
        raise  # still there: damaged, not deleted
      if retry:
        log.info(f"checkpoint step {chosen} was deleted while it was read (the run is still training); reading the "
                 "newest finished step instead")
        continue
      raise FileNotFoundError(
          f"checkpoint {ckpt_dir}/{chosen} was deleted while it was read ({type(e).__name__}): the run is still "
          "training and keeps only config.checkpoint.max_to_keep checkpoints; score a step it keeps (--checkpoint="
          "last), or wait until it finishes") from None


def _load_step_arrays(step_dir: str, allow_unverified: bool) -> dict:
  """The verified numpy train state of one step folder (`load_checkpoint_arrays`)."""
  meta_path = os.path.join(step_dir, "meta", "metadata")
  meta = io_lib.load_json(meta_path, "checkpoint meta") if io_lib.epath_of(meta_path).exists() else {}
  path = os.path.join(step_dir, "state")
  # The tree comes from the item's handler: the checkpointer's `metadata` reads a *step* folder's metadata, which the
  # CheckpointManager wrote one level up (<step>/_CHECKPOINT_METADATA, beside the state/data/meta items), and warned
  # "Metadata file does not exist" on every evaluation.
  tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path))
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  with ocp.PyTreeCheckpointer() as ckptr:
    arrays = ckptr.restore(path, restore_args=args)
  safeguards.verify_checksums(arrays, meta.get("checksums") if isinstance(meta, dict) else None, step_dir,
                              allow_unverified)
  params = {k: arrays[k] for k in ("trainable", "frozen") if isinstance(arrays, dict) and k in arrays}
  io_lib.check_finite_weights({jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)},
                              f"checkpoint {step_dir}")
  return arrays


def load_params(workdir: str, step: int | None = None, allow_unverified: bool = False) -> tuple[int, dict]:
  """(step, host numpy parameters) of a run's checkpoint (default: its newest): the trainable and frozen parameters
  as one nested dict, verified as `load_checkpoint_arrays` verifies them. What a second training stage reads from the
  first stage's workdir (JustAsk+'s `pretrained.init_from`, VIOLIN's BERT fine-tuning stage)."""
  step, state = load_checkpoint_arrays(workdir, step, allow_unverified)
  flat = dict(traverse_util.flatten_dict(state.get("frozen") or {}))
  flat.update(traverse_util.flatten_dict(state.get("trainable") or {}))
  return step, traverse_util.unflatten_dict(flat)
