"""What every benchmark records about the machine it ran on, and whether its timings can be quoted.

A speed figure depends on the CPU generation (XLA's code generation gains more from a newer core than PyTorch/MKL
does) and on what else runs: other processes on a shared box take cores from XLA's and PyTorch's thread pools
unequally, so ratios measured under load are not ratios of the idle machine. So each benchmark:

  mon = machine.Monitor()                       # thresholds: --max-foreign-cores / --max-load-per-core
  with mon.block("jax/train"):                  # one timed block
    ...
  result.update(mon.report())                   # {"machine": describe(), "load": ..., "usable": bool, ...}

A block records the 1-minute load average before and after it, its wall time, the CPU that processes OTHER
than this one (and its reaped children) used during it, in cores: (busy jiffies of the whole machine in
/proc/stat - this process's CPU time) / wall, and the hypervisor's steal in cores (time this VM's virtual CPUs
were runnable but the host ran something else: a neighbour on the host slows every side without showing up as a
process here). A run is `usable` only when, in every block, the foreign CPU stayed at or under `max_foreign_cores`,
the steal at or under `max_steal_cores` and the load average at or under `max_load_per_core` x cores. The load average is
the issue's rule of thumb (it counts this benchmark's own threads too, and lags by a minute); the foreign CPU is
the sharper test. An unusable run still prints its figures, marked so in the JSON and on stderr.
"""

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time

PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers")
# CPU features that change what XLA / oneDNN generate (vector width, bf16/int8 dot instructions, AMX tiles).
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a benchmark's figures depend on: the code it runs and its own script.
CODE_PATHS = ("evqa_jax", "configs", "data_prep", "launch", "benchmarks")
DEFAULT_MAX_FOREIGN_CORES = 0.2
DEFAULT_MAX_STEAL_CORES = 0.1
DEFAULT_MAX_LOAD_PER_CORE = 1.0


def cpuinfo() -> dict:
  """The first processor's fields in /proc/cpuinfo ("model name", "flags", ...; {} where there is none, e.g. macOS)."""
  try:
    with open("/proc/cpuinfo") as f:
      first = f.read().split("\n\n")[0]
  except OSError:
    return {}
  info = {}
  for line in first.splitlines():
    key, _, value = line.partition(":")
    info[key.strip()] = value.strip()
  return info


def describe() -> dict:
  """CPU model, vector/matrix flags, cores, hypervisor, OS, library versions and XLA flags of this machine."""
  info = cpuinfo()
  flags = set(info.get("flags", "").split())
  try:
    usable_cores = len(os.sched_getaffinity(0))
  except AttributeError:
    usable_cores = os.cpu_count()
  versions = {"python": platform.python_version()}
  for pkg in PACKAGES:  # installed versions, read without importing (torch alone takes seconds to import)
    try:
      versions[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      versions[pkg] = None
  return {"cpu_model": info.get("model name") or platform.processor() or platform.machine(),
          "cpu_id": cpu_id(info),
          "cpu_flags": [f for f in CPU_FLAGS if f in flags], "hypervisor": "hypervisor" in flags,
          "cpu_count": os.cpu_count(), "usable_cores": usable_cores, "platform": platform.platform(),
          "versions": versions, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
          "git_commit": git_commit()}


def cpu_id(info: dict) -> dict:
  """Vendor, family, model and stepping numbers and the cache size of /proc/cpuinfo's first processor ({} where
  unknown). A VM's "model name" can be as vague as "AMD EPYC"; family/model tell the core generation apart (AMD
  family 25: model 1 is Zen 3 "Milan", model 17 Zen 4 "Genoa"), and with the flags they name what XLA compiled for."""
  out = {}
  if info.get("vendor_id"):
    out["vendor"] = info["vendor_id"]
  for key, name in (("cpu family", "family"), ("model", "model"), ("stepping", "stepping")):
    try:
      out[name] = int(info[key])
    except (KeyError, ValueError):
      pass
  if info.get("cache size"):
    out["cache_size"] = info["cache size"]
  return out


def git_commit() -> str | None:
  """The repository's HEAD commit, with "+dirty" when the code a figure times (CODE_PATHS: the library, configs,
  data_prep, launch and the benchmark scripts) differs from it (None outside a git checkout), so that a figure names
  the code it timed. Outputs (docs/benchmarks/, e.g. a table a benchmark is writing row by row) and the README are
  not part of a figure."""
  try:
    head, status = (subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10)
                    for args in (("rev-parse", "HEAD"),
                                 ("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)))
  except (OSError, subprocess.SubprocessError):
    return None
  if head.returncode or status.returncode:
    return None
  return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def _cpu_seconds():
  """(busy, steal) CPU seconds of the whole machine (all cores) from /proc/stat's first line, or (None, None) off
  Linux. busy = user + nice + system + irq + softirq (guest time is already inside user/nice); steal = time the
  hypervisor gave this VM's runnable virtual CPUs to someone else."""
  try:
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
  except OSError:
    return None, None
  v += [0] * (8 - len(v))
  tick = os.sysconf("SC_CLK_TCK")
  return (v[0] + v[1] + v[2] + v[5] + v[6]) / tick, v[7] / tick


def _own_seconds() -> float:
  """CPU seconds of this process (all threads) and of its children that have been waited for."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load1() -> float:
  return os.getloadavg()[0]


class Block:
  """One timed block: load average before/after, wall seconds, own and foreign CPU in cores (context manager)."""

  def __init__(self, label: str, sink: list | None = None):
    self.label = label
    self.record = None
    self._sink = sink

  def __enter__(self):
    self._load = load1()
    (self._busy, self._steal), self._own, self._t = _cpu_seconds(), _own_seconds(), time.perf_counter()
    return self

  def __exit__(self, *exc):
    wall = max(time.perf_counter() - self._t, 1e-9)
    (busy, steal), own = _cpu_seconds(), _own_seconds() - self._own
    foreign = None if busy is None else max(0.0, busy - self._busy - own) / wall
    steal = None if steal is None else max(0.0, steal - self._steal) / wall
    self.record = {"label": self.label, "wall_s": round(wall, 4), "load1_before": round(self._load, 2),
                   "load1_after": round(load1(), 2), "own_cores": round(own / wall, 3),
                   "foreign_cores": None if foreign is None else round(foreign, 3),
                   "steal_cores": None if steal is None else round(steal, 3)}
    if self._sink is not None:
      self._sink.append(self.record)
    return False


class Monitor:
  """Collects the blocks of one benchmark run and gives the `usable` verdict over all of them."""

  def __init__(self, max_foreign_cores: float = DEFAULT_MAX_FOREIGN_CORES,
               max_load_per_core: float = DEFAULT_MAX_LOAD_PER_CORE,
               max_steal_cores: float = DEFAULT_MAX_STEAL_CORES):
    self.max_foreign_cores = max_foreign_cores
    self.max_steal_cores = max_steal_cores
    self.max_load_per_core = max_load_per_core
    self.blocks = []
    self.start_load1 = load1()
    self.start_utc = _utc_now()

  def block(self, label: str) -> Block:
    return Block(label, self.blocks)

  def verdict(self) -> dict:
    """{"usable", "reasons": [...], "load1_max_per_core", "foreign_cores_max", "foreign_cores_mean"}."""
    cores = os.cpu_count() or 1
    reasons = []
    if not self.blocks:
      reasons.append("no timed block was recorded")
    loads = [self.start_load1] + [x for b in self.blocks for x in (b["load1_before"], b["load1_after"])]
    load_max = max(loads) / cores
    if load_max > self.max_load_per_core:
      reasons.append(f"1-minute load average reached {max(loads):.2f} on {cores} cores "
                     f"({load_max:.2f} per core > {self.max_load_per_core})")
    foreign = [b["foreign_cores"] for b in self.blocks if b["foreign_cores"] is not None]
    noisy = [b["label"] for b in self.blocks if (b["foreign_cores"] or 0.0) > self.max_foreign_cores]
    if noisy:
      reasons.append(f"other processes used more than {self.max_foreign_cores} cores during {len(noisy)} of "
                     f"{len(self.blocks)} timed blocks (max {max(foreign):.2f}; first: {noisy[0]})")
    # Blocks recorded before steal was measured have no "steal_cores": they are judged on the rest.
    steal = [b["steal_cores"] for b in self.blocks if b.get("steal_cores") is not None]
    stolen = [b["label"] for b in self.blocks if (b.get("steal_cores") or 0.0) > self.max_steal_cores]
    if stolen:
      reasons.append(f"the hypervisor stole more than {self.max_steal_cores} cores during {len(stolen)} of "
                     f"{len(self.blocks)} timed blocks (max {max(steal):.2f}; first: {stolen[0]})")
    if self.blocks and not foreign:
      reasons.append("foreign CPU could not be measured (no /proc/stat)")
    return {"usable": not reasons, "reasons": reasons, "load1_max_per_core": round(load_max, 3),
            "foreign_cores_max": round(max(foreign), 3) if foreign else None,
            "foreign_cores_mean": round(sum(foreign) / len(foreign), 3) if foreign else None,
            "steal_cores_max": round(max(steal), 3) if steal else None,
            "steal_cores_mean": round(sum(steal) / len(steal), 3) if steal else None,
            "thresholds": {"max_foreign_cores": self.max_foreign_cores, "max_load_per_core": self.max_load_per_core,
                           "max_steal_cores": self.max_steal_cores}}

  def report(self, log=True) -> dict:
    """{"machine", "load": {verdict + blocks}, "usable"} for the benchmark's JSON; prints the verdict to stderr."""
    v = self.verdict()
    if log:
      if v["usable"]:
        print(f"[machine] usable: foreign CPU max {v['foreign_cores_max']} cores, steal max {v['steal_cores_max']} "
              f"cores, load {v['load1_max_per_core']} per core", file=sys.stderr, flush=True)
      else:
        print("[machine] UNUSABLE for quoting (machine busy): " + "; ".join(v["reasons"]), file=sys.stderr,
              flush=True)
    return {"machine": describe(), "load": dict(v, blocks=self.blocks), "usable": v["usable"],
            "utc": {"start": self.start_utc, "end": _utc_now()}}


def add_arguments(parser) -> None:
  """--max-foreign-cores / --max-load-per-core on a benchmark's argparse parser."""
  parser.add_argument("--max-foreign-cores", type=float, default=DEFAULT_MAX_FOREIGN_CORES,
                      help="a timed block with more CPU used by other processes (in cores) makes the run unusable")
  parser.add_argument("--max-load-per-core", type=float, default=DEFAULT_MAX_LOAD_PER_CORE,
                      help="a 1-minute load average above this x cores makes the run unusable")
  parser.add_argument("--max-steal-cores", type=float, default=DEFAULT_MAX_STEAL_CORES,
                      help="a timed block with more hypervisor steal (in cores) makes the run unusable")


def monitor_from_args(args) -> Monitor:
  return Monitor(args.max_foreign_cores, args.max_load_per_core, args.max_steal_cores)
