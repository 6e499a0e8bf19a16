"""A workdir's experiment identity: the config (all of it but NOT_IDENTITY) a checkpoint must match to be resumed.

`check_workdir` runs first in every job: it refuses a workdir that holds another experiment's checkpoint, then (process
0) writes <workdir>/config.json with the identity, the full config and the code version. `sync` is the barrier every
process passes around such shared files in a multi-process job.
"""

import json
import os

import jax
from jax.experimental import multihost_utils

from evqa_jax import io as io_lib

# The experiment identity is the whole config except these entries, which do not change what a run computes: how
# often it logs and checkpoints, how checkpoints are written and kept, how many input workers and which mesh it runs
# on (checkpoints are read back onto any mesh), and what evaluation reports (extra splits, batch size, model selection,
# how often it evaluates). Everything else -- model, data, optimiser, schedule length, verbalizer, seed -- is identity.
NOT_IDENTITY = ("log_every_steps", "checkpoint", "checkpoint_every_steps", "checkpoint_every_epochs",
                "checkpoint_every_examples", "eval_every_steps", "eval_every_epochs", "eval_every_examples",
                "eval_batch_size", "data.eval_splits", "data.worker_count", "select", "mesh_shape", "mesh_axes",
                "logical_axis_rules", "trust_pickles")


def config_identity(config) -> dict:
  """The config as JSON (tuples read back as lists, as from a checkpoint) without the NOT_IDENTITY entries."""
  out = json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort") else json.loads(
      json.dumps(dict(config)))
  for key in NOT_IDENTITY:
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
      node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(leaf, None)
  return out


def identity_diffs(mine: dict, theirs: dict) -> list:
  """Human-readable differences between two experiment identities, one entry per differing (nested) field."""
  out = []

  def walk(a, b, prefix):
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        walk(a.get(k, "<unset>"), b.get(k, "<unset>"), f"{prefix}.{k}" if prefix else k)
    elif a != b:
      out.append(f"{prefix} (checkpoint: {json.dumps(b)}, config: {json.dumps(a)})")

  walk(mine, theirs, "")
  return out


def sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def recorded_identity(workdir: str) -> dict | None:
  """The experiment identity <workdir>/config.json records, or None when there is no config.json."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  try:
    return io_lib.load_json(path, "workdir config").get("identity", {})
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{path} is unreadable ({e}): is {workdir} an evqa_jax workdir?") from e


def check_same_experiment(config, workdir: str) -> None:
  """Refuses to score a workdir's checkpoints with a config other than the one that trained them."""
  theirs = recorded_identity(workdir)
  if theirs is None:
    raise FileNotFoundError(f"{workdir}/config.json is missing: is {workdir} a workdir written by launch/train.py?")
  diffs = identity_diffs(config_identity(config), theirs)
  if diffs:
    raise ValueError(f"workdir {workdir} was trained with another config; it differs in {'; '.join(diffs)}. "
                     "Pass the config (and --config. overrides) it was trained with")


def check_workdir(config, workdir: str) -> None:
  """Refuses to resume a workdir that holds another experiment's checkpoint."""
  path = os.path.join(workdir, "config.json")
  mine = config_identity(config)
  theirs = recorded_identity(workdir)
  if theirs is not None:
    diffs = identity_diffs(mine, theirs)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    held = ("a checkpoint" if os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir)) else
            "the final metrics" if os.path.exists(os.path.join(workdir, "final_metrics.json")) else None)
    if diffs and held:
      raise ValueError(
          f"workdir {workdir} holds {held} of another experiment; it differs in "
          f"{'; '.join(diffs)}. Use a new --workdir or delete that one")
  sync("evqa_jax:workdir_checked")  # everyone read the old file before process 0 replaces it
  if jax.process_index() == 0:
    io_lib.write_json(path, {"identity": mine, "config": json.loads(config.to_json_best_effort()),
                             "code": io_lib.code_version()})
