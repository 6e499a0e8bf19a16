"""pytest plugin: where the suite's time goes, per test module (or per test), from jax.monitoring durations.

  PYTHONPATH=benchmarks python -m pytest -q -n 2 --dist loadfile -p suite_compile_profile tests
  SUITE_PROFILE_PER_TEST=1 PYTHONPATH=benchmarks python -m pytest -q -p suite_compile_profile tests/test_evqa_model.py

Each pytest process (every xdist worker) writes `<SUITE_PROFILE_OUT or suite_profile>_<worker>.json`: per module,
wall seconds, XLA backend compile seconds and count, jaxpr trace and MLIR lowering seconds, compile time saved by
the persistent cache. Not a timing test: run it on an idle machine and record the load beside the figures.
"""

import collections
import json
import os
import time

import pytest
from jax import monitoring

_totals = collections.defaultdict(float)
_per = collections.defaultdict(lambda: collections.defaultdict(float))


def _listener(event, duration, **kwargs):
  del kwargs
  _totals[event] += duration
  if event.endswith("backend_compile_duration"):
    _totals["n_compiles"] += 1


monitoring.register_event_duration_secs_listener(_listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  before, start = dict(_totals), time.time()
  yield
  key = item.nodeid if os.environ.get("SUITE_PROFILE_PER_TEST") else item.path.name
  for event, total in _totals.items():
    if total != before.get(event, 0.0):
      _per[key][event.split("/")[-1]] += total - before.get(event, 0.0)
  _per[key]["wall"] += time.time() - start


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  with open(f"{os.environ.get('SUITE_PROFILE_OUT', 'suite_profile')}_{worker}.json", "w") as f:
    json.dump({k: dict(v) for k, v in _per.items()}, f, indent=1)
