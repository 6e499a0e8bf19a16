"""Entry point: flags only.

  python launch/train.py --config=configs/ovqa_msrvtt.py:demo --workdir=runs/ovqa_demo [--config.field=value ...]

Multi-process jobs (several hosts, or several processes on one host) call jax.distributed.initialize() first; it
reads the coordinator from the environment (Cloud TPU, SLURM) or from the --coordinator/--num_processes/--process_id
flags that launch/local_multiprocess.py passes.
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import job  # noqa: E402

job.define_flags("Directory for checkpoints, logs and predictions.",
                 "Call jax.distributed.initialize() (auto-detected coordinator).",
                 "host:port of process 0, for explicit multi-process runs.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  job.start(FLAGS)
  from evqa_jax.train import train_and_evaluate
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  from evqa_jax import cli
  sys.exit(cli.run_absl(main))
