"""Test-wide set-up: 8 simulated CPU devices so sharding tests run on one host."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
  config.addinivalue_line("markers", "demo: reruns a recorded demo table (long); only with `-m demo`")


def pytest_collection_modifyitems(config, items):
  """Demo reruns take tens of minutes each: run them only when `-m` names them."""
  if "demo" in (config.option.markexpr or ""):
    return
  import pytest  # pylint: disable=g-import-not-at-top
  skip = pytest.mark.skip(reason="demo table rerun: opt in with `pytest -m demo`")
  for item in items:
    if "demo" in item.keywords:
      item.add_marker(skip)
