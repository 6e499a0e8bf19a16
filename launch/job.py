"""What launch/train.py and launch/evaluate.py share: the config and multi-process flags, and the start of a job
before the trainer runs (jax.distributed, the workdir check, the synthetic world)."""

from absl import flags, logging
from ml_collections import config_flags

from configs import common as configs_common

flags.disclaim_key_flags()  # the flags defined below are the calling launcher's own (its --help lists them)


def define_flags(workdir_help: str, distributed_help: str, coordinator_help: str) -> None:
  """--config (with every config file's variants in its help), --workdir (required, both), --distributed and the
  explicit multi-process flags --coordinator, --num_processes and --process_id."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file, configs/<name>.py[:variant,...]; each "
                                  "file's variants:\n" + configs_common.variants_help(), lock_config=True)
  flags.DEFINE_string("workdir", None, workdir_help)
  flags.DEFINE_bool("distributed", False, distributed_help)
  flags.DEFINE_string("coordinator", None, coordinator_help)
  flags.DEFINE_integer("num_processes", None, "Number of processes, for explicit multi-process runs.")
  flags.DEFINE_integer("process_id", None, "This process's id, for explicit multi-process runs.")
  flags.mark_flags_as_required(["config", "workdir"])


def start(flag_values) -> None:
  """Quiet library logs (unless -v is given), jax.distributed.initialize() where the flags ask for it, the workdir's
  paths checked before anything is written, then the config's synthetic world built (the :demo / :small worlds are
  built here, never by the library)."""
  if not flag_values["verbosity"].present:  # orbax/grain INFO chatter hides the progress lines; -v 0 brings it back
    logging.set_verbosity(logging.WARNING)
  if flag_values.coordinator or flag_values.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    if flag_values.coordinator:
      jax.distributed.initialize(flag_values.coordinator, flag_values.num_processes, flag_values.process_id)
    else:
      jax.distributed.initialize()
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  safeguards.check_workdir_paths(flag_values.config, flag_values.workdir)  # before the world or anything else
  from data_prep import worlds  # pylint: disable=g-import-not-at-top
  worlds.ensure_synthetic_world(flag_values.config)
