"""Checks a run of a recorded demo table (docs/results.md) against the committed files (docs/results/), on any CPU.

  python launch/check_results.py docs/results/<table> [--workdir=DIR]      # DIR: check an existing run instead
  python launch/check_results.py docs/results/<table> --record --printed='{"<file>": {"eval.test.mAcc": 2}}' \
      [--workdir=DIR] -- python launch/train.py --config=... --workdir={workdir}

Exit status 0 when the run passes; otherwise each difference is listed and the status is 1 (2: a record or run
that cannot be read, or a command the check refuses to run).

A record is a folder (docs/results/<table>/) holding

  record.json   {"command": [argv with "{workdir}" for the output directory], "commit": ..., "dirty": ...,
                 "machine": {"vendor", "simd", "cpu_family", "model"},
                 "printed": {"<file under the workdir>": {"<dotted key>": <decimals the docs print>, ...}, ...},
                 "expect": (optional) what the docs state for every CPU: ranges and orderings (`expectations`)}
  <file> ...    the committed copy of every file named in "printed", at its path under the workdir

Runs are deterministic on one CPU, but the last digits differ between CPU generations (XLA's CPU code differs), and
over hundreds of steps so do the printed ones. So the check compares every printed number, at the printed decimals,
with the table's record made on the user's class of CPU (vendor and vector extension; the records of one command
sit side by side in docs/results/) when there is one, and otherwise holds the run to the ranges and orderings the
docs state for every CPU. The command is rerun into a fresh workdir unless --workdir names a run; only this
project's launch commands run, with this interpreter (`checked_command`): a downloaded record chooses nothing else.
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


def _cpuinfo() -> dict:
  """/proc/cpuinfo's first processor block as {key: value} ({} where unknown, e.g. macOS)."""
  try:
    with open("/proc/cpuinfo") as f:
      first = f.read().split("\n\n")[0]
  except OSError:
    return {}
  return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}


def cpu_model() -> str | None:
  """/proc/cpuinfo's first "model name" (None where unknown). XLA's CPU code differs between processor generations,
  so a recorded result names the CPU it ran on."""
  return _cpuinfo().get("model name")


def machine() -> dict:
  """This CPU as a record stores it: {"vendor": vendor_id, "simd": widest vector extension XLA uses ("avx512",
  "avx2", "avx" or "sse"), "cpu_family": /proc/cpuinfo's cpu family, "model": model name}; {} where unknown."""
  info = _cpuinfo()
  if not info.get("vendor_id"):
    return {}
  flags = set(info.get("flags", "").split())
  simd = next((s for f, s in (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx")) if f in flags), "sse")
  family = info.get("cpu family")
  return {"vendor": info["vendor_id"], "simd": simd,
          "cpu_family": int(family) if family and family.isdigit() else None, "model": info.get("model name")}


def cpu_class(m: dict | None):
  """The part of `machine()` that decides the digits: the vendor and the vector extension. Runs of one command on
  a Zen 4 and a Zen 5 (AMD, AVX-512) gave the same digits; an Intel Xeon with AVX-512 and a Zen 3 (AVX2) each gave
  others (docs/results.md). None where unknown."""
  if not m or not m.get("vendor") or not m.get("simd"):
    return None
  return (m["vendor"], m["simd"])


def describe(m: dict | None) -> str:
  if not m:
    return "an unrecorded CPU"
  vendor = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(m.get("vendor"), m.get("vendor"))
  family = f", cpu family {m['cpu_family']}" if m.get("cpu_family") is not None else ""
  return f"{m.get('model') or vendor} ({vendor}, {m.get('simd', '?').upper().replace('AVX', 'AVX-')}{family})"


# ------------------------------------------------------------------ what a record may run: this project's launchers

LAUNCHERS = ("launch/train.py", "launch/sweep.py", "launch/evaluate.py")
# Flags that make a run execute or trust input files' contents (docs/hostile_input.md): never from a record.
UNSAFE_FLAGS = ("trust_pickles", "allow_unverified", "trust-pickles", "--flagfile")


def checked_command(command, where: str) -> list:
  """`command` if it is one of this project's launch commands (`python launch/{train,sweep,evaluate}.py`, a
  `--config=configs/<file>.py[:variants]` of this checkout, `--workdir={workdir}`, flags only, none that trusts
  input files' contents), else ValueError naming `where`: a record is data, and a downloaded one must not choose
  what runs. The check runs it with this interpreter (sys.executable), never a program the record names."""
  def refuse(why):
    raise ValueError(f"{where}: refusing to run {command!r}: {why}; a record may only hold `python "
                     f"{{{','.join(LAUNCHERS)}}} --config=configs/<file>.py[:variants] --workdir={{workdir}} --flags`")
  if (not isinstance(command, list) or len(command) < 2 or not all(isinstance(a, str) for a in command)):
    refuse("not a list of strings")
  if command[0] not in ("python", "python3"):
    refuse(f"the program is {command[0]!r}, not python")
  if command[1] not in LAUNCHERS:
    refuse(f"{command[1]!r} is not one of this project's launch scripts")
  configs = [a for a in command[2:] if a.startswith("--config=")]
  for a in command[2:]:
    if not a.startswith("--") or a == "--":
      refuse(f"{a!r} is not a --flag")
    if any(u in a for u in UNSAFE_FLAGS):
      refuse(f"{a!r} makes the run trust input files")
  if len(configs) != 1:
    refuse("it needs exactly one --config=")
  path = configs[0].split("=", 1)[1].split(":")[0]
  config_dir = os.path.realpath(os.path.join(REPO, "configs"))
  full = os.path.realpath(os.path.join(REPO, path))
  if (os.path.isabs(path) or os.path.dirname(full) != config_dir or not full.endswith(".py")
      or not os.path.isfile(full)):
    refuse(f"--config file {path!r} is not a file of this checkout's configs/")
  if "--workdir={workdir}" not in command[2:]:
    refuse("it has no --workdir={workdir}")
  return list(command)


# ------------------------------------------------------------------------------------------- record and compare

def _lookup(obj, dotted: str, where: str):
  for part in dotted.split("."):
    if not isinstance(obj, dict) or part not in obj:
      raise KeyError(f"{where}: no key {dotted!r} (missing {part!r})")
    obj = obj[part]
  if not isinstance(obj, (int, float)) or isinstance(obj, bool):
    raise TypeError(f"{where}: {dotted!r} is {obj!r}, not a number")
  return float(obj)


def _run(command: list, workdir: str, where: str) -> None:
  """Runs `command` (one of this project's launch commands, `checked_command`) with this interpreter from the
  repository, "{workdir}" replaced by the output directory."""
  argv = [sys.executable, *(a.replace("{workdir}", workdir) for a in checked_command(command, where)[1:])]
  env = dict(os.environ, PYTHONPATH=REPO)
  subprocess.run(argv, cwd=REPO, env=env, check=True)


def _read_record(folder: str) -> dict:
  path = os.path.join(folder, RECORD)
  rec = io_lib.load_json(path, what="results record")
  if not isinstance(rec, dict) or not isinstance(rec.get("printed"), dict):
    raise ValueError(f"{path}: not a results record (no \"printed\" object)")
  return rec


def record(folder: str, command: list, printed: dict, workdir: str | None = None) -> dict:
  """Runs `command` (unless `workdir` already holds its outputs) and writes the record of `printed` into `folder`."""
  if not any("{workdir}" in a for a in command):
    raise ValueError(f"command {command} has no '{{workdir}}' argument: the check could not rerun it elsewhere")
  checked_command(command, "--record")  # a record the check would refuse to run is not written
  if workdir is None:
    workdir = tempfile.mkdtemp(prefix="evqa_record_")
    _run(command, workdir, "--record")
  rec = {"command": list(command), **code_version(), "cpu": cpu_model(), "machine": machine(), "printed": printed}
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
  rec = _read_record(folder)
  bad = []
  for rel, keys in rec["printed"].items():
    committed = io_lib.load_json(os.path.join(folder, rel), what="committed result")
    rerun_path = os.path.join(workdir, rel)
    if not os.path.exists(rerun_path):
      bad.append(f"{rel}: not written by the rerun ({rerun_path})")
      continue
    rerun = io_lib.load_json(rerun_path, what="run's result")
    for key, decimals in keys.items():
      a = f"{_lookup(committed, key, os.path.join(folder, rel)):.{decimals}f}"
      b = f"{_lookup(rerun, key, rerun_path):.{decimals}f}"
      if a != b:
        bad.append(f"{rel} {key}: committed {a}, rerun {b}")
  return bad


# ------------------------------------------------- what holds on every CPU: the ranges and orderings the docs state

def expectations(folder: str, workdir: str) -> list:
  """-> one line per statement of the record's "expect" that the run in `workdir` breaks ([] without "expect").

  "expect": {"ranges": [{"file", "key", "min", "max", "decimals"}],   the value at `decimals` lies in [min, max]
             "below": [{"file", "key", "above_file", "by"}]}          file's key is at least `by` below above_file's
  These are what the docs state for every CPU (README's table of ranges, "CVQA far below the open heads")."""
  expect = _read_record(folder).get("expect") or {}
  bad, cache = [], {}

  def value(rel, key):
    path = os.path.join(workdir, rel)
    if path not in cache:
      if not os.path.exists(path):
        raise FileNotFoundError(f"{rel}: not written by the run ({path})")
      cache[path] = io_lib.load_json(path, what="run's result")
    return _lookup(cache[path], key, path)

  for r in expect.get("ranges", []):
    try:
      v = value(r["file"], r["key"])
    except OSError as e:
      bad.append(str(e))
      continue
    shown = f"{v:.{r['decimals']}f}"
    if not r["min"] <= float(shown) <= r["max"]:
      bad.append(f"{r['file']} {r['key']}: {shown}, outside the range {r['min']}-{r['max']} the docs state")
  for r in expect.get("below", []):
    try:
      low, high = value(r["file"], r["key"]), value(r["above_file"], r["key"])
    except OSError as e:
      bad.append(str(e))
      continue
    if not high - low >= r["by"]:
      bad.append(f"{r['file']} {r['key']} {low:.2f} is not {r['by']} or more below {r['above_file']}'s {high:.2f}")
  return bad


def table_records(folder: str) -> list:
  """The record in `folder` first, then every other record beside it (docs/results/*/) of the same command: the
  same table made on other machines."""
  folder = os.path.normpath(folder)
  command = _read_record(folder)["command"]
  out = [folder]
  parent = os.path.dirname(folder) or "."
  for name in sorted(os.listdir(parent)):
    other = os.path.join(parent, name)
    if other != folder and os.path.isfile(os.path.join(other, RECORD)):
      try:
        if _read_record(other)["command"] == command:
          out.append(other)
      except (ValueError, OSError):
        continue  # a broken record beside this one is not this table's
  return out


def check(folder: str, workdir: str | None = None, log=print) -> list:
  """Reruns the record's command into a temporary workdir (or uses `workdir`) and checks it; -> what differs.

  With a record of this CPU's class (vendor and vector extension, `cpu_class`) among the table's records
  (`table_records`), every printed number is compared with it. Without one, the run is held to what the record's
  "expect" states for every CPU (`expectations`); a table without "expect" is compared with `folder`'s record, and
  the differences are named as those of another CPU."""
  rec = _read_record(folder)
  command = checked_command(rec.get("command"), os.path.join(folder, RECORD))
  if workdir is None:
    with tempfile.TemporaryDirectory(prefix="evqa_check_") as tmp:
      _run(command, tmp, os.path.join(folder, RECORD))
      return check(folder, tmp, log)
  now, mine = code_version(), machine()
  records = table_records(folder)
  mine_class = cpu_class(mine)
  ours = [f for f in records if mine_class is not None and cpu_class(_read_record(f).get("machine")) == mine_class]
  log(f"this CPU: {describe(mine)}; records of this table: "
      + "; ".join(f"{f} ({describe(_read_record(f).get('machine'))})" for f in records), flush=True)
  if ours:
    theirs = _read_record(ours[0])
    if not same_code({k: theirs.get(k) for k in ("commit", "dirty")}, now):
      log(f"note: {ours[0]} was recorded with commit {theirs.get('commit')}, this checkout is "
          f"{now.get('commit')} (dirty: {now.get('dirty')}): the code differs", flush=True)
    log(f"comparing every printed number with {ours[0]}, recorded on your CPU's class", flush=True)
    bad = [f"MISMATCH {line}" for line in compare(ours[0], workdir)]
    if bad and rec.get("expect"):
      broken = expectations(folder, workdir)
      log(f"what the docs state for every CPU: {'holds' if not broken else f'{len(broken)} broken'}", flush=True)
      bad += [f"BROKEN {line}" for line in broken]
    return bad
  if rec.get("expect"):
    log("no record of this table was made on your CPU's class (its last digits differ between CPU generations): "
        "checking the ranges and orderings the docs state for every CPU", flush=True)
    return [f"BROKEN {line}" for line in expectations(folder, workdir)]
  log(f"no record of this table was made on your CPU's class, and the docs state no ranges for it: comparing with "
      f"{folder}, made on {describe(rec.get('machine'))}; a difference may come from the CPU alone", flush=True)
  return [f"MISMATCH {line}" for line in compare(folder, workdir)]


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
    print(line)
  print(f"{args.folder}: " + ("OK" if not bad else f"{len(bad)} difference(s)"))
  return 1 if bad else 0


if __name__ == "__main__":
  from evqa_jax import cli  # noqa: E402
  sys.exit(cli.run(main))
