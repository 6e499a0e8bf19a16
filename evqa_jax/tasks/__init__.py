"""Task table: config.task -> class. Imported lazily so one task's dependencies do not load the others."""

import importlib

TASKS = {
    "ovqa": "evqa_jax.tasks.ovqa:OVQATask",
    "violin": "evqa_jax.tasks.violin:ViolinTask",
    "evqa": "evqa_jax.tasks.evqa:EVQATask",
}


def get_task_class(name: str):
  if name not in TASKS:
    raise ValueError(f"config.task = {name!r}: expected one of {sorted(TASKS)}")
  module, cls = TASKS[name].split(":")
  return getattr(importlib.import_module(module), cls)


def build_task(config):
  return get_task_class(config.task)(config)
