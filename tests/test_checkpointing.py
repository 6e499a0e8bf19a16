"""Checkpoint saves in one process are not replica-parallel by default (no per-shard slice programs); with several
processes, or when config.checkpoint.replica_parallel says so, they are; either kind restores the same arrays."""

import logging
import os
import sys

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from evqa_jax.runs import checkpointing
from evqa_jax.runs import safeguards


def _config(replica_parallel):
  return ml_collections.ConfigDict({"checkpoint": {"max_to_keep": 2, "replica_parallel": replica_parallel}})


@pytest.fixture
def orbax_default_handler():
  """Puts Orbax's process-wide jax.Array handler back after the test."""
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  yield
  ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def _state():
  assert jax.device_count() == 8
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
  # Shapes no other test saves: each (shape, device) slice program is compiled once per process.
  replicated = jax.device_put(np.arange(48 * 11, dtype=np.float32).reshape(48, 11), NamedSharding(mesh, P()))
  split = jax.device_put(np.arange(8 * 14, dtype=np.float32).reshape(8, 14), NamedSharding(mesh, P("data", "model")))
  return {"replicated": replicated, "split": split}


def _save_and_count_slice_compiles(workdir, config, state, caplog) -> int:
  mngr = checkpointing.make_checkpoint_manager(str(workdir), config)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="jax._src.interpreters.pxla"), jax.log_compiles(True):
    mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    mngr.wait_until_finished()
  mngr.close()
  return sum("Compiling jit(slice)" in r.getMessage() for r in caplog.records)


def _restore(workdir, state):
  mngr = checkpointing.make_checkpoint_manager(str(workdir), _config(None))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
  restored = mngr.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
  mngr.close()
  return restored


def test_one_process_saves_without_replica_slices_and_both_kinds_restore_alike(tmp_path, caplog,
                                                                               orbax_default_handler):
  del orbax_default_handler
  assert jax.process_count() == 1
  assert checkpointing.replica_parallel(_config(None)) is False
  assert checkpointing.replica_parallel(_config(True)) is True
  # The default lives in configs/common.py (STYLE rule 2), not in the library: unset, i.e. only with several processes.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import common  # pylint: disable=g-import-not-at-top
  assert common.base_config().checkpoint.replica_parallel is None
  state = _state()
  plain = _save_and_count_slice_compiles(tmp_path / "plain", _config(None), state, caplog)
  parallel = _save_and_count_slice_compiles(tmp_path / "parallel", _config(True), state, caplog)
  # Replica-parallel: the replicated [48, 11] array's 8 replicas (48 rows divide among them) each slice their share
  # on their own device, a program per (shape, device); the fully split [8, 14] array has one replica.
  assert plain == 0
  assert parallel == 8, parallel
  for name in ("plain", "parallel"):
    restored = _restore(tmp_path / name, state)
    for key, value in state.items():
      np.testing.assert_array_equal(np.asarray(restored[key]), np.asarray(value), err_msg=f"{name}: {key}")
      assert restored[key].sharding == value.sharding


def test_load_checkpoint_arrays_reads_a_managed_step_without_a_warning(tmp_path, caplog):
  """launch/evaluate.py reads a checkpoint host-side (load_checkpoint_arrays): the very arrays, and no Orbax
  "Metadata file does not exist: .../<step>/state/_CHECKPOINT_METADATA" (step metadata is one level up)."""
  state = _state()
  mngr = checkpointing.make_checkpoint_manager(str(tmp_path), _config(None))
  meta = {"step": 3, "checksums": safeguards.state_checksums(state)}  # as save_checkpoint writes it
  mngr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
  mngr.wait_until_finished()
  mngr.close()
  assert (tmp_path / "checkpoints" / "3" / "_CHECKPOINT_METADATA").exists()
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    step, arrays = checkpointing.load_checkpoint_arrays(str(tmp_path))
  assert step == 3 and [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
  for key, value in state.items():
    assert isinstance(arrays[key], np.ndarray)
    np.testing.assert_array_equal(arrays[key], np.asarray(value))


def test_switching_the_array_handler_logs_no_orbax_override_warning(caplog, orbax_default_handler):
  """A one-process run replaces Orbax's default (replica-parallel) jax.Array handler at its first checkpoint manager
  through Orbax's public `register_type_handler`, quietly: Orbax logs "Type handler registry type ... overriding" at
  every replacement, and the library holds the absl logger at ERROR for that call."""
  del orbax_default_handler
  with caplog.at_level(logging.DEBUG):
    for enabled in (True, False, True):  # the last two replace the handler before them, whatever the first finds
      checkpointing._use_replica_parallel(enabled)  # pylint: disable=protected-access
      handler = ocp.type_handlers.get_type_handler(jax.Array)
      assert handler._use_replica_parallel is enabled  # pylint: disable=protected-access
  assert not [r.getMessage() for r in caplog.records if "Type handler registry" in r.getMessage()]


def test_state_checksums_on_host_equal_the_device_program_and_a_hand_computed_case():
  """A small state held whole by the process is summed on the host (no compile); the numbers are the device
  program's, for every dtype a train state holds and for sharded and replicated arrays."""
  from evqa_jax.runs import safeguards
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
  r = np.random.RandomState(0)
  state = {
      "f32": jax.device_put(r.normal(size=(8, 8750)).astype(np.float32),
                            NamedSharding(mesh, P("data", None))),
      "bf16": jax.device_put(r.normal(size=(4, 6)).astype(jax.numpy.bfloat16), NamedSharding(mesh, P(None, "model"))),
      "step": jax.numpy.asarray(123456, np.int32),
      "mask": jax.numpy.asarray(r.rand(5) > 0.5),
      "ids": jax.numpy.asarray(r.randint(0, 255, (3, 3)), np.uint8),
      "neg": jax.numpy.asarray([-1, -2**31], np.int32),
  }
  host = safeguards.state_checksums(state)
  device = safeguards.state_checksums(state, host_max_bytes=0)
  assert host == device and len(host) == 6
  # uint32 [1, 2, 3]: weights (i * 2654435761 mod 2^32) | 1 = 1, 2654435761, 1013904227; sum mod 2^32.
  expected = (1 * 1 + 2 * 2654435761 + 3 * 1013904227) % 2**32
  assert safeguards.state_checksums({"x": np.array([1, 2, 3], np.uint32)}) == {"['x']": expected}
  assert safeguards.state_checksums({"x": jax.numpy.asarray([1, 2, 3], np.uint32)}, host_max_bytes=0) == \
      {"['x']": expected}
  flipped = dict(state, bf16=state["bf16"].at[2, 3].set(7.0))
  changed = {k for k, v in safeguards.state_checksums(flipped).items() if v != host[k]}
  assert changed == {"['bf16']"}


def test_load_params_merges_the_trainable_and_frozen_parameters_of_a_run(tmp_path):
  """What a second training stage reads of the first one's workdir (runs.checkpointing.load_params): one tree of the
  trainable and frozen parameters, as host numpy, verified; the optimiser state and step left out."""
  w, b, emb = (jax.numpy.asarray(np.arange(n, dtype=np.float32) + n) for n in (6, 2, 4))
  state = {"step": jax.numpy.asarray(7, np.int32), "trainable": {"head": {"w": w}},
           "frozen": {"head": {"b": b}, "emb": emb}, "opt_state": {"mu": {"head": {"w": w * 0}}}}
  mngr = checkpointing.make_checkpoint_manager(str(tmp_path), _config(None))
  meta = {"step": 7, "checksums": safeguards.state_checksums(state)}
  mngr.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
  mngr.wait_until_finished()
  mngr.close()
  step, params = checkpointing.load_params(str(tmp_path))
  assert step == 7 and jax.tree.structure(params) == jax.tree.structure({"head": {"w": 0, "b": 0}, "emb": 0})
  for got, want in ((params["head"]["w"], w), (params["head"]["b"], b), (params["emb"], emb)):
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, np.asarray(want))
