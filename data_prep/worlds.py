"""The built-in synthetic worlds, built from a config before its task is: `config.data.synthetic` names the preset,
`config.data.dir` (WORLD/records) where it goes.

  python -m data_prep.worlds --config=configs/ovqa_msrvtt.py:demo      # build the world of a config, nothing else

launch/train.py, launch/aot_check.py, the benchmarks and the tests call `ensure_synthetic_world(config)` before
`train_and_evaluate`; the library (evqa_jax) never generates data, it raises when config.data.dir holds no records.
"""

import argparse
import importlib
import os
import sys

from evqa_jax import io as evqa_io
from evqa_jax import projects


def _world_root(config) -> str:
  data_dir = os.path.expanduser(config.data.dir)
  if os.path.basename(os.path.normpath(data_dir)) != "records":
    raise ValueError(f"config.data.dir = {config.data.dir!r}: the synthetic world writes WORLD/raw and WORLD/records, "
                     "so the directory must be named 'records'")
  return os.path.dirname(os.path.abspath(os.path.normpath(data_dir)))


def ensure_synthetic_world(config) -> None:
  """Builds the synthetic world of `config.data.synthetic` with the builder that `config.task`'s entry in
  evqa_jax.projects.TASKS names (its `ensure_world(world_dir, preset)`, which leaves a world already there alone and
  refuses an unknown preset); a no-op when config.data.synthetic is empty. Safe to call from several processes at
  once."""
  preset = config.data.synthetic
  if not preset:
    return
  if evqa_io.is_uri(config.data.dir):  # the builders write a local disk
    if (evqa_io.epath_of(config.data.dir) / "metadata.json").exists():
      return  # a world already in the bucket is used as it is
    raise FileNotFoundError(
        f"config.data.dir = {config.data.dir!r} holds no records, and synthetic worlds are built on a local disk: "
        "build it locally (the same command with a local --config.data.dir), copy the folder to the bucket "
        "(gcloud storage cp -r), or pass --config.data.synthetic=''")
  world = importlib.import_module(projects.project(config.task).world)
  world.ensure_world(_world_root(config), preset)


def generator_main(generate, description: str, argv=None) -> int:
  """The command line of a world generator `generate(out, seed, small, num_shards)` (`python -m
  data_prep.synthetic_evqa` / `synthetic_violin`): --out, --seed, --small, --num-shards."""
  from evqa_jax import settings  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--out", required=True)
  p.add_argument("--seed", type=settings.arg(settings.INTEGER, "--seed"), default=0)
  p.add_argument("--small", action="store_true", help="tiny preset for tests")
  p.add_argument("--num-shards", type=settings.arg(settings.POSITIVE_INT, "--num-shards"), default=1,
                 help="shards of the train split")
  a = p.parse_args(argv)
  generate(a.out, a.seed, a.small, a.num_shards)
  return 0


def main(argv) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  ensure_synthetic_world(flags.FLAGS.config)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from evqa_jax import cli  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<name>.py[:variant]).")
  sys.exit(cli.run_absl(main))
