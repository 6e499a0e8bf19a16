"""Does the input pipeline keep up with the train step? Prints one JSON line per task.

    python benchmarks/pipeline_vs_step.py [--tasks=ovqa] [--batches=8] [--workers=0,2]

For each task's :demo config it measures (a) the Grain training pipeline (read + decode + the task's preprocess +
stack; `worker_count` = each value of --workers) in batches/s after the first batch, and (b) the jitted train step in
steps/s on prepared batches. `headroom` = pipeline batches/s / step steps/s: above 1 the step is the bottleneck;
below 1 the accelerator waits for data (raise config.data.worker_count). Each line carries the machine, the load
around its timed blocks and the `usable` verdict of benchmarks/machine.py.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import machine  # noqa: E402  pylint: disable=wrong-import-position
import train_throughput  # noqa: E402  pylint: disable=wrong-import-position


def pipeline_rate(bench, workers: int, batches: int) -> float:
  from evqa_jax.data import pipeline
  task, config = bench.task, bench.config
  loader = pipeline.make_train_loader(bench.source, global_batch_size=config.batch_size,
                                      transform=pipeline.KeyedTransform(task.preprocess_train), seed=1,
                                      worker_count=workers)
  with iter(loader) as it:
    next(it)  # worker start-up is not the steady state
    t0 = time.perf_counter()
    for _ in range(batches):
      next(it)
    return batches / (time.perf_counter() - t0)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tasks", default="all")
  parser.add_argument("--shapes", default="demo", choices=["demo", "tiny"])
  parser.add_argument("--batches", type=int, default=8)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--workers", default="0,2")
  machine.add_arguments(parser)
  args = parser.parse_args()
  tasks = train_throughput.available_tasks() if args.tasks == "all" else args.tasks.split(",")
  for task in tasks:
    bench = train_throughput.Bench(train_throughput.make_config(task, args.shapes))
    bench.compile()
    monitor = machine.monitor_from_args(args)
    with monitor.block(f"{task}/step"):
      times = bench.run(args.steps)
    step_rate = len(times) / sum(times)
    out = {"benchmark": "pipeline_vs_step", "task": task, "shapes": args.shapes,
           "batch_size": int(bench.config.batch_size), "step_per_s": round(step_rate, 3), "pipeline": {}}
    for w in [int(x) for x in args.workers.split(",")]:
      with monitor.block(f"{task}/pipeline_workers_{w}"):
        rate = pipeline_rate(bench, w, args.batches)
      out["pipeline"][f"workers_{w}"] = {"batches_per_s": round(rate, 3),
                                          "examples_per_s": round(rate * bench.config.batch_size, 1),
                                          "headroom": round(rate / step_rate, 3)}
    out.update(monitor.report())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
  main()
