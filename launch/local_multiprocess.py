"""Runs one job as N local processes joined by jax.distributed (for tests and for trying multi-host code on one box).

  python launch/local_multiprocess.py --num_processes=2 --devices_per_process=2 -- \
      launch/train.py --config=configs/ovqa_msrvtt.py:demo,small --workdir=/tmp/mp

Each process gets `--coordinator=127.0.0.1:<free port> --num_processes=N --process_id=i` appended to its arguments
(the flags launch/train.py reads), its output lines prefixed with `[i]`. With --devices_per_process=D (CPU) every
process simulates D devices (XLA_FLAGS=--xla_force_host_platform_device_count=D) and uses gloo for cross-process
collectives. When one process fails the others are stopped, and the exit status is the first failure's.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(devices_per_process: int | None, base: Mapping[str, str] | None = None) -> dict:
  env = dict(os.environ if base is None else base)
  if devices_per_process:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  env.setdefault("PYTHONUNBUFFERED", "1")
  return env


def _pump(stream, prefix: str, sink, lines: list):
  for line in iter(stream.readline, ""):
    lines.append(line)
    if sink is not None:
      sink.write(prefix + line)
      sink.flush()
  stream.close()


def launch(argv: Sequence[str], num_processes: int, devices_per_process: int | None = None,
           env: Mapping[str, str] | None = None, timeout: float | None = None, echo: bool = True,
           port: int | None = None) -> tuple[list[int], list[str]]:
  """Starts `python argv... --coordinator=... --num_processes=N --process_id=i` for i < N and waits.

  Returns (exit codes, output of each process). On the first failure (or the timeout) the remaining processes
  are killed; their exit codes are then negative (the signal).
  """
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  port = port or free_port()
  child_env = process_env(devices_per_process, env)
  procs, outputs, pumps = [], [], []
  for i in range(num_processes):
    cmd = [sys.executable, *argv, f"--coordinator=127.0.0.1:{port}", f"--num_processes={num_processes}",
           f"--process_id={i}"]
    p = subprocess.Popen(cmd, env=child_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    t = threading.Thread(target=_pump, args=(p.stdout, f"[{i}] ", sys.stdout if echo else None, lines), daemon=True)
    t.start()
    procs.append(p)
    outputs.append(lines)
    pumps.append(t)
  deadline = None if timeout is None else time.monotonic() + timeout
  failed = False
  while any(p.poll() is None for p in procs):
    if any(p.returncode not in (None, 0) for p in procs) or (deadline is not None and time.monotonic() > deadline):
      failed = True
      break
    time.sleep(0.1)
  if failed:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p in procs:
    p.wait()
  for t in pumps:
    t.join(timeout=5)
  return [p.returncode for p in procs], ["".join(lines) for lines in outputs]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--num_processes", type=int, required=True)
  parser.add_argument("--devices_per_process", type=int, default=None,
                      help="simulated CPU devices per process (sets XLA_FLAGS, JAX_PLATFORMS=cpu, gloo)")
  parser.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
  parser.add_argument("--timeout", type=float, default=None, help="seconds before all processes are killed")
  parser.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py [its flags]")
  args = parser.parse_args(argv)
  script = args.script[1:] if args.script[:1] == ["--"] else args.script
  if not script:
    parser.error("give the script to run after --, e.g. -- launch/train.py --config=... --workdir=...")
  codes, _ = launch(script, args.num_processes, args.devices_per_process, timeout=args.timeout, port=args.port)
  bad = [c for c in codes if c != 0]
  print(f"local_multiprocess: exit codes {codes}", flush=True)
  sys.exit(bad[0] if bad else 0)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from evqa_jax import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.run(main))
