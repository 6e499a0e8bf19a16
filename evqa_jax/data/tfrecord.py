"""TFRecord files without TensorFlow: writing, indexing and CRC-checked random access.

Standard framing, byte compatible with `tf.io.TFRecordWriter` / `tf.data.TFRecordDataset`:

  uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

with masked_crc(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32). Next to every `X.tfrecord` the
writer puts `X.tfrecord.idx`: the byte offset of each record as little-endian uint64, which gives O(1) random
access. Both files appear atomically (temporary files renamed on a successful close).
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
from typing import Iterator

import crc32c as _crc32c
import numpy as np

from evqa_jax import io as evqa_io

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
HEADER_BYTES = 12
FOOTER_BYTES = 4
_MASK_DELTA = 0xA282EAD8


class CorruptRecordError(ValueError):
  """A record whose framing or CRC is wrong; `path`, `offset` and `reason` say where and why."""

  def __init__(self, path: str, offset: int, reason: str):
    self.path = str(path)
    self.offset = int(offset)
    self.reason = reason
    super().__init__(f"corrupt TFRecord in {self.path} at byte offset {self.offset}: {reason}")

  def __reduce__(self):
    # Grain workers send exceptions across processes; keep the constructor arguments.
    return (CorruptRecordError, (self.path, self.offset, self.reason))


def masked_crc(data: bytes) -> int:
  crc = _crc32c.crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
  """One record with its framing, as it appears in the file."""
  length = struct.pack("<Q", len(data))
  return length + _CRC.pack(masked_crc(length)) + data + _CRC.pack(masked_crc(data))


def index_path(path: str) -> str:
  return str(path) + ".idx"


class TFRecordWriter:
  """Writes framed records to `path` (and offsets to `path`.idx) atomically.

      with TFRecordWriter("train-00000-of-00001.tfrecord") as w:
        w.write(encode_example(ex, spec))

  Nothing appears at `path` unless the `with` block (or `close()`) completes without an exception.
  """

  def __init__(self, path: str):
    self.path = str(path)
    self._stack: contextlib.ExitStack | None = None
    self._file = None
    self._offsets: list[int] = []
    self._position = 0

  @property
  def num_records(self) -> int:
    return len(self._offsets)

  def open(self) -> "TFRecordWriter":
    if self._stack is not None:
      raise RuntimeError(f"TFRecordWriter({self.path}) is already open")
    stack = contextlib.ExitStack()
    try:
      # Entered first, renamed last: the index never appears before its data file.
      self._tmp_idx = stack.enter_context(evqa_io.atomic_path(index_path(self.path)))
      tmp = stack.enter_context(evqa_io.atomic_path(self.path))
      self._file = stack.enter_context(open(tmp, "wb"))
    except BaseException:
      stack.close()
      raise
    self._stack = stack
    self._offsets = []
    self._position = 0
    return self

  def write(self, data: bytes) -> None:
    if self._file is None:
      raise RuntimeError(f"TFRecordWriter({self.path}) is not open; use it in a `with` block")
    if not isinstance(data, (bytes, bytearray, memoryview)):
      raise TypeError(f"TFRecordWriter({self.path}).write wants bytes, got {type(data).__name__}")
    data = bytes(data)
    self._file.write(frame(data))
    self._offsets.append(self._position)
    self._position += HEADER_BYTES + len(data) + FOOTER_BYTES

  def close(self) -> None:
    self._finish(None, None, None)

  def _finish(self, exc_type, exc, tb) -> None:
    stack, self._stack = self._stack, None
    if stack is None:
      return
    if exc_type is None:
      try:
        self._file.flush()
        with open(self._tmp_idx, "wb") as f:
          f.write(np.asarray(self._offsets, dtype="<u8").tobytes())
      except BaseException as e:
        self._file = None
        stack.__exit__(type(e), e, e.__traceback__)
        raise
      self._file = None
      stack.close()  # closes the data file, then renames data and index into place
    else:
      self._file = None
      # Passing the exception on makes atomic_path delete the temporary files instead of renaming them.
      stack.__exit__(exc_type, exc, tb)

  def __enter__(self) -> "TFRecordWriter":
    return self.open()

  def __exit__(self, exc_type, exc, tb) -> bool:
    self._finish(exc_type, exc, tb)
    return False


def file_size(f) -> int:
  """Size in bytes of the open binary file `f` (a local file, or an epath/fsspec file object of gs://...)."""
  try:
    return os.fstat(f.fileno()).st_size
  except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
    return f.seek(0, io.SEEK_END)


def _pread(f, size: int, offset: int) -> bytes:
  if hasattr(f, "fileno"):
    try:
      return os.pread(f.fileno(), size, offset)
    except (OSError, AttributeError, ValueError):
      pass
  f.seek(offset)
  return f.read(size)


def _record_length(f, offset: int, path: str) -> int:
  """The data length in the header of the record at byte `offset`, its CRC checked (CorruptRecordError naming
  `path` and `offset` for a short or corrupt header)."""
  header = _pread(f, HEADER_BYTES, offset)
  if len(header) < HEADER_BYTES:
    raise CorruptRecordError(path, offset, f"truncated header ({len(header)} of {HEADER_BYTES} bytes)")
  length, length_crc = _HEADER.unpack(header)
  if masked_crc(header[:8]) != length_crc:
    raise CorruptRecordError(path, offset, "length CRC mismatch")
  return length


def read_record(f, offset: int, path: str, verify: bool = True) -> bytes:
  """Reads the record starting at byte `offset` of the open binary file `f` (named `path` in errors).

  Checks the length CRC always and the data CRC when `verify`. Uses positioned reads (os.pread) on real
  files, so one handle may be shared by threads.
  """
  offset = int(offset)
  length = _record_length(f, offset, path)
  size = file_size(f)
  if offset + HEADER_BYTES + length + FOOTER_BYTES > size:  # before allocating what the header claims
    raise CorruptRecordError(path, offset, f"truncated record (its header claims {length} data bytes, the file "
                             f"ends at byte {size})")
  body = _pread(f, length + FOOTER_BYTES, offset + HEADER_BYTES)
  if len(body) < length + FOOTER_BYTES:
    raise CorruptRecordError(
        path, offset, f"truncated record (needs {length} data + {FOOTER_BYTES} CRC bytes, {len(body)} left in file)")
  data = body[:length]
  if verify and masked_crc(data) != _CRC.unpack(body[length:])[0]:
    raise CorruptRecordError(path, offset, "data CRC mismatch")
  return data


def _scan_offsets(f, path: str) -> Iterator[int]:
  """Offsets of consecutive records, checking framing and length CRCs without reading the data."""
  size = file_size(f)
  offset = 0
  while offset < size:
    length = _record_length(f, offset, path)
    end = offset + HEADER_BYTES + length + FOOTER_BYTES
    if end > size:
      raise CorruptRecordError(path, offset, f"truncated record (length {length}, file ends at byte {size})")
    yield offset
    offset = end


def build_index(path: str) -> np.ndarray:
  """Scans `path` and returns the byte offset of every record (uint64); checks framing and length CRCs."""
  with evqa_io.epath_of(path).open("rb") as f:
    return np.fromiter(_scan_offsets(f, str(path)), dtype=np.uint64)


def write_index(path: str) -> np.ndarray:
  """Builds the offsets of `path` and writes them atomically to `path`.idx."""
  offsets = build_index(path)
  with evqa_io.atomic_path(index_path(path)) as tmp:
    with open(tmp, "wb") as f:
      f.write(offsets.astype("<u8").tobytes())
  return offsets


def load_index(path: str) -> np.ndarray:
  """Offsets of the records of `path`: from `path`.idx when present, else by scanning the file."""
  idx = index_path(path)
  if not evqa_io.epath_of(idx).exists():
    return build_index(path)
  raw = evqa_io.epath_of(idx).read_bytes()
  if len(raw) % 8:
    raise ValueError(f"index file {idx} has {len(raw)} bytes, not a multiple of 8 (uint64 offsets)")
  offsets = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
  # Offsets past the end of a truncated file are kept: reading them raises CorruptRecordError there.
  if offsets.size and (int(offsets[0]) != 0 or np.any(np.diff(offsets.astype(np.int64)) < 16)):
    raise ValueError(f"index file {idx} does not match {path}: offsets must start at 0 and grow by >= 16 bytes")
  return offsets


def check_index_covers(path: str, offsets: np.ndarray) -> None:
  """ValueError when the index `offsets` ends before `path` does (an .idx cut short lists fewer records than the shard
  holds, every one of them readable). Reads one record header. An index reaching past the end (a truncated shard) is
  left to the readers, whose CorruptRecordError names the byte where the shard ends."""
  with evqa_io.epath_of(path).open("rb") as f:
    size = file_size(f)
    end = 0
    if len(offsets):
      header = _pread(f, HEADER_BYTES, int(offsets[-1]))
      if len(header) < HEADER_BYTES:
        return
      end = int(offsets[-1]) + HEADER_BYTES + _HEADER.unpack(header)[0] + FOOTER_BYTES
  if end < size:
    raise ValueError(f"index file {index_path(path)} lists {len(offsets)} records ending at byte {end}, but {path} "
                     f"has {size} bytes: the index is short or damaged (the shard holds more records). Delete the "
                     ".idx to rebuild it by scanning the shard")


def iter_records(path: str, verify: bool = True) -> Iterator[bytes]:
  """Yields the data of every record of `path` in file order; raises CorruptRecordError on bad framing/CRC."""
  with evqa_io.epath_of(path).open("rb") as f:
    size = file_size(f)
    offset = 0
    while offset < size:
      data = read_record(f, offset, str(path), verify=verify)
      yield data
      offset += HEADER_BYTES + len(data) + FOOTER_BYTES
