"""Record layer: Example encoding, TFRecord framing/CRC, dataset directories, the Grain data source."""

import json
import os
import pickle
import struct

import numpy as np
import pytest

from evqa_jax.data import example as example_lib
from evqa_jax.data import records
from evqa_jax.data import tfrecord
from evqa_jax.data.example import Feature
from tensorflow_datasets.proto import tf_example_pb2


# ---------------------------------------------------------------- independent reference framing


def _crc32c_reference(data: bytes) -> int:
  """Bit-by-bit CRC32C (Castagnoli, reflected polynomial 0x82F63B78), independent of the crc32c package."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked_reference(data: bytes) -> int:
  crc = _crc32c_reference(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def _frame_reference(data: bytes) -> bytes:
  n = struct.pack("<Q", len(data))
  return n + struct.pack("<I", _masked_reference(n)) + data + struct.pack("<I", _masked_reference(data))


SPEC = {
    "video": Feature("float32", (None, 4)),
    "half": Feature("float16", (3,)),
    "question": Feature("string", ()),
    "choices": Feature("string", (None,)),
    "frames": Feature("uint8", (None, 2, 3)),
    "mask": Feature("uint8", (None, None)),
    "label": Feature("int64", ()),
    "ids": Feature("int32", (None,)),
    "flags": Feature("bool", (2,)),
}


def _example(i: int) -> dict:
  rng = np.random.default_rng(i)
  n = 1 + i % 3
  return {
      "video": rng.normal(size=(n, 4)).astype(np.float32),
      "half": rng.normal(size=3).astype(np.float16),
      "question": f"what is {i}? ünïcode",
      "choices": [f"c{i}", "", "b c"][: 1 + i % 3],
      "frames": rng.integers(0, 256, size=(n, 2, 3), dtype=np.uint8),
      "mask": rng.integers(0, 2, size=(n, 1 + i % 2), dtype=np.uint8),
      "label": 2**40 + i,
      "ids": np.arange(i % 4, dtype=np.int32) - 2,
      "flags": [bool(i % 2), True],
  }


def _assert_example_equal(got: dict, want: dict, spec=SPEC):
  assert set(got) == set(want)
  for name, f in spec.items():
    if f.dtype == "string":
      if f.shape == ():
        assert isinstance(got[name], str) and got[name] == want[name], name
      else:
        assert got[name].dtype == object and list(got[name]) == list(want[name]), name
    else:
      want_arr = np.asarray(want[name]).astype(f.dtype)
      assert got[name].dtype == np.dtype(f.dtype), name
      assert got[name].shape == want_arr.shape, name
      np.testing.assert_array_equal(got[name], want_arr, err_msg=name)


# ---------------------------------------------------------------- example.py


def test_masked_crc_matches_reference():
  assert tfrecord._crc32c.crc32c(b"123456789") == 0xE3069283 == _crc32c_reference(b"123456789")
  for data in [b"", b"\x00" * 8, bytes(range(256)), b"tfrecord"]:
    assert tfrecord.masked_crc(data) == _masked_reference(data)
    assert tfrecord.frame(data) == _frame_reference(data)


@pytest.mark.parametrize("i", range(6))
def test_example_round_trip(i):
  ex = _example(i)
  got = example_lib.decode_example(example_lib.encode_example(ex, SPEC), SPEC)
  _assert_example_equal(got, ex)


def test_example_storage_is_tf_compatible():
  ex = _example(4)
  proto = tf_example_pb2.Example.FromString(example_lib.encode_example(ex, SPEC))
  fmap = proto.features.feature
  np.testing.assert_array_equal(np.array(fmap["video"].float_list.value, np.float32), ex["video"].reshape(-1))
  assert list(fmap["label"].int64_list.value) == [2**40 + 4]
  assert list(fmap["flags"].int64_list.value) == [0, 1]
  assert list(fmap["choices"].bytes_list.value) == [s.encode() for s in ex["choices"]]
  assert list(fmap["frames"].bytes_list.value) == [ex["frames"].tobytes()]
  # Two variable dims: the shape travels alongside; one variable dim is inferred from the count.
  assert list(fmap["mask/shape"].int64_list.value) == list(ex["mask"].shape)
  assert "video/shape" not in fmap


def test_example_empty_variable_dims():
  spec = {"v": Feature("float32", (None, 5)), "s": Feature("string", (None,)), "m": Feature("uint8", (None, None))}
  ex = {"v": np.zeros((0, 5), np.float32), "s": [], "m": np.zeros((0, 7), np.uint8)}
  got = example_lib.decode_example(example_lib.encode_example(ex, spec), spec)
  assert got["v"].shape == (0, 5) and got["s"].shape == (0,) and got["m"].shape == (0, 7)


@pytest.mark.parametrize("bad, message", [
    (lambda ex: ex.pop("label"), "'label'"),
    (lambda ex: ex.update(extra=1), "'extra'"),
    (lambda ex: ex.update(label=1.5), "'label'"),
    (lambda ex: ex.update(video="text"), "'video'"),
    (lambda ex: ex.update(question=3), "'question'"),
    (lambda ex: ex.update(video=np.zeros((2, 5), np.float32)), "'video'"),
    (lambda ex: ex.update(half=np.zeros((2, 3))), "'half'"),
    (lambda ex: ex.update(frames=np.full((1, 2, 3), 300)), "'frames'"),
    (lambda ex: ex.update(ids=np.array([2**40])), "'ids'"),
    (lambda ex: ex.update(flags=[1, 0]), "'flags'"),
])
def test_encode_validation_names_field_and_record(bad, message):
  ex = _example(1)
  bad(ex)
  with pytest.raises(ValueError, match=message) as info:
    example_lib.encode_example(ex, SPEC, where="record 7 of train.csv")
  assert "record 7 of train.csv" in str(info.value)


def test_decode_validation():
  data = example_lib.encode_example(_example(2), SPEC)
  with pytest.raises(ValueError, match="'label'.*rec 3"):
    example_lib.decode_example(data, {**SPEC, "label": Feature("float32", ())}, where="rec 3")
  with pytest.raises(ValueError, match="'video'"):
    example_lib.decode_example(data, {**SPEC, "video": Feature("float32", (None, 5))})
  with pytest.raises(ValueError, match="'nope'"):
    example_lib.decode_example(data, {**SPEC, "nope": Feature("int64", ())})
  spec = dict(SPEC)
  del spec["ids"]
  with pytest.raises(ValueError, match="'ids'"):
    example_lib.decode_example(data, spec)
  with pytest.raises(ValueError, match="not a serialized"):
    example_lib.decode_example(b"\xff\xff\xff", SPEC, where="rec 9")


def test_feature_json_and_validation():
  for f in SPEC.values():
    assert Feature.from_json(json.loads(json.dumps(f.to_json()))) == f
  with pytest.raises(ValueError, match="complex64"):
    Feature("complex64", ())
  with pytest.raises(ValueError, match="shape"):
    Feature("float32", (-1,))


# ---------------------------------------------------------------- tfrecord.py


def _write(path, payloads):
  with tfrecord.TFRecordWriter(path) as w:
    for p in payloads:
      w.write(p)


def _payloads(n=7):
  rng = np.random.default_rng(0)
  return [rng.integers(0, 256, size=int(s), dtype=np.uint8).tobytes() for s in rng.integers(0, 300, size=n)] + [b""]


def test_tfrecord_bit_exact_round_trip(tmp_path):
  path = str(tmp_path / "x.tfrecord")
  payloads = _payloads()
  _write(path, payloads)
  raw = open(path, "rb").read()
  assert raw == b"".join(_frame_reference(p) for p in payloads)
  want_offsets = np.cumsum([0] + [16 + len(p) for p in payloads[:-1]]).astype(np.uint64)
  idx = np.frombuffer(open(path + ".idx", "rb").read(), dtype="<u8")
  np.testing.assert_array_equal(idx, want_offsets)
  np.testing.assert_array_equal(tfrecord.build_index(path), want_offsets)
  np.testing.assert_array_equal(tfrecord.load_index(path), want_offsets)
  assert list(tfrecord.iter_records(path)) == payloads
  with open(path, "rb") as f:
    for off, p in reversed(list(zip(idx, payloads))):
      assert tfrecord.read_record(f, off, path) == p


def test_writer_is_atomic(tmp_path):
  path = str(tmp_path / "y.tfrecord")
  with pytest.raises(RuntimeError):
    with tfrecord.TFRecordWriter(path) as w:
      w.write(b"abc")
      raise RuntimeError("boom")
  assert os.listdir(tmp_path) == []
  w = tfrecord.TFRecordWriter(path).open()
  w.write(b"abc")
  assert not os.path.exists(path)
  w.close()
  assert list(tfrecord.iter_records(path)) == [b"abc"] and os.path.exists(path + ".idx")


def _corrupt(path, kind, payloads):
  """Damages record 2; returns its byte offset."""
  offset = sum(16 + len(p) for p in payloads[:2])
  raw = bytearray(open(path, "rb").read())
  if kind == "length_crc":
    raw[offset + 8] ^= 0xFF
  elif kind == "data_crc":
    raw[offset + 12] ^= 0x01
  elif kind == "truncated":
    raw = raw[: offset + 12 + len(payloads[2]) // 2]
  open(path, "wb").write(bytes(raw))
  return offset


@pytest.mark.parametrize("kind, reason", [
    ("length_crc", "length CRC"), ("data_crc", "data CRC"), ("truncated", "truncated")])
def test_corrupt_records_raise_with_file_and_offset(tmp_path, kind, reason):
  path = str(tmp_path / "c.tfrecord")
  payloads = [b"a" * 10, b"b" * 20, b"c" * 30, b"d" * 5]
  _write(path, payloads)
  offset = _corrupt(path, kind, payloads)
  with open(path, "rb") as f:
    assert tfrecord.read_record(f, 16 + 10, path) == payloads[1]
    with pytest.raises(tfrecord.CorruptRecordError, match=reason) as info:
      tfrecord.read_record(f, offset, path)
  err = info.value
  assert err.path == path and err.offset == offset == 62
  assert path in str(err) and "byte offset 62" in str(err)
  assert pickle.loads(pickle.dumps(err)).offset == 62
  with pytest.raises(tfrecord.CorruptRecordError, match=reason):
    list(tfrecord.iter_records(path))
  if kind != "data_crc":  # the index scan checks framing only, not data CRCs
    with pytest.raises(tfrecord.CorruptRecordError, match="byte offset 62"):
      tfrecord.build_index(path)
  else:
    assert len(tfrecord.build_index(path)) == 4


def test_tensorflow_reads_our_records(tmp_path):
  tf = pytest.importorskip(
      "tensorflow", reason="TensorFlow is an optional extra (pip install -e '.[tf]'); this test alone reads our "
      "TFRecords back with tf.data")
  path = str(tmp_path / "tf.tfrecord")
  examples = [_example(i) for i in range(4)]
  _write(path, [example_lib.encode_example(ex, SPEC) for ex in examples])
  features = {
      "video": tf.io.VarLenFeature(tf.float32), "half": tf.io.FixedLenFeature([3], tf.float32),
      "question": tf.io.FixedLenFeature([], tf.string), "choices": tf.io.VarLenFeature(tf.string),
      "frames": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
      "ids": tf.io.VarLenFeature(tf.int64), "flags": tf.io.FixedLenFeature([2], tf.int64),
      "mask": tf.io.FixedLenFeature([], tf.string), "mask/shape": tf.io.FixedLenFeature([2], tf.int64),
  }
  for raw, ex in zip(tf.data.TFRecordDataset(path), examples):
    p = tf.io.parse_single_example(raw, features)
    np.testing.assert_array_equal(tf.sparse.to_dense(p["video"]).numpy().reshape(-1, 4), ex["video"])
    np.testing.assert_array_equal(p["half"].numpy().astype(np.float16), ex["half"])
    assert p["question"].numpy().decode() == ex["question"]
    assert [s.decode() for s in tf.sparse.to_dense(p["choices"]).numpy()] == list(ex["choices"])
    np.testing.assert_array_equal(tf.io.decode_raw(p["frames"], tf.uint8).numpy().reshape(-1, 2, 3), ex["frames"])
    np.testing.assert_array_equal(
        tf.io.decode_raw(p["mask"], tf.uint8).numpy().reshape(p["mask/shape"].numpy()), ex["mask"])
    assert int(p["label"]) == ex["label"]
    np.testing.assert_array_equal(tf.sparse.to_dense(p["ids"]).numpy(), ex["ids"])
    np.testing.assert_array_equal(p["flags"].numpy(), np.asarray(ex["flags"], np.int64))


# ---------------------------------------------------------------- records.py


def test_write_split_shards_and_metadata(tmp_path):
  out = str(tmp_path / "ds")
  examples = [_example(i) for i in range(10)]
  assert records.write_split(out, "train", examples, SPEC, num_shards=3) == 10
  assert records.write_split(out, "test", iter(examples[:4]), SPEC) == 4  # no len(): spooled
  records.update_metadata(out, task="ovqa", vocab_train_file="vocab.json")
  meta = records.load_metadata(out)
  assert meta["task"] == "ovqa" and meta["vocab_train_file"] == "vocab.json"
  assert meta["splits"]["train"]["num_examples"] == 10
  assert meta["splits"]["train"]["shards"] == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
  assert meta["splits"]["train"]["shard_sizes"] == [3, 3, 4]
  assert meta["splits"]["test"] == {"num_examples": 4, "shards": ["test-00000-of-00001.tfrecord"],
                                    "shard_sizes": [4], "features": example_lib.spec_to_json(SPEC)}
  assert records.load_spec(out) == SPEC and records.load_spec(out, "train") == SPEC
  paths = records.split_paths(out, "train")
  assert [os.path.basename(p) for p in paths] == meta["splits"]["train"]["shards"]
  # Shards are contiguous runs: reading them in order gives the input order.
  decoded = [example_lib.decode_example(r, SPEC) for p in paths for r in tfrecord.iter_records(p)]
  for got, want in zip(decoded, examples, strict=True):
    _assert_example_equal(got, want)
  decoded = [example_lib.decode_example(r, SPEC) for r in tfrecord.iter_records(records.split_paths(out, "test")[0])]
  for got, want in zip(decoded, examples[:4], strict=True):
    _assert_example_equal(got, want)

  # Rewriting with another shard count removes the old shards; other splits and fields survive.
  assert records.write_split(out, "train", examples[:5], SPEC, num_shards=2) == 5
  names = sorted(n for n in os.listdir(out) if n.startswith("train"))
  assert names == ["train-00000-of-00002.tfrecord", "train-00000-of-00002.tfrecord.idx",
                   "train-00001-of-00002.tfrecord", "train-00001-of-00002.tfrecord.idx"]
  meta = records.load_metadata(out)
  assert meta["task"] == "ovqa" and meta["splits"]["test"]["num_examples"] == 4
  assert sum(1 for p in records.split_paths(out, "train") for _ in tfrecord.iter_records(p)) == 5


def test_write_split_errors_are_atomic_and_named(tmp_path):
  out = str(tmp_path / "ds")
  bad = [_example(0), _example(1), {**_example(2), "label": "oops"}]
  with pytest.raises(ValueError, match=r"'label' of example 2 of split 'train'"):
    records.write_split(out, "train", bad, SPEC, num_shards=2)
  assert [n for n in os.listdir(out) if not n.startswith(".metadata.lock")] == []
  with pytest.raises(ValueError, match=r"example 2 of split 'val'"):
    records.write_split(out, "val", iter(bad), SPEC)
  assert [n for n in os.listdir(out) if not n.startswith(".metadata.lock")] == []
  with pytest.raises(FileNotFoundError, match=r"ds.*'train'"):
    records.split_paths(out, "train")
  with pytest.raises(ValueError, match="split 'nope'"):
    records.load_spec(out, "nope")


def test_split_paths_without_metadata(tmp_path):
  for i in range(2):
    _write(str(tmp_path / f"val-0000{i}-of-00002.tfrecord"), [b"x"])
  _write(str(tmp_path / "valx-00000-of-00001.tfrecord"), [b"y"])
  assert [os.path.basename(p) for p in records.split_paths(str(tmp_path), "val")] == [
      "val-00000-of-00002.tfrecord", "val-00001-of-00002.tfrecord"]


# ---------------------------------------------------------------- source.py


def test_data_source_random_access_and_pickle(tmp_path):
  from evqa_jax.data import source as source_lib
  out = str(tmp_path / "ds")
  examples = [_example(i) for i in range(9)]
  records.write_split(out, "train", examples, SPEC, num_shards=2)
  src = source_lib.TFRecordDataSource.from_split(out, "train")
  assert len(src) == 9 and src.skipped == []
  for i in [8, 0, 4, 5, -1]:
    _assert_example_equal(src[i], examples[i])
  clone = pickle.loads(pickle.dumps(src))
  _assert_example_equal(clone[3], examples[3])
  assert repr(clone) == repr(src) and "num_records=9" in repr(src) and str(tmp_path) not in repr(src)
  with pytest.raises(IndexError):
    src[9]
  # Without .idx files the offsets are rebuilt by scanning.
  for p in records.split_paths(out, "train"):
    os.remove(p + ".idx")
  src2 = source_lib.TFRecordDataSource(records.split_paths(out, "train"), example_lib.spec_to_json(SPEC))
  _assert_example_equal(src2[6], examples[6])


@pytest.mark.parametrize("with_index", [True, False])
@pytest.mark.parametrize("kind", ["length_crc", "data_crc", "truncated"])
def test_data_source_corrupt_raise_and_skip(tmp_path, kind, with_index):
  from evqa_jax.data import source as source_lib
  spec = {"text": Feature("string", ())}
  payloads = [example_lib.encode_example({"text": t * (3 + i)}, spec) for i, t in enumerate("abcde")]
  good = str(tmp_path / "good.tfrecord")
  bad = str(tmp_path / "bad.tfrecord")
  _write(good, payloads[:2])
  _write(bad, payloads)
  offset = _corrupt(bad, kind, payloads)
  if not with_index:
    os.remove(bad + ".idx")

  if with_index:
    src = source_lib.TFRecordDataSource([good, bad], spec)
    assert [src[i]["text"] for i in range(4)] == ["aaa", "bbbb", "aaa", "bbbb"]
    source_lib.TFRecordDataSource([good], spec).check_tails()
    if kind == "truncated":  # the damage is in the tail: found without reading the whole file
      with pytest.raises(ValueError, match=f"record file {bad} is damaged or truncated"):
        src.check_tails()
    with pytest.raises(tfrecord.CorruptRecordError, match=f"{bad} at byte offset {offset}"):
      src[4]
  else:
    with pytest.raises(tfrecord.CorruptRecordError, match=f"{bad} at byte offset {offset}"):
      src = source_lib.TFRecordDataSource([good, bad], spec)
      src[4]

  src = source_lib.TFRecordDataSource([good, bad], spec, on_corrupt="skip")
  if kind == "truncated" and with_index:
    # Every record the index knows of past the cut is reported on its own.
    ends = np.cumsum([offset] + [16 + len(p) for p in payloads[2:4]]).tolist()
    assert [s[:2] for s in src.skipped] == [(bad, o) for o in ends]
    assert all("truncated" in s[2] for s in src.skipped)
    src.skipped = src.skipped[:1]
  assert len(src.skipped) == 1 and src.num_skipped == 1
  path, off, reason = src.skipped[0]
  assert (path, off) == (bad, offset)
  assert {"length_crc": "length CRC", "data_crc": "data CRC", "truncated": "truncated"}[kind] in reason
  texts = [src[i]["text"] for i in range(len(src))]
  if kind == "truncated":
    want_bad = ["aaa", "bbbb"]  # the file ends inside record 2
  elif kind == "length_crc" and not with_index:
    want_bad = ["aaa", "bbbb"]  # nothing after a bad length can be located without the index
  else:
    want_bad = ["aaa", "bbbb", "dddddd", "eeeeeee"]
  assert texts == ["aaa", "bbbb"] + want_bad
