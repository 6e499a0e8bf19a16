"""What every converter shares: the output folder's life cycle, value checks after the storage cast, the trust
switch and the end-of-run checks.

    with common.build_output(args.out, inputs=[csv, features], converter="ovqa") as tmp:
      ...write shards, metadata and ground truth into tmp...
    # tmp is now marked (metadata.json "converter") and has replaced OUT in one rename

Rules (docs/hostile_input.md):
  - OUT is built in a temporary sibling folder and swapped in atomically at the end: a failure leaves OUT untouched.
  - OUT is refused when it is an input or contains one (by real path, so a link or `..` cannot hide it), or holds a
    symlink leading outside it (evqa_jax.io.check_outputs / check_links_inside, the guard every command uses).
  - OUT must be new, empty, or an earlier output of one of our converters (metadata.json with a "converter" field);
    anything else is refused, never deleted.
  - `keep_existing` (converters that add one split per run) starts from OUT's current files (hard links, so nothing
    is copied; every writer replaces files by rename, so the old OUT is never modified).
  - OUT may be a gs://... URI (`build_remote_output`): the set is built in a local temporary folder, then published
    so that a reader (records.require_records, split_paths, check_record_counts) sees the old complete set, no set
    (no metadata.json), or the new complete set, never a mix: metadata.json is removed first and uploaded last, after
    every other object is in place at its size. One converter at a time per gs:// OUT (a lease object).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import socket
import tempfile
import time
from typing import Iterable, Mapping

from evqa_jax import io as evqa_io
from evqa_jax.data import example as example_lib
from evqa_jax.data import records

CONVERTER_FIELD = "converter"
TRUST_PICKLES_HELP = ("UNSAFE: also read pickled inputs (.npy object arrays, .pkl, torch files with arbitrary "
                      "objects); unpickling runs code from the file, so use it only for files you trust")


class OutputError(ValueError):
  """An --out that would destroy or mix data."""


def add_trust_pickles(parser) -> None:
  parser.add_argument("--trust-pickles", action="store_true", help=TRUST_PICKLES_HELP)


def check_out(out: str, inputs: Iterable[str | None]) -> str:
  """The absolute OUT when a converter may replace it; OutputError naming the reason otherwise (`io.check_outputs`:
  OUT is not an input, holds none and lies in none, by real path; no link in it leads outside). A gs://... OUT:
  `_check_remote_out`."""
  if evqa_io.is_uri(out):
    return _check_remote_out(out, inputs)
  if os.path.lexists(out) and not os.path.isdir(out):
    raise OutputError(f"--out {out} exists and is not a folder")
  try:
    evqa_io.check_outputs({"the input": [p for p in inputs if p]}, {"--out": out})
    if os.path.isdir(out):
      evqa_io.check_links_inside(out)
  except ValueError as e:
    raise OutputError(str(e)) from None
  if os.path.isdir(out) and os.listdir(out):
    try:
      marked = records.load_metadata(out).get(CONVERTER_FIELD)
    except ValueError:
      marked = None
    if not marked:
      raise OutputError(
          f"--out {out} is a non-empty folder that no converter of this project wrote (no {records.METADATA_FILE} "
          f"with a {CONVERTER_FIELD!r} field): refusing to replace it. Give a new or empty folder")
  return os.path.abspath(out)


def input_paths(args, *, out: str = "out") -> list:
  """Every argument of a converter's parsed `args` but `out` whose value names an existing path or a URI: what
  check_out must protect (a new input flag is covered without being listed)."""
  paths = []
  for dest, value in vars(args).items():
    for v in (value if isinstance(value, (list, tuple)) else [value]):
      if dest != out and isinstance(v, str) and v and (evqa_io.is_uri(v) or os.path.lexists(v)):
        paths.append(v)
  return paths


def _swap_into_place(tmp_dir: str, out_dir: str) -> None:
  old = None
  if os.path.exists(out_dir):
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=os.path.dirname(out_dir))
    os.rmdir(old)
    os.rename(out_dir, old)
  os.rename(tmp_dir, out_dir)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def build_output(out: str, inputs: Iterable[str | None], converter: str, keep_existing: bool = False):
  """Yields a temporary folder beside OUT; on success marks it as `converter`'s output and swaps it into place.
  A gs://... OUT: `build_remote_output`."""
  if evqa_io.is_uri(out):
    with build_remote_output(out, inputs, converter, keep_existing) as tmp_dir:
      yield tmp_dir
    return
  out_dir = check_out(out, inputs)
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
  try:
    if keep_existing and os.path.isdir(out_dir):
      os.rmdir(tmp_dir)
      shutil.copytree(out_dir, tmp_dir, copy_function=os.link, symlinks=True)
    os.chmod(tmp_dir, 0o755)
    yield tmp_dir
    records.update_metadata(tmp_dir, **{CONVERTER_FIELD: converter})
    _swap_into_place(tmp_dir, out_dir)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise


# ------------------------------------------------------------------------------------------------ OUT on gs://

# In a gs:// OUT while a converter publishes into it (metadata.json is then absent, so readers see no record set);
# left behind by a converter that stopped half way, it marks OUT as a converter's, to be replaced by the next run.
UPLOAD_MARKER = ".upload_incomplete.json"
# The lease object that keeps a second converter out of a gs:// OUT while one builds and publishes into it.
OUT_LOCK = ".converter.lock"
_OWN_OBJECTS = (UPLOAD_MARKER, OUT_LOCK)


def _remote_fs(uri: str):
  import fsspec  # pylint: disable=g-import-not-at-top
  fs, key = fsspec.core.url_to_fs(evqa_io.storage_address(uri))  # the object evqa_io.check_outputs compared
  fs.invalidate_cache()  # another process (a converter before us, a reader) may have changed the bucket
  return fs, key.rstrip("/")


def _remote_files(uri: str) -> dict:
  """{path relative to `uri`: size} of every object under the prefix `uri`."""
  fs, key = _remote_fs(uri)
  found = fs.find(key, detail=True) if fs.exists(key) else {}
  out = {}
  for name, info in found.items():
    if info.get("type") == "directory":
      continue
    rel = posixpath.relpath(name.rstrip("/"), key)
    if rel != ".":
      out[rel] = int(info.get("size") or 0)
  return out


def _check_remote_out(out: str, inputs: Iterable[str | None]) -> str:
  """`check_out` for a gs://... OUT: not an input, holding none and lying in none (`io.check_outputs`); not an
  object; empty, or an earlier output of our converters (metadata.json with a "converter" field, or an
  UPLOAD_MARKER left by an interrupted publication). Returns OUT as `evqa_io.storage_address` spells it (no `/./`,
  `//` or trailing slash)."""
  try:
    evqa_io.check_outputs({"the input": [p for p in inputs if p]}, {"--out": out})
  except ValueError as e:
    raise OutputError(str(e)) from None
  out = evqa_io.storage_address(out)
  fs, key = _remote_fs(out)
  if fs.isfile(key):
    raise OutputError(f"--out {out} exists and is an object, not a folder")
  names = set(_remote_files(out))
  if names - set(_OWN_OBJECTS):
    try:
      marked = records.load_metadata(out).get(CONVERTER_FIELD)
    except ValueError:
      marked = None
    if not marked and UPLOAD_MARKER not in names:
      raise OutputError(
          f"--out {out} holds objects that no converter of this project wrote (no {records.METADATA_FILE} with a "
          f"{CONVERTER_FIELD!r} field): refusing to replace them. Give a new or empty prefix")
  return out


def _download_existing(out: str, tmp_dir: str) -> None:
  """OUT's current set into `tmp_dir` (keep_existing): every object but our own; when an interrupted publication
  removed metadata.json, the marker's copy of the metadata it replaced."""
  files = _remote_files(out)
  for rel in files:
    if rel in _OWN_OBJECTS:
      continue
    dst = os.path.join(tmp_dir, *rel.split("/"))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with evqa_io.epath_of(f"{out}/{rel}").open("rb") as fin, open(dst, "wb") as fout:
      shutil.copyfileobj(fin, fout, 1 << 22)
  if records.METADATA_FILE not in files and UPLOAD_MARKER in files:
    marker = evqa_io.load_json(f"{out}/{UPLOAD_MARKER}", "interrupted publication marker")
    if isinstance(marker, dict) and isinstance(marker.get("previous_metadata"), dict):
      evqa_io.write_json(os.path.join(tmp_dir, records.METADATA_FILE), marker["previous_metadata"])


def _upload_files(fs, local_paths: list, keys: list) -> None:
  """Uploads local files to their keys (fsspec's `put`: concurrent on gcsfs); each object appears whole."""
  fs.put(local_paths, keys)


def publish(local_dir: str, out: str, converter: str) -> None:
  """Uploads the finished set `local_dir` to the gs:// prefix `out`, replacing what is there, so that a reader never
  sees a half set:

  1. an UPLOAD_MARKER object (converter, host, pid, the metadata being replaced);
  2. OUT/metadata.json is deleted: from here `records.require_records` reports no records, and no reader starts on
     the old set;
  3. objects of the old set that the new one lacks are deleted (a stale shard could otherwise be listed by name);
  4. every other file is uploaded (each object appears whole), and the bucket's listing is checked against the
     local one, name by name and size by size;
  5. metadata.json is uploaded: the new set is complete;
  6. the marker is deleted.
  A failure before 5 leaves OUT without metadata.json (no set) and with the marker, so the next run replaces it."""
  local = {}
  for dirpath, _, filenames in os.walk(local_dir):
    for name in filenames:
      path = os.path.join(dirpath, name)
      local[os.path.relpath(path, local_dir).replace(os.sep, "/")] = os.path.getsize(path)
  if records.METADATA_FILE not in local:
    raise ValueError(f"{local_dir}: no {records.METADATA_FILE} to publish")
  own = set(local) & set(_OWN_OBJECTS)
  if own:
    raise ValueError(f"{local_dir}: holds {sorted(own)}, names reserved for the publication's own objects")
  fs, key = _remote_fs(out)
  try:
    previous = records.load_metadata(out) or None
  except ValueError:
    previous = None
  if previous is None and fs.exists(f"{key}/{UPLOAD_MARKER}"):  # an interrupted publication's: handed on
    try:
      previous = evqa_io.load_json(f"{out}/{UPLOAD_MARKER}", "interrupted publication marker").get("previous_metadata")
    except (ValueError, AttributeError):
      previous = None
  evqa_io.write_json(f"{out}/{UPLOAD_MARKER}", {"converter": converter, "host": socket.gethostname(),
                                                "pid": os.getpid(), "started": time.time(),
                                                "previous_metadata": previous})
  if fs.exists(f"{key}/{records.METADATA_FILE}"):
    fs.rm_file(f"{key}/{records.METADATA_FILE}")
  for rel in sorted(set(_remote_files(out)) - set(local) - set(_OWN_OBJECTS)):
    fs.rm_file(f"{key}/{rel}")
  body = sorted(rel for rel in local if rel != records.METADATA_FILE)
  if body:
    _upload_files(fs, [os.path.join(local_dir, *rel.split("/")) for rel in body], [f"{key}/{rel}" for rel in body])
  remote = _remote_files(out)
  wrong = [rel for rel in body if remote.get(rel) != local[rel]]
  if wrong:
    raise IOError(f"--out {out}: after the upload, {len(wrong)} object(s) are missing or of the wrong size (first: "
                  f"{wrong[0]}: {remote.get(wrong[0])} bytes in the bucket, {local[wrong[0]]} here); the prefix holds "
                  f"no {records.METADATA_FILE}, so no reader uses it; run the converter again")
  evqa_io.upload(os.path.join(local_dir, records.METADATA_FILE), f"{out}/{records.METADATA_FILE}")
  fs.rm_file(f"{key}/{UPLOAD_MARKER}")


@contextlib.contextmanager
def build_remote_output(out: str, inputs: Iterable[str | None], converter: str, keep_existing: bool = False):
  """`build_output` for a gs://... OUT: yields a local temporary folder (under $TMPDIR: it must have room for the
  set), then marks it as `converter`'s output and `publish`es it to OUT. OUT's lease object (OUT_LOCK, as the
  workdir lock: created only when absent, rewritten while held) keeps a second converter out meanwhile."""
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  out = _check_remote_out(out, inputs)
  with contextlib.ExitStack() as stack:
    try:
      stack.enter_context(safeguards.remote_lock(f"{out}/{OUT_LOCK}"))
    except evqa_io.LockedError as e:
      raise OutputError(f"--out {out} is being written by another converter ({e}); wait for it to finish or give "
                        "another --out") from None
    _check_remote_out(out, inputs)  # again: it may have changed while this run waited for the lock
    tmp_root = stack.enter_context(tempfile.TemporaryDirectory(prefix="evqa_convert_"))
    tmp_dir = os.path.join(tmp_root, posixpath.basename(out) or "out")
    os.makedirs(tmp_dir)
    if keep_existing:
      _download_existing(out, tmp_dir)
    yield tmp_dir
    records.update_metadata(tmp_dir, **{CONVERTER_FIELD: converter})
    publish(tmp_dir, out, converter)


def check_record(example: Mapping, spec, where: str) -> dict:
  """`example` when every field survives the cast to its storage dtype (finite floats, ints in range, shapes);
  ValueError naming `where` (file, row / record) and the field otherwise."""
  example_lib.validate_example(example, spec, where)
  return dict(example)


def check_converted(converted: int, skipped: Mapping[str, int], where: str, split: str | None = None) -> None:
  """A run, or one `split` of it, that converted nothing (every record skipped by --skip-bad, or no input rows) is an
  error, not an empty dataset or split: every converter calls it for each split it writes, inside `build_output`,
  so the error leaves --out as it was."""
  if converted == 0:
    reasons = ", ".join(f"{k}: {v}" for k, v in skipped.items() if v) or "no input records"
    of = f"split {split!r}: " if split else ""
    raise ValueError(f"{where}: {of}converted 0 records (skipped {reasons}); nothing to write")
