"""Config loading on the command line (docs/hostile_input.md): every way a `--config=` fails to load (a missing file,
a syntax error, no get_config, a mistyped variant) is one `error:` line naming the file and variant, exit status 2,
from every launcher, before anything is written; a broken file in configs/ that nobody asked for breaks no launch of
another config; `--help` exits 0 on every launch script."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO)


def _run(*argv, timeout=120):
  return subprocess.run([sys.executable, *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bad_configs(tmp_path_factory):
  d = tmp_path_factory.mktemp("configs")
  (d / "no_get_config.py").write_text("VARIANTS = {'demo'}\n")
  (d / "syntax.py").write_text("def get_config(arg=None:\n")
  (d / "raises.py").write_text("import no_such_module_evqa\n")
  return d


@pytest.mark.parametrize("script,spec,message", [
    ("launch/train.py", "configs/ovqa_msrvtt.py:demo,demoo",
     "error: --config=configs/ovqa_msrvtt.py:demo,demoo: unknown variant(s) ['demoo']; known: ['allinone', 'authors_eps', "),
    ("launch/sweep.py", "configs/violin.py:dmeo",
     "error: --config=configs/violin.py:dmeo: unknown variant(s) ['dmeo']; known: ["),
    ("launch/evaluate.py", "configs/nope.py:demo", "error: --config file configs/nope.py does not exist"),
    ("launch/aot_check.py", "{d}/no_get_config.py:demo",
     "error: --config={d}/no_get_config.py:demo: {d}/no_get_config.py defines no get_config()"),
    ("launch/train.py", "{d}/syntax.py", "error: --config={d}/syntax.py: SyntaxError: "),
    ("benchmarks/step_breakdown.py", "{d}/raises.py",
     "error: --config={d}/raises.py: ModuleNotFoundError: No module named 'no_such_module_evqa'"),
])
def test_a_config_that_does_not_load_is_one_line_exit_2(bad_configs, tmp_path, script, spec, message):
  spec, message = spec.format(d=bad_configs), message.format(d=bad_configs)
  work = tmp_path / "w"
  out = _run(script, f"--config={spec}", f"--workdir={work}", "--sweep=heads", "--checkpoint=last")
  assert out.returncode == 2 and out.stderr.startswith(message), out.stderr[-2000:]
  assert len(out.stderr.splitlines()) == 1 and out.stdout == "" and not work.exists()


def test_a_broken_file_in_configs_breaks_no_other_launch(tmp_path):
  """configs/ holding a file without VARIANTS and one that does not parse: --help names both, and launching a shipped
  config parses its flags and reaches training (stubbed here: the child process replaces the training call)."""
  import shutil
  configs = tmp_path / "configs"
  shutil.copytree(os.path.join(REPO, "configs"), configs)
  (configs / "zz_no_variants.py").write_text("X = 1\n")
  (configs / "zz_syntax.py").write_text("def get_config(\n")
  code = ("import runpy, sys; import configs; from configs import common; "
          f"configs.__path__.insert(0, {str(configs)!r}); common.CONFIG_DIR = {str(configs)!r}; "
          "from data_prep import worlds; worlds.ensure_synthetic_world = lambda c: None; "
          "import evqa_jax.train as t; t.train_and_evaluate = lambda c, w: print('TRAINING', c.task, c.seed); "
          "sys.argv = ['launch/train.py', *sys.argv[1:]]; runpy.run_path('launch/train.py', run_name='__main__')")
  out = _run("-c", code, "--help")
  text = " ".join(out.stdout.split())
  assert out.returncode == 0, out.stderr[-2000:]
  assert "configs/zz_no_variants.py: (cannot list its variants: AttributeError: module 'configs.zz_no_variants' " \
         "has no attribute 'VARIANTS')" in text
  assert "configs/zz_syntax.py: (cannot list its variants: SyntaxError: " in text
  assert "configs/violin.py: " in text and "configs/ovqa_msrvtt.py: allinone, authors_eps, baseline" in text
  out = _run("-c", code, "--config=configs/violin.py:demo", f"--workdir={tmp_path / 'w'}", "--config.seed=7")
  assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "TRAINING violin 7", out.stderr[-2000:]


@pytest.mark.parametrize("script", ["launch/train.py", "launch/evaluate.py", "launch/sweep.py", "launch/aot_check.py",
                                    "launch/check_results.py", "launch/behaviour_check.py",
                                    "launch/local_multiprocess.py", "benchmarks/step_breakdown.py"])
def test_help_exits_0(script):
  out = _run(script, "--help")
  assert out.returncode == 0 and "--" in out.stdout and out.stderr == "", (out.stdout + out.stderr)[-2000:]
