"""Test-wide set-up: 8 simulated CPU devices so sharding tests run on one host; the opt-in `demo` marker; a
persistent compilation cache for the whole run (and a fresh one per module where a module asks for it)."""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on CPU even where libtpu is installed (`.[tpu]`, for AOT compiles to TPU topologies): JAX then
# neither probes for TPU chips nor takes libtpu's host-wide lock at start-up.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA cache for the whole run, shared by the pytest-xdist workers and by every
# launch/train.py subprocess the tests start (they inherit the environment): the resume, hardening, CLI and
# multi-process tests restart the same tiny configs many times, and each restart would otherwise compile its steps
# again. Entries are keyed by the program, devices, flags and versions, so a hit is the program a miss would compile.
# The controller sets it before the workers start, so they inherit it; a cache the user set is left alone.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
_CACHE_DIR = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                                   os.path.join(tempfile.gettempdir(), f"evqa_jax_test_xla_cache_{os.getpid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# The slowest modules, slowest first (seconds of a 2-worker run on the 2-core machine, 2026-12-01: 170, 152, 148, 145,
# 136, 104, 91, 77, 74, 73, 70, 68, 68, 63, 59, 51, 43, 39; every other module under 40 s). With `--dist loadfile`
# each worker takes the next module when it is nearly done with its own, so starting with the longest ones leaves
# short ones to even out the end. (xdist's own order, most tests first, put the 150 s one-test E-VQA mesh module
# last: one worker ran it alone for the last two and a half minutes.)
SLOW_MODULES = (
    "test_justask.py", "test_justask_cache.py", "test_gcs.py", "test_mesh_sharding_evqa.py", "test_integrity.py",
    "test_violin_task.py", "test_memory_levers.py", "test_multihost.py", "test_evqa_model.py", "test_ovqa_release.py",
    "test_gcs_tasks.py", "test_hardening.py", "test_benchmarks.py", "test_mesh_sharding.py",
    "test_evqa_release.py", "test_violin_release.py", "test_resume.py", "test_bert.py", "test_results_check.py",
    "test_deberta_v2.py", "test_synthetic_ovqa.py", "test_violin_model.py", "test_hostile_input.py",
    "test_gcs_convert.py",
)


def pytest_configure(config):
  config.addinivalue_line("markers", "demo: reruns a recorded demo table (long); only with `-m demo`")
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order of pytest_collection_modifyitems
    config.option.loadscopereorder = False


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  if _OWN_CACHE and not hasattr(session.config, "workerinput"):  # the process that made the cache removes it
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  """SLOW_MODULES first (the others in their collection order); demo reruns, which take tens of minutes each, run
  only when `-m` names them."""
  rank = {name: i for i, name in enumerate(SLOW_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's tests keep their order
  if "demo" in (config.option.markexpr or ""):
    return
  skip = pytest.mark.skip(reason="demo table rerun: opt in with `pytest -m demo`")
  for item in items:
    if "demo" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope="module")
def persistent_compilation_cache(tmp_path_factory):
  """A persistent XLA cache for one test module whose runs recompile identical steps (each module starts empty),
  where the run has no cache of its own (the run-wide one above, unless the user's environment set another).
  Use with `pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")`."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.config.jax_compilation_cache_dir:  # the run-wide cache: its hits include other modules' and subprocesses'
    yield
    return
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  yield
  jax.config.update("jax_compilation_cache_dir", old[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
  cc.reset_cache()
