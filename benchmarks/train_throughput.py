"""Train-step throughput of each task's real jitted step (steps.StepFns) on this host; prints one JSON line.

    python benchmarks/train_throughput.py                         # every task with a config, demo shapes
    python benchmarks/train_throughput.py --tasks=ovqa --shapes=paper --batch=2 --steps=2

Shapes: `demo` = the config's :demo variant (synthetic world, MiniLM-size encoders); `paper` = OVQA with the paper's
DeBERTa-v2-xlarge encoder (random weights, config pretrained.shape), 256 tokens, on the synthetic world's records and
answer vocabulary (VIOLIN / E-VQA: their default configs need the released data, so `paper` covers OVQA only).
Batches are prepared beforehand, so the figure is the step alone: compile time, then the mean over --steps timed
steps after one warm-up step. Weights are random (no checkpoint is read). The JSON carries the machine, the load
around each timed block and the `usable` verdict of benchmarks/machine.py (quote only usable runs).
"""

import argparse
import contextlib
import importlib
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import machine  # noqa: E402  pylint: disable=wrong-import-position

TASK_CONFIGS = {"ovqa": "configs.ovqa_msrvtt", "violin": "configs.violin", "evqa": "configs.evqa_gen"}


def available_tasks():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return [t for t, m in TASK_CONFIGS.items() if os.path.exists(os.path.join(root, *m.split(".")) + ".py")]


def make_config(task: str, shapes: str, batch: int | None = None, variants: str = ""):
  """The benchmark config of `task` at `shapes` ('demo', 'paper' or 'tiny')."""
  import ml_collections
  module = importlib.import_module(TASK_CONFIGS[task])
  extra = [v for v in variants.split(",") if v]
  if shapes == "demo":
    config = module.get_config(",".join(["demo"] + extra))
  elif task == "ovqa" and shapes in ("paper", "tiny"):
    from configs import ovqa_common
    config = module.get_config(",".join(extra) or None)
    config.data.dir = "data/synthetic_ovqa_small/records"
    config.data.synthetic = "small"
    config.pretrained.dir = ""  # random weights, built from pretrained.shape
    config.pretrained.init_from = "none"  # the paper configs require a FrozenBiLM checkpoint otherwise
    config.pretrained.tokenizer = "pkg:minilm"  # any local tokenizer: only the token ids' range matters here
    config.data.max_tokens = 256
    shape = dict(ovqa_common.DEBERTA_V2_XLARGE)
    if shapes == "tiny":  # the same architecture, small enough for a CPU test
      shape.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   position_buckets=32)
      config.data.max_tokens = 32
      config.batch_size = 4
    config.pretrained.shape = ml_collections.ConfigDict(shape)
  else:
    raise ValueError(f"no {shapes!r} shapes for task {task!r}: demo for every task, paper/tiny for ovqa")
  if batch:
    config.batch_size = batch
  config.data.worker_count = 0
  return config


class Bench:
  """The trainer's state, step and a few prepared global batches for one config."""

  def __init__(self, config, num_batches: int = 2):
    import jax
    from data_prep import worlds
    from evqa_jax import projects
    from evqa_jax.data import pipeline
    from evqa_jax.train import partition, sharding
    from evqa_jax.train import steps as steps_lib
    self.config = config
    worlds.ensure_synthetic_world(config)  # the library never builds data
    self.task = projects.build_task(config)
    self.mesh = sharding.make_mesh(config.mesh_shape, config.mesh_axes)
    rules = config.logical_axis_rules
    self.batch_shard = sharding.batch_sharding(self.mesh, rules)
    self.tx, _ = partition.make_optimizer(config.optim, 1000)
    t0 = time.perf_counter()
    self.state, shardings = steps_lib.create_state(self.task, config, self.mesh, self.tx)
    jax.block_until_ready(self.state)
    self.init_s = time.perf_counter() - t0
    step_aux = steps_lib.StepAux(self.task, self.mesh, rules, self.state, shardings,
                                 self.task.aux_inputs(config.data.train_split))
    self.aux = step_aux(self.state, self.task.aux_inputs(config.data.train_split))  # what the trainer's steps read
    self.steps = steps_lib.StepFns(self.task, self.tx, self.mesh, rules, shardings, self.batch_shard,
                                   step_aux.shardings)
    self.source = self.task.source(config.data.train_split)
    loader = pipeline.make_train_loader(self.source, global_batch_size=config.batch_size,
                                        transform=pipeline.KeyedTransform(self.task.preprocess_train), seed=0)
    it = iter(loader)
    self.host_batches = [next(it) for _ in range(num_batches)]
    it.close()
    self.batches = [sharding.global_batch(b, self.batch_shard) for b in self.host_batches]
    self.trainable = partition.count_params(self.state["trainable"])
    self.frozen = partition.count_params(self.state["frozen"])

  def compile(self):
    """-> (compile seconds, compiled step); FLOPs from XLA's cost analysis of the same step."""
    t0 = time.perf_counter()
    with self.steps.context():
      compiled = self.steps.train_step.lower(self.state, self.batches[0], self.aux).compile()
    return time.perf_counter() - t0, compiled

  def run(self, steps: int, warmup: int = 1) -> list:
    import jax
    times = []
    with self.steps.context():
      for i in range(warmup + steps):
        t0 = time.perf_counter()
        self.state, metrics = self.steps.train_step(self.state, self.batches[i % len(self.batches)], self.aux)
        jax.block_until_ready(metrics)
        if i >= warmup:
          times.append(time.perf_counter() - t0)
    loss = float(metrics["loss"])
    if loss != loss:
      raise FloatingPointError("benchmark step produced a NaN loss")
    return times


def step_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def measure(task: str, shapes: str, steps: int, batch: int | None, variants: str = "", monitor=None) -> dict:
  import jax
  config = make_config(task, shapes, batch, variants)
  bench = Bench(config)
  compile_s, compiled = bench.compile()
  with monitor.block(f"{task}/{shapes}") if monitor else contextlib.nullcontext():
    times = bench.run(steps)
  mean = sum(times) / len(times)
  flops = step_flops(compiled)
  return {"task": task, "shapes": shapes, "describe": bench.task.describe(), "batch_size": int(config.batch_size),
          "devices": jax.device_count(), "trainable_params": bench.trainable, "frozen_params": bench.frozen,
          "compile_s": round(compile_s, 3), "step_s": round(mean, 4), "step_s_min": round(min(times), 4),
          "examples_per_s": round(config.batch_size / mean, 2),
          "flops_per_step_per_device": flops,
          "achieved_flops_per_s": None if flops is None else round(flops * jax.device_count() / mean, 1)}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tasks", default="all", help="comma-separated: ovqa,violin,evqa (default: all with configs)")
  parser.add_argument("--shapes", default="demo", choices=["demo", "paper", "tiny", "both"])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
  machine.add_arguments(parser)
  args = parser.parse_args()
  import jax
  monitor = machine.monitor_from_args(args)
  tasks = available_tasks() if args.tasks == "all" else args.tasks.split(",")
  shapes = ["demo", "paper"] if args.shapes == "both" else [args.shapes]
  results = []
  for task in tasks:
    for s in shapes:
      if s in ("paper", "tiny") and task != "ovqa":
        continue
      results.append(measure(task, s, args.steps, args.batch, monitor=monitor))
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  print(json.dumps({"benchmark": "train_throughput", "backend": jax.default_backend(),
                    "device_kind": jax.devices()[0].device_kind, "host_cpus": os.cpu_count(),
                    "arch": platform.machine(), "results": results, **monitor.report()}), flush=True)


if __name__ == "__main__":
  main()
