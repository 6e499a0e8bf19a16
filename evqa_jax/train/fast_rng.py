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

jax keeps one lowering rule per primitive and platform, registered process-wide, and applies it when a function is
lowered (its first call, or `.lower()`), not when it is jitted. So the choice belongs to the jitted function, not to
the process: `fast_rng.jit(fn, unrolled_threefry=...)` lowers `fn` with the lowering it was given whatever is
registered when it is first called (the train steps of two configs in one process, e.g. a notebook or a test
session, each get their own), and restores the registered one afterwards.
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


class ThreefryJit:
  """`jax.jit(fn, **jit_kwargs)` that is traced and lowered with the given CPU threefry lowering (see `jit`).

  Calls and `.lower()` enter `threefry_lowering(unrolled_threefry)` unless that lowering is already the registered
  one (one dict lookup per call on the usual path); other attributes are the jitted function's. `fn` is jitted
  through a function object of its own: jax caches traces and lowerings by the Python function, so the same `fn`
  jitted elsewhere (with the other lowering) would otherwise hand its lowered program to this one.
  """

  def __init__(self, fn, unrolled_threefry: bool, **jit_kwargs):
    self.unrolled_threefry = bool(unrolled_threefry)

    @functools.wraps(fn)
    def own(*args, **kwargs):
      return fn(*args, **kwargs)

    self.jitted = jax.jit(own, **jit_kwargs)
    functools.update_wrapper(self, fn)

  def __call__(self, *args, **kwargs):
    if _state["unrolled"] == self.unrolled_threefry:
      return self.jitted(*args, **kwargs)
    with threefry_lowering(self.unrolled_threefry):
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with threefry_lowering(self.unrolled_threefry):
      return self.jitted.lower(*args, **kwargs)

  def __getattr__(self, name):
    if name == "jitted":  # not set yet (e.g. while unpickling): no recursion
      raise AttributeError(name)
    return getattr(self.jitted, name)


def jit(fn, *, unrolled_threefry: bool, **jit_kwargs) -> ThreefryJit:
  """`jax.jit(fn, **jit_kwargs)` lowered with the unrolled (True) or jax's looped (False) CPU threefry, whatever
  lowering is registered process-wide when it is first called. The train steps use it (`steps.StepFns`, from
  `config.unrolled_cpu_threefry`)."""
  return ThreefryJit(fn, unrolled_threefry, **jit_kwargs)


def jit_init(fn, **jit_kwargs) -> ThreefryJit:
  """`jax.jit(fn, **jit_kwargs)` lowered with the unrolled CPU threefry: for parameter initialisation, which draws
  the same bits either way and gives bit-identical parameters (no reduction follows the draws), while the looped
  lowering compiles one while loop per parameter tensor (a few seconds of compile for a small model)."""
  return jit(fn, unrolled_threefry=True, **jit_kwargs)
