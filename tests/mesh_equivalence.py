"""8x1, 4x2 and 2x4 (data x model) meshes train alike: the shared body of tests/test_mesh_sharding*.py.

The trainer traces its steps inside `jax.set_mesh(mesh)` + `nn.logical_axis_rules(rules)`; there the modules'
`with_logical_constraint` calls become `sdy.sharding_constraint` ops on the activations. On the 8 simulated CPU
devices the three meshes must give the same losses, to 1e-5 (+ 1e-6 relative), on each task's test config, from the
same initial parameters and batches, and frozen parameters must never move. One module per task
(tests/test_mesh_sharding.py: OVQA, test_mesh_sharding_violin.py, test_mesh_sharding_evqa.py), so that the
pytest-xdist workers (`--dist loadfile`) share the three tasks' compiles.
"""

import os
import sys

import jax
import numpy as np
from flax import traverse_util

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from configs import evqa_gen, ovqa_msrvtt, violin  # noqa: E402
from evqa_jax import projects as tasks_lib  # noqa: E402
from evqa_jax.data import pipeline  # noqa: E402
from data_prep import worlds  # noqa: E402
from evqa_jax.train import partition, sharding  # noqa: E402
from evqa_jax.train import steps as steps_lib  # noqa: E402

# The smallest configs that run every part of each task's model (OVQA: a random 2-layer BERT and the GNN
# verbalizer; E-VQA: one encoder layer, a 16 x 16 patch grid): the three meshes compile every step anew.
CONFIGS = {
    "ovqa": lambda: ovqa_msrvtt.get_config("tiny"),
    "violin": lambda: violin.get_config("small"),
    "evqa": lambda: evqa_gen.get_config("tiny"),
}
MESHES = ((8, 1), (4, 2), (2, 4))
STEPS = 2


def config_in_repo(name, monkeypatch):
  """The task's test config, with the working directory at the repository (the configs name their synthetic worlds
  relative to it) and its world built, as launch/train.py does before building a task."""
  monkeypatch.chdir(REPO)
  config = CONFIGS[name]()
  worlds.ensure_synthetic_world(config)
  return config


def train(config, mesh_shape, steps=STEPS):
  """`steps` train steps of the trainer's own StepFns on `mesh_shape` -> (losses, host frozen before, after)."""
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(mesh_shape, config.mesh_axes)
  rules = config.logical_axis_rules
  tx, _ = partition.make_optimizer(config.optim, config.total_steps)
  state, shardings = steps_lib.create_state(task, config, mesh, tx)
  state = steps_lib.load_pretrained_into(state, task, shardings)
  frozen_before = jax.tree.map(np.asarray, state["frozen"])
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
  return losses, frozen_before, jax.tree.map(np.asarray, state["frozen"])


def assert_meshes_give_the_same_losses(config):
  """STEPS steps on each of MESHES: finite, changing losses equal to the 8x1 run's; frozen parameters bit for bit."""
  assert jax.device_count() == 8
  runs = {shape: train(config, shape) for shape in MESHES}
  reference = runs[MESHES[0]][0]
  assert all(np.isfinite(reference)) and len(set(reference)) == STEPS, reference  # real, changing losses
  for shape, (losses, before, after) in runs.items():
    # 1e-5, plus float32 rounding for large losses: E-VQA's ~39 differs by 1.1e-5 (3 ulps) on 4x2, where the
    # reductions over rows and widths run in another order.
    np.testing.assert_allclose(losses, reference, rtol=1e-6, atol=1e-5, err_msg=f"mesh {shape}")
    flat_before, flat_after = traverse_util.flatten_dict(before), traverse_util.flatten_dict(after)
    assert flat_before.keys() == flat_after.keys()
    for k, v in flat_before.items():  # frozen parameters: bit for bit
      np.testing.assert_array_equal(flat_after[k], v, err_msg=f"mesh {shape}: frozen {'/'.join(k)}")
