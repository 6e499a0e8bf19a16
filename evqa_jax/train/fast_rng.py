"""Threefry without the loop on CPU: the same random bits, drawn several times faster.

jax lowers the threefry2x32 hash on CPU as a 5-iteration `fori_loop` (an XLA while loop, which keeps compile time
down), while every other platform gets the unrolled 20 rounds. In the loop each iteration reads and writes the whole
[N] uint32 state, and nothing around it fuses; unrolled, XLA fuses the hash with the Bernoulli comparison that
uses its bits into one elementwise pass. Both lowerings are the same uint32 arithmetic, so the bits and the dropout
masks are identical (tests/test_fast_rng.py). A lone [32, 12, 74, 74] Bernoulli draw is about 8x faster unrolled;
in the OVQA demo's train step the ops holding the dropout draws fell from about 17% to 12% of the op time
(benchmarks/profile_ovqa_step.py, about 5% off the step).

The masks are identical, but the float results are not always to the last bit: with the hash fused, XLA fuses the
ops around the dropout differently (and, presumably, contracts multiply-adds differently), so a training run drifts
from the looped one after a few steps (launch/behaviour_check.py on ovqa_small: step 3 loss 4.6610289 against
4.6610298). The README's demo results were trained with the looped lowering, so this is opt-in:
`config.unrolled_cpu_threefry = True` (configs/common.py).

Parameter initialisation always lowers with the unrolled hash (`jit_init`, used by
`steps.create_state`): it draws the same bits and, with no reduction after the draws, gives bit-identical
parameters (tests/test_fast_rng.py), while XLA compiles it faster (E-VQA's test config: `create_state`, compile + run,
18.1 -> 8.0 s side by side in one process), since the looped lowering compiles one while loop per parameter tensor.

The lowering is registered process-wide (jax keeps one rule per primitive and platform); it applies to everything
lowered afterwards, not to programs already compiled.
"""

import contextlib
import functools

import jax

_state = {"unrolled": False}


def _threefry_module():
  try:
    from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel
    from jax._src.random import threefry2x32 as tf  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None, None
  if not all(hasattr(tf, a) for a in ("threefry2x32_p", "_threefry2x32_lowering_rule",
                                      "_threefry2x32_cpu_lowering_rule")):
    return None, None  # another jax layout: keep jax's own lowering
  return tf, mlir


def set_unrolled_threefry_on_cpu(unrolled: bool = True) -> bool:
  """Registers the unrolled (True) or jax's default looped (False) threefry lowering for CPU. -> whether it could."""
  tf, mlir = _threefry_module()
  if tf is None:
    return False
  rule = tf._threefry2x32_lowering_rule if unrolled else tf._threefry2x32_cpu_lowering_rule  # pylint: disable=protected-access
  mlir.register_lowering(tf.threefry2x32_p, rule, platform="cpu")
  _state["unrolled"] = unrolled
  return True


@contextlib.contextmanager
def threefry_lowering(unrolled: bool):
  """Lowers with the unrolled (True) or jax's own looped (False) CPU threefry inside the block, then restores the
  lowering that was registered before. Only what is lowered inside the block is affected."""
  previous = _state["unrolled"]
  set_unrolled_threefry_on_cpu(unrolled)
  try:
    yield
  finally:
    if previous != unrolled:
      set_unrolled_threefry_on_cpu(previous)


def jax_default_threefry():
  """Lowers with jax's own looped CPU threefry inside the block (benchmarks' plain-JAX references)."""
  return threefry_lowering(False)


def jit_init(fn, **jit_kwargs):
  """`jax.jit(fn, **jit_kwargs)` lowered with the unrolled CPU threefry: for parameter initialisation, which draws
  the same bits either way and gives bit-identical parameters (no reduction follows the draws), while the looped
  lowering compiles one while loop per parameter tensor (a few seconds of compile for a small model)."""
  jitted = jax.jit(fn, **jit_kwargs)

  @functools.wraps(fn)
  def call(*args, **kwargs):
    with threefry_lowering(True):
      return jitted(*args, **kwargs)

  return call
