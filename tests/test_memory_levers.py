"""Memory levers as config fields: per-encoder-layer rematerialisation (`config.model.remat`) and bf16 storage of the
frozen parameters (`config.frozen_param_dtype`).

Remat changes what the backward pass keeps, not what it computes: the loss and every gradient equal the no-remat
ones. (Its memory saving is for accelerators at real shapes: XLA:CPU at these tiny shapes even reported more
temporary memory with remat, 1.38 MB full vs 1.19 MB none.) bf16 storage keeps trainable parameters in float32.
"""

import os
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from configs import violin  # noqa: E402
from evqa_jax.models import bert, deberta_v2, layers  # noqa: E402
from evqa_jax.projects.violin import task as violin_task  # noqa: E402
from data_prep import worlds  # noqa: E402
from evqa_jax.train import partition, sharding, steps  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

B, L = 4, 24
TINY_DEBERTA = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                    max_position_embeddings=40, relative_attention=True, position_buckets=8,
                    pos_att_type=["p2c", "c2p"], share_att_key=True, position_biased_input=False,
                    norm_rel_ebd="layer_norm", conv_kernel_size=3, conv_act="gelu")
TINY_BERT = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=40)
# A jax.checkpoint region in a printed jaxpr (the primitive prints as remat2 in jax 0.10, checkpoint elsewhere).
_REMAT_EQN = re.compile(r"\b(?:remat\w*|checkpoint)\[")
ENCODERS = {"bert": (bert.BertLM, bert.BertConfig, TINY_BERT),
            "deberta_v2": (deberta_v2.DebertaV2LM, deberta_v2.DebertaV2Config, TINY_DEBERTA)}


def _inputs():
  r = np.random.RandomState(0)
  ids = jnp.asarray(r.randint(1, 61, (B, L)), jnp.int32)
  mask = jnp.asarray(np.arange(L)[None] < np.array([[L], [L - 3], [10], [17]]), jnp.int32)
  return ids, mask, jnp.asarray(r.normal(size=(B, L, 32)), jnp.float32)


def _init_params(name):
  """The encoder's parameters (remat does not change them), initialised under jit (eagerly, every op of the init
  would be compiled on its own)."""
  cls, cfg_cls, shape = ENCODERS[name]
  ids, mask, _ = _inputs()
  init = jax.jit(cls(cfg_cls.from_dict(shape)).init)
  return nn.meta.unbox(init(jax.random.key(0), ids, mask)["params"])


def _loss(name, remat, params):
  """A fixed projection of the last hidden states (dropout on: remat must replay its RNG)."""
  cls, cfg_cls, shape = ENCODERS[name]
  model = cls(cfg_cls.from_dict(shape, remat=remat))
  ids, mask, target = _inputs()

  def loss(p):
    hidden = model.apply({"params": p}, ids, mask, deterministic=False,
                         rngs={"dropout": jax.random.key(1)})["hidden"]
    return jnp.sum(hidden * target) / B

  return loss


def _remat_policies(jaxpr) -> list:
  """The policy of every jax.checkpoint region of a jaxpr, in order."""
  return [eqn.params.get("policy") for eqn in jaxpr.jaxpr.eqns if _REMAT_EQN.match(f"{eqn.primitive.name}[")]


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_remat_gives_the_same_loss_and_gradients(name):
  """Every policy wraps each encoder layer in one checkpoint region carrying that policy, with the parameter names of
  no remat; with the "full" policy (which replays every op of the layer, dropout draws included, in the backward
  pass) the loss and every gradient equal no remat's. The "dots_saveable" policy is checked in the traced program
  only: a policy chooses which residuals a region keeps, which jax.checkpoint's results do not depend on, and
  compiling one more gradient of each encoder took a fifth of this module's time."""
  params = _init_params(name)
  layers_count = ENCODERS[name][2]["num_hidden_layers"]
  ref_loss = _loss(name, "none", params)
  assert not _remat_policies(jax.make_jaxpr(ref_loss)(params))
  ref_value, ref_grads = jax.jit(jax.value_and_grad(ref_loss))(params)
  ref_flat = traverse_util.flatten_dict(ref_grads)
  scale = max(float(np.abs(g).max()) for g in ref_flat.values())
  for remat in ("full", "dots_saveable"):
    loss = _loss(name, remat, params)
    assert _remat_policies(jax.make_jaxpr(loss)(params)) == [layers.REMAT_POLICIES[remat]] * layers_count
    grad_shapes = traverse_util.flatten_dict(jax.eval_shape(jax.grad(loss), params))
    assert grad_shapes.keys() == ref_flat.keys()  # same parameter names: checkpoints load either way
    assert all(grad_shapes[k].shape == g.shape for k, g in ref_flat.items())
  value, grads = jax.jit(jax.value_and_grad(_loss(name, "full", params)))(params)
  np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-6)
  flat = traverse_util.flatten_dict(grads)
  for k, g in ref_flat.items():
    # The same ops, fused and summed in another order: equal up to float32 rounding at the gradients' scale
    # (the attention key bias, whose true gradient is 0, holds only rounding noise).
    np.testing.assert_allclose(flat[k], g, rtol=1e-5, atol=1e-6 * scale, err_msg="/".join(k))


def test_unknown_remat_policy_names_the_field():
  with pytest.raises(ValueError, match=r"config.model.remat = 'some'.*dots_saveable"):
    bert.BertConfig.from_dict(TINY_BERT, remat="some")


def test_bf16_frozen_storage_keeps_trainable_float32(monkeypatch):
  """VIOLIN's frozen text encoder stored in bf16: the state's frozen leaves are the pretrained float32 weights
  rounded to bf16, the trainable ones and the optimiser state stay float32, and the loss is within bf16 rounding of
  the float32-storage loss."""
  monkeypatch.chdir(REPO)
  losses = {}
  for dtype in ("float32", "bfloat16"):
    c = violin.get_config("small")
    c.frozen_param_dtype = dtype
    worlds.ensure_synthetic_world(c)
    task = violin_task.Task(c)
    mesh = sharding.make_mesh((1, 1), c.mesh_axes, devices=jax.devices()[:1])
    tx, _ = partition.make_optimizer(c.optim, c.total_steps)
    state, shardings = steps.create_state(task, c, mesh, tx)
    state = steps.load_pretrained_into(state, task, shardings)
    frozen = traverse_util.flatten_dict(state["frozen"])
    assert {x.dtype for x in frozen.values()} == {jnp.dtype(dtype)}
    assert {x.dtype for x in jax.tree.leaves((state["trainable"], state["opt_state"]))
            if jnp.issubdtype(x.dtype, jnp.floating)} == {jnp.dtype("float32")}
    enc = traverse_util.flatten_dict({"text_encoder": task.encoder_params()})
    for k, v in frozen.items():
      np.testing.assert_array_equal(np.asarray(v), np.asarray(enc[k]).astype(dtype), err_msg="/".join(k))
    abstract = steps.abstract_train_state(task, c, mesh, tx)
    assert {x.dtype for x in jax.tree.leaves(abstract["frozen"])} == {jnp.dtype(dtype)}
    src = task.source("train")
    batch = jax.tree.map(jnp.asarray, {k: np.stack([np.asarray(task.preprocess(src[i], train=False)[k])
                                                    for i in range(4)]) for k in task.preprocess(src[0], False)})
    params = partition.merge_params(state["trainable"], state["frozen"])
    loss = jax.jit(lambda p, b: task.loss(p, b, {}, jax.random.key(0), train=False)[0])
    losses[dtype] = float(loss(params, batch))
    if dtype == "float32":  # a small bug for the bound to catch: every parameter scaled by 0.99 (compiled already)
      losses["scaled"] = float(loss(jax.tree.map(lambda w: 0.99 * w, params), batch))
  # bf16 storage against float32 storage: measured |difference| 2.3e-6 on a loss of 1.387 (the untrained model, near
  # ln 4); bound 1e-5 (4.4x). Every parameter scaled by 0.99 moves the loss by 4.3e-5, which fails it.
  assert losses["bfloat16"] != losses["float32"]
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=0, atol=1e-5)
  assert abs(losses["scaled"] - losses["float32"]) > 2 * 1e-5


def test_fsdp_sharding_picks_the_largest_free_dimension_the_data_axis_divides():
  mesh = sharding.make_mesh((4, 2), ("data", "model"), devices=jax.devices()[:8])
  P = jax.sharding.PartitionSpec
  named = lambda *spec: jax.sharding.NamedSharding(mesh, P(*spec))  # noqa: E731
  assert sharding.fsdp_sharding(named(None, "model"), (1536, 6144)).spec == P("data", "model")
  assert sharding.fsdp_sharding(named(None, None), (1536, 6144)).spec == P(None, "data")
  assert sharding.fsdp_sharding(named("model", None), (30522, 32)).spec == P("model", "data")
  assert sharding.fsdp_sharding(named(None, None), (30, 6)).spec == P(None, None)  # 4 divides neither
  assert sharding.fsdp_sharding(named(None), (1536,)).spec == P(None)  # 1-d (bias, LayerNorm): unchanged
  assert sharding.fsdp_sharding(named("data", None), (8, 8)).spec == P("data", None)  # already split over data


def test_frozen_fsdp_stores_a_quarter_per_device_and_trains_alike(monkeypatch):
  """config.frozen_fsdp on a 4 x 2 mesh (OVQA test config): every frozen matrix is split over the 4 data shards
  (each device holds a quarter of what the replicated layout holds), trainable parameters keep their layout, and two
  train steps from the same state give the replicated layout's losses (1e-5) and leave the frozen values alone."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import mesh_equivalence  # pylint: disable=g-import-not-at-top
  config = mesh_equivalence.config_in_repo("ovqa", monkeypatch)
  plain = mesh_equivalence.train(config, (4, 2))
  config.frozen_fsdp = True
  fsdp = mesh_equivalence.train(config, (4, 2), initial=plain.initial)
  np.testing.assert_allclose(fsdp.losses, plain.losses, rtol=1e-6, atol=1e-5)
  for k, v in traverse_util.flatten_dict(plain.initial["frozen"]).items():
    np.testing.assert_array_equal(traverse_util.flatten_dict(fsdp.frozen_after)[k], v)

  from evqa_jax import projects  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh((4, 2), config.mesh_axes, jax.devices()[:8])
  tx, _ = partition.make_optimizer(config.optim, 10)
  task = projects.build_task(config)
  states = {}
  for flag in (False, True):
    config.frozen_fsdp = flag
    states[flag] = steps.abstract_train_state(task, config, mesh, tx)
  shard_bytes = lambda x: np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize  # noqa: E731
  for (path, a), b in zip(traverse_util.flatten_dict(states[False]["frozen"]).items(),
                          traverse_util.flatten_dict(states[True]["frozen"]).values()):
    if a.ndim >= 2:
      assert "data" in jax.tree.leaves(tuple(b.sharding.spec)), path
      assert shard_bytes(b) * 4 == shard_bytes(a), path
  assert jax.tree.map(lambda x: x.sharding.spec, states[True]["trainable"]) == \
      jax.tree.map(lambda x: x.sharding.spec, states[False]["trainable"])
