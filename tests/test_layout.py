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


# ---------------------------------------------------------------- the import graph

# Packages (and top-level modules) by floor: a module imports only from its own floor or below. Floor 0 is the
# library's base; the run directory (runs/) sits above the data pipeline it checkpoints and below the tasks that read
# an earlier run's parameters; the trainer is the library's top; configs and data_prep use the library; launch/ uses
# everything.
FLOORS = (
    ("evqa_jax", "evqa_jax.log", "evqa_jax.io", "evqa_jax.cli", "evqa_jax.settings", "evqa_jax.spm_tokenizer",
     "evqa_jax.violin_text"),
    ("evqa_jax.pretrained", "evqa_jax.metrics", "evqa_jax.data"),
    ("evqa_jax.graphs", "evqa_jax.models", "evqa_jax.evaluate", "evqa_jax.runs"),
    ("evqa_jax.projects",),
    ("evqa_jax.train",),
    ("configs", "data_prep"),
    ("launch",),
)
GRAPH_ROOTS = ("evqa_jax", "configs", "launch", "data_prep")
def _module_files():
  out = {}
  for top in GRAPH_ROOTS:
    for folder, dirs, files in os.walk(os.path.join(REPO, top)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      for f in files:
        if f.endswith(".py"):
          name = os.path.relpath(os.path.join(folder, f), REPO)[:-3].replace(os.sep, ".")
          out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(folder, f)
  return out


def import_graph() -> dict:
  """{module: set of the project modules it imports} over GRAPH_ROOTS, every import statement counted (those
  inside functions too); `from a import b` is a.b when that is a module, else a."""
  files = _module_files()

  def known(name):
    while name and name not in files:
      name = name.rpartition(".")[0]
    return name

  graph = {}
  for module, path in files.items():
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(open(path).read(), filename=path)):
      if isinstance(node, ast.Import):
        targets.update(known(a.name) for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(parts + [base] if base else parts)
        targets.update(known(f"{base}.{a.name}") for a in node.names)
    graph[module] = {t for t in targets if t and t != module}
  return graph


def circles(graph: dict) -> list:
  """The strongly connected components of more than one module (Tarjan), each a set of module names."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(component)

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def floor(module: str) -> int:
  """The floor of the longest FLOORS entry that is `module` or a package holding it."""
  best = max((e for f in FLOORS for e in f if module == e or module.startswith(e + ".")), key=len)
  return next(i for i, f in enumerate(FLOORS) if best in f)


def test_import_graph_of_a_toy_tree(tmp_path, monkeypatch):
  """The graph builder and the circle finder on a hand-made tree: absolute, relative and function-level imports."""
  for rel, text in {"evqa_jax/__init__.py": "", "evqa_jax/a.py": "from evqa_jax import b\n",
                    "evqa_jax/b.py": "def f():\n  from . import c\n", "evqa_jax/c.py": "import evqa_jax.a\n",
                    "evqa_jax/d.py": "from evqa_jax.a import name\nimport numpy\n"}.items():
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(text)
  monkeypatch.setitem(globals(), "REPO", str(tmp_path))
  graph = import_graph()
  assert graph == {"evqa_jax": set(), "evqa_jax.a": {"evqa_jax.b"}, "evqa_jax.b": {"evqa_jax.c"},
                   "evqa_jax.c": {"evqa_jax.a"}, "evqa_jax.d": {"evqa_jax.a"}}
  assert circles(graph) == [{"evqa_jax.a", "evqa_jax.b", "evqa_jax.c"}]


def test_import_graph_has_no_circle():
  assert circles(import_graph()) == []


def test_data_and_projects_never_import_the_trainer():
  graph = import_graph()
  bad = sorted((m, t) for m, targets in graph.items() for t in targets
               if m.startswith(("evqa_jax.data", "evqa_jax.projects")) and t.startswith("evqa_jax.train"))
  assert not bad, bad


def test_at_most_one_import_runs_back_up_the_floors():
  graph = import_graph()
  every = [m for f in FLOORS for m in f]
  assert all(any(m == e or m.startswith(e + ".") for e in every) for m in graph)  # every module has a floor
  up = sorted((m, t) for m, targets in graph.items() for t in targets if floor(t) > floor(m))
  assert len(up) <= 1, up
