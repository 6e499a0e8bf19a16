"""One folder per paper (input.py, model.py, task.py, evaluator.py), found by `config.task` in this table.

Imported lazily so that one project's dependencies do not load the others. A new task adds its line here.
"""

import importlib

TASKS = {
    "ovqa": "evqa_jax.projects.ovqa.task:make_task",  # FrozenBiLM+ or JustAsk+ (config.model.backbone)
    "violin": "evqa_jax.projects.violin.task:make_task",  # the task, or its BERT fine-tuning stage
    "evqa": "evqa_jax.projects.evqa.task:Task",
}


def get_task_class(name: str):
  if name not in TASKS:
    raise ValueError(f"config.task = {name!r}: expected one of {sorted(TASKS)}")
  module, cls = TASKS[name].split(":")
  return getattr(importlib.import_module(module), cls)


def build_task(config):
  return get_task_class(config.task)(config)
