"""Atomic file output: write to a temporary path beside the target, then rename."""

import contextlib
import json
import os
import tempfile


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


def write_json(path: str, obj, indent: int = 2) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      json.dump(obj, f, indent=indent, sort_keys=True)
      f.write("\n")


def write_text(path: str, text: str) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(text)
