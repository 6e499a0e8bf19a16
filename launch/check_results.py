"""Reruns a recorded demo table (docs/results.md) and compares every printed number with the committed files
(docs/results/).

  python launch/check_results.py docs/results/<table> [--workdir=DIR]      # DIR: compare an existing run instead
  python launch/check_results.py docs/results/<table> --record --printed='{"<file>": {"eval.test.mAcc": 2}}' \
      [--workdir=DIR] -- python launch/train.py --config=... --workdir={workdir}

Exit status 0 when every printed number matches; otherwise each mismatch is listed and the status is 1.

A record is a folder (docs/results/<table>/) holding

  record.json   {"command": [argv with "{workdir}" for the output directory], "commit": ..., "dirty": ..., "cpu": ...,
                 "printed": {"<file under the workdir>": {"<dotted key>": <decimals the README prints>, ...}, ...}}
  <file> ...    the committed copy of every file named in "printed", at its path under the workdir

The check reruns the command into a fresh workdir (or reads one that already holds its outputs) and compares every
printed number, formatted to the printed decimals, with the committed copy. Runs are deterministic on one CPU, so a
difference means the code or the environment changed what the README shows. The git commit and the CPU model are
recorded so that a check on other code or another processor says so (this script's bookkeeping, not the library's).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from evqa_jax import io as io_lib  # noqa: E402

RECORD = "record.json"
# What a training run executes; README, tests and benchmarks are not part of a result.
CODE_PATHS = ("evqa_jax", "configs", "data_prep", "launch")


# ------------------------------------------------------------------------------- provenance: git commit, CPU model

def _git(*args, timeout: float = 10.0):
  try:
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=timeout)
  except (OSError, subprocess.SubprocessError):
    return None


def code_version(paths=CODE_PATHS) -> dict:
  """{"commit": HEAD, "dirty": `paths` have uncommitted changes to tracked files} of this git checkout; {} outside
  one."""
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no", "--", *paths)
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


def cpu_model() -> str | None:
  """/proc/cpuinfo's first "model name" (None where unknown, e.g. macOS). XLA's CPU code differs between processor
  generations, so a recorded result names the CPU it ran on."""
  try:
    with open("/proc/cpuinfo") as f:
      first = f.read().split("\n\n")[0]
  except OSError:
    return None
  for line in first.splitlines():
    key, _, value = line.partition(":")
    if key.strip() == "model name":
      return value.strip()
  return None


# ------------------------------------------------------------------------------------------- record and compare

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
  env = dict(os.environ, PYTHONPATH=REPO)
  subprocess.run(argv, cwd=REPO, env=env, check=True)


def record(folder: str, command: list, printed: dict, workdir: str | None = None) -> dict:
  """Runs `command` (unless `workdir` already holds its outputs) and writes the record of `printed` into `folder`."""
  if not any("{workdir}" in a for a in command):
    raise ValueError(f"command {command} has no '{{workdir}}' argument: the check could not rerun it elsewhere")
  if workdir is None:
    workdir = tempfile.mkdtemp(prefix="evqa_record_")
    _run(command, workdir)
  rec = {"command": list(command), **code_version(), "cpu": cpu_model(), "printed": printed}
  for rel, keys in printed.items():
    src = os.path.join(workdir, rel)
    with open(src) as f:
      values = json.load(f)
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
  with open(os.path.join(folder, RECORD)) as f:
    rec = json.load(f)
  bad = []
  for rel, keys in rec["printed"].items():
    with open(os.path.join(folder, rel)) as f:
      committed = json.load(f)
    rerun_path = os.path.join(workdir, rel)
    if not os.path.exists(rerun_path):
      bad.append(f"{rel}: not written by the rerun ({rerun_path})")
      continue
    with open(rerun_path) as f:
      rerun = json.load(f)
    for key, decimals in keys.items():
      a = f"{_lookup(committed, key, os.path.join(folder, rel)):.{decimals}f}"
      b = f"{_lookup(rerun, key, rerun_path):.{decimals}f}"
      if a != b:
        bad.append(f"{rel} {key}: committed {a}, rerun {b}")
  return bad


def check(folder: str, workdir: str | None = None) -> list:
  """Reruns the record's command into a temporary workdir (or uses `workdir`) and compares; -> the mismatches."""
  with open(os.path.join(folder, RECORD)) as f:
    rec = json.load(f)
  now = code_version()
  if not same_code({k: rec.get(k) for k in ("commit", "dirty")}, now):
    print(f"note: recorded with commit {rec.get('commit')} (dirty: {rec.get('dirty')}), checking with "
          f"{now.get('commit')} (dirty: {now.get('dirty')}): the code differs", flush=True)
  cpu = cpu_model()
  if rec.get("cpu") != cpu:  # XLA's CPU code differs between processors: the last bits, then the trained numbers
    print(f"note: recorded on CPU {rec.get('cpu') or '(not recorded)'!r}, checking on {cpu!r}: results are "
          f"reproducible on one machine, not on every CPU", flush=True)
  if workdir is not None:
    return compare(folder, workdir)
  with tempfile.TemporaryDirectory(prefix="evqa_check_") as tmp:
    _run(rec["command"], tmp)
    return compare(folder, tmp)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  command = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("folder", help="docs/results/<table>")
  parser.add_argument("--workdir", help="a run that already holds the command's outputs (no rerun)")
  parser.add_argument("--record", action="store_true", help="write the record (command after --) instead")
  parser.add_argument("--printed", help='JSON {"<file under the workdir>": {"<dotted key>": decimals}}')
  args = parser.parse_args(argv)
  if args.record:
    if not command or not args.printed:
      parser.error("--record needs --printed and the command after --")
    record(args.folder, command, json.loads(args.printed), workdir=args.workdir)
    print(f"recorded {args.folder}")
    return 0
  bad = check(args.folder, workdir=args.workdir)
  for line in bad:
    print(f"MISMATCH {line}")
  print(f"{args.folder}: {'OK, every printed number matches' if not bad else f'{len(bad)} mismatch(es)'}")
  return 1 if bad else 0


if __name__ == "__main__":
  from evqa_jax import cli  # noqa: E402
  sys.exit(cli.run(main))
