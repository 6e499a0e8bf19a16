"""Behaviour fingerprint: train a fixed list of short, deterministic runs and compare their logs to another set.

  python launch/behaviour_check.py --out=runs/fingerprint_after            # train every run of RUNS into OUT
  python launch/behaviour_check.py --compare runs/fingerprint_before runs/fingerprint_after

A refactor that claims "behaviour unchanged" runs this before and after: every run's `final_metrics.json` and
`train_history.jsonl` must be equal to every digit (CPU runs are deterministic). Timing fields (wall clock, steps/s)
are dropped before comparing. Exit status 0 when equal, 1 when anything differs (each difference is printed).
`--compare` takes any two directories of runs (each run a subdirectory with final_metrics.json, e.g. two workdirs of
one sweep, or two configs' runs of the same points), or two single runs:

  python launch/behaviour_check.py --compare runs/ovqa_demo_heads /tmp/heads_rerun
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> launch/train.py arguments. The first OVQA demo point is the README main command's (the heads sweep's CVQA
# point), cut to a few steps.
RUNS = {
    "ovqa_small": ["--config=configs/ovqa_msrvtt.py:demo,small"],
    "ovqa_small_baseline": ["--config=configs/ovqa_msrvtt.py:demo,small,baseline"],
    "ovqa_small_cvqa": ["--config=configs/ovqa_msrvtt.py:demo,small,cvqa"],
    "violin_small": ["--config=configs/violin.py:small"],
    "evqa_small": ["--config=configs/evqa_gen.py:small"],
    "ovqa_demo_heads_cvqa_8steps": ["--config=configs/ovqa_msrvtt.py:demo", "--config.model.head=cvqa",
                                    "--config.verbalizer.variant=A", "--config.total_epochs=None",
                                    "--config.total_steps=8", "--config.checkpoint_every_epochs=None",
                                    "--config.checkpoint_every_steps=8", "--config.log_every_steps=2"],
}

# Keys whose values are wall-clock measurements, not results.
_TIMING_KEYS = {"steps_per_sec", "wall_s", "time", "elapsed_s", "eta_s", "examples_per_sec", "compile_s",
                "train_s", "eval_s", "timestamp"}


def _strip(obj):
  if isinstance(obj, dict):
    return {k: _strip(v) for k, v in obj.items() if k not in _TIMING_KEYS and not k.endswith("_sec")
            and not k.endswith("_time")}
  if isinstance(obj, list):
    return [_strip(v) for v in obj]
  return obj


def _path(path):
  """`path` (local or gs://...) as an etils.epath.Path."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  return io.epath_of(path)


def _load(run_dir):
  final = _strip(json.loads(_path(os.path.join(run_dir, "final_metrics.json")).read_text()))
  lines = _path(os.path.join(run_dir, "train_history.jsonl")).read_text().splitlines()
  history = [_strip(json.loads(line)) for line in lines if line.strip()]
  return {"final_metrics.json": final, "train_history.jsonl": history}  # keys name the file in a difference's path


def _diff(a, b, path=""):
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if k not in a or k not in b:
        yield f"{path}/{k}: only in {'after' if k in b else 'before'}"
      else:
        yield from _diff(a[k], b[k], f"{path}/{k}")
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    for i, (x, y) in enumerate(zip(a, b)):
      yield from _diff(x, y, f"{path}[{i}]")
  elif a != b:
    yield f"{path}: {a!r} != {b!r}"


def run_names(before: str, after: str) -> list:
  """The runs to compare: every subdirectory of either side holding a final_metrics.json (RUNS' order first, then
  the others sorted: a fingerprint, or any sweep's workdirs, e.g. two runs of the same points), or "." when both
  sides are single runs."""
  found = set()
  for side in (before, after):
    if _path(side).is_dir():
      found.update(p.name for p in _path(side).iterdir() if (p / "final_metrics.json").is_file())
  if not found and all(_path(os.path.join(d, "final_metrics.json")).is_file() for d in (before, after)):
    return ["."]
  return [n for n in RUNS if n in found] + sorted(found - set(RUNS))


def compare(before: str, after: str) -> int:
  names = run_names(before, after)
  if not names:
    print(f"no run (a directory with final_metrics.json) in {before} or {after}")
    return 1
  bad = 0
  for name in names:
    a, b = os.path.join(before, name), os.path.join(after, name)
    finished = [(_path(d) / "final_metrics.json").is_file() for d in (a, b)]
    if not all(finished):  # absent, or still training (its final_metrics.json is written last)
      print(f"{name}: missing in {'before' if not finished[0] else 'after'}")
      bad += 1
      continue
    diffs = list(_diff(_load(a), _load(b)))
    print(f"{name}: {'equal' if not diffs else f'{len(diffs)} differences'}")
    for d in diffs[:20]:
      print("   ", d)
    bad += bool(diffs)
  return 1 if bad else 0


def train_all(out: str, only) -> None:
  for name, args in RUNS.items():
    if only and name not in only:
      continue
    workdir = os.path.join(out, name)
    if os.path.exists(os.path.join(workdir, "final_metrics.json")):
      print(f"{name}: done already ({workdir})")
      continue
    cmd = [sys.executable, os.path.join(ROOT, "launch", "train.py"), *args, f"--workdir={workdir}"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", help="train every run into this directory")
  p.add_argument("--only", nargs="*", help="names of RUNS to train (default: all)")
  p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
  a = p.parse_args(argv)
  if a.compare:
    sys.exit(compare(*a.compare))
  if not a.out:
    p.error("give --out DIR or --compare BEFORE AFTER")
  train_all(os.path.abspath(a.out), a.only)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from evqa_jax import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.run(main))
