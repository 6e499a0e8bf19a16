"""Steps traced under the mesh: activation sharding constraints are real, and every mesh shape trains alike (OVQA).

The trainer traces its steps inside `jax.set_mesh(mesh)` + `nn.logical_axis_rules(rules)`; there the modules'
`with_logical_constraint` calls become `sdy.sharding_constraint` ops on the activations (without the mesh they
vanish). 1 device and the 8x1, 4x2 and 2x4 meshes give the same losses on every task (tests/mesh_equivalence.py;
E-VQA in tests/test_mesh_sharding_evqa.py, so that the xdist workers share them; VIOLIN in tests/test_violin_task.py).
The 4 x 2 run is the trainer's whole `train_and_evaluate` on the OVQA test config (random 2-layer BERT, GNN
verbalizer, the small synthetic world): its metrics must equal the command-line evaluator re-scoring the written
predictions.csv.
"""

import json
import math
import os
import re
import subprocess
import sys

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


def test_one_device_and_meshes_8x1_4x2_2x4_give_the_same_losses_and_evaluation(monkeypatch, tmp_path):
  config = mesh_equivalence.config_in_repo("ovqa", monkeypatch)
  workdir = str(tmp_path / "mesh42")
  result = mesh_equivalence.assert_meshes_give_the_same_losses(config, workdir)
  steps = mesh_equivalence.STEPS
  with open(os.path.join(workdir, "train_history.jsonl")) as f:
    history = [json.loads(line) for line in f]
  for row in history:
    assert math.isfinite(row["loss"]) and row["loss"] > 0 and math.isfinite(row["grad_norm"])
    assert 0.0 <= row["accuracy"] <= 1.0
  records = os.path.abspath(config.data.dir)
  # The first loss is near log |V_train| (untrained answer scores are close to uniform), not 0 or huge.
  with open(os.path.join(records, "vocab.json")) as f:
    n_train = len(json.load(f)["vocab_train"])
  assert 0.3 * math.log(n_train) < history[0]["loss"] < 3.0 * math.log(n_train)
  assert result["train"]["loss"] == history[-1]["loss"]

  with open(os.path.join(workdir, "eval", "test_metrics.json")) as f:
    written = json.load(f)
  assert written["step"] == steps
  for key in ("base", "common", "rare", "unseen", "total", "mAcc", "BNG"):
    assert 0.0 <= written[key] <= 100.0 or key == "BNG", (key, written[key])
  with open(os.path.join(records, "test.csv")) as f:
    n_test = sum(1 for _ in f) - 1
  assert written["num_samples_total"] == n_test
  assert written["BNG"] == pytest.approx(written["base"] - written["non_base"])

  pred_dir = os.path.join(workdir, "eval", f"test_step{steps}")
  rescored = os.path.join(workdir, "rescored.json")
  subprocess.run([sys.executable, "-m", "evqa_jax.evaluate.ovqa", "--train-csv", os.path.join(records, "train.csv"),
                  "--test-csv", os.path.join(records, "test.csv"), "--pred", os.path.join(pred_dir, "predictions.csv"),
                  "--out", rescored], cwd=mesh_equivalence.REPO, check=True,
                 env=dict(os.environ, PYTHONPATH=mesh_equivalence.REPO))
  with open(rescored) as f:
    cli = json.load(f)
  for key in ("base", "common", "rare", "unseen", "non_base", "total", "mAcc", "BNG"):
    assert written[key] == pytest.approx(cli[key], abs=1e-9), key
  for key in [k for k in cli if k.startswith("num_")]:
    assert written[key] == cli[key], key
  with open(os.path.join(pred_dir, "predictions.csv")) as f:
    rows = f.read().splitlines()
  assert rows[0] == "index,prediction" and len(rows) == n_test + 1
  assert sorted(int(r.split(",")[0]) for r in rows[1:]) == list(range(n_test))
