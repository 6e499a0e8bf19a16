"""Ahead-of-time compile check: lower and compile a config's train step for a target mesh, with no data and no
weights, and report its memory use and FLOPs.

    report = compile_train_step(config, mesh_shape=(4, 2))           # the local devices (8 fake CPUs, a GPU, ...)
    report = compile_train_step(config, (16, 4), topology="v5e:8x8")  # a TPU slice this host need not be part of

Inputs are jax.ShapeDtypeStructs carrying the shardings the trainer would use: the train state comes from
`jax.eval_shape(task.init_params)` (no parameter is created), the batch shapes from the task's preprocessing of one
record (`config.batch_size` rows), the aux inputs (answer vocabulary, graphs) from the task (what the steps read: `steps.StepAux`). The compiled function is
the trainer's own train step (`steps.StepFns`), so what compiles here is what a run executes. The chips' data
sheets and the roofline drawn from these figures are benchmark bookkeeping: benchmarks/chips.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from evqa_jax import projects as tasks_lib
from evqa_jax.train import partition, sharding
from evqa_jax.train import steps as steps_lib


# Chips with two TensorCores that JAX runs as one device each (megacore): libtpu's default description of their
# topologies lists the cores (v4:2x2x2 -> 16 devices of half a chip's HBM), not the devices a job gets (8).
MEGACORE_CHIPS = ("v4", "v5p")


def topology_devices(topology: str, platform: str = "tpu"):
  """Devices of a target topology such as 'v5e:2x4' (TPU; needs libtpu on this host, not the TPUs themselves):
  one per chip, as a job on that slice sees them (MEGACORE_CHIPS: v4:2x2x2 is 8 devices).

  `pip install -e .[tpu]` brings the libtpu that this jax pins. libtpu takes a host-wide lock file
  (/tmp/libtpu_lockfile) that any other JAX process on the host may hold; compiling needs no TPU, so the lock is
  waived (ALLOW_MULTIPLE_LIBTPU_LOAD, set here unless the caller set it).
  """
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  kwargs = {}
  if platform == "tpu" and topology.split(":")[0] in MEGACORE_CHIPS:
    kwargs["chip_config_name"] = "megacore"
  try:
    return topologies.get_topology_desc(topology_name=topology, platform=platform, **kwargs).devices
  except (ImportError, RuntimeError, ValueError) as e:  # JaxRuntimeError is a RuntimeError
    raise RuntimeError(f"cannot describe the {platform} topology {topology!r} on this host ({e}); "
                       f"a TPU topology needs libtpu: pip install -e .[tpu]") from e


def _batch_struct(task, config, batch_shard):
  source = task.source(config.data.train_split)
  if len(source) == 0:
    raise ValueError(f"split {config.data.train_split!r} of {config.data.dir} has no examples: its first record "
                     "fixes the input shapes")
  example = task.preprocess(source[0], train=True)
  return {k: jax.ShapeDtypeStruct((config.batch_size,) + np.shape(v), np.asarray(v).dtype, sharding=batch_shard)
          for k, v in example.items()}


def analysis(compiled) -> dict:
  out = {}
  try:
    mem = compiled.memory_analysis()
  except Exception as e:  # pylint: disable=broad-except
    mem, out["memory_error"] = None, str(e)
  if mem is not None:
    for key in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes",
                "generated_code_size_in_bytes", "host_temp_size_in_bytes"):
      if hasattr(mem, key):
        out[key] = int(getattr(mem, key))
    if {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= out.keys():
      # Donated state aliases its outputs: count those bytes once.
      out["peak_estimate_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                                    + out["temp_size_in_bytes"] - out.get("alias_size_in_bytes", 0))
  try:
    cost = compiled.cost_analysis()
  except Exception as e:  # pylint: disable=broad-except
    cost, out["cost_error"] = None, str(e)
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  # A figure XLA's cost report lacks is missing (None, JSON null), never 0: a 0 would read as a measured count.
  for key, name in (("flops", "flops"), ("bytes_accessed", "bytes accessed"), ("transcendentals", "transcendentals")):
    out[key] = float(cost[name]) if cost and cost.get(name) is not None else None
  return out


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a lowering needs: the devices and mesh, the task and optimiser, and ShapeDtypeStructs (with the trainer's
  shardings) of the train state and aux inputs."""
  devices: list
  mesh: Any
  rules: Any
  task: Any
  tx: Any
  state: dict
  aux: Any
  aux_shardings: Any


def setup(config, mesh_shape=None, devices=None, topology: str | None = None) -> Setup:
  """The mesh, task, abstract train state and aux inputs of `config` on `mesh_shape` over `devices` (or a TPU
  `topology`'s)."""
  if topology:
    devices = topology_devices(topology)
  devices = list(jax.devices() if devices is None else devices)
  mesh_shape = tuple(config.mesh_shape if mesh_shape is None else mesh_shape)
  mesh = sharding.make_mesh(mesh_shape, config.mesh_axes, devices=devices)
  rules = config.logical_axis_rules
  task = tasks_lib.build_task(config)
  tx, _ = partition.make_optimizer(config.optim, total_steps=1000)
  state = steps_lib.abstract_train_state(task, config, mesh, tx)
  # What the steps read: with task.precomputes_aux (JustAsk+'s frozen answer encoder), the precomputed inputs.
  step_aux = steps_lib.StepAux(task, mesh, rules, state, jax.tree.map(lambda x: x.sharding, state),
                               task.aux_inputs(config.data.train_split))
  return Setup(devices, mesh, rules, task, tx, state, step_aux.abstract, step_aux.shardings)


def describe(config, task, mesh, devices, state) -> dict:
  return {
      "task": config.task,
      "describe": task.describe(),
      "mesh": {k: int(v) for k, v in mesh.shape.items()},
      "devices": len(devices),
      "device_kind": devices[0].device_kind,
      "platform": devices[0].platform,
      "global_batch_size": int(config.batch_size),
      "trainable_params": partition.count_params(state["trainable"]),
      "frozen_params": partition.count_params(state["frozen"]),
  }


def lower_train_step(config, mesh_shape=None, devices=None, topology: str | None = None):
  """-> (jax `Lowered` train step of `config` on `mesh_shape`, JSON-able description). Traced under the mesh and the
  logical rules exactly as the trainer traces it, so `lowered.as_text()` shows the activation sharding constraints."""
  s = setup(config, mesh_shape, devices, topology)
  state_shardings = jax.tree.map(lambda x: x.sharding, s.state)
  batch_shard = sharding.batch_sharding(s.mesh, s.rules)
  batch = _batch_struct(s.task, config, batch_shard)
  steps = steps_lib.StepFns(s.task, s.tx, s.mesh, s.rules, state_shardings, batch_shard, s.aux_shardings)
  with steps.context():
    lowered = steps.train_step.lower(s.state, batch, s.aux)
  report = describe(config, s.task, s.mesh, s.devices, s.state)
  report["batch"] = {k: [list(v.shape), str(v.dtype)] for k, v in batch.items()}
  return lowered, report


def compile_train_step(config, mesh_shape=None, devices=None, topology: str | None = None) -> dict:
  """Compiles the train step of `config` for `mesh_shape` (default config.mesh_shape); returns a JSON-able report.

  Memory figures are per device (XLA compiles one SPMD program); FLOPs are per device as XLA counts them.
  """
  report = compile_lowered(*lower_train_step(config, mesh_shape, devices, topology))
  if config.model.get("remat", "none") == "none":
    report["model_flops"] = report.get("flops")
  return report


def model_flops(config, mesh_shape=None, devices=None, topology: str | None = None) -> float | None:
  """XLA's FLOPs count of the same step without rematerialization (model.remat = none): the step's model FLOPs,
  without the forward recomputed in the backward (one more compile; memory is not checked)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.model.remat = "none"
  lowered, _ = lower_train_step(config, mesh_shape, devices, topology)
  return analysis(lowered.compile()).get("flops")


def compile_lowered(lowered, report, compiler_options=None) -> dict:
  """Compiles a `Lowered` (with XLA `compiler_options` such as {"xla_dump_to": DIR}) and adds its compile seconds,
  memory and cost analysis to `report`."""
  t0 = time.time()
  compiled = lowered.compile(compiler_options)
  report["compile_seconds"] = round(time.time() - t0, 1)
  report.update(analysis(compiled))
  return report
