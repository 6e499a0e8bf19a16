"""Grid sweeps (the eps sweep of Table 8, Table 5's verbalizer variants, ...), local or as cluster commands.

A config module that supports sweeps defines `get_sweep(name, arg)` -> dict with
  points:  [{"name": str, "overrides": {"dotted.key": value}, "x": float or None}, ...]
  columns: [(metric key, column title), ...]  e.g. [("base", "B"), ("common", "C"), ...]
  split:   the eval split whose metrics fill the table
  x_label: label of the x axis for the plot (points with a numeric x are plotted), or None
A point may also name `from_points`: {"dotted.key": "other point"}, that key set to the other point's run directory
(the same seed's, with --seeds), e.g. a second training stage whose `pretrained.init_from` is the first stage's run.
The other point must come earlier in `points`, and must have finished (in this sweep's workdir) before it runs.
Each point is one ordinary `launch/train.py` run in `<workdir>/<name>`; a point whose `final_metrics.json` exists is
not rerun (resumable), and an interrupted point resumes from its own checkpoints.

`reuse_dirs`: other sweeps' workdirs whose finished points may stand in for this sweep's points. A point is reused only
when a finished run there has exactly the configuration this point would train (its `config.json`, compared field by
field), e.g. Table 5's variant E is Table 8's eps = 0.7 and the heads sweep's "+ GNN" point. Its results (metrics,
history, evaluation outputs, TensorBoard log; not the checkpoints) are copied, with `reused_from.json` naming the source.
A source run is reused only if its config.json records (under "code") the digest of the current sources
(`workdir.code_version`): the same config trained by other code is another experiment.
"""

import csv
import json
import math
import os
import shlex
import subprocess
import sys
import time

from evqa_jax import io as io_lib
from launch import overrides
from evqa_jax.runs import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config_module(config_path: str):
  module = overrides.load_config_module(config_path, "_sweep_config")
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{config_path.split(':')[0]} defines no get_sweep(name, arg): it supports no sweeps")
  return module


def _format_value(v) -> str:
  if isinstance(v, str):
    return v
  if isinstance(v, bool):
    return "true" if v else "false"
  return repr(v)


def portable_config_path(config_path: str) -> str:
  """`config_path` relative to the repository root when it lies inside it (its `:variant` kept), else as given."""
  path, sep, variant = config_path.partition(":")
  full = os.path.abspath(path)
  if full.startswith(REPO + os.sep):
    path = os.path.relpath(full, REPO)
  return path + sep + variant


def point_command(config_path: str, workdir: str, point: dict, extra_args=(), portable: bool = False) -> list:
  """The point's `launch/train.py` command. portable=True (--mode=print): `python launch/train.py` and a config path
  relative to the repository root, to run from the root of any checkout on any host (a cluster's workers, a pod);
  else this interpreter and absolute paths, run here."""
  if portable:
    cmd = ["python", "launch/train.py", f"--config={portable_config_path(config_path)}"]
  else:
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={config_path}"]
  cmd.append(f"--workdir={workdir}")
  cmd += [f"--config.{k}={_format_value(v)}" for k, v in point["overrides"].items()]
  return cmd + _without_keys(list(extra_args), set(point.get("from_points") or ()))


def _without_keys(args: list, keys: set) -> list:
  """`args` less its `--config.<key>[=value]` (or `--config.<key> value`) for `keys`: a point's from_points keys are
  set by the sweep (e.g. the first stage's `--config.pretrained.init_from=CKPT` given to every point is not the second
  stage's, which starts from the first stage's run)."""
  out, i = [], 0
  while i < len(args):
    arg = args[i]
    key = arg[len("--config."):].split("=", 1)[0] if arg.startswith("--config.") else None
    if key in keys:
      if "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--"):
        i += 1
    else:
      out.append(arg)
    i += 1
  return out


def point_config(module, arg, point: dict) -> dict:
  """The configuration `launch/train.py` would train for `point`, as the JSON its `config.json` records."""
  return json.loads(point_config_dict(module, arg, point).to_json_best_effort())


def point_config_dict(module, arg, point: dict):
  """The ConfigDict `launch/train.py` would train for `point`."""
  config = module.get_config(arg)
  for key, value in point["overrides"].items():
    parent = config
    *path, leaf = key.split(".")
    for part in path:
      parent = parent[part]
    if leaf not in parent:
      raise KeyError(f"sweep point {point['name']}: override {key} names no config field")
    parent[leaf] = value
  return config


def find_reusable(expected: dict, reuse_dirs) -> str:
  """A finished run directory under one of `reuse_dirs` that trained exactly `expected` with this code, or ''."""
  current = workdir_lib.code_version()
  for root in reuse_dirs:  # local or gs://...
    if not io_lib.epath_of(root).is_dir():
      raise FileNotFoundError(f"--reuse directory {root} does not exist")
    for name in sorted(p.name for p in io_lib.epath_of(root).iterdir()):
      run = os.path.join(root, name)
      cfg_path = os.path.join(run, "config.json")
      if not (io_lib.epath_of(cfg_path).exists() and _finished(run)):
        continue
      try:
        record = io_lib.load_json(cfg_path, "workdir config")
      except (OSError, ValueError):
        continue
      if record.get("config") == expected:
        code = record.get("code") or {}
        if code.get("sources_sha256") != current["sources_sha256"]:
          print(f"[sweep] {run} has the same config but was trained by other or unrecorded code "
                f"(sources {code.get('sources_sha256') or 'not recorded'}, now {current['sources_sha256']}): "
                "not reused", flush=True)
          continue
        return run
  return ""


_REUSED = ("config.json", "final_metrics.json", "train_history.jsonl", "eval", "tensorboard")


def reuse_point(source: str, point_dir: str) -> None:
  """Copies a finished run's results into `point_dir` (final_metrics.json last: the point counts as done only once
  everything else is there)."""
  io_lib.makedirs(point_dir)
  for name in _REUSED:  # local or gs://..., either side
    src, dst = os.path.join(source, name), os.path.join(point_dir, name)
    if name == "final_metrics.json" or not io_lib.epath_of(src).exists():
      continue
    io_lib.copy(src, dst)
  io_lib.write_json(os.path.join(point_dir, "reused_from.json"), {"source": io_lib.absolute(source)})
  io_lib.copy(os.path.join(source, "final_metrics.json"), os.path.join(point_dir, "final_metrics.json"))


def _run_point(cmd: list, env: dict | None = None) -> subprocess.CompletedProcess:
  """Runs one point's training command (the tests replace this)."""
  return subprocess.run(cmd, cwd=REPO, env=env)


def point_env(workdir: str) -> dict | None:
  """The environment of the points run here: JAX's persistent compilation cache in `<workdir>/.xla_cache`, so points
  that differ only in values the step takes as inputs (the seed) reuse the first one's compiled step instead of
  compiling it again (the same executable, so the same numbers). None (the inherited environment) when the user set
  JAX_COMPILATION_CACHE_DIR or the workdir is remote."""
  if "JAX_COMPILATION_CACHE_DIR" in os.environ or io_lib.is_uri(workdir):
    return None
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.abspath(workdir), ".xla_cache"))


def check_from_points(points) -> None:
  """Every `from_points` entry names a point defined earlier in the sweep (it runs first)."""
  seen = set()
  for p in points:
    for key, other in (p.get("from_points") or {}).items():
      if other not in seen:
        where = "a later point" if any(q["name"] == other for q in points) else "no point of this sweep"
        raise ValueError(f"sweep point {p['name']}: from_points {key} = {other!r} names {where}; it must name a "
                         "point defined before it")
    seen.add(p["name"])


def select_points(sweep: dict, only=(), seeds=()) -> dict:
  """The sweep restricted to the points named in `only` (all if empty), each repeated once per seed in `seeds` as
  `<name>_seed<s>` with `seed` overridden (as is if empty). Every point keeps its `group` (the original name), which
  the table averages over; `from_points` then name the same seed's runs."""
  points = sweep["points"]
  check_from_points(points)
  if only:
    names = [p["name"] for p in points]
    unknown = [n for n in only if n not in names]
    if unknown:
      raise ValueError(f"--only names unknown sweep points {unknown}; this sweep has {names}")
    points = [p for p in points if p["name"] in only]
  out = []
  for p in points:
    if seeds:
      out += [dict(p, name=f"{p['name']}_seed{s}", overrides={**p["overrides"], "seed": int(s)}, group=p["name"],
                   from_points={k: f"{v}_seed{s}" for k, v in (p.get("from_points") or {}).items()})
              for s in seeds]
    else:
      out.append(dict(p, group=p["name"]))
  return dict(sweep, points=out)


def resolve_from_points(point: dict, workdir: str, check: bool = True) -> dict:
  """`point` with its `from_points` keys set, in its overrides, to those points' run directories under `workdir`.
  check=True: each of those runs must have finished (else ValueError naming it)."""
  needs = point.get("from_points") or {}
  if not needs:
    return point
  overrides = dict(point["overrides"])
  for key, other in needs.items():
    other_dir = os.path.join(workdir, other)
    if check and not _finished(other_dir):
      raise ValueError(f"sweep point {point['name']} starts from point {other}'s run ({key}), which has not finished "
                       f"in {other_dir}: run that point first (it is not among --only's points, or it failed)")
    overrides[key] = other_dir
  return dict(point, overrides=overrides)


def run_sweep(config_path: str, sweep_name: str, workdir: str, mode: str = "local", extra_args=(),
              reuse_dirs=(), only=(), seeds=()) -> dict:
  """Runs (or prints) every point, then writes `<workdir>/<sweep>.csv`, `.md` and `.png`. Returns the table.

  `only`: point names to run (default all); `seeds`: run every point once per seed; the table then gives the mean and
  the standard deviation over seeds.
  """
  module = load_config_module(config_path)
  arg = config_path.split(":", 1)[1] if ":" in config_path else None
  sweep = select_points(module.get_sweep(sweep_name, arg), only, seeds)
  if reuse_dirs and extra_args:
    raise ValueError(f"--reuse cannot be combined with extra train.py arguments {list(extra_args)}: the reused "
                     f"runs' configs are compared with the sweep points' configs, which those arguments would change")
  if mode == "print":  # in order: a point's from_points come before it
    for point in sweep["points"]:
      point = resolve_from_points(point, workdir, check=False)
      cmd = point_command(config_path, os.path.join(workdir, point["name"]), point, extra_args, portable=True)
      print(" ".join(shlex.quote(c) for c in cmd))
    return {}
  io_lib.makedirs(workdir)
  points = sweep["points"]
  progress = SweepProgress(len(points))
  for k, point in enumerate(points, 1):
    point_dir = os.path.join(workdir, point["name"])
    # A finished point keeps its table row even if the run it started from was deleted since.
    point = resolve_from_points(point, io_lib.absolute(workdir), check=not _finished(point_dir))
    cmd = point_command(config_path, point_dir, point, extra_args)
    progress.start(k, point["name"])
    if _finished(point_dir):
      if not extra_args:  # a finished point is reused only for the experiment it trained (the sweep may have changed)
        from evqa_jax.runs import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
        workdir_lib.check_same_experiment(point_config_dict(module, arg, point), point_dir)
      print(f"[sweep] point {k} of {len(points)}: {point['name']}: done already, skipped", flush=True)
      continue
    if reuse_dirs:
      source = find_reusable(point_config(module, arg, point), reuse_dirs)
      if source:
        reuse_point(source, point_dir)
        print(f"[sweep] {point['name']}: same config as the finished run {source}, its results reused", flush=True)
        continue
    print(f"[sweep] point {k} of {len(points)}: {point['name']}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    result = _run_point(cmd, env=point_env(workdir))
    if result.returncode != 0:
      raise RuntimeError(f"sweep point {point['name']} failed with exit code {result.returncode} "
                         f"(workdir {point_dir})")
    progress.done(k, point["name"], remaining=sum(not _finished(os.path.join(workdir, p["name"]))
                                                 for p in points[k:]))
  return write_table(sweep, sweep_name, workdir)


def _finished(point_dir: str) -> bool:
  return io_lib.epath_of(os.path.join(point_dir, "final_metrics.json")).exists()


class SweepProgress:
  """`[sweep] point k of n` lines, and after each trained point the sweep's ETA: the mean time of the points trained
  so far in this call times the points still to train (skipped and reused points take no time)."""

  def __init__(self, total: int, clock=time.monotonic):
    self.total, self.clock = total, clock
    self.trained, self.t0, self.seconds = 0, None, 0.0

  def start(self, k: int, name: str) -> None:
    del k, name
    self.t0 = self.clock()

  def done(self, k: int, name: str, remaining: int) -> str:
    took = self.clock() - self.t0
    self.trained += 1
    self.seconds += took
    eta = self.seconds / self.trained * remaining
    line = (f"[sweep] point {k} of {self.total} ({name}) done in {took / 60:.1f} min; {remaining} point(s) to go, "
            f"ETA {eta / 60:.1f} min")
    print(line, flush=True)
    return line


def per_seed_lines(sweep: dict, rows: list) -> list:
  """Markdown lines under a multi-seed table: the sweep's `per_seed` column (e.g. "M") at every seed, one row per
  point, and, when the sweep names an `order` of points (lowest first), at how many seeds that order holds strictly:
  a mean can hide a seed where it does not."""
  title = sweep.get("per_seed")
  if not title:
    return []
  seeds = sorted({s for r in rows for s in r["per_seed"]}, key=lambda s: (s is None, s))
  out = ["", f"{title} per seed", "", "| point | " + " | ".join(f"seed {s}" for s in seeds) + " |",
         "|---|" + "---|" * len(seeds)]
  out += ["| " + r["name"] + " | " + " | ".join(f"{r['per_seed'][s][title]:.2f}" if s in r["per_seed"] else "-"
                                                for s in seeds) + " |" for r in rows]
  order = [name for name in sweep.get("order", ()) if any(r["name"] == name for r in rows)]
  if len(order) > 1:
    by_name = {r["name"]: r for r in rows}
    common = [s for s in seeds if all(s in by_name[n]["per_seed"] for n in order)]
    holds = [s for s in common if all(by_name[a]["per_seed"][s][title] < by_name[b]["per_seed"][s][title]
                                      for a, b in zip(order, order[1:]))]
    out += ["", f"{title}: {' < '.join(order)} at {len(holds)} of {len(common)} seeds"
            + (f" (not at {', '.join(str(s) for s in common if s not in holds)})" if len(holds) < len(common) else "")]
  return out


def write_table(sweep: dict, sweep_name: str, workdir: str) -> dict:
  """Reads every point's final metrics; writes `<sweep>.csv`, `.md` and (numeric x) `.png`.

  Points sharing a `group` (one per seed) become one row: the mean, with the sample standard deviation over them
  (ddof 1: with 3 seeds the population std would understate the spread by sqrt(3/2); NaN for a single run) in the
  CSV's `<column>_std` columns, as `mean ± std` in the Markdown and as error bars in the plot.
  """
  split = sweep["split"]
  titles = [t for _, t in sweep["columns"]]
  groups = {}
  for point in sweep["points"]:
    path = os.path.join(workdir, point["name"], "final_metrics.json")
    if not io_lib.epath_of(path).exists():
      raise FileNotFoundError(f"{path} is missing: sweep point {point['name']} has not finished")
    metrics = io_lib.load_json(path, "final metrics", finite=False)["eval"][split]
    group = groups.setdefault(point.get("group", point["name"]), {"x": point.get("x"), "values": [], "seeds": []})
    group["values"].append({title: float(metrics[key]) for key, title in sweep["columns"]})
    group["seeds"].append(point["overrides"].get("seed"))
  rows = []
  for name, g in groups.items():
    row = {"name": name, "x": g["x"], "n": len(g["values"]),
           "per_seed": {seed: v for seed, v in zip(g["seeds"], g["values"])}}
    for t in titles:
      vals = [v[t] for v in g["values"]]
      mean = sum(vals) / len(vals)
      row[t] = mean
      row[f"{t}_std"] = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else math.nan
    rows.append(row)
  multi = any(r["n"] > 1 for r in rows)

  csv_path = os.path.join(workdir, f"{sweep_name}.csv")
  with io_lib.atomic_path(csv_path) as tmp:
    with open(tmp, "w", newline="") as f:
      w = csv.writer(f)
      if multi:
        w.writerow(["point", "seeds"] + [c for t in titles for c in (t, f"{t}_std")])
        for r in rows:
          w.writerow([r["name"], r["n"]] + [f"{r[c]:.2f}" for t in titles for c in (t, f"{t}_std")])
      else:
        w.writerow(["point"] + titles)
        for r in rows:
          w.writerow([r["name"]] + [f"{r[t]:.2f}" for t in titles])
  if multi:
    md = [f"{split} split, mean ± sample std (ddof 1) over seeds", "",
          "| point | seeds | " + " | ".join(titles) + " |", "|---|---|" + "---|" * len(titles)]
    md += ["| " + r["name"] + f" | {r['n']} | " + " | ".join(f"{r[t]:.2f} ± {r[t + '_std']:.2f}" for t in titles)
           + " |" for r in rows]
    md += per_seed_lines(sweep, rows)
  else:
    md = ["| point | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    md += ["| " + r["name"] + " | " + " | ".join(f"{r[t]:.2f}" for t in titles) + " |" for r in rows]
  io_lib.write_text(os.path.join(workdir, f"{sweep_name}.md"), "\n".join(md) + "\n")
  print("\n".join(md), flush=True)
  numeric = [r for r in rows if r["x"] is not None]
  if sweep.get("x_label") and len(numeric) > 1:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    numeric.sort(key=lambda r: r["x"])
    xs = [r["x"] for r in numeric]
    for t in titles:
      if multi:
        ax.errorbar(xs, [r[t] for r in numeric], yerr=[r[f"{t}_std"] for r in numeric], marker="o", capsize=3,
                    label=t)
      else:
        ax.plot(xs, [r[t] for r in numeric], marker="o", label=t)
    ax.set_xlabel(sweep["x_label"])
    ax.set_ylabel("accuracy (%)")
    seeds = f", mean ± sample std over {max(r['n'] for r in rows)} seeds" if multi else ""
    ax.set_title(f"{sweep_name} sweep ({split}{seeds})")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    png = os.path.join(workdir, f"{sweep_name}.png")
    with io_lib.atomic_path(png) as tmp:
      fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
  return {"rows": rows, "csv": csv_path}
