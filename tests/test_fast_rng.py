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


def test_step_fns_lower_with_the_configured_threefry_whatever_is_registered():
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
    fns = steps.StepFns(Task(**cfg), optax.sgd(0.0), mesh, (), {}, repl, None)
    for step in (fns.train_step, fns.eval_step, fns.eval_loss_step):
      assert isinstance(step, fast_rng.ThreefryJit) and step.unrolled_threefry is want
    assert fast_rng._state["unrolled"] is False  # pylint: disable=protected-access  # nothing registered globally


def test_threefry_jit_lowers_its_own_way_in_any_order(monkeypatch):
  """Two configs in one process (a notebook, the test session): each jitted function, even of the same Python
  function, is lowered with its own lowering whatever is registered when it is first called or lowered, draws the
  same bits, and leaves the registered lowering as it found it."""
  tf, _ = fast_rng._threefry_module()  # pylint: disable=protected-access
  used = []  # which rule lowered each threefry op: True = unrolled, False = jax's looped CPU rule
  for name, unrolled in (("_threefry2x32_lowering_rule", True), ("_threefry2x32_cpu_lowering_rule", False)):
    real = getattr(tf, name)
    monkeypatch.setattr(tf, name, lambda *a, _real=real, _u=unrolled, **k: used.append(_u) or _real(*a, **k))

  def f(step):
    key = jax.random.fold_in(jax.random.key(42), step)
    return jax.random.bernoulli(key, 0.9, (4, 3, 37, 37))

  try:
    for registered in (True, False):
      fast_rng.set_unrolled_threefry_on_cpu(registered)
      looped, unrolled = fast_rng.jit(f, unrolled_threefry=False), fast_rng.jit(f, unrolled_threefry=True)
      assert looped.__name__ == "f" and (looped.unrolled_threefry, unrolled.unrolled_threefry) == (False, True)
      for fn, want_while in ((looped, True), (unrolled, False), (fast_rng.jit(f, unrolled_threefry=False), True)):
        # (lowered for a bool step: a trace of its own, so the calls below, with an int, trace and lower anew)
        assert (" while(" in fn.lower(registered).compile().as_text()) is want_while
      used.clear()
      want = np.asarray(looped(2))  # first calls: traced and lowered here, one of them against the registration
      assert used and set(used) == {False}
      used.clear()
      np.testing.assert_array_equal(np.asarray(unrolled(2)), want)
      assert used and set(used) == {True}
      assert fast_rng._state["unrolled"] is registered  # pylint: disable=protected-access
      assert 0.85 < want.mean() < 0.95
  finally:
    monkeypatch.undo()  # jax's own rules back first, so that the registration below is not one of the wrappers
    fast_rng.set_unrolled_threefry_on_cpu(False)


def test_create_state_initialises_the_parameters_of_the_looped_lowering(monkeypatch):
  """create_state lowers the parameter init with the unrolled hash (faster to compile): the parameters are those
  jax's own looped lowering gives, bit for bit (OVQA's tiny config: a BERT, the GAT verbalizer, visual projection)."""
  import mesh_equivalence  # pylint: disable=import-outside-toplevel
  from flax import linen as nn  # pylint: disable=import-outside-toplevel
  from flax import traverse_util  # pylint: disable=import-outside-toplevel
  from evqa_jax import projects  # pylint: disable=import-outside-toplevel
  from evqa_jax.train import partition, sharding, steps  # pylint: disable=import-outside-toplevel

  config = mesh_equivalence.config_in_repo("ovqa", monkeypatch)
  task = projects.build_task(config)
  mesh = sharding.make_mesh((1, 1), config.mesh_axes, devices=jax.devices()[:1])
  fast_rng.set_unrolled_threefry_on_cpu(False)
  lowerings = []
  real = fast_rng.threefry_lowering
  monkeypatch.setattr(fast_rng, "threefry_lowering", lambda unrolled: lowerings.append(unrolled) or real(unrolled))
  state, _ = steps.create_state(task, config, mesh, partition.make_optimizer(config.optim, config.total_steps)[0])
  assert lowerings == [True] and fast_rng._state["unrolled"] is False  # pylint: disable=protected-access
  looped = jax.jit(lambda r: nn.meta.unbox(task.init_params(r)))
  assert " while(" in looped.lower(jax.random.key(config.seed)).compile().as_text()
  want = traverse_util.flatten_dict(jax.tree.map(np.asarray, looped(jax.random.key(config.seed))))
  got = traverse_util.flatten_dict(jax.tree.map(np.asarray, partition.merge_params(state["trainable"],
                                                                                  state["frozen"])))
  assert got.keys() == want.keys() and len(want) > 50
  for k, v in want.items():
    np.testing.assert_array_equal(got[k], v, err_msg="/".join(k))
