"""Grain pipelines: global shuffle, per-process sharding, worker equivalence, Orbax resume, eval padding."""

import json
import os

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from evqa_jax.data import pipeline
from evqa_jax.data import records
from evqa_jax.data.example import Feature
from evqa_jax.data.source import TFRecordDataSource
from evqa_jax.runs import data_iterator

N = 37
MAX_LEN = 6
SPEC = {"id": Feature("int64", ()), "x": Feature("float32", (None,)), "text": Feature("string", ())}


def _raw(i):
  return {"id": i, "x": np.arange(1 + i % MAX_LEN, dtype=np.float32) + 100 * i, "text": f"example {i}"}


def transform(ex):
  """Variable-length example -> static shapes."""
  return {"id": np.int32(ex["id"]), "x": pipeline.pad_to_length(ex["x"], MAX_LEN),
          "mask": pipeline.length_mask(len(ex["x"]), MAX_LEN), "n": np.int32(len(ex["text"]))}


def _expected_row(i):
  x = np.zeros(MAX_LEN, np.float32)
  x[: 1 + i % MAX_LEN] = np.arange(1 + i % MAX_LEN) + 100 * i
  return x


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("pipeline_ds"))
  records.write_split(out, "train", [_raw(i) for i in range(N)], SPEC, num_shards=3)
  return TFRecordDataSource.from_split(out, "train")


def _loader(source, **kw):
  args = dict(global_batch_size=8, transform=transform, seed=5, process_index=0, process_count=1)
  args.update(kw)
  return pipeline.make_train_loader(source, **args)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert set(x) == set(y)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_train_batches_shuffle_per_epoch(source):
  it = iter(_loader(source, num_epochs=2))
  batches = list(it)
  assert len(batches) == 2 * (N // 8)  # drop_remainder, then the iterator ends
  for b in batches:
    assert b["id"].shape == (8,) and b["x"].shape == (8, MAX_LEN) and b["mask"].dtype == bool
    for row, i in enumerate(b["id"]):
      np.testing.assert_array_equal(b["x"][row], _expected_row(i))
      assert b["mask"][row].sum() == 1 + i % MAX_LEN and b["n"][row] == len(f"example {i}")
  for epoch in range(2):
    ids = np.concatenate([b["id"] for b in batches[4 * epoch: 4 * epoch + 4]])
    want = np.random.default_rng([5, epoch]).permutation(N)[:32]
    np.testing.assert_array_equal(ids, want)
    assert len(set(ids.tolist())) == 32
  first = np.concatenate([b["id"] for b in batches[:4]])
  second = np.concatenate([b["id"] for b in batches[4:]])
  assert not np.array_equal(first, second)
  other = next(iter(_loader(source, seed=6)))
  assert not np.array_equal(other["id"], batches[0]["id"])
  assert len(_loader(source, num_epochs=3)) == 12


def test_two_processes_partition_each_global_batch(source):
  single = iter(_loader(source))
  procs = [iter(_loader(source, process_index=p, process_count=2)) for p in range(2)]
  for step in range(10):  # crosses the epoch boundary at step 4
    whole = next(single)["id"]
    parts = [next(it)["id"] for it in procs]
    assert all(p.shape == (4,) for p in parts)
    assert not set(parts[0].tolist()) & set(parts[1].tolist())
    assert set(parts[0].tolist()) | set(parts[1].tolist()) == set(whole.tolist())
    np.testing.assert_array_equal(np.concatenate(parts), whole)  # process p holds rows [4p, 4p+4)
  with pytest.raises(ValueError, match="multiple of process_count"):
    _loader(source, global_batch_size=7, process_count=2)
  with pytest.raises(ValueError, match="fewer than global_batch_size"):
    _loader(source, global_batch_size=40)


def _save(mngr, step, it, value):
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave({"w": np.arange(4.0) * value, "step": np.array(step, np.int32)}),
      data=data_iterator.checkpoint_args_save(it)))
  mngr.wait_until_finished()


def _restore(mngr, step, it):
  abstract = {"w": np.zeros(4), "step": np.array(0, np.int32)}
  return mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), data=data_iterator.checkpoint_args_restore(it)))


def test_orbax_checkpoint_resumes_at_next_batch(source, tmp_path):
  it = iter(_loader(source))
  _take(it, 3)
  with ocp.CheckpointManager(str(tmp_path / "ckpt")) as mngr:
    _save(mngr, 3, it, 2.0)
    after_save = _take(it, 4)  # keep consuming past the save (crosses into epoch 1)
    restored = _restore(mngr, 3, iter(_loader(source)))
  assert restored["state"]["step"] == 3
  np.testing.assert_array_equal(restored["state"]["w"], np.arange(4.0) * 2.0)
  fresh = restored["data"]
  assert isinstance(fresh, pipeline.DataIterator) and fresh.step == 3
  _assert_batches_equal(_take(fresh, 4), after_save)
  files = [f for f in os.listdir(tmp_path / "ckpt" / "3" / "data") if f.endswith(".json")]
  assert files == ["process_0-of-1.json"]
  payload = json.loads((tmp_path / "ckpt" / "3" / "data" / "process_0-of-1.json").read_text())
  assert payload["step"] == 3

  with ocp.CheckpointManager(str(tmp_path / "ckpt")) as mngr:
    with pytest.raises(ValueError, match="differs"):
      _restore(mngr, 3, iter(_loader(source, seed=9)))


def test_orbax_checkpoint_two_processes(source, tmp_path):
  # Each simulated process has its own iterator and writes its own state file (as on a multi-host job).
  its = [iter(_loader(source, process_index=p, process_count=2)) for p in range(2)]
  for it in its:
    _take(it, 5)
  for p, it in enumerate(its):
    with ocp.CheckpointManager(str(tmp_path / f"host{p}")) as mngr:
      _save(mngr, 5, it, float(p))
  after_save = [_take(it, 3) for it in its]
  for p in range(2):
    files = [f for f in os.listdir(tmp_path / f"host{p}" / "5" / "data") if f.endswith(".json")]
    assert files == [f"process_{p}-of-2.json"]
    with ocp.CheckpointManager(str(tmp_path / f"host{p}")) as mngr:
      restored = _restore(mngr, 5, iter(_loader(source, process_index=p, process_count=2)))
    np.testing.assert_array_equal(restored["state"]["w"], np.arange(4.0) * p)
    _assert_batches_equal(_take(restored["data"], 3), after_save[p])
  # The position is global: one process can resume what two processes left off.
  with ocp.CheckpointManager(str(tmp_path / "host1")) as mngr:
    single = _restore(mngr, 5, iter(_loader(source)))["data"]
  for step in range(3):
    np.testing.assert_array_equal(next(single)["id"],
                                  np.concatenate([after_save[0][step]["id"], after_save[1][step]["id"]]))


def test_workers_give_same_batches_and_resume(source, tmp_path):
  serial = iter(_loader(source, worker_count=0))
  want = _take(serial, 7)
  with iter(_loader(source, worker_count=2)) as parallel:
    _assert_batches_equal(_take(parallel, 4), want[:4])
    assert parallel.step == 4
    # Save with 2 workers, restore into 0 workers: the batch after the save matches.
    with ocp.CheckpointManager(str(tmp_path / "w")) as mngr:
      _save(mngr, 4, parallel, 1.0)
      resumed = _restore(mngr, 4, iter(_loader(source, worker_count=0)))["data"]
    _assert_batches_equal(_take(resumed, 3), want[4:7])
    _assert_batches_equal(_take(parallel, 3), want[4:7])


def test_grain_native_checkpoint_handler_also_works(source, tmp_path):
  it = iter(_loader(source))
  _take(it, 2)
  with ocp.CheckpointManager(str(tmp_path / "g")) as mngr:
    mngr.save(2, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
    want = _take(it, 2)
    fresh = mngr.restore(2, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(iter(_loader(source)))))
  _assert_batches_equal(_take(fresh["data"], 2), want)


@pytest.mark.parametrize("gbs, process_count", [(8, 1), (10, 1), (8, 2), (6, 2)])
def test_eval_batches_cover_every_example_once(source, gbs, process_count):
  per_process = []
  for p in range(process_count):
    batches = list(pipeline.make_eval_batches(source, global_batch_size=gbs, transform=transform,
                                              process_index=p, process_count=process_count))
    assert len(batches) == -(-N // gbs)  # same step count on every process
    for b in batches:
      assert b["_valid"].dtype == bool and b["_valid"].shape == (gbs // process_count,)
      assert b["id"].shape == (gbs // process_count,) and b["x"].shape == (gbs // process_count, MAX_LEN)
      for row, i in enumerate(b["id"]):
        np.testing.assert_array_equal(b["x"][row], _expected_row(i))
    per_process.append(batches)
  valid = [i for batches in per_process for b in batches for i in b["id"][b["_valid"]].tolist()]
  assert sorted(valid) == list(range(N))  # each example exactly once
  # Index order: global batch j = examples [j*gbs, (j+1)*gbs), padded with copies of the last example.
  for j in range(-(-N // gbs)):
    ids = np.concatenate([batches[j]["id"] for batches in per_process])
    ok = np.concatenate([batches[j]["_valid"] for batches in per_process])
    want = np.arange(j * gbs, (j + 1) * gbs)
    np.testing.assert_array_equal(ok, want < N)
    np.testing.assert_array_equal(ids, np.minimum(want, N - 1))
  # Deterministic: a second pass gives the same batches.
  again = list(pipeline.make_eval_batches(source, global_batch_size=gbs, transform=transform,
                                          process_index=process_count - 1, process_count=process_count))
  _assert_batches_equal(again, per_process[-1])


def test_transform_must_return_static_shapes(source):
  bad = pipeline.make_eval_batches(source, global_batch_size=4, transform=lambda ex: {"x": ex["x"]},
                                   process_index=0, process_count=1)
  with pytest.raises(ValueError, match="'x'.*fixed shapes"):
    next(iter(bad))


def test_padding_helpers():
  np.testing.assert_array_equal(pipeline.pad_to_length([1, 2], 4, value=-1), [1, 2, -1, -1])
  np.testing.assert_array_equal(pipeline.pad_to_length(np.ones((1, 2)), 3, axis=0),
                                [[1, 1], [0, 0], [0, 0]])
  np.testing.assert_array_equal(pipeline.pad_to_length(np.ones((2, 1)), 3, axis=1), [[1, 0, 0], [1, 0, 0]])
  with pytest.raises(ValueError, match="exceeds"):
    pipeline.pad_to_length([1, 2, 3], 2)
  np.testing.assert_array_equal(pipeline.pad_or_truncate([1, 2, 3], 2), [1, 2])
  np.testing.assert_array_equal(pipeline.pad_or_truncate([1], 3), [1, 0, 0])
  np.testing.assert_array_equal(pipeline.length_mask(2, 4), [True, True, False, False])
  padded = pipeline.pad_batch({"a": np.array([[1], [2]]), "b": np.array([5, 6])}, 4)
  np.testing.assert_array_equal(padded["a"], [[1], [2], [2], [2]])
  np.testing.assert_array_equal(padded["b"], [5, 6, 6, 6])
  np.testing.assert_array_equal(padded["_valid"], [True, True, False, False])
