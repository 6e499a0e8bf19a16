"""Entry point: flags only.

  python launch/train.py --config=configs/ovqa_msrvtt.py:demo --workdir=runs/ovqa_demo [--config.field=value ...]

Multi-process jobs (several hosts, or several processes on one host) call jax.distributed.initialize() first; it
reads the coordinator from the environment (Cloud TPU, SLURM) or from the --coordinator/--num_processes/--process_id
flags that launch/local_multiprocess.py passes.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import common as configs_common  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Experiment config file, configs/<name>.py[:variant,...]; each "
                                "file's variants:\n" + configs_common.variants_help(), lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and predictions.")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (auto-detected coordinator).")
flags.DEFINE_string("coordinator", None, "host:port of process 0, for explicit multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes, for explicit multi-process runs.")
flags.DEFINE_integer("process_id", None, "This process's id, for explicit multi-process runs.")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS["verbosity"].present:  # orbax/grain INFO chatter hides the progress lines; -v 0 brings it back
    logging.set_verbosity(logging.WARNING)
  import jax
  if FLAGS.coordinator:
    jax.distributed.initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id)
  elif FLAGS.distributed:
    jax.distributed.initialize()
  from evqa_jax.runs import safeguards
  safeguards.check_workdir_paths(FLAGS.config, FLAGS.workdir)  # before the world or anything else is written
  from data_prep import worlds
  worlds.ensure_synthetic_world(FLAGS.config)  # the :demo / :small worlds are built here, never by the library
  from evqa_jax.train import train_and_evaluate
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  from evqa_jax import cli
  sys.exit(cli.run_absl(main))
