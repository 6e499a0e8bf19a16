"""config.rng_impl: the train step's dropout key stream (threefry2x32 by default, the stream the demo was trained with)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import common
from evqa_jax.train import sharding, trainer


class _DropoutTask:
  """loss = sum of x where a Bernoulli(0.5) mask drawn from the step's key keeps it, times a trainable w."""

  trainable_patterns = ("w",)

  def __init__(self, rng_impl):
    self.config = ml_collections.ConfigDict({"seed": 3})
    if rng_impl is not None:
      self.config.rng_impl = rng_impl

  def loss(self, params, batch, aux, rng, train=True):
    keep = jax.random.bernoulli(rng, 0.5, batch["x"].shape)
    return jnp.sum(jnp.where(keep, batch["x"], 0.0)) * params["w"], {}

  def predict(self, params, batch, aux):
    return {"pred": batch["x"][:, 0]}


def _losses(rng_impl, steps=2):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  repl = sharding.replicated(mesh)
  tx = optax.sgd(0.0)
  trainable = {"w": jax.device_put(jnp.ones(()), repl)}
  state = {"step": jax.device_put(jnp.zeros((), jnp.int32), repl), "trainable": trainable, "frozen": {},
           "opt_state": jax.device_put(tx.init(trainable), repl)}
  shardings = jax.tree.map(lambda x: x.sharding, state)
  fns = trainer.StepFns(_DropoutTask(rng_impl), tx, mesh, (), shardings, repl, None)
  x = np.arange(1, 65, dtype=np.float32).reshape(4, 16)
  out = []
  for _ in range(steps):
    state, metrics = fns.train_step(state, {"x": jax.device_put(x, repl)}, None)
    out.append(float(metrics["loss"]))
  return out, x


def _expected(impl, x, steps=2):
  return [float(np.sum(np.where(jax.random.bernoulli(jax.random.fold_in(jax.random.key(3, impl=impl), s), 0.5,
                                                     x.shape), x, 0.0))) for s in range(steps)]


def test_default_is_threefry_and_rbg_is_another_stream():
  assert common.base_config().rng_impl == "threefry2x32"
  default, x = _losses(None)  # a config without the field (older config files) keeps threefry
  assert default == _expected("threefry2x32", x)
  assert _losses("threefry2x32")[0] == default
  rbg, _ = _losses("rbg")
  assert rbg == _expected("rbg", x)
  assert rbg != default  # another stream: the demo tables were trained with threefry


def test_unknown_rng_impl_is_rejected():
  with pytest.raises(Exception, match="rng_impl|impl|PRNG|prng"):
    _losses("no_such_impl", steps=1)
