"""Logs every Python process of a run, with its XLA compiles: where a test suite's processes spend their time.

  EVQA_PROCESS_LOG=/tmp/plog PYTHONPATH=benchmarks/process_log python -m pytest -q -n 2 --dist loadfile tests
  python benchmarks/process_log/analyze.py /tmp/plog

Python imports `sitecustomize` at start-up from PYTHONPATH, so with this folder on it every process (the pytest
workers and each subprocess that inherits PYTHONPATH; a test that replaces PYTHONPATH hides its subprocess) writes
<EVQA_PROCESS_LOG>/<pid>.log: its command line, the jit tracing / MLIR lowering / XLA compile of every program with
its seconds (jax's own debug log lines), persistent-cache hits, and its wall time at exit. Without EVQA_PROCESS_LOG
it does nothing. Not a timing test: run it on an idle machine.
"""

import os

if os.environ.get("EVQA_PROCESS_LOG"):
  import atexit
  import logging
  import sys
  import time

  _START = time.time()
  _FILE = open(os.path.join(os.environ["EVQA_PROCESS_LOG"], f"{os.getpid()}.log"), "a", buffering=1)  # pylint: disable=consider-using-with
  _FILE.write(f"START {_START:.3f} {' '.join(sys.argv)[:300]}\n")
  _KEPT = ("Finished XLA compilation", "Finished tracing", "Finished jaxpr to MLIR", "Persistent compilation cache hit")

  class _Handler(logging.Handler):

    def emit(self, record):
      message = record.getMessage()
      if message.startswith(_KEPT):
        _FILE.write(f"{time.time():.3f} {message}\n")

  for _name in ("jax._src.dispatch", "jax._src.compiler"):
    _logger = logging.getLogger(_name)
    _logger.addHandler(_Handler())
    _logger.setLevel(logging.DEBUG)
  atexit.register(lambda: _FILE.write(f"END {time.time():.3f} {time.time() - _START:.2f}\n"))
