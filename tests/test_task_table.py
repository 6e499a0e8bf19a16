"""A fourth task is its folder plus one evqa_jax.projects.TASKS entry: every place that depends on the task reads the
table. A throw-away task registered by monkeypatching TASKS is built by `build_task` (what the trainer calls), gets
its synthetic world from data_prep.worlds, and is listed by launch/evaluate.py --help and by the unknown-task error."""

import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from evqa_jax import projects

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# The throw-away project: a Task (a linear classifier over one feature) and the world builder its entry names.
TOY = textwrap.dedent('''
    import json
    import os

    import jax.numpy as jnp

    from evqa_jax.projects import base

    class Task(base.Task):
      def source(self, split):
        return [{"index": i, "x": float(i), "label": i % 2} for i in range(4)]

      def preprocess(self, example, train):
        return example

      def init_params(self, rng):
        return {"w": jnp.zeros((1, 2))}

      @property
      def trainable_patterns(self):
        return (".*",)

      def loss(self, params, batch, aux, rng, train=True):
        logits = batch["x"][:, None] @ params["w"]
        return -jnp.mean(logits[jnp.arange(len(logits)), batch["label"]]), {}

      def predict(self, params, batch, aux):
        return {"prediction": jnp.argmax(batch["x"][:, None] @ params["w"], -1)}

      def evaluate(self, split, outputs, out_dir):
        return {"accuracy": 0.0}

    def ensure_world(world_dir, preset):
      records = os.path.join(world_dir, "records")
      os.makedirs(records, exist_ok=True)
      with open(os.path.join(records, "metadata.json"), "w") as f:
        json.dump({"task": "toy", "preset": preset}, f)
      return records
''')
TOY_ENTRY = dict(task="toy_project:Task", world="toy_project", evaluators=("evqa_jax.evaluate.violin",))


@pytest.fixture
def toy(tmp_path, monkeypatch):
  (tmp_path / "toy_project.py").write_text(TOY)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(projects.TASKS, "toy", projects.Project(**TOY_ENTRY))
  return tmp_path


def _config(root, synthetic):
  return ml_collections.ConfigDict(dict(task="toy", data=dict(dir=str(root / "world" / "records"),
                                                              synthetic=synthetic)))


def test_build_task_and_the_unknown_task_error_read_the_table(toy):
  task = projects.build_task(_config(toy, ""))
  assert type(task).__module__ == "toy_project" and task.config.task == "toy"
  with pytest.raises(ValueError, match=r"^config.task = 'nope': expected one of \['evqa', 'ovqa', 'toy', 'violin'\]$"):
    projects.build_task(ml_collections.ConfigDict(dict(task="nope")))


def test_worlds_build_the_world_the_entry_names(toy):
  from data_prep import worlds
  worlds.ensure_synthetic_world(_config(toy, ""))  # no preset: nothing built
  assert not (toy / "world").exists()
  worlds.ensure_synthetic_world(_config(toy, "small"))
  assert (toy / "world" / "records" / "metadata.json").read_text() == '{"task": "toy", "preset": "small"}'


def test_evaluate_help_lists_every_task_evaluators(toy):
  """launch/evaluate.py --help, run with the toy entry registered (in a child process: absl flags are global)."""
  code = ("import runpy, sys; from evqa_jax import projects; "
          f"projects.TASKS['toy'] = projects.Project(**{TOY_ENTRY!r}); "
          "sys.argv = ['launch/evaluate.py', '--help']; runpy.run_path('launch/evaluate.py', run_name='__main__')")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=f"{REPO}:{toy}"))
  lines = out.stdout.splitlines()
  start = lines.index("The prediction files are in the benchmarks' official formats; each task's evaluators score "
                      "anyone's:")
  assert lines[start + 1:start + 5] == [
      "  ovqa: python -m evqa_jax.evaluate.ovqa",
      "  violin: python -m evqa_jax.evaluate.violin",
      "  evqa: python -m evqa_jax.evaluate.st_evidence, python -m evqa_jax.evaluate.st_evidence_mcq",
      "  toy: python -m evqa_jax.evaluate.violin"], out.stdout + out.stderr
