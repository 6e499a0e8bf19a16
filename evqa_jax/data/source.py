"""A Grain random-access data source over TFRecord shards of tf.train.Example.

    src = TFRecordDataSource.from_split("/data/ovqa", "train")        # spec from metadata.json
    src = TFRecordDataSource(paths, spec, on_corrupt="skip")
    len(src); src[17] -> {"video": np.ndarray[10, 768] float32, "question": str, ...}

Random access goes through the `.idx` offsets written next to every shard (rebuilt by scanning when a file
has none). Every read checks both CRCs. With on_corrupt="raise" (default) a bad record raises
CorruptRecordError when it is read. With on_corrupt="skip" every record is checked once up front (one full
read of the data); corrupt ones are logged, listed in `.skipped` as (file, byte offset, reason) and left out
of the index, so `len()` counts only good records. When a file without an .idx has a bad length field, the
records after it cannot be located and are reported as one skipped entry.

The source is picklable (Grain worker processes get a copy); file handles are reopened in each process. Paths may be
local or URIs (gs://...): files are opened through etils.epath.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from evqa_jax import io as evqa_io
from evqa_jax.data import example as example_lib
from evqa_jax.data import records
from evqa_jax.data import tfrecord
from evqa_jax.data.example import Feature

_ON_CORRUPT = ("raise", "skip")


def _as_spec(spec: Mapping[str, Any]) -> dict[str, Feature]:
  out = {}
  for name, f in spec.items():
    if isinstance(f, Feature):
      out[name] = f
    elif isinstance(f, Mapping):
      out[name] = Feature.from_json(f)
    else:
      raise ValueError(f"spec field {name!r}: expected Feature or its JSON dict, got {type(f).__name__}")
  return out


def _check_file(path: str, skipped: list) -> tuple[np.ndarray, int | None]:
  """(offsets of the records of `path` that pass both CRC checks, records located: good + corrupt, None when the
  rest of the file could not be located); appends the bad ones to `skipped`."""
  good = []
  n_skipped = len(skipped)
  located = True
  with evqa_io.epath_of(path).open("rb") as f:
    try:
      offsets = tfrecord.load_index(path) if evqa_io.epath_of(tfrecord.index_path(path)).exists() else None
      if offsets is not None:
        tfrecord.check_index_covers(path, offsets)  # a short index would hide the records after its end
    except ValueError as e:
      logging.warning("TFRecordDataSource: ignoring bad index of %s (%s); scanning the file", path, e)
      offsets = None
    if offsets is not None:
      for off in offsets:
        try:
          tfrecord.read_record(f, int(off), path, verify=True)
          good.append(int(off))
        except tfrecord.CorruptRecordError as e:
          skipped.append((path, e.offset, e.reason))
    else:
      size = tfrecord.file_size(f)
      off = 0
      while off < size:
        try:
          data = tfrecord.read_record(f, off, path, verify=True)
        except tfrecord.CorruptRecordError as e:
          if e.reason == "data CRC mismatch":
            # The framing is intact, so the next record can still be found.
            length = int(np.frombuffer(tfrecord._pread(f, 8, off), dtype="<u8")[0])
            skipped.append((path, e.offset, e.reason))
            off += tfrecord.HEADER_BYTES + length + tfrecord.FOOTER_BYTES
            continue
          skipped.append((path, e.offset, e.reason + "; the rest of the file cannot be located"))
          located = False
          break
        good.append(off)
        off += tfrecord.HEADER_BYTES + len(data) + tfrecord.FOOTER_BYTES
  return np.asarray(good, dtype=np.uint64), (len(good) + len(skipped) - n_skipped) if located else None


class TFRecordDataSource:
  """Grain RandomAccessDataSource: `len(src)`, `src[i] -> dict[str, np.ndarray | str]` in file order."""

  def __init__(self, paths: str | Sequence[str], spec: Mapping[str, Any], on_corrupt: str = "raise"):
    if on_corrupt not in _ON_CORRUPT:
      raise ValueError(f"TFRecordDataSource: on_corrupt must be one of {_ON_CORRUPT}, got {on_corrupt!r}")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
      raise ValueError("TFRecordDataSource: no paths given")
    self.paths = [os.fspath(p) for p in paths]
    for p in self.paths:
      if not evqa_io.epath_of(p).is_file():
        raise FileNotFoundError(f"TFRecordDataSource: record file {p} does not exist")
    self.spec = _as_spec(spec)
    self.on_corrupt = on_corrupt
    self.skipped: list[tuple[str, int, str]] = []
    per_file, found, unknown = [], {}, set()
    for p in self.paths:
      if on_corrupt == "skip":  # corrupt records are dropped and listed; every record must still be accounted for
        offsets, located = _check_file(p, self.skipped)
        if located is None:
          unknown.add(p)
        found[p] = located or 0
      else:
        offsets = tfrecord.load_index(p)
        found[p] = len(offsets)
      per_file.append(offsets)
    # In every mode: the records located (good + corrupt) must be as many as metadata.json says.
    records.check_record_counts(self.paths, found, unknown)
    if on_corrupt == "raise":
      for p, offsets in zip(self.paths, per_file):
        tfrecord.check_index_covers(p, offsets)
    if self.skipped:
      logging.warning("TFRecordDataSource: skipped %d corrupt record(s): %s", len(self.skipped),
                      "; ".join(f"{p} @ byte {o}: {r}" for p, o, r in self.skipped))
    self._file_ids = np.concatenate([np.full(len(o), i, np.int32) for i, o in enumerate(per_file)])
    self._offsets = np.concatenate(per_file).astype(np.uint64)
    # Position of each record within its file, for error messages.
    self._record_in_file = np.concatenate([np.arange(len(o)) for o in per_file]).astype(np.int64)
    self._handles: dict[int, Any] = {}
    self._pid = os.getpid()
    self._lock = threading.Lock()

  @classmethod
  def from_split(cls, data_dir: str, split: str, on_corrupt: str = "raise") -> "TFRecordDataSource":
    """The shards of `split` in `data_dir` with the spec recorded in its metadata.json."""
    return cls(records.split_paths(data_dir, split), records.load_spec(data_dir, split), on_corrupt=on_corrupt)

  @property
  def num_skipped(self) -> int:
    return len(self.skipped)

  def __len__(self) -> int:
    return int(self._offsets.shape[0])

  def _handle(self, file_id: int):
    if self._pid != os.getpid():  # forked: do not share the parent's handles
      self._handles, self._pid = {}, os.getpid()
    f = self._handles.get(file_id)
    if f is None:
      with self._lock:
        f = self._handles.get(file_id)
        if f is None:
          f = evqa_io.epath_of(self.paths[file_id]).open("rb")
          self._handles[file_id] = f
    return f

  def read_raw(self, index: int) -> bytes:
    """The serialized Example of record `index` (CRC-checked)."""
    index = self._check_index(index)
    file_id = int(self._file_ids[index])
    path = self.paths[file_id]
    f = self._handle(file_id)
    if evqa_io.is_uri(path):  # no positioned read (os.pread) on gs:// files: seek + read, one thread at a time
      with self._lock:
        return tfrecord.read_record(f, int(self._offsets[index]), path)
    return tfrecord.read_record(f, int(self._offsets[index]), path)

  def check_tails(self) -> None:
    """Reads the last record of every shard (CRC-checked), so a truncated or damaged file fails when a job starts,
    naming the file, instead of hours later when the shuffle first reaches its tail. ValueError if one does not."""
    for fid in np.unique(self._file_ids):
      last = int(np.nonzero(self._file_ids == fid)[0][-1])
      try:
        self.read_raw(last)
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f"record file {self.paths[int(fid)]} is damaged or truncated ({e})") from e

  def _check_index(self, index) -> int:
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
      raise TypeError(f"TFRecordDataSource index must be an int, got {type(index).__name__}")
    n = len(self)
    index = int(index)
    if index < 0:
      index += n
    if not 0 <= index < n:
      raise IndexError(f"TFRecordDataSource index {index} out of range for {n} records")
    return index

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = self._check_index(index)
    data = self.read_raw(index)
    file_id = int(self._file_ids[index])
    where = (f"record {int(self._record_in_file[index])} (byte offset {int(self._offsets[index])}) "
             f"of {self.paths[file_id]}")
    return example_lib.decode_example(data, self.spec, where=where)

  def close(self) -> None:
    for f in self._handles.values():
      f.close()
    self._handles = {}

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_handles"] = {}
    state["_lock"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()
    self._pid = os.getpid()

  def __repr__(self) -> str:
    # Grain compares this string when restoring an iterator: it names the data without absolute paths so
    # a checkpoint stays valid when the dataset directory moves.
    names = [os.path.basename(p) for p in self.paths]
    shown = names if len(names) <= 3 else [names[0], "...", names[-1]]
    return (f"TFRecordDataSource(files={shown}, num_files={len(names)}, num_records={len(self)}, "
            f"fields={sorted(self.spec)}, on_corrupt={self.on_corrupt!r})")


class IndexedSource:
  """A record source whose examples also carry `index` (int64: the record's position in the split), for records
  that store no index field (VIOLIN, E-VQA)."""

  def __init__(self, source):
    self.source = source

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> dict:
    example = dict(self.source[index])
    example["index"] = np.int64(index)
    return example

  def __repr__(self) -> str:
    return f"IndexedSource({self.source!r})"


class SubsetSource:
  """The records of `source` at `indices` (in that order): a split without the rows a model cannot train on (OVQA's
  closed-vocabulary head drops train rows whose answer is outside its top-k answers, as FrozenBiLM does)."""

  def __init__(self, source, indices, why: str):
    self.source = source
    self.indices = np.asarray(indices, np.int64)
    self.why = why
    if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= len(source)):
      raise IndexError(f"SubsetSource ({why}): indices outside [0, {len(source)}) of {source!r}")

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, index: int) -> dict:
    return self.source[int(self.indices[index])]

  def check_tails(self) -> None:
    if hasattr(self.source, "check_tails"):
      self.source.check_tails()

  def __repr__(self) -> str:
    # Part of a checkpointed data iterator's identity: another subset (other k, other vocabulary) is another dataset.
    digest = hashlib.sha1(self.indices.tobytes()).hexdigest()[:12]
    return f"SubsetSource({self.source!r}, kept={len(self.indices)}, indices_sha1={digest}, why={self.why!r})"
