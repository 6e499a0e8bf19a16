"""Atomic file output (write to a temporary path beside the target, then rename) and reading paths on any filesystem.

Inputs (records, their `.idx` indexes, metadata, vocabularies, graphs) are read through `etils.epath`, as Grain and
Orbax read theirs, so a data directory may be local or a URI such as gs://bucket/ovqa/records.
"""

import contextlib
import json
import os
import subprocess
import tempfile


def epath_of(path) -> "epath.Path":
  """`path` as an `etils.epath.Path`: a local path (`~` expanded) or a gs://, s3://, ... URI."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  return epath.Path(path if is_uri(path) else os.path.expanduser(path))


def is_uri(path) -> bool:
  """True for a non-local path such as gs://bucket/dir."""
  return "://" in os.fspath(path)


def absolute(path) -> str:
  """An absolute local path, or the URI unchanged (os.path.abspath would turn gs://b into ./gs:/b)."""
  path = os.fspath(path)
  return path if is_uri(path) else os.path.abspath(os.path.expanduser(path))


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


@contextlib.contextmanager
def atomic_path(path: str):
  """Yields a temporary path in the target's directory; renames it onto `path` only on success."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
  os.close(fd)
  try:
    yield tmp
    if os.path.isfile(tmp):
      os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600 files; outputs are ordinary readable files
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


@contextlib.contextmanager
def file_lock(path: str):
  """Holds an exclusive advisory lock (fcntl.flock) on `path`, created if missing, for the `with` block: several
  processes building the same world, metadata or cache take turns."""
  import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def write_json(path: str, obj, indent: int = 2) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      json.dump(obj, f, indent=indent, sort_keys=True)
      f.write("\n")


def write_text(path: str, text: str) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(text)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a training run executes; README, tests and benchmarks are not part of a result.
CODE_PATHS = ("evqa_jax", "configs", "data_prep", "launch")


def _git(*args, timeout: float = 10.0):
  try:
    out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=timeout)
  except (OSError, subprocess.SubprocessError):
    return None
  return out


def code_version() -> dict:
  """{"commit": HEAD, "dirty": the code paths have uncommitted changes} of the git checkout this package runs from;
  {} outside one. Recorded in every workdir's config.json, so a result can be traced to the code that produced it."""
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
  if commit is None or status is None or commit.returncode != 0 or status.returncode != 0:
    return {}
  return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def same_code(a: dict, b: dict) -> bool:
  """Whether two `code_version()` records ran the same code: both clean and no difference in CODE_PATHS between
  their commits (commits that change only docs or tests count as the same code)."""
  if not a or not b or a.get("dirty") or b.get("dirty"):
    return False
  if a["commit"] == b["commit"]:
    return True
  diff = _git("diff", "--quiet", a["commit"], b["commit"], "--", *CODE_PATHS)
  return diff is not None and diff.returncode == 0
