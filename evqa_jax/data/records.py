"""Dataset directories of TFRecord shards plus metadata.json.

Layout:
  DIR/metadata.json                              dataset-level metadata (below)
  DIR/{split}-{i:05d}-of-{n:05d}.tfrecord        shards of serialized tf.train.Example
  DIR/{split}-{i:05d}-of-{n:05d}.tfrecord.idx    record offsets, little-endian uint64

metadata.json:
  "features": spec as JSON ({name: {"dtype", "shape"}}), the spec of the most recently written split
  "splits":   {split: {"num_examples", "shards" (file names relative to DIR), "shard_sizes", "features"}}
  anything else a converter records with `update_metadata` (e.g. "task", "vocab_train_file").

Writers of different splits may run concurrently in one directory: metadata updates hold a file lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from typing import Any, Iterable, Mapping

from evqa_jax import io as evqa_io
from evqa_jax.data import example as example_lib
from evqa_jax.data import tfrecord
from evqa_jax.data.example import Feature

METADATA_FILE = "metadata.json"
_LOCK_FILE = ".metadata.lock"
_SPLIT_RE = re.compile(r"^[A-Za-z0-9_.]+$")


def shard_name(split: str, index: int, num_shards: int) -> str:
  return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


@contextlib.contextmanager
def _metadata_lock(out_dir: str):
  with evqa_io.file_lock(os.path.join(out_dir, _LOCK_FILE)):
    yield


def require_records(config, task_name: str, convert_command: str, demo_config: str) -> None:
  """Raises FileNotFoundError naming config.data.dir and the command that fills it when it holds no records (the
  library never generates data; the synthetic worlds are built by the launch side, data_prep.worlds)."""
  if (evqa_io.epath_of(config.data.dir) / METADATA_FILE).exists():  # local or gs://...
    return
  if config.data.synthetic:
    raise FileNotFoundError(
        f"config.data.dir = {config.data.dir!r} holds no records yet: config.data.synthetic = "
        f"{config.data.synthetic!r} names a built-in synthetic world, which launch/train.py builds before training; "
        f"build it alone with `python -m data_prep.worlds --config={demo_config}` (your config file and variant)")
  raise FileNotFoundError(
      f"config.data.dir = {config.data.dir!r} holds no converted {task_name} records (no metadata.json). Convert "
      f"the release first:\n  {convert_command}\nor run the demo variant (--config={demo_config}) on the built-in "
      "synthetic world.")


def load_metadata(out_dir: str) -> dict:
  """Contents of DIR/metadata.json ({} when the file does not exist yet)."""
  path = evqa_io.epath_of(out_dir) / METADATA_FILE
  if not path.exists():
    return {}
  meta = evqa_io.load_json(os.fspath(path), "dataset metadata")  # UTF-8, valid JSON; errors name the file
  if not isinstance(meta, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
  return meta


def _update_metadata_locked(out_dir: str, fields: Mapping[str, Any]) -> dict:
  meta = load_metadata(out_dir)
  meta.update(fields)
  evqa_io.write_json(os.path.join(out_dir, METADATA_FILE), meta)
  return meta


def update_metadata(out_dir: str, **fields) -> dict:
  """Sets top-level metadata fields (replacing their previous values); returns the new metadata.

  "splits" is maintained by `write_split`; use this for converter fields such as task="ovqa".
  Values must be JSON-serializable.
  """
  for key, value in fields.items():
    try:
      json.dumps(value)
    except TypeError as e:
      raise ValueError(f"update_metadata({out_dir}): field {key!r} is not JSON-serializable ({e})") from e
  with _metadata_lock(out_dir):
    return _update_metadata_locked(out_dir, fields)


def load_spec(data_dir: str, split: str | None = None) -> dict[str, Feature]:
  """The feature spec of `split` (or the dataset-level "features" when split is None)."""
  meta = load_metadata(data_dir)
  if split is not None:
    entry = meta.get("splits", {}).get(split)
    if entry is None:
      raise ValueError(f"{data_dir}: split {split!r} not in {METADATA_FILE} (splits: {sorted(meta.get('splits', {}))})")
    if "features" in entry:
      return example_lib.spec_from_json(entry["features"])
  if "features" not in meta:
    raise ValueError(f"{os.path.join(data_dir, METADATA_FILE)}: no 'features' spec (missing or not written yet)")
  return example_lib.spec_from_json(meta["features"])


def split_paths(data_dir: str, split: str) -> list[str]:
  """Absolute shard paths of `split`, from metadata.json when it lists the split, else by file name pattern."""
  meta = load_metadata(data_dir)
  entry = meta.get("splits", {}).get(split)
  root = evqa_io.epath_of(data_dir)
  if entry is not None:
    paths = [root / name for name in entry.get("shards", [])]
    absent = [os.fspath(p) for p in paths if not p.exists()]
    if absent:
      raise FileNotFoundError(f"{data_dir}: split {split!r} lists shards that do not exist: {absent}")
  else:
    pattern = re.compile(re.escape(split) + r"-\d{5}-of-\d{5}\.tfrecord")
    paths = sorted((p for p in root.iterdir() if pattern.fullmatch(p.name)), key=lambda p: p.name) \
        if root.is_dir() else []
  if not paths:
    raise FileNotFoundError(f"{data_dir}: no TFRecord shards for split {split!r}")
  return [evqa_io.absolute(p) for p in paths]


def check_record_counts(paths, found: Mapping[str, int], unknown=()) -> None:
  """ValueError when the records located in `paths` are fewer or more than the metadata.json beside them says: per
  shard (its "shard_sizes"), else per split ("num_examples", over the split's shards when all of them are in
  `paths`). `found`: {shard path: records located (read back, or reported corrupt)}; shards in `unknown` (whose rest
  could not be located after a damaged length field, reported with the skipped records) are left out. So a damaged
  or short .idx, or a shard cut at a record boundary together with its index, never shrinks a dataset silently."""
  by_dir: dict[str, list] = {}
  for p in paths:
    d, name = os.path.split(os.path.abspath(p))
    by_dir.setdefault(d, []).append((name, p))
  for d, shards in by_dir.items():
    try:
      splits = load_metadata(d).get("splits", {})
    except ValueError:
      continue  # a dataset without readable metadata has nothing to compare with (the readers report it)
    present = dict(shards)
    meta_path = os.path.join(d, METADATA_FILE)
    for split, entry in splits.items():
      names = list(entry.get("shards", []))
      sizes = entry.get("shard_sizes")
      if sizes:
        for name, n in zip(names, sizes):
          p = present.get(name)
          if p is not None and p not in unknown and found[p] != int(n):
            idx = tfrecord.index_path(p)
            where = idx if evqa_io.epath_of(idx).exists() else p
            raise ValueError(
                f"{where} lists {found[p]} records but {meta_path} says shard {name} holds {n}: the index (or "
                "shard) is damaged or short. Delete the .idx to rebuild it by scanning the shard, or convert the "
                "data again")
      elif "num_examples" in entry and names and all(n in present for n in names) \
          and not any(present[n] in unknown for n in names):
        total = sum(found[present[n]] for n in names)
        if total != int(entry["num_examples"]):
          raise ValueError(
              f"split {split!r}: its shards ({', '.join(names)}) hold {total} records but {meta_path} says "
              f"{entry['num_examples']} (num_examples): a shard or its index is damaged or short. Delete the "
              ".idx files to rebuild them by scanning, or convert the data again")


def _spool(examples: Iterable[dict], spec, split: str, tmp_dir: str):
  """Encodes an iterable of unknown length into one temporary TFRecord; returns (path, count)."""
  fd, path = tempfile.mkstemp(prefix=f".{split}.spool.", suffix=".tmp", dir=tmp_dir)
  os.close(fd)
  count = 0
  try:
    with open(path, "wb") as f:
      for i, ex in enumerate(examples):
        f.write(tfrecord.frame(example_lib.encode_example(ex, spec, where=f"example {i} of split {split!r}")))
        count += 1
  except BaseException:
    os.remove(path)
    raise
  return path, count


def write_split(out_dir: str, split: str, examples: Iterable[dict], spec: Mapping[str, Feature],
                num_shards: int = 1) -> int:
  """Encodes `examples` into `num_shards` shards of DIR/{split}-*.tfrecord and records them in metadata.json.

  Shards hold contiguous runs of examples, so reading the shards in order gives the input order. An
  iterable without len() is first spooled to a temporary file (constant memory). Every file appears
  atomically; shards of an earlier write of this split with a different shard count are removed.
  Returns the number of records written.
  """
  if not _SPLIT_RE.match(split):
    raise ValueError(f"write_split({out_dir}): split name {split!r} must match {_SPLIT_RE.pattern}")
  if num_shards < 1:
    raise ValueError(f"write_split({out_dir}, {split!r}): num_shards must be >= 1, got {num_shards}")
  spec = dict(spec)
  for name, f in spec.items():
    if not isinstance(f, Feature):
      raise ValueError(f"write_split({out_dir}, {split!r}): spec field {name!r} is {type(f).__name__}, not Feature")
  os.makedirs(out_dir, exist_ok=True)
  names = [shard_name(split, i, num_shards) for i in range(num_shards)]

  spool_path = None
  try:
    if hasattr(examples, "__len__"):
      total = len(examples)
      records = (example_lib.encode_example(ex, spec, where=f"example {i} of split {split!r}")
                 for i, ex in enumerate(examples))
    else:
      spool_path, total = _spool(examples, spec, split, out_dir)
      records = tfrecord.iter_records(spool_path, verify=False)
    # Shard i gets examples [bounds[i], bounds[i+1]): sizes differ by at most one.
    bounds = [total * i // num_shards for i in range(num_shards + 1)]
    written = 0
    sizes = []
    with contextlib.ExitStack() as stack:
      for i, name in enumerate(names):
        writer = stack.enter_context(tfrecord.TFRecordWriter(os.path.join(out_dir, name)))
        for _ in range(bounds[i + 1] - bounds[i]):
          data = next(records, None)
          if data is None:
            raise ValueError(f"write_split({out_dir}, {split!r}): examples yielded {written} items, len() said {total}")
          writer.write(data)
          written += 1
        sizes.append(writer.num_records)
      if next(records, None) is not None:
        raise ValueError(f"write_split({out_dir}, {split!r}): examples yielded more items than len() = {total}")
  finally:
    if spool_path is not None and os.path.exists(spool_path):
      os.remove(spool_path)

  with _metadata_lock(out_dir):
    meta = load_metadata(out_dir)
    splits = dict(meta.get("splits", {}))
    old = splits.get(split, {})
    spec_json = example_lib.spec_to_json(spec)
    for other, entry in splits.items():
      if other != split and "features" in entry and entry["features"] != spec_json:
        logging.warning("write_split(%s): split %r has a different spec than split %r", out_dir, split, other)
    splits[split] = {"num_examples": written, "shards": names, "shard_sizes": sizes, "features": spec_json}
    _update_metadata_locked(out_dir, {"splits": splits, "features": spec_json})
  for stale in set(old.get("shards", [])) - set(names):
    for p in (os.path.join(out_dir, stale), tfrecord.index_path(os.path.join(out_dir, stale))):
      if os.path.exists(p):
        os.remove(p)
  return written
