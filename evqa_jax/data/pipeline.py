"""Grain input pipelines: shuffled per-process training batches, padded evaluation passes, static shapes.

Training
    loader = make_train_loader(source, global_batch_size=64, transform=fn, seed=0, worker_count=2)
    it = iter(loader)                 # a DataIterator (grain.DataLoaderIterator with get_state/set_state)
    batch = next(it)                  # dict of np arrays, leading dim global_batch_size // process_count

  Global batch k of the run holds the examples at positions [j*B, (j+1)*B) of the permutation of epoch
  e = k // (N // B), j = k % (N // B), where B = global_batch_size, N = len(source), and the permutation is
  np.random.default_rng([seed, e]).permutation(N); the last N % B examples of each epoch's permutation are
  dropped. Process p gets rows [p*b, (p+1)*b) of it (b = B // process_count), which is the row layout that
  jax.make_array_from_process_local_data(sharding, batch) expects for a batch axis sharded in process order.
  Whole batches (read, decode, `transform`, stack) are built by Grain's worker processes, so the batch
  sequence does not depend on worker_count, and the global batches do not depend on process_count.

Evaluation
    for batch in make_eval_batches(source, global_batch_size=64, transform=fn): ...
  One pass in index order: global batch j holds examples [j*B, (j+1)*B), process p rows [p*b, (p+1)*b);
  every process gets ceil(N / B) batches (multi-host steps stay in lockstep). Rows past the end are copies
  of the last example and have `"_valid"` False; every batch has the boolean `"_valid"` [b] field.

A DataIterator's position is the number of global batches it has consumed (`it.step`, `it.set_step(k)`); the
run directory's checkpoints store it beside the train state (evqa_jax.runs.data_iterator), so a checkpoint restores
into a loader with another worker_count or process_count, while the source, batch size, seed and num_epochs must
match (`BatchPlan.identity`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping

import grain
import grain.python as gp
import numpy as np

Transform = Callable[[dict], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class KeyedTransform:
  """A training transform that also reads its example's key: `fn(example, key)` with key = (seed, step, index), the
  loader's seed, the global step of the batch and the example's index in the source. Random augmentation drawn from
  it (np.random.default_rng(key)) is the same whatever the worker or process count, and again after a resume
  (`DataIterator.set_step`). An evaluation pass calls it with seed None."""
  fn: Callable[[dict, tuple], Mapping[str, Any]]

VALID_KEY = "_valid"
# Upper bound on the step count of an endless run (num_epochs=None); Grain's sampler wants a size.
_ENDLESS_STEPS = 2**62


# ---------------------------------------------------------------- static-shape helpers


def pad_to_length(x, length: int, axis: int = 0, value=0) -> np.ndarray:
  """Pads `x` along `axis` with `value` up to `length`; raises ValueError when it is longer."""
  x = np.asarray(x)
  n = x.shape[axis]
  if n > length:
    raise ValueError(f"pad_to_length: size {n} along axis {axis} exceeds target length {length}")
  if n == length:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - n)
  return np.pad(x, pad, constant_values=value)


def pad_or_truncate(x, length: int, axis: int = 0, value=0) -> np.ndarray:
  """Keeps the first `length` entries along `axis`, padding with `value` when there are fewer."""
  x = np.asarray(x)
  if x.shape[axis] > length:
    return np.take(x, np.arange(length), axis=axis)
  return pad_to_length(x, length, axis=axis, value=value)


def length_mask(n: int, length: int) -> np.ndarray:
  """bool [length]: True for the first min(n, length) positions."""
  return np.arange(length) < n


def pad_batch(batch: Mapping[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  """Pads every field along axis 0 to `batch_size` with copies of the last row; adds `"_valid"` [batch]."""
  sizes = {k: np.shape(v)[0] for k, v in batch.items() if k != VALID_KEY}
  if len(set(sizes.values())) != 1:
    raise ValueError(f"pad_batch: fields have different leading sizes {sizes}")
  n = next(iter(sizes.values()))
  if not 0 < n <= batch_size:
    raise ValueError(f"pad_batch: {n} rows do not fit batch_size {batch_size}")
  rows = np.minimum(np.arange(batch_size), n - 1)
  out = {k: np.asarray(v)[rows] for k, v in batch.items() if k != VALID_KEY}
  valid = np.asarray(batch[VALID_KEY], bool) if VALID_KEY in batch else np.ones(n, bool)
  out[VALID_KEY] = np.concatenate([valid, np.zeros(batch_size - n, bool)])
  return out


def stack_examples(examples: list[Mapping[str, Any]], where: list[str] | None = None) -> dict[str, np.ndarray]:
  """Stacks transformed examples into a batch; raises naming the field when keys or shapes differ."""
  if not examples:
    raise ValueError("stack_examples: no examples")
  first = examples[0]
  keys = list(first)
  out = {}
  for i, ex in enumerate(examples):
    if set(ex) != set(keys):
      raise ValueError(f"transform returned fields {sorted(ex)} for {where[i] if where else f'row {i}'}, "
                       f"but {sorted(keys)} for {where[0] if where else 'row 0'}")
  for key in keys:
    arrays = [np.asarray(ex[key]) for ex in examples]
    for i, a in enumerate(arrays):
      if a.shape != arrays[0].shape or a.dtype != arrays[0].dtype:
        raise ValueError(
            f"transform output {key!r} is {a.dtype}{list(a.shape)} for {where[i] if where else f'row {i}'} "
            f"but {arrays[0].dtype}{list(arrays[0].shape)} for {where[0] if where else 'row 0'}: "
            "the transform must return fixed shapes and dtypes")
    out[key] = np.stack(arrays)
  return out


# ---------------------------------------------------------------- batch plans


def _process_layout(global_batch_size, process_index, process_count):
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, process_count={process_count})")
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f"global_batch_size {global_batch_size} must be a positive multiple of "
                     f"process_count {process_count}")
  return int(process_index), int(process_count), global_batch_size // process_count


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """Which examples make up each step's batch on this process (see the module docstring)."""

  mode: str  # "train" or "eval"
  source_repr: str
  num_examples: int
  global_batch_size: int
  process_index: int
  process_count: int
  seed: int | None
  num_epochs: int | None
  worker_count: int

  @property
  def local_batch_size(self) -> int:
    return self.global_batch_size // self.process_count

  @property
  def steps_per_epoch(self) -> int:
    if self.mode == "train":
      return self.num_examples // self.global_batch_size
    return -(-self.num_examples // self.global_batch_size)

  @property
  def num_steps(self) -> int:
    if self.num_epochs is None:
      return _ENDLESS_STEPS
    return self.steps_per_epoch * self.num_epochs

  def identity(self) -> str:
    """What a restored checkpoint must agree on; leaves out process and worker counts on purpose."""
    return (f"{self.mode}(source={self.source_repr}, global_batch_size={self.global_batch_size}, "
            f"seed={self.seed}, num_epochs={self.num_epochs})")


class _StepSource:
  """Grain data source whose element k is the step number k itself; the batch is built in the transform."""

  def __init__(self, plan: BatchPlan):
    self._plan = plan

  def __len__(self) -> int:
    return self._plan.num_steps

  def __getitem__(self, index: int) -> int:
    return int(index)

  def __repr__(self) -> str:
    return f"StepSource({self._plan.identity()})"


class _BuildBatch(gp.MapTransform):
  """step -> this process's batch: reads the records, applies `transform`, stacks."""

  def __init__(self, source, transform: Transform, plan: BatchPlan):
    self._source = source
    self._transform = transform
    self._plan = plan
    self._perm_epoch = None
    self._perm = None

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_epoch != epoch:
      self._perm = np.random.default_rng([self._plan.seed, epoch]).permutation(self._plan.num_examples)
      self._perm_epoch = epoch
    return self._perm

  def indices(self, step: int) -> np.ndarray:
    """Source indices of this process's rows at `step` (eval: clamped to the last example)."""
    plan = self._plan
    epoch, j = divmod(int(step), plan.steps_per_epoch)
    start = j * plan.global_batch_size + plan.process_index * plan.local_batch_size
    positions = np.arange(start, start + plan.local_batch_size)
    if plan.mode == "train":
      return self._permutation(epoch)[positions]
    return np.minimum(positions, plan.num_examples - 1)

  def map(self, step: int) -> dict[str, np.ndarray]:
    plan = self._plan
    ids = self.indices(step)
    examples, where = [], []
    keyed = isinstance(self._transform, KeyedTransform)
    for i in ids.tolist():
      example = self._source[i]
      examples.append(self._transform.fn(example, (plan.seed, int(step), i)) if keyed else self._transform(example))
      where.append(f"example {i} of {plan.source_repr}")
    batch = stack_examples(examples, where)
    if plan.mode == "eval":
      epoch, j = divmod(int(step), plan.steps_per_epoch)
      start = j * plan.global_batch_size + plan.process_index * plan.local_batch_size
      batch[VALID_KEY] = np.arange(start, start + plan.local_batch_size) < plan.num_examples
    return batch


class DataIterator(grain.DataLoaderIterator):
  """grain.DataLoaderIterator that also knows its BatchPlan and how many batches it has produced."""

  def __init__(self, loader: "DataLoader"):
    super().__init__(loader, state=None, validate_state=True)
    self.plan: BatchPlan = loader.plan

  @property
  def step(self) -> int:
    """Number of batches consumed so far (the index of the next batch in the run)."""
    return _step_from_grain_state(json.loads(self.get_state().decode()))

  def close(self) -> None:
    """Stops Grain's prefetching (threads and worker processes) now rather than at garbage collection."""
    self._iterator.close()

  def __enter__(self) -> "DataIterator":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def set_step(self, step: int) -> None:
    """Positions the iterator so that the next batch is batch `step` of the run."""
    if not 0 <= step <= self.plan.num_steps:
      raise ValueError(f"set_step({step}): outside [0, {self.plan.num_steps}] for {self.plan.identity()}")
    current = json.loads(self.get_state().decode())
    self.set_state(json.dumps(_grain_state_for_step(step, current)).encode())


class DataLoader(grain.DataLoader):
  """grain.DataLoader over a BatchPlan; iter() gives a DataIterator."""

  def __init__(self, *, source, transform: Transform, plan: BatchPlan, worker_buffer_size: int = 2):
    if plan.worker_count > 0:
      _ensure_absl_flags_parsed()
    self.plan = plan
    self.source = source
    super().__init__(
        data_source=_StepSource(plan),
        sampler=gp.IndexSampler(num_records=plan.num_steps, shard_options=gp.NoSharding(), shuffle=False,
                                num_epochs=1, seed=None),
        operations=[_BuildBatch(source, transform, plan)],
        worker_count=plan.worker_count,
        worker_buffer_size=worker_buffer_size,
        shard_options=gp.NoSharding(),
        # Elements handed to the workers are step numbers: nothing to read ahead in threads.
        read_options=gp.ReadOptions(num_threads=1, prefetch_buffer_size=2),
    )

  def __iter__(self) -> DataIterator:
    return DataIterator(self)

  def __len__(self) -> int:
    if self.plan.num_epochs is None:
      raise TypeError("an endless training loader (num_epochs=None) has no len()")
    return self.plan.num_steps

  def batch_indices(self, step: int) -> np.ndarray:
    """Source indices of this process's rows at `step` (for tests and debugging)."""
    return _BuildBatch(self.source, None, self.plan).indices(step)


def _ensure_absl_flags_parsed() -> None:
  # Grain's worker start-up reads absl flags; outside an absl app nothing has parsed them.
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def make_train_loader(source, *, global_batch_size: int, transform: Transform, seed: int,
                      num_epochs: int | None = None, worker_count: int = 0, process_index: int | None = None,
                      process_count: int | None = None, worker_buffer_size: int = 2) -> DataLoader:
  """Shuffled training batches for this process; see the module docstring for the exact batch layout.

  Args:
    source: random-access source (e.g. TFRecordDataSource); `source[i]` is an example dict.
    global_batch_size: examples per step over all processes; a multiple of process_count.
    transform: example dict -> dict of fixed-shape numpy arrays (runs in the Grain workers; picklable
      with cloudpickle when worker_count > 0).
    seed: shuffle seed (non-negative int).
    num_epochs: passes over the data; None = endless.
    worker_count: Grain worker processes building batches (0 = in this process).
    process_index, process_count: default jax.process_index() / jax.process_count().
  Returns:
    A grain.DataLoader; each batch is a dict of arrays with leading dim global_batch_size // process_count.
  """
  process_index, process_count, _ = _process_layout(global_batch_size, process_index, process_count)
  if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
    raise ValueError(f"make_train_loader: seed must be a non-negative int, got {seed!r}")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"make_train_loader: num_epochs must be None or >= 1, got {num_epochs}")
  n = len(source)
  if n < global_batch_size:
    raise ValueError(f"make_train_loader: {source!r} has {n} examples, fewer than global_batch_size "
                     f"{global_batch_size} (batches drop the remainder)")
  plan = BatchPlan("train", repr(source), n, global_batch_size, process_index, process_count, int(seed),
                   num_epochs, int(worker_count))
  return DataLoader(source=source, transform=transform, plan=plan, worker_buffer_size=worker_buffer_size)


def make_eval_batches(source, *, global_batch_size: int, transform: Transform, process_index: int | None = None,
                      process_count: int | None = None, worker_count: int = 0) -> DataLoader:
  """One deterministic pass in index order over all examples, padded, with a `"_valid"` [batch] mask.

  Returns a re-iterable grain.DataLoader: every iter() is a fresh pass of ceil(N / global_batch_size)
  batches of global_batch_size // process_count rows.
  """
  process_index, process_count, _ = _process_layout(global_batch_size, process_index, process_count)
  n = len(source)
  if n == 0:
    raise ValueError(f"make_eval_batches: {source!r} is empty")
  plan = BatchPlan("eval", repr(source), n, global_batch_size, process_index, process_count, None, 1,
                   int(worker_count))
  return DataLoader(source=source, transform=transform, plan=plan)


# ---------------------------------------------------------------- iterator state <-> step


def _step_from_grain_state(state: Mapping[str, Any]) -> int:
  last_seen = state["last_seen_indices"]
  workers = state["worker_count"]
  if workers == 0:
    return int(last_seen["0"]) + 1
  return sum((int(last_seen[str(i)]) + workers - i) // workers for i in range(workers))


def _grain_state_for_step(step: int, state: Mapping[str, Any]) -> dict:
  """Grain's DataLoaderIterator `state` (its public get_state(), format version 2) moved to after `step` batches.

  With W workers, batch k comes from worker k % W (round robin), so worker i has produced
  ceil((step - i) / W) batches; Grain stores the last index each worker saw and the last worker used. The other
  fields (the sampler and data source Grain checks the state against) are kept as the iterator gave them.
  """
  if state.get("version") != 2:
    raise ValueError(f"Grain's iterator state has format version {state.get('version')!r}; this code positions "
                     "version 2 (the Grain that setup.py pins)")
  workers = int(state["worker_count"])
  w = max(workers, 1)
  last_seen = {str(i): -w + i + max(0, -(-(step - i) // w)) * w for i in range(w)}
  return {**state, "last_seen_indices": last_seen, "last_worker_index": (step % w) - 1 if workers else -1}
