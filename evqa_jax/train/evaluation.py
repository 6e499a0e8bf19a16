"""Evaluation during training: prediction over a whole split, scored by the task's evaluator."""

import jax
import numpy as np

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
