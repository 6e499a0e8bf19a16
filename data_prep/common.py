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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
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
  OUT is not an input, holds none and lies in none, by real path; no link in it leads outside)."""
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
  """Every argument of a converter's parsed `args` but `out` whose value names an existing path: what check_out
  must protect (a new input flag is covered without being listed)."""
  paths = []
  for dest, value in vars(args).items():
    for v in (value if isinstance(value, (list, tuple)) else [value]):
      if dest != out and isinstance(v, str) and v and os.path.lexists(v):
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
  """Yields a temporary folder beside OUT; on success marks it as `converter`'s output and swaps it into place."""
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


def check_record(example: Mapping, spec, where: str) -> dict:
  """`example` when every field survives the cast to its storage dtype (finite floats, ints in range, shapes);
  ValueError naming `where` (file, row / record) and the field otherwise."""
  example_lib.validate_example(example, spec, where)
  return dict(example)


def check_converted(converted: int, skipped: Mapping[str, int], where: str) -> None:
  """A run that converted nothing (every record skipped, or no input rows) is an error, not an empty dataset."""
  if converted == 0:
    reasons = ", ".join(f"{k}: {v}" for k, v in skipped.items() if v) or "no input records"
    raise ValueError(f"{where}: converted 0 records (skipped {reasons}); nothing to write")
