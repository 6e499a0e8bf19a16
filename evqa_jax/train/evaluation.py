"""Evaluation: prediction over a whole split, scored by the task's evaluator, and model selection over the
evaluations a run wrote (config.select)."""

import os

import jax
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax.data import pipeline
from evqa_jax.train import sharding
from evqa_jax.train import steps as steps_lib


def evaluate_split(task, steps: steps_lib.StepFns, state, aux, split: str, config, batch_shard, out_dir: str) -> dict:
  """Runs prediction over the whole split and scores it with the task's evaluator (same code as the CLI)."""
  source = task.source(split)
  batches = pipeline.make_eval_batches(
      source, global_batch_size=config.eval_batch_size, transform=lambda ex: task.preprocess(ex, train=False))
  collected = []
  for local in batches:
    local = dict(local)
    local["_valid"] = np.asarray(local["_valid"]).astype(np.int32)
    out = steps.eval_step(state, sharding.global_batch(local, batch_shard), aux)
    collected.append(jax.tree.map(np.asarray, out))
  outputs = {k: np.concatenate([c[k] for c in collected]) for k in collected[0]}
  valid = outputs.pop("_valid").astype(bool)
  outputs = {k: v[valid] for k, v in outputs.items()}
  order = np.argsort(outputs["index"], kind="stable")
  outputs = {k: v[order] for k, v in outputs.items()}
  if len(np.unique(outputs["index"])) != len(outputs["index"]):
    raise RuntimeError(f"evaluation of split {split!r} saw an example twice")
  if jax.process_index() != 0:
    return {}
  return task.evaluate(split, outputs, out_dir)


def selection(config, task) -> dict | None:
  """Model selection: {"split", "metric", "mode"} from `config.select` (split: default the first evaluation split;
  metric: default the task's main metric; mode "max" or "min"), or None without evaluation splits. Checked at
  start-up."""
  if not config.data.eval_splits:
    return None  # nothing is evaluated during training: nothing to select from
  sc = config.select
  split = sc.split or config.data.eval_splits[0]
  metric = sc.metric or task.main_metric
  mode = sc.mode
  if split not in config.data.eval_splits:
    raise ValueError(f"config.select.split = {split!r} is not evaluated during training: config.data.eval_splits = "
                     f"{tuple(config.data.eval_splits)}")
  if mode not in ("max", "min"):
    raise ValueError(f"config.select.mode = {mode!r}: expected 'max' or 'min'")
  return {"split": split, "metric": metric, "mode": mode}


def _eval_dirs(workdir: str, split: str) -> dict:
  """step -> <workdir>/eval/<split>_step<step> for the evaluations a run wrote."""
  root = os.path.join(workdir, "eval")
  prefix = f"{split}_step"
  names = [p.name for p in io_lib.epath_of(root).iterdir()] if io_lib.epath_of(root).is_dir() else []
  return {int(n[len(prefix):]): os.path.join(root, n) for n in names
          if n.startswith(prefix) and n[len(prefix):].isdigit()}


def best_eval(workdir: str, select: dict, splits, up_to_step: int | None = None) -> dict | None:
  """The best evaluated step of a workdir by `select` (see `selection`), read from its eval/<split>_step<N>/
  metrics.json files -> {"step", "split", "metric", "value", "eval": {split: metrics at that step}}, or None before
  the first evaluation. Ties go to the earlier step (the authors keep a new best only when strictly better)."""
  best = None
  for step, path in sorted(_eval_dirs(workdir, select["split"]).items()):
    if up_to_step is not None and step > up_to_step:
      continue  # a killed run's evaluation beyond the restored step: redone, and not this run's yet
    metrics_path = os.path.join(path, "metrics.json")
    if not io_lib.epath_of(metrics_path).exists():
      continue
    metrics = io_lib.load_json(metrics_path, "evaluation metrics", finite=False)
    value = metrics.get(select["metric"])
    if not isinstance(value, (int, float)) or isinstance(value, bool):
      raise ValueError(f"config.select.metric = {select['metric']!r} is not a number in {metrics_path} (its numbers: "
                       f"{sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))})")
    better = best is None or (value > best["value"] if select["mode"] == "max" else value < best["value"])
    if better:
      best = {"step": step, **select, "value": value}
  if best is None:
    return None
  best["eval"] = {}
  for split in splits:
    path = os.path.join(workdir, "eval", f"{split}_step{best['step']}", "metrics.json")
    if io_lib.epath_of(path).exists():
      best["eval"][split] = io_lib.load_json(path, "evaluation metrics", finite=False)
  return best
