"""evqa_jax.train.fast_rng: the unrolled CPU threefry draws the very bits of jax's looped one, without the loop."""

import jax
import numpy as np

from evqa_jax.train import fast_rng


def _draws():
  """A fresh jitted function (so it is lowered anew): dropout-style masks and raw bits from a folded key."""
  def f(step):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(42), step), 7)
    return jax.random.bernoulli(key, 0.9, (4, 3, 37, 37)), jax.random.bits(key, (1001,))
  return jax.jit(f)


def test_unrolled_threefry_gives_identical_bits_without_a_loop():
  try:
    assert fast_rng.set_unrolled_threefry_on_cpu(False)
    looped = _draws()
    looped_hlo = looped.lower(3).compile().as_text()
    want = [np.asarray(x) for x in looped(3)]
    assert fast_rng.set_unrolled_threefry_on_cpu(True)
    unrolled = _draws()
    unrolled_hlo = unrolled.lower(3).compile().as_text()
    got = [np.asarray(x) for x in unrolled(3)]
  finally:
    fast_rng.set_unrolled_threefry_on_cpu(False)  # the default: jax's own lowering
  assert " while(" in looped_hlo and " while(" not in unrolled_hlo  # jax's default CPU lowering loops; ours not
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  assert 0.85 < got[0].mean() < 0.95  # a real Bernoulli(0.9) mask, not a constant


def test_unrolled_threefry_known_answers():
  """The Random123 known-answer vectors of Threefry-2x32 (20 rounds), through the unrolled CPU lowering."""
  from jax._src.random import threefry2x32  # pylint: disable=import-outside-toplevel
  assert fast_rng.set_unrolled_threefry_on_cpu(True)
  try:
    f = jax.jit(threefry2x32.threefry_2x32)
    assert [int(x) for x in f(np.uint32([0, 0]), np.uint32([0, 0]))] == [0x6b200159, 0x99ba4efe]
    assert [int(x) for x in f(np.uint32([0x13198a2e, 0x03707344]), np.uint32([0x243f6a88, 0x85a308d3]))] == [
        0xc4923a9c, 0x483df7a0]
  finally:
    fast_rng.set_unrolled_threefry_on_cpu(False)


def test_jax_default_threefry_block_restores_the_previous_lowering():
  for before in (True, False):
    fast_rng.set_unrolled_threefry_on_cpu(before)
    with fast_rng.jax_default_threefry():
      assert " while(" in _draws().lower(0).compile().as_text()
    assert (" while(" in _draws().lower(0).compile().as_text()) == (not before)
  fast_rng.set_unrolled_threefry_on_cpu(False)


def test_step_fns_register_it_only_when_configured():
  import ml_collections  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from configs import common  # pylint: disable=import-outside-toplevel
  from evqa_jax.train import sharding, steps  # pylint: disable=import-outside-toplevel

  assert common.base_config().unrolled_cpu_threefry is False  # the demo results' lowering stays the default
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  repl = sharding.replicated(mesh)

  class Task:
    def __init__(self, **cfg):
      self.config = ml_collections.ConfigDict(dict(seed=0, **cfg))

  fast_rng.set_unrolled_threefry_on_cpu(False)
  for cfg, want in (({}, False), ({"unrolled_cpu_threefry": False}, False), ({"unrolled_cpu_threefry": True}, True)):
    steps.StepFns(Task(**cfg), optax.sgd(0.0), mesh, (), {}, repl, None)
    assert fast_rng._state["unrolled"] is want  # pylint: disable=protected-access
  fast_rng.set_unrolled_threefry_on_cpu(False)
