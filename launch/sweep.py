"""Sweeps: flags only. The grid comes from `get_sweep(name, arg)` in the config file.

  python launch/sweep.py --config=configs/ovqa_msrvtt.py:demo --sweep=eps --workdir=runs/eps_sweep
  python launch/sweep.py --config=configs/ovqa_msrvtt.py --sweep=eps --workdir=gs://... --mode=print  # cluster
  python launch/sweep.py --config=configs/ovqa_msrvtt.py:demo --sweep=variants --workdir=runs/variants \
      --reuse=runs/eps_sweep   # points with exactly the config of a finished run there are copied, not retrained
  python launch/sweep.py --config=configs/ovqa_msrvtt.py:demo --sweep=eps --workdir=runs/eps_seeds \
      --only=eps_1.0,eps_0.7 --seeds=42,43,44   # mean ± std over seeds for two points
  python launch/sweep.py --config=configs/ovqa_msrvtt.py:demo --sweep=eps --workdir=runs/eps_4ep \
      --config.total_epochs=4   # train.py's --config.* overrides (and anything after --) go to every point
Finished points are not rerun; the table (CSV + Markdown) and plot (PNG) land in --workdir.
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_string("config", None, "Config file with optional :variant, which defines get_sweep().")
flags.DEFINE_string("sweep", None, "Sweep name, e.g. eps, variants, heads.")
flags.DEFINE_string("workdir", None, "Directory holding one workdir per point and the tables.")
flags.DEFINE_list("reuse", [], "Other sweeps' workdirs: a finished point there with exactly the same config is "
                  "copied instead of retrained (e.g. variants E = eps 0.7).")
flags.DEFINE_list("only", [], "Run only these points of the sweep (names as in get_sweep), e.g. eps_1.0,eps_0.7.")
flags.DEFINE_list("seeds", [], "Run every point once per seed (config.seed); the table gives mean ± std over them.")
flags.DEFINE_enum("mode", "local", ["local", "print"], "local: run points one after another; print: print commands.")
flags.mark_flags_as_required(["config", "sweep", "workdir"])
flags.register_validator("seeds", lambda v: all(x.strip().lstrip("-").isdigit() for x in v),
                         message="--seeds must be a comma-separated list of integers, e.g. 42,43,44")
FLAGS = flags.FLAGS


def split_point_overrides(argv):
  """argv -> (this script's argv, train.py's `--config.key[=value]` overrides for every point).

  absl would reject `--config.key=value` here as an unknown flag; it is a train.py config override, so it is passed
  through to each point as if written after `--`."""
  own, point = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg == "--":
      own.extend(argv[i:])
      break
    if arg.startswith("--config."):
      point.append(arg)
      if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):  # `--config.key value`
        point.append(argv[i + 1])
        i += 1
    else:
      own.append(arg)
    i += 1
  return own, point


_POINT_OVERRIDES = []


def main(argv):
  from launch import sweeps
  sweeps.run_sweep(FLAGS.config, FLAGS.sweep, FLAGS.workdir, mode=FLAGS.mode,
                  extra_args=_POINT_OVERRIDES + argv[1:],
                  reuse_dirs=FLAGS.reuse, only=FLAGS.only, seeds=[int(x) for x in FLAGS.seeds])


if __name__ == "__main__":
  _argv, _POINT_OVERRIDES[:] = split_point_overrides(sys.argv)
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])  # before any point runs: the config loads, its keys exist
  from evqa_jax import cli
  sys.exit(cli.run_absl(main, _argv))
