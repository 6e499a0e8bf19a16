"""Recorded demo results: the command that made a README table, the commit it ran, and its metric files.

A record is a folder (docs/results/<table>/) holding

  record.json   {"command": [argv with "{workdir}" for the output directory], "commit": ..., "dirty": ...,
                 "printed": {"<file under the workdir>": {"<dotted key>": <decimals the README prints>, ...}, ...}}
  <file> ...    the committed copy of every file named in "printed", at its path under the workdir

`check` reruns the command into a fresh workdir (or reads one that already holds its outputs) and compares every
printed number, formatted to the printed decimals, with the committed copy. Runs are deterministic on CPU, so a
difference means the code or the environment changed what the README shows.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from evqa_jax import io as io_lib

RECORD = "record.json"


def _lookup(obj, dotted: str, where: str):
  for part in dotted.split("."):
    if not isinstance(obj, dict) or part not in obj:
      raise KeyError(f"{where}: no key {dotted!r} (missing {part!r})")
    obj = obj[part]
  if not isinstance(obj, (int, float)) or isinstance(obj, bool):
    raise TypeError(f"{where}: {dotted!r} is {obj!r}, not a number")
  return float(obj)


def _run(command: list, workdir: str) -> None:
  """Runs `command` (argv; "python" is this interpreter, "{workdir}" the output directory) from the repository."""
  argv = [sys.executable if a == "python" else a.replace("{workdir}", workdir) for a in command]
  env = dict(os.environ, PYTHONPATH=io_lib.REPO)
  subprocess.run(argv, cwd=io_lib.REPO, env=env, check=True)


def record(folder: str, command: list, printed: dict, workdir: str | None = None) -> dict:
  """Runs `command` (unless `workdir` already holds its outputs) and writes the record of `printed` into `folder`."""
  if not any("{workdir}" in a for a in command):
    raise ValueError(f"command {command} has no '{{workdir}}' argument: the check could not rerun it elsewhere")
  if workdir is None:
    workdir = tempfile.mkdtemp(prefix="evqa_record_")
    _run(command, workdir)
  rec = {"command": list(command), **io_lib.code_version(), "cpu": io_lib.cpu_model(), "printed": printed}
  for rel, keys in printed.items():
    src = os.path.join(workdir, rel)
    values = io_lib.load_json(src, "results file", finite=False)
    for key in keys:
      _lookup(values, key, src)  # every printed number must be in the file
    dst = os.path.join(folder, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with io_lib.atomic_path(dst) as tmp:
      shutil.copyfile(src, tmp)
  io_lib.write_json(os.path.join(folder, RECORD), rec)
  return rec


def compare(folder: str, workdir: str) -> list:
  """-> one line per printed number whose rerun value, at the printed decimals, differs from the committed one."""
  rec = io_lib.load_json(os.path.join(folder, RECORD), "results file", finite=False)
  bad = []
  for rel, keys in rec["printed"].items():
    committed = io_lib.load_json(os.path.join(folder, rel), "results file", finite=False)
    rerun_path = os.path.join(workdir, rel)
    if not os.path.exists(rerun_path):
      bad.append(f"{rel}: not written by the rerun ({rerun_path})")
      continue
    rerun = io_lib.load_json(rerun_path, "results file", finite=False)
    for key, decimals in keys.items():
      a = f"{_lookup(committed, key, os.path.join(folder, rel)):.{decimals}f}"
      b = f"{_lookup(rerun, key, rerun_path):.{decimals}f}"
      if a != b:
        bad.append(f"{rel} {key}: committed {a}, rerun {b}")
  return bad


def check(folder: str, workdir: str | None = None) -> list:
  """Reruns the record's command into a temporary workdir (or uses `workdir`) and compares; -> the mismatches."""
  rec = io_lib.load_json(os.path.join(folder, RECORD), "results file", finite=False)
  now = io_lib.code_version()
  if not io_lib.same_code({k: rec.get(k) for k in ("commit", "dirty")}, now):
    print(f"note: recorded with commit {rec.get('commit')} (dirty: {rec.get('dirty')}), checking with "
          f"{now.get('commit')} (dirty: {now.get('dirty')}): the code differs", flush=True)
  cpu = io_lib.cpu_model()
  if rec.get("cpu") != cpu:  # XLA's CPU code differs between processors: the last bits, then the trained numbers
    print(f"note: recorded on CPU {rec.get('cpu') or '(not recorded)'!r}, checking on {cpu!r}: results are "
          f"reproducible on one machine, not on every CPU (README, Demo result)", flush=True)
  if workdir is not None:
    return compare(folder, workdir)
  with tempfile.TemporaryDirectory(prefix="evqa_check_") as tmp:
    _run(rec["command"], tmp)
    return compare(folder, tmp)
