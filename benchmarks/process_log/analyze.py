"""Sums the logs of benchmarks/process_log/sitecustomize.py: processes by script, compiles by program, as JSON.

  python benchmarks/process_log/analyze.py /tmp/plog [--top 30]
"""

import argparse
import collections
import glob
import json
import os
import re

_COMPILE = re.compile(r"Finished XLA compilation of (.*) in ([\d.]+) sec")
_TRACE = re.compile(r"Finished tracing (.*) for jit in ([\d.]+) sec")


def summarize(log_dir: str, top: int = 30) -> dict:
  compiles = collections.defaultdict(lambda: [0, 0.0])
  traces = collections.defaultdict(lambda: [0, 0.0])
  scripts = collections.defaultdict(lambda: {"processes": 0, "wall_s": 0.0, "compile_s": 0.0, "cache_hits": 0})
  for path in sorted(glob.glob(os.path.join(log_dir, "*.log"))):
    argv, wall, compile_s, hits = "", 0.0, 0.0, 0
    with open(path) as f:
      for line in f:
        if line.startswith("START "):
          argv = line.split(" ", 2)[2].strip() if line.count(" ") >= 2 else ""
        elif line.startswith("END "):
          wall = float(line.split()[2])
        elif m := _COMPILE.search(line):
          compiles[m.group(1)][0] += 1
          compiles[m.group(1)][1] += float(m.group(2))
          compile_s += float(m.group(2))
        elif m := _TRACE.search(line):
          traces[m.group(1)][0] += 1
          traces[m.group(1)][1] += float(m.group(2))
        elif "cache hit" in line:
          hits += 1
    words = argv.split()
    if not words:
      script = "?"
    elif words[0] in ("-c", "-m"):  # python -c / -m (the pytest-xdist workers run -c)
      script = " ".join(words[:2])[:40]
    else:
      script = os.path.basename(words[0])
    s = scripts[script]
    s["processes"] += 1
    s["wall_s"] = round(s["wall_s"] + wall, 2)
    s["compile_s"] = round(s["compile_s"] + compile_s, 2)
    s["cache_hits"] += hits

  def ranked(table):
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"program": k, "count": n, "seconds": round(t, 2)} for k, (n, t) in rows]

  return {"processes": sum(s["processes"] for s in scripts.values()), "by_script": dict(scripts),
          "compile_s": round(sum(t for _, t in compiles.values()), 1),
          "compiles": sum(n for n, _ in compiles.values()), "top_compiles": ranked(compiles),
          "trace_s": round(sum(t for _, t in traces.values()), 1), "top_traces": ranked(traces)}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("log_dir")
  p.add_argument("--top", type=int, default=30)
  args = p.parse_args()
  print(json.dumps(summarize(args.log_dir, args.top)))


if __name__ == "__main__":
  main()
