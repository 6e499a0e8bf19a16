"""Test-wide set-up: 8 simulated CPU devices so sharding tests run on one host; the opt-in `demo` marker; a
per-module persistent compilation cache."""

import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on CPU even where libtpu is installed (`.[tpu]`, for AOT compiles to TPU topologies): JAX then
# neither probes for TPU chips nor takes libtpu's host-wide lock at start-up.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
  config.addinivalue_line("markers", "demo: reruns a recorded demo table (long); only with `-m demo`")


def pytest_collection_modifyitems(config, items):
  """Demo reruns take tens of minutes each: run them only when `-m` names them."""
  if "demo" in (config.option.markexpr or ""):
    return
  skip = pytest.mark.skip(reason="demo table rerun: opt in with `pytest -m demo`")
  for item in items:
    if "demo" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope="module")
def persistent_compilation_cache(tmp_path_factory):
  """A persistent XLA cache for one test module whose runs recompile identical steps (each module starts empty).
  Use with `pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")`."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  yield
  jax.config.update("jax_compilation_cache_dir", old[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
  cc.reset_cache()
