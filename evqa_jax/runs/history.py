"""train_history.jsonl, the durable log of the training rows.

Exact resume: each logged row is appended and fsynced as it is logged; a resumed run first drops the rows past the
restored step, so after any number of kills the file equals the one of an uninterrupted run.
"""

import json

from evqa_jax import io as io_lib
from evqa_jax import log


class History:
  """train_history.jsonl: one JSON row per logged step, appended durably (process 0 only).

  Opening it with `keep_up_to=step` drops the rows past `step` (those a killed run logged after its last
  checkpoint, and a torn last line), so a resumed run's file equals an uninterrupted run's.
  """

  def __init__(self, path: str, keep_up_to: int, enabled: bool = True):
    self.path = path
    self.enabled = enabled
    if not enabled or not io_lib.epath_of(path).exists():
      return
    lines = io_lib.epath_of(path).read_text().split("\n")
    # Every complete row ends with a newline; an unterminated last piece is a row torn by a kill mid-write.
    changed = bool(lines[-1].strip())
    kept = []
    for i, line in enumerate(lines[:-1]):
      if not line.strip():
        continue
      try:
        step = int(json.loads(line)["step"])
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} line {i + 1} is not a history row ({e}): {line[:200]!r}") from e
      if step <= keep_up_to:
        kept.append(line)
      else:
        changed = True
    if changed:
      io_lib.write_text(path, "".join(line + "\n" for line in kept))
      log.info(f"{path}: dropped the rows past step {keep_up_to} (logged after the last checkpoint)")

  def append(self, row: dict) -> None:
    if not self.enabled:
      return
    io_lib.append_text(self.path, json.dumps(row) + "\n")
