"""The import graph tells the truth: the library never imports the data-preparation scripts (which generate data),
and every project's task.py stays a small file (loss, predict, main metric)."""

import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imported_modules(path):
  tree = ast.parse(open(path).read(), filename=path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      yield node.module


def test_library_never_imports_data_prep():
  files = glob.glob(os.path.join(REPO, "evqa_jax", "**", "*.py"), recursive=True)
  assert len(files) > 30
  bad = [(os.path.relpath(f, REPO), m) for f in files for m in _imported_modules(f)
         if m == "data_prep" or m.startswith("data_prep.")]
  assert not bad, bad


def test_every_task_file_is_small():
  from evqa_jax import projects
  tasks = glob.glob(os.path.join(REPO, "evqa_jax", "projects", "*", "task.py"))
  assert sorted(os.path.basename(os.path.dirname(t)) for t in tasks) == sorted(projects.TASKS)  # a folder per entry
  for path in tasks:
    n = len(open(path).read().splitlines())
    assert n <= 250, f"{os.path.relpath(path, REPO)} has {n} lines"


def test_every_project_has_the_four_files_a_world_and_evaluators():
  """Each TASKS entry names its own folder's task, a data_prep world builder with `ensure_world(world_dir, preset)`
  and command-line evaluators with a `main`."""
  import importlib
  import inspect
  import sys
  sys.path.insert(0, REPO)
  from evqa_jax import projects
  for name, entry in projects.TASKS.items():
    folder = os.path.join(REPO, "evqa_jax", "projects", name)
    assert entry.task.startswith(f"evqa_jax.projects.{name}.task:"), entry
    for f in ("input.py", "model.py", "task.py", "evaluator.py"):
      assert os.path.exists(os.path.join(folder, f)), (name, f)
    assert entry.world.startswith("data_prep.synthetic_"), entry
    params = list(inspect.signature(importlib.import_module(entry.world).ensure_world).parameters)
    assert params[:2] == ["world_dir", "preset"], (name, params)
    assert entry.evaluators and all(callable(importlib.import_module(m).main) for m in entry.evaluators), entry


def test_task_never_builds_a_world(tmp_path):
  """A demo config whose world is missing: building the task raises, naming the directory and the command, and
  writes nothing (the launch side builds worlds: data_prep.worlds.ensure_synthetic_world)."""
  import sys
  import pytest
  sys.path.insert(0, REPO)
  from configs import evqa_gen, ovqa_msrvtt, violin
  from evqa_jax import projects
  for config in (ovqa_msrvtt.get_config("demo,small"), violin.get_config("small"), evqa_gen.get_config("small")):
    config.data.dir = str(tmp_path / config.task / "records")
    with pytest.raises(FileNotFoundError, match=r"config.data.dir = .*records.*python -m data_prep.worlds"):
      projects.build_task(config)
    assert not os.path.exists(tmp_path / config.task)
