"""One folder per paper (input.py, model.py, task.py, evaluator.py), found by `config.task` in this table.

Each entry says, in one place, everything outside its folder that depends on the task: the Task class the trainer
builds, the data_prep module that builds its built-in synthetic world (`config.data.synthetic`; named, never imported
here: the library does not generate data) and the command-line evaluators that score its prediction files. The
trainer, data_prep/worlds.py, launch/evaluate.py --help and the tests read this table, so a new task is its folder plus
one entry here. Modules are imported lazily so that one project's dependencies do not load the others.
"""

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Project:
  """`task`: "module:attribute" of the Task class (or a factory taking the config); `world`: a module with
  `ensure_world(world_dir, preset)` that builds the synthetic world of a preset into world_dir/records;
  `evaluators`: modules run as `python -m <module>` that score the task's prediction files."""
  task: str
  world: str
  evaluators: tuple


TASKS = {
    # One task for every backbone (config.model.backbone: evqa_jax/projects/ovqa/backbones/).
    "ovqa": Project("evqa_jax.projects.ovqa.task:Task", world="data_prep.synthetic_ovqa",
                    evaluators=("evqa_jax.evaluate.ovqa",)),
    # The task, or its BERT fine-tuning stage.
    "violin": Project("evqa_jax.projects.violin.task:make_task", world="data_prep.synthetic_violin",
                      evaluators=("evqa_jax.evaluate.violin",)),
    "evqa": Project("evqa_jax.projects.evqa.task:Task", world="data_prep.synthetic_evqa",
                    evaluators=("evqa_jax.evaluate.st_evidence", "evqa_jax.evaluate.st_evidence_mcq")),
}


def project(name: str) -> Project:
  """The table entry of `config.task`; ValueError naming the known tasks otherwise."""
  if name not in TASKS:
    raise ValueError(f"config.task = {name!r}: expected one of {sorted(TASKS)}")
  return TASKS[name]


def get_task_class(name: str):
  module, attr = project(name).task.split(":")
  return getattr(importlib.import_module(module), attr)


def build_task(config):
  return get_task_class(config.task)(config)
