"""JustAsk+ with a frozen answer encoder (config.model.freeze_answer_encoder): its outputs over the graph nodes (with
the GNN verbalizer) or the answers (without) are computed once per split from the loaded frozen parameters
(evqa_jax/projects/ovqa/backbones/justask.py: JustAsk.precompute_aux, through evqa_jax.train.steps.StepAux) instead of
in every step. The cached and uncached steps give the same logits, loss and gradients; training and evaluation give
the same numbers, also across a resume; a trainable encoder is never cached."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import ovqa_msrvtt
from evqa_jax import projects as tasks_lib
from evqa_jax.data import pipeline
from evqa_jax.train import partition, sharding
from evqa_jax.train import steps as steps_lib

SMALL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "synthetic_ovqa_small",
                     "records")


@pytest.fixture(scope="module", autouse=True)
def small_world():
  if not os.path.exists(os.path.join(SMALL, "metadata.json")):
    from data_prep import synthetic_ovqa
    synthetic_ovqa.ensure_world(os.path.dirname(SMALL), preset="small")


def _config(variant, freeze=None, cache=True):
  c = ovqa_msrvtt.get_config(f"tiny,{variant}")
  c.data.dir = SMALL
  if freeze is not None:
    c.model.freeze_answer_encoder = freeze
  c.model.cache_answer_encoder = cache
  return c


def _perturb_amodel(params, seed=0):
  """`params` (host) with the answer encoder moved away from its initial values, as a checkpoint would: a cache made
  from the initial rather than the loaded weights then shows."""
  rng = np.random.default_rng(seed)
  params = dict(params)
  params["amodel"] = jax.tree.map(lambda x: (np.asarray(x) + 0.05 * rng.standard_normal(np.shape(x))).astype(
      np.asarray(x).dtype), params["amodel"])
  return params


# ------------------------------------------------------------------------------------------ one step


@pytest.mark.parametrize("variant,nodes,mesh_shape", [("justask", True, (4, 2)), ("justask,baseline", False, (1, 1))],
                         ids=["gnn_nodes", "answers_only"])
def test_cached_and_uncached_steps_agree(variant, nodes, mesh_shape):
  """Logits (V_train and V_test), loss and the gradient of every trainable parameter with the precomputed encoder
  outputs equal the step's own, in fp32 within 1e-6; the precomputed inputs come from the frozen parameters passed in
  (here not the initial ones) and are sharded like the tokens. The graph nodes on a 4 x 2 mesh (split over `model`);
  the answers, replicated on any mesh, on one device (each compile of these steps costs the suite tens of seconds)."""
  c = _config(variant, freeze=True)
  c.mesh_shape = mesh_shape
  task = tasks_lib.build_task(c)
  assert task.precomputes_aux and task.model.freeze_answer_encoder
  mesh = sharding.make_mesh(c.mesh_shape, c.mesh_axes, devices=jax.devices()[:int(np.prod(mesh_shape))])
  rules = c.logical_axis_rules
  tx, _ = partition.make_optimizer(c.optim, 10)
  state, shardings = steps_lib.create_state(task, c, mesh, tx)
  assert "amodel" in state["frozen"] and "amodel" not in state["trainable"]
  host = jax.tree.map(np.asarray, partition.merge_params(state["trainable"], state["frozen"]))
  trainable, frozen = partition.split_params(_perturb_amodel(host), task.trainable_patterns)
  state = steps_lib.put_params(state, trainable, frozen, shardings)

  kind = "node" if nodes else "answer"
  step_aux = steps_lib.StepAux(task, mesh, rules, state, shardings, task.aux_inputs(c.data.train_split))
  raw_shardings = steps_lib.aux_shardings_for(task, mesh, rules, task.aux_inputs(c.data.train_split))
  raw, cached = {}, {}
  for split in (c.data.train_split, "test"):
    raw[split] = sharding.host_to_global(task.aux_inputs(split), raw_shardings)
    cached[split] = step_aux(state, task.aux_inputs(split))
    assert f"{kind}_encodings" in cached[split]
    assert not {f"{kind}_tokens", "answer_tokens", "answer_token_mask"} & set(cached[split])
    assert set(cached[split]) - {f"{kind}_encodings"} <= set(raw[split])
  enc = cached["train"][f"{kind}_encodings"]
  assert enc.shape == (raw["train"][f"{kind}_tokens"].shape[0], c.model.d_model) and enc.dtype == jnp.float32
  assert enc.sharding.spec == raw["train"][f"{kind}_tokens"].sharding.spec
  # Node encodings split over the nodes' mesh axis like the node tokens; the answers' replicated like their tokens.
  assert enc.sharding.spec == (jax.sharding.PartitionSpec("model", None) if nodes else jax.sharding.PartitionSpec())
  assert step_aux.abstract[f"{kind}_encodings"].shape == enc.shape

  loader = pipeline.make_train_loader(task.source(c.data.train_split), global_batch_size=c.batch_size,
                                      transform=lambda ex: task.preprocess(ex, train=True), seed=0, worker_count=0)
  it = iter(loader)
  batch = sharding.global_batch(next(it), sharding.batch_sharding(mesh, rules))
  it.close()
  rng = jax.random.key(7)

  def run(trainable, frozen, batch, aux, aux_eval):
    def loss_fn(tr):
      return task.loss(partition.merge_params(tr, frozen), batch, aux, rng, train=True)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    params = partition.merge_params(trainable, frozen)
    return (loss, metrics, grads, task._logits(params, batch, aux, None, train=False),
            task._logits(params, batch, aux_eval, None, train=False))

  with steps_lib.mesh_context(mesh, rules):
    want = jax.device_get(jax.jit(run)(state["trainable"], state["frozen"], batch, raw["train"], raw["test"]))
    got = jax.device_get(jax.jit(run)(state["trainable"], state["frozen"], batch, cached["train"], cached["test"]))
  (loss_w, metrics_w, grads_w, logits_w, eval_w), (loss_g, metrics_g, grads_g, logits_g, eval_g) = want, got
  np.testing.assert_allclose(loss_g, loss_w, rtol=1e-6, atol=1e-6)
  for k in metrics_w:
    np.testing.assert_allclose(metrics_g[k], metrics_w[k], rtol=1e-6, atol=1e-6, err_msg=k)
  for got_l, want_l in ((logits_g, logits_w), (eval_g, eval_w)):
    valid = want_l > np.finfo(np.float32).min
    assert np.array_equal(got_l > np.finfo(np.float32).min, valid) and valid.any()
    np.testing.assert_allclose(got_l[valid], want_l[valid], rtol=1e-6, atol=1e-6)
  flat_w, flat_g = (jax.tree_util.tree_flatten_with_path(g)[0] for g in (grads_w, grads_g))
  assert len(flat_w) == len(flat_g) > 0
  for (path, w), (_, g) in zip(flat_w, flat_g):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(w).max())),
                               err_msg=jax.tree_util.keystr(path))
  assert any(np.abs(w).max() > 0 for _, w in flat_w)
  if nodes:  # the verbalizer trains, and its gradient runs through the cached node encodings
    assert np.abs(np.asarray(grads_w["verbalizer"]["gat_0"]["w_dst"])).max() > 0

  # From other frozen weights, other encodings: the cache is a function of the state it is given.
  other = steps_lib.put_params(state, trainable, partition.split_params(_perturb_amodel(host, 1),
                                                                        task.trainable_patterns)[1], shardings)
  assert not np.allclose(np.asarray(step_aux(other, task.aux_inputs("train"))[f"{kind}_encodings"]), np.asarray(enc))


@pytest.mark.parametrize("variant", ["justask,baseline", "justask,cvqa"])
def test_a_trainable_answer_encoder_is_not_cached(variant):
  """JustAsk+ (stage 1) and the JustAsk CVQA row train their answer encoder: the steps read the tokens and run it."""
  c = _config(variant)
  assert not c.model.freeze_answer_encoder and c.model.cache_answer_encoder
  task = tasks_lib.build_task(c)
  assert not task.precomputes_aux
  mesh = sharding.make_mesh(c.mesh_shape, c.mesh_axes)
  tx, _ = partition.make_optimizer(c.optim, 10)
  state, shardings = steps_lib.create_state(task, c, mesh, tx)
  assert "amodel" in state["trainable"]
  aux = task.aux_inputs(c.data.train_split)
  step_aux = steps_lib.StepAux(task, mesh, c.logical_axis_rules, state, shardings, aux)
  assert not step_aux.precomputes and set(step_aux(state, aux)) == set(aux)
  assert task.precompute_aux(state["frozen"], aux) is aux
  with pytest.raises(ValueError, match="answer encoder trains"):
    task.model.apply({"params": partition.merge_params(state["trainable"], state["frozen"])}, jax.tree.map(
        jnp.asarray, aux), method=task.model.encode_vocab)


def test_aot_compiles_the_cached_step():
  """launch/aot_check.py compiles what training runs: with the frozen encoder, a step that reads node encodings."""
  from evqa_jax.train import aot
  s = aot.setup(_config("justask"))
  assert "node_encodings" in s.aux and "node_tokens" not in s.aux
  s = aot.setup(_config("justask", cache=False))
  assert "node_tokens" in s.aux and "node_encodings" not in s.aux


# ------------------------------------------------------------------------------------------ training


def _train_config(cache):
  c = _config("justask", cache=cache)
  c.total_steps, c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps = 4, 1, 2, 4
  c.data.eval_splits = ("test",)
  return c


def test_training_with_the_cache_matches_without(tmp_path, monkeypatch, capsys):
  """4 steps of `:tiny,justask` (GNN, frozen answer encoder moved off its initial values by the weight loading):
  uncached and uninterrupted, then cached and stopped after its step-2 checkpoint and resumed. The same loss, grad-norm
  trajectory and test metrics (the resumed run precomputes from its restored frozen weights), and launch/evaluate.py's
  path on the cached run's checkpoint scores the same."""
  from evqa_jax.projects.ovqa.backbones.justask import JustAsk
  from evqa_jax.train import train_and_evaluate, trainer
  from evqa_jax.runs import checkpointing
  loads = []
  original = JustAsk.load_pretrained

  def load_pretrained(self, params):
    loads.append(1)
    return _perturb_amodel(original(self, params))

  monkeypatch.setattr(JustAsk, "load_pretrained", load_pretrained)

  def rows(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "train_history.jsonl"))]

  plain = str(tmp_path / "plain")
  train_and_evaluate(_train_config(cache=False), plain)
  assert "outputs computed once" not in capsys.readouterr().out

  cached = str(tmp_path / "cached")
  save = checkpointing.save_checkpoint

  class Stop(Exception):
    pass

  def save_then_stop(mngr, step, *args, **kwargs):
    save(mngr, step, *args, **kwargs)
    if step == 2:
      mngr.wait_until_finished()
      raise Stop

  monkeypatch.setattr(checkpointing, "save_checkpoint", save_then_stop)
  with pytest.raises(Stop):
    train_and_evaluate(_train_config(cache=True), cached)
  monkeypatch.setattr(checkpointing, "save_checkpoint", save)
  assert len(loads) == 2
  result = train_and_evaluate(_train_config(cache=True), cached)
  out = capsys.readouterr().out
  assert "Resumed from" in out and "graph-node outputs computed once per split" in out
  assert len(loads) == 2  # resumed: the frozen weights come from the checkpoint, not from loading again

  want, got = rows(plain), rows(cached)
  assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
  for w, g in zip(want, got):
    for key in ("loss", "vqa_loss", "mlm_loss", "grad_norm", "accuracy"):
      assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-6), (g["step"], key)
  final = json.loads(open(os.path.join(plain, "final_metrics.json")).read())
  _assert_same_metrics(result["eval"]["test"], final["eval"]["test"])

  scored = trainer.evaluate_checkpoint(_train_config(cache=True), cached, "last", ["test"])
  assert scored["step"] == 4
  _assert_same_metrics(scored["eval"]["test"], final["eval"]["test"])


def _assert_same_metrics(got, want, where="eval"):
  assert set(got) == set(want), where
  for key, value in want.items():
    if isinstance(value, dict):
      _assert_same_metrics(got[key], value, f"{where}.{key}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), f"{where}.{key}"
    else:
      assert got[key] == value, f"{where}.{key}"
