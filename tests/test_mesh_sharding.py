"""Steps traced under the mesh: activation sharding constraints are real, and every mesh shape trains alike (OVQA).

The trainer traces its steps inside `jax.set_mesh(mesh)` + `nn.logical_axis_rules(rules)`; there the modules'
`with_logical_constraint` calls become `sdy.sharding_constraint` ops on the activations (without the mesh they
vanish). 8x1, 4x2 and 2x4 meshes give the same losses on every task (tests/mesh_equivalence.py; VIOLIN and E-VQA in
tests/test_mesh_sharding_violin.py and tests/test_mesh_sharding_evqa.py, so that the xdist workers share them).
"""

import re

import flax.linen as nn
import jax
import numpy as np
import pytest

import mesh_equivalence
from evqa_jax import projects as tasks_lib
from evqa_jax.train import aot, sharding

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _constraints(text: str) -> list:
  """The distinct sharding annotations of `sdy.sharding_constraint` ops in lowered StableHLO text."""
  return sorted(set(re.findall(r"sdy\.sharding_constraint %\S+ (<@mesh, \[.*?\]>) : (tensor<[^>]*>)", text)))


def test_train_step_lowered_on_2x4_mesh_carries_activation_shardings(monkeypatch):
  """OVQA (BERT-family LM + verbalizer) on data x model = 2 x 4: the LM's [batch, length, embed] hidden states are
  constrained to the data axis and the verbalizer's [nodes, embed] states to the model axis; traced without the
  context mesh (what the trainer did before) the same step has no activation constraint at all."""
  config = mesh_equivalence.config_in_repo("ovqa", monkeypatch)
  lowered, report = aot.lower_train_step(config, (2, 4))
  assert report["mesh"] == {"data": 2, "model": 4}
  found = _constraints(lowered.as_text())
  specs = {spec for spec, _ in found}
  assert '<@mesh, [{"data"}, {}, {}]>' in specs, found        # [batch, length, embed]
  assert '<@mesh, [{"model"}, {}]>' in specs, found            # [nodes, embed]
  nodes = [t for spec, t in found if spec == '<@mesh, [{"model"}, {}]>']
  # The verbalizer's node states: [nodes padded to a multiple of 64, embed].
  assert all(int(re.match(r"tensor<(\d+)x", t).group(1)) % 64 == 0 for t in nodes), nodes

  task = tasks_lib.build_task(config)
  with nn.logical_axis_rules(sharding.rules_tuple(config.logical_axis_rules)):  # rules but no mesh
    text = jax.jit(lambda p, b, a: task.loss(p, b, a, jax.random.key(0))[0]).lower(
        *_abstract_inputs(task, config)).as_text()
  assert "sdy.sharding_constraint" not in text


def _abstract_inputs(task, config):
  params = nn.meta.unbox(jax.eval_shape(task.init_params, jax.random.key(0)))
  example = task.preprocess(task.source(config.data.train_split)[0], train=True)
  batch = {k: jax.ShapeDtypeStruct((config.batch_size,) + np.shape(v), np.asarray(v).dtype) for k, v in example.items()}
  aux = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                     task.aux_inputs(config.data.train_split))
  return params, batch, aux


def test_meshes_8x1_4x2_2x4_give_the_same_losses(monkeypatch):
  mesh_equivalence.assert_meshes_give_the_same_losses(mesh_equivalence.config_in_repo("ovqa", monkeypatch))
