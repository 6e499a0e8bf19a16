"""1 device and the 8x1, 4x2 and 2x4 (data x model) meshes train alike: the shared body of the mesh tests.

The trainer traces its steps inside `jax.set_mesh(mesh)` + `nn.logical_axis_rules(rules)`; there the modules'
`with_logical_constraint` calls become `sdy.sharding_constraint` ops on the activations. On the 8 simulated CPU
devices the three meshes must give the losses of one device (a 1 x 1 mesh on the first device: a single-device
program), to 1e-5 (+ 1e-6 relative), on each task's test config, from the same initial parameters and batches, and
frozen parameters must never move. The 4 x 2 run is the trainer's whole `train_and_evaluate` (evaluated at the end:
the calling module checks its metrics and files); the others run the trainer's own StepFns. One module per task
(tests/test_mesh_sharding.py: OVQA, tests/test_mesh_sharding_evqa.py; VIOLIN's task module compares its evaluated
4 x 2 run with these meshes itself), so that the pytest-xdist workers (`--dist loadfile`) share the tasks' compiles.
"""

import json
import os
import sys
from typing import NamedTuple

import jax
import numpy as np
from flax import traverse_util

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from configs import evqa_gen, ovqa_msrvtt  # noqa: E402
from evqa_jax import projects as tasks_lib  # noqa: E402
from evqa_jax.data import pipeline  # noqa: E402
from data_prep import worlds  # noqa: E402
from evqa_jax.train import partition, sharding, train_and_evaluate  # noqa: E402
from evqa_jax.runs import checkpointing  # noqa: E402
from evqa_jax.train import steps as steps_lib  # noqa: E402

# The smallest configs that run every part of each task's model (OVQA: a random 2-layer BERT and the GNN
# verbalizer; E-VQA: one encoder layer, a 16 x 16 patch grid): the three meshes compile every step anew.
CONFIGS = {
    "ovqa": lambda: ovqa_msrvtt.get_config("tiny"),
    "evqa": lambda: evqa_gen.get_config("tiny"),
}
ONE_DEVICE = (1, 1)
STEPS = 2


class Run(NamedTuple):
  """One mesh's run: its losses, its initial train state and its frozen parameters after training (host numpy)."""
  losses: list
  initial: dict
  frozen_after: dict


def config_in_repo(name, monkeypatch):
  """The task's test config (STEPS steps, evaluated and checkpointed at the end), with the working directory at the
  repository (the configs name their synthetic worlds relative to it) and its world built, as launch/train.py does
  before building a task."""
  monkeypatch.chdir(REPO)
  config = CONFIGS[name]()
  for prefix, value in (("total", STEPS), ("eval_every", STEPS), ("checkpoint_every", STEPS)):
    for unit in ("steps", "epochs", "examples"):
      if f"{prefix}_{unit}" in config:
        config[f"{prefix}_{unit}"] = value if unit == "steps" else None
  worlds.ensure_synthetic_world(config)
  return config


def initial_state(config, mesh_shape) -> dict:
  """The trainer's initial state on `mesh_shape` (`create_state`, pretrained weights loaded), on the host: the
  `train_and_evaluate` run on that mesh then finds its init compiled (a persistent-cache hit)."""
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(mesh_shape, config.mesh_axes, jax.devices()[:int(np.prod(mesh_shape))])
  tx, _ = partition.make_optimizer(config.optim, config.total_steps)
  state, shardings = steps_lib.create_state(task, config, mesh, tx)
  return jax.tree.map(np.asarray, steps_lib.load_pretrained_into(state, task, shardings))


def train(config, mesh_shape, steps=STEPS, initial=None) -> Run:
  """`steps` train steps of the trainer's own StepFns on `mesh_shape` (over the first devices). The initial state is the trainer's (`create_state`, pretrained weights
  loaded), or `initial` (a host state of another mesh's run) placed with this mesh's state shardings: the same
  parameters without another init compile."""
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(mesh_shape, config.mesh_axes, jax.devices()[:int(np.prod(mesh_shape))])
  rules = config.logical_axis_rules
  tx, _ = partition.make_optimizer(config.optim, config.total_steps)
  if initial is None:
    state, shardings = steps_lib.create_state(task, config, mesh, tx)
    state = steps_lib.load_pretrained_into(state, task, shardings)
    initial = jax.tree.map(np.asarray, state)
  else:
    shardings = jax.tree.map(lambda s: s.sharding, steps_lib.abstract_train_state(task, config, mesh, tx))
    state = jax.device_put(initial, shardings)
  batch_shard = sharding.batch_sharding(mesh, rules)
  aux = task.aux_inputs(config.data.train_split)
  aux_shardings = steps_lib.aux_shardings_for(task, mesh, rules, aux)
  aux = sharding.host_to_global(aux, aux_shardings)
  fns = steps_lib.StepFns(task, tx, mesh, rules, shardings, batch_shard, aux_shardings)
  loader = pipeline.make_train_loader(task.source(config.data.train_split), global_batch_size=config.batch_size,
                                      transform=lambda ex: task.preprocess(ex, train=True), seed=config.seed,
                                      process_index=0, process_count=1)
  it = iter(loader)
  losses = []
  with fns.context():
    for _ in range(steps):
      state, metrics = fns.train_step(state, sharding.global_batch(next(it), batch_shard), aux)
      losses.append(float(metrics["loss"]))
  it.close()
  return Run(losses, initial, jax.tree.map(np.asarray, state["frozen"]))


def assert_same_losses(runs: dict, reference_shape=ONE_DEVICE, steps=STEPS) -> None:
  """runs: {mesh shape: Run}. Finite, changing losses equal to those of `reference_shape`'s run; frozen parameters
  after training bit for bit those of the initial state."""
  reference = runs[reference_shape].losses
  assert len(reference) == steps and all(np.isfinite(reference)) and len(set(reference)) == steps, reference
  for shape, (losses, initial, after) in runs.items():
    # 1e-5, plus float32 rounding for large losses: E-VQA's ~39 differs by 1.1e-5 (3 ulps) on 4x2, where the
    # reductions over rows and widths run in another order.
    np.testing.assert_allclose(losses, reference, rtol=1e-6, atol=1e-5, err_msg=f"mesh {shape}")
    flat_before, flat_after = traverse_util.flatten_dict(initial["frozen"]), traverse_util.flatten_dict(after)
    assert flat_before.keys() == flat_after.keys()
    for k, v in flat_before.items():  # frozen parameters: bit for bit
      np.testing.assert_array_equal(flat_after[k], v, err_msg=f"mesh {shape}: frozen {'/'.join(k)}")


def assert_meshes_give_the_same_losses(config, workdir: str, meshes=((8, 1), (2, 4))) -> dict:
  """1 device, then `meshes` (StepFns) and 4x2 (`train_and_evaluate` in `workdir`, STEPS steps, evaluated):
  the same losses; frozen parameters never move. -> the 4 x 2 run's result (its last metrics).
  All start from the trainer's initial state on the 4 x 2 mesh: one init compile, which the 4 x 2 run reuses."""
  assert jax.device_count() == 8
  run = config.copy_and_resolve_references()
  run.mesh_shape = (4, 2)
  initial = initial_state(config, run.mesh_shape)
  runs = {shape: train(config, shape, initial=initial) for shape in (ONE_DEVICE, *meshes)}
  one = runs[ONE_DEVICE]
  result = train_and_evaluate(run, workdir)
  with open(os.path.join(workdir, "train_history.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert [h["step"] for h in history] == list(range(1, STEPS + 1)) and result["step"] == STEPS
  step, state = checkpointing.load_checkpoint_arrays(workdir)
  assert step == STEPS
  # The 4 x 2 run's frozen parameters after training against the 1-device run's before: also the same initial
  # parameters on both meshes.
  runs[(4, 2)] = Run([h["loss"] for h in history], one.initial, state["frozen"])
  assert_same_losses(runs)
  return result
