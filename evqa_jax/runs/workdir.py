"""A workdir's experiment identity: the config (all of it but NOT_IDENTITY) a checkpoint must match to be resumed.

`check_workdir` runs first in every job: it refuses a workdir that holds another experiment's checkpoint, then (process
0) writes <workdir>/config.json with the identity, the full config and the code version. `sync` is the barrier every
process passes around such shared files in a multi-process job.
"""

import hashlib
import json
import os

import jax
from jax.experimental import multihost_utils

import evqa_jax
from evqa_jax import io as io_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a training run executes (README, tests and benchmarks are not part of a result).
CODE_PATHS = ("evqa_jax", "configs", "data_prep", "launch")

# The experiment identity is the whole config except these entries, which do not change what a run computes: how
# often it logs and checkpoints, how checkpoints are written and kept, how many input workers and which mesh it runs
# on (checkpoints are read back onto any mesh), what evaluation reports (extra splits, batch size, model selection,
# how often it evaluates), and whether JustAsk+'s frozen answer encoder is run once per split or in every step (the
# same numbers). Everything else -- model, data, optimiser, schedule length, verbalizer, seed -- is identity.
NOT_IDENTITY = ("log_every_steps", "checkpoint", "checkpoint_every_steps", "checkpoint_every_epochs",
                "checkpoint_every_examples", "eval_every_steps", "eval_every_epochs", "eval_every_examples",
                "eval_batch_size", "data.eval_splits", "data.worker_count", "select", "mesh_shape", "mesh_axes",
                "logical_axis_rules", "trust_pickles", "model.cache_answer_encoder")


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
  if not io_lib.epath_of(path).exists():
    return None
  try:
    return io_lib.load_json(path, "workdir config").get("identity", {})
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{path} is unreadable ({e}): is {workdir} an evqa_jax workdir?") from e


def code_version() -> dict:
  """{"evqa_jax": the package version, "sources_sha256": a digest of the Python sources under CODE_PATHS}.

  Written into every workdir's config.json: `launch/sweep.py --reuse` copies a finished run only when the same code
  trained it (the same config trained by other code is another experiment). The digest is of the files themselves,
  so it needs no git checkout and tells an edited tree from its commit; folders an installed package lacks
  (configs/, data_prep/, launch/) are skipped.
  """
  paths = []
  for top in CODE_PATHS:
    for folder, dirs, files in os.walk(os.path.join(REPO, top)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      paths += [os.path.relpath(os.path.join(folder, f), REPO) for f in files if f.endswith(".py")]
  digest = hashlib.sha256()
  for rel in sorted(paths):
    with open(os.path.join(REPO, rel), "rb") as f:
      digest.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
  return {"evqa_jax": evqa_jax.__version__, "sources_sha256": digest.hexdigest()}


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
  """Refuses to resume a workdir that holds another experiment's checkpoint (reads only: `record_config` writes)."""
  mine = config_identity(config)
  theirs = recorded_identity(workdir)
  if theirs is not None:
    diffs = identity_diffs(mine, theirs)
    ckpt_dir = io_lib.epath_of(os.path.join(workdir, "checkpoints"))
    held = ("a checkpoint" if ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()) else
            "the final metrics" if io_lib.epath_of(os.path.join(workdir, "final_metrics.json")).exists() else None)
    if diffs and held:
      raise ValueError(
          f"workdir {workdir} holds {held} of another experiment; it differs in "
          f"{'; '.join(diffs)}. Use a new --workdir or delete that one")


def record_config(config, workdir: str) -> None:
  """Writes workdir/config.json (identity, config, code version): after the task is built, so that a config the task
  or its model refuses leaves no file behind."""
  path = os.path.join(workdir, "config.json")
  mine = config_identity(config)
  sync("evqa_jax:workdir_checked")  # everyone read the old file before process 0 replaces it
  if jax.process_index() == 0:
    io_lib.write_json(path, {"identity": mine, "config": json.loads(config.to_json_best_effort()),
                             "code": code_version()})
