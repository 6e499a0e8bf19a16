"""Defaults shared by every experiment: mesh, logical axis rules, optimiser, durations, logging, checkpoints.

Durations use one vocabulary (evqa_jax.train.durations): set exactly one of `<name>_steps`, `<name>_epochs`,
`<name>_examples` for `total`, `eval_every`, `checkpoint_every`.
"""

import glob
import importlib
import os

import ml_collections
from ml_collections import config_dict

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


def parse_variants(arg) -> set:
  """`--config=file.py:demo,cvqa` -> {"demo", "cvqa"}."""
  return {v.strip() for v in (arg or "").split(",") if v.strip()}


def config_files() -> list:
  """The experiment config files' names (configs/*.py without the shared modules), sorted."""
  return sorted(os.path.basename(p) for p in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
                if os.path.basename(p) not in ("__init__.py", "common.py") and not p.endswith("_common.py"))


def variants_help() -> str:
  """One line per config file with its VARIANTS, for launch/*.py --help:
  `configs/ovqa_msrvtt.py: authors_eps, baseline, ...` (combine them: `--config=configs/ovqa_msrvtt.py:demo,small`)."""
  lines = []
  for name in config_files():
    try:
      module = importlib.import_module(f"configs.{name[:-3]}")
      variants = ", ".join(sorted(module.VARIANTS))
    except Exception as e:  # noqa: BLE001 - one broken file must not stop every launch: it is named, not raised
      variants = f"(cannot list its variants: {type(e).__name__}: {' '.join(str(e).split())})"
    lines.append(f"configs/{name}: {variants}")
  return "\n".join(lines)


def check_variants(variants: set, known: set, config_file: str) -> None:
  unknown = variants - known
  if unknown:
    raise ValueError(f"{config_file}: unknown variant(s) {sorted(unknown)}; known: {sorted(known)}")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = ""
  c.seed = 42
  # UNSAFE when True: input files holding pickled Python objects (e.g. a FrozenBiLM checkpoint that pickles more than
  # tensors and an argparse Namespace) are unpickled, which runs code from the file. Only for files you trust.
  c.trust_pickles = False
  c.batch_size = 32
  c.eval_batch_size = 64

  # Placeholders (None until set) so that `--config.total_steps=500 --config.total_epochs=None` works from the command
  # line: config_flags cannot override a plain None field, and parses `object` fields as Python literals (None, 500,
  # 0.5). evqa_jax.train.durations checks the values. Epochs may be fractional.
  for prefix in ("total", "eval_every", "checkpoint_every"):
    for unit in ("steps", "epochs", "examples"):
      c[f"{prefix}_{unit}"] = config_dict.placeholder(object)
  c.log_every_steps = 10

  # replica_parallel: split each replicated array's save between its replicas (Orbax); None: only with several
  # processes (evqa_jax.runs.checkpointing.replica_parallel). allow_unverified (UNSAFE): resume from / evaluate a
  # checkpoint that has no checksums (older versions, a deleted meta/), whose damage would go unnoticed.
  c.checkpoint = ml_collections.ConfigDict(dict(max_to_keep=2, replica_parallel=config_dict.placeholder(bool),
                                                allow_unverified=False))
  # Model selection (evqa_jax.train.evaluation.selection): the step whose `metric` on `split` is best (mode max or
  # min) is reported beside the last step in final_metrics.json ("best"), and its checkpoint is kept besides the
  # newest max_to_keep when that step was a checkpoint step. Empty: the first of data.eval_splits, the task's main
  # metric.
  c.select = ml_collections.ConfigDict(dict(split="", metric="", mode="max"))

  # Storage dtype of the frozen parameters (float32 | bfloat16): bf16 halves the HBM of a frozen LM; trainable
  # parameters and optimiser state stay float32, and the compute dtype is config.model.dtype.
  c.frozen_param_dtype = "float32"
  # True: the frozen parameters are also split over the 'data' mesh axis (FSDP-style storage, each 2-d or larger
  # array along its largest dimension the axis divides) instead of replicated on every data shard; XLA gathers each
  # weight where it is used. Same values; less HBM per device, more collectives (docs/accelerators.md).
  c.frozen_fsdp = False

  # Mesh and sharding: data parallel over 'data', tensor/graph parallel over 'model'.
  c.mesh_shape = (-1, 1)
  c.mesh_axes = ("data", "model")
  c.logical_axis_rules = (
      ("batch", "data"),
      ("length", None),
      ("frames", None),
      ("embed", None),
      ("mlp", "model"),
      ("heads", "model"),
      ("kv", None),
      ("vocab", "model"),
      ("classes", "model"),
      ("nodes", "model"),
  )

  c.optim = ml_collections.ConfigDict(dict(
      name="adam", lr=5e-5, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0,
      warmup_fraction=0.1, decay="linear", grad_clip=0.1,
      # Regexes on trainable parameter paths that train at the constant peak lr while the rest follows the schedule
      # (evqa_jax.train.partition.make_optimizer); () = all on the schedule.
      constant_lr_params=(),
      # True: the schedule runs one step late, step 0 at the peak lr (a loop that sets the lr after each step).
      lr_after_step=False))
  return c
