"""Evaluate only: score a trained checkpoint, or the initial weights (zero-shot), on any split.

  python launch/evaluate.py --config=configs/ovqa_msrvtt.py --workdir=runs/msrvtt --checkpoint=best [--split=test,val]
  python launch/evaluate.py --config=configs/ovqa_msrvtt.py:baseline --workdir=runs/msrvtt_zs --zero_shot \
      --config.pretrained.init_from=~/models/frozenbilm.pth          # the OVQA paper's zero-shot Table 6

--checkpoint is `last`, `best` (model selection by config.select over the run's evaluations) or a step number, of a
workdir that launch/train.py wrote with the same config (and --config. overrides); --zero_shot scores the weights
training would start from (pretrained LM, config.pretrained.init_from) and needs no trained workdir; it refuses a
learned head that nothing filled (OVQA: the GNN verbalizer without an OVQA-trained init_from; docs/ovqa.md). Each
split's predictions and metrics are written as training's evaluation writes them, to <workdir>/eval/<split>_step<N>/
(zero-shot: <split>_zero_shot/), and all of them to <workdir>/evaluate_<step<N>|zero_shot>.json.

Several processes (a pod slice, a SLURM job: --distributed on every host, as launch/train.py; on one machine:
launch/local_multiprocess.py, which passes --coordinator/--num_processes/--process_id) score the same examples as
one process, each reading its rows of every batch; process 0 writes the files.
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evqa_jax import projects  # noqa: E402
from launch import job  # noqa: E402

# --help: the command-line evaluators of each task (evqa_jax.projects.TASKS), which score anyone's prediction files.
__doc__ += ("\nThe prediction files are in the benchmarks' official formats; each task's evaluators score anyone's:\n"
            + "".join(f"  {name}: {', '.join(f'python -m {m}' for m in entry.evaluators)}\n"
                      for name, entry in projects.TASKS.items()))

job.define_flags("The training run's directory (zero-shot: where the outputs go).",
                 "Call jax.distributed.initialize() (a pod slice or a SLURM job: every host runs this command, as "
                 "for launch/train.py).",
                 "host:port of process 0, for explicit multi-process runs (launch/local_multiprocess.py passes it).")
flags.DEFINE_string("checkpoint", None, "last, best or a step number.")
flags.DEFINE_bool("zero_shot", False, "Score the initial weights (no training) instead of a checkpoint.")
flags.DEFINE_list("split", None, "Splits to score (default: config.data.eval_splits).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if bool(FLAGS.checkpoint) == FLAGS.zero_shot:
    raise ValueError("give exactly one of --checkpoint=last|best|STEP and --zero_shot")
  job.start(FLAGS)
  from evqa_jax.train import trainer
  trainer.evaluate_checkpoint(FLAGS.config, FLAGS.workdir, None if FLAGS.zero_shot else FLAGS.checkpoint,
                              FLAGS.split)


if __name__ == "__main__":
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  from evqa_jax import cli
  sys.exit(cli.run_absl(main))
