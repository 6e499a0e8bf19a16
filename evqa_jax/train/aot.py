"""Ahead-of-time compile check: lower and compile a config's train step for a target mesh, with no data and no
weights, and report its memory use and FLOPs.

    report = compile_train_step(config, mesh_shape=(4, 2))           # the local devices (8 fake CPUs, a GPU, ...)
    report = compile_train_step(config, (16, 4), topology="v5e:8x8")  # a TPU slice this host need not be part of

Inputs are jax.ShapeDtypeStructs carrying the shardings the trainer would use: the train state comes from
`jax.eval_shape(task.init_params)` (no parameter is created), the batch shapes from the task's preprocessing of one
record (`config.batch_size` rows), the aux inputs (answer vocabulary, graphs) from the task. The compiled function is
the trainer's own train step (`steps.StepFns`), so what compiles here is what a run executes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from flax import traverse_util
import jax
import numpy as np

from evqa_jax import projects as tasks_lib
from evqa_jax.models import encoders
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


def _analysis(compiled) -> dict:
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
  if cost:
    out["flops"] = float(cost.get("flops", 0.0))
    out["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
    out["transcendentals"] = float(cost.get("transcendentals", 0.0))
  return out


# Published per-chip HBM capacity (bytes) and bandwidth (bytes/s) by jax device_kind (Cloud TPU system architecture
# pages). Peak FLOP/s come from benchmarks/gpu_mfu.py's PEAK_FLOPS, which the compile table passes in.
CHIP_HBM = {
    "TPU v5 lite": (16 * 2**30, 819e9),   # v5e
    "TPU v6 lite": (32 * 2**30, 1640e9),  # v6e (Trillium)
    "TPU v5": (95 * 2**30, 2765e9),       # v5p
    "TPU v4": (32 * 2**30, 1200e9),
}


def roofline(report: dict, peak_flops: float | None) -> dict:
  """Fit and roofline figures of a compile report (per device): HBM of the chip, `fits` (peak estimate <= HBM),
  roofline step time max(FLOPs / peak, bytes accessed / HBM bandwidth) and the MFU ceiling it implies (compute time
  / roofline time: the most a step can reach even with perfect overlap). Unknown chips give only what is known."""
  out = {}
  hbm = CHIP_HBM.get(report.get("device_kind", ""))
  if hbm:
    out["hbm_bytes"], out["hbm_bytes_per_s"] = hbm
    if "peak_estimate_bytes" in report:
      out["fits"] = report["peak_estimate_bytes"] <= hbm[0]
  if peak_flops:
    out["peak_flops_per_s"] = peak_flops
  flops, moved = report.get("flops"), report.get("bytes_accessed")
  if peak_flops and flops:
    compute_s = flops / peak_flops
    memory_s = moved / hbm[1] if hbm and moved else 0.0
    out["roofline_step_s"] = max(compute_s, memory_s)
    out["roofline_bound"] = "compute" if compute_s >= memory_s else "memory"
    out["mfu_ceiling"] = compute_s / out["roofline_step_s"]
  return out


@dataclasses.dataclass(frozen=True)
class _Setup:
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


def _setup(config, mesh_shape=None, devices=None, topology: str | None = None) -> _Setup:
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
  aux_np = task.aux_inputs(config.data.train_split)
  aux_shardings = steps_lib.aux_shardings_for(task, mesh, rules, aux_np)
  aux = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=s),
                     aux_np, aux_shardings)
  return _Setup(devices, mesh, rules, task, tx, state, aux, aux_shardings)


def _describe(config, task, mesh, devices, state) -> dict:
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
  s = _setup(config, mesh_shape, devices, topology)
  state_shardings = jax.tree.map(lambda x: x.sharding, s.state)
  batch_shard = sharding.batch_sharding(s.mesh, s.rules)
  batch = _batch_struct(s.task, config, batch_shard)
  steps = steps_lib.StepFns(s.task, s.tx, s.mesh, s.rules, state_shardings, batch_shard, s.aux_shardings)
  with steps.context():
    lowered = steps.train_step.lower(s.state, batch, s.aux)
  report = _describe(config, s.task, s.mesh, s.devices, s.state)
  report["batch"] = {k: [list(v.shape), str(v.dtype)] for k, v in batch.items()}
  return lowered, report


def lower_verbalizer_step(config, mesh_shape=None, devices=None, topology: str | None = None):
  """-> (`Lowered` gradient of an OVQA config's answer scoring alone, JSON-able description).

  Only the answer path of the train step: the answer and node embeddings from the frozen word-embedding table, the
  GNN verbalizer, the scores of `config.batch_size` [MASK] features (stand-ins for the LM's, batch-sharded) against
  them, their cross-entropy, and its gradient for the verbalizer's parameters; shapes, dtypes, shardings and the
  logical rules are the trainer's. It compiles in seconds where the whole step takes many minutes, so the
  verbalizer's memory can be studied (benchmarks/verbalizer_memory.py).
  """
  import jax.numpy as jnp
  import optax

  if config.task != "ovqa":
    raise ValueError(f"config.task = {config.task!r}: the verbalizer step is OVQA's")
  s = _setup(config, mesh_shape, devices, topology)
  state, mesh, aux = s.state, s.mesh, s.aux
  if "verbalizer" not in state["trainable"]:
    raise ValueError("the config has no GNN verbalizer (config.verbalizer.variant 'A' or a closed head)")
  model = s.task.model
  lm = model.encoder_config
  # Of the frozen parameters only the LM's word-embedding table is read (the answer encoder): pass just that leaf,
  # found where the model finds it (encoders.word_embeddings), at its path in the frozen tree.
  if "lm" not in state["frozen"]:
    raise ValueError(f"the frozen parameters hold no 'lm' (the {config.model.encoder} LM): {sorted(state['frozen'])}")
  table = encoders.word_embeddings(model.encoder, state["frozen"]["lm"])
  flat = traverse_util.flatten_dict(state["frozen"])
  frozen = {k: v for k, v in flat.items() if v is table}
  if len(frozen) != 1:
    raise ValueError(f"the {config.model.encoder} LM's word-embedding table is {len(frozen)} leaves of the frozen tree")
  frozen = traverse_util.unflatten_dict(frozen)
  batch_shard = sharding.batch_sharding(mesh, s.rules)
  feature = jax.ShapeDtypeStruct((config.batch_size, lm.hidden_size), lm.dtype, sharding=batch_shard)
  labels = jax.ShapeDtypeStruct((config.batch_size,), jnp.int32, sharding=batch_shard)

  def loss_fn(verbalizer, frozen, aux, feature, labels):
    params = dict(frozen, verbalizer=verbalizer)
    logits = model.apply({"params": params}, feature, aux, method=model.score)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  step = jax.jit(jax.value_and_grad(loss_fn))
  with steps_lib.mesh_context(mesh, s.rules):
    lowered = step.lower(state["trainable"]["verbalizer"], frozen, aux, feature, labels)
  report = _describe(config, s.task, mesh, s.devices, state)
  report["verbalizer"] = dict(config.verbalizer)
  report["verbalizer_call"] = {k: int(v) for k, v in (model.verbalizer_call or {}).items()}
  report["aux"] = {k: [list(v.shape), str(v.dtype)] for k, v in aux.items()}
  return lowered, report


def compile_train_step(config, mesh_shape=None, devices=None, topology: str | None = None) -> dict:
  """Compiles the train step of `config` for `mesh_shape` (default config.mesh_shape); returns a JSON-able report.

  Memory figures are per device (XLA compiles one SPMD program); FLOPs are per device as XLA counts them.
  """
  return _compile(*lower_train_step(config, mesh_shape, devices, topology))


def compile_verbalizer_step(config, mesh_shape=None, devices=None, topology: str | None = None,
                            compiler_options=None) -> dict:
  """`lower_verbalizer_step`, compiled (with XLA `compiler_options` such as {"xla_dump_to": DIR}); its report has the
  memory and FLOPs figures of `compile_train_step`."""
  return _compile(*lower_verbalizer_step(config, mesh_shape, devices, topology), compiler_options)


def _compile(lowered, report, compiler_options=None) -> dict:
  t0 = time.time()
  compiled = lowered.compile(compiler_options)
  report["compile_seconds"] = round(time.time() - t0, 1)
  report.update(_analysis(compiled))
  return report
