"""Step time, examples/s and MFU of the paper's OVQA model (FrozenBiLM+ on DeBERTa-v2-xlarge, GNN verbalizer, bf16).

    python benchmarks/gpu_mfu.py                      # one accelerator, paper shapes, batch 32: < 5 minutes
    python benchmarks/gpu_mfu.py --set model.relative_gather=rows --set frozen_param_dtype=bfloat16 --batch 64
    python benchmarks/gpu_mfu.py --set model.relative_gather=dpa --set model.dropout=0.0   # cuDNN fused attention
    python benchmarks/gpu_mfu.py --tiny               # same architecture at toy size: runs on CPU (tests)

Builds configs/ovqa_msrvtt.py:bf16 with pretrained.shape = the xlarge shapes and random weights (no checkpoint), on the
built-in small synthetic world's records and answer graph (real [10, 768] video features, 256 tokens). The step is
the trainer's own (trainable adapters/LayerNorms/verbalizer, frozen LM, Adam). FLOPs per step are XLA's count for the
compiled step (per device x devices); MFU = FLOPs per step / step time / (peak FLOP/s per device x devices), with
the peak dense bf16 rate of the device kind from benchmarks/chips.py PEAK_FLOPS (override with --peak_flops); XLA's
FLOPs include what remat recomputes, so with `--set model.remat=full` the figure is a hardware (not model) FLOPs
utilisation. `--set key=value` sets any config field (the levers of docs/accelerators.md). Prints one JSON line,
with the host machine, its load and the `usable` verdict of benchmarks/machine.py (host load matters less on a GPU).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chips import PEAK_FLOPS, peak_flops  # noqa: E402,F401  pylint: disable=wrong-import-position
import machine  # noqa: E402  pylint: disable=wrong-import-position
import train_throughput  # noqa: E402  pylint: disable=wrong-import-position


def set_field(config, assignment: str) -> None:
  """`a.b=value` -> config.a.b = value, the value parsed as a Python literal when it is one (else a string)."""
  import ast
  key, sep, text = assignment.partition("=")
  if not sep or not key:
    raise SystemExit(f"--set {assignment!r}: expected key=value, e.g. model.remat=full")
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  *path, last = key.split(".")
  node = config
  for part in path:
    node = node[part]
  if last not in node:
    raise SystemExit(f"--set {assignment!r}: the config has no field {key!r}")
  node[last] = value


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tiny", action="store_true", help="toy sizes of the same architecture (CPU)")
  parser.add_argument("--batch", type=int, default=None, help="global batch (default: 32, the paper's; tiny: 4)")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--fp32", action="store_true", help="float32 instead of the bf16 variant")
  parser.add_argument("--peak_flops", type=float, default=None, help="per-device peak FLOP/s (else by device kind)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config field to set, e.g. model.remat=full (repeatable)")
  machine.add_arguments(parser)
  args = parser.parse_args()
  monitor = machine.monitor_from_args(args)
  import jax
  shapes = "tiny" if args.tiny else "paper"
  config = train_throughput.make_config("ovqa", shapes, args.batch, variants="" if args.fp32 else "bf16")
  for assignment in args.set:
    set_field(config, assignment)
  bench = train_throughput.Bench(config)
  compile_s, compiled = bench.compile()
  with monitor.block("train_step"):
    times = bench.run(args.steps, warmup=2)
  step_s = sorted(times)[len(times) // 2]  # median: robust to a stray slow step
  flops_dev = train_throughput.step_flops(compiled)
  n = jax.device_count()
  kind = jax.devices()[0].device_kind
  peak = args.peak_flops or peak_flops(kind)
  flops = None if flops_dev is None else flops_dev * n
  mem = {}
  try:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
      mem["peak_bytes_in_use"] = int(stats["peak_bytes_in_use"])
  except Exception:  # pylint: disable=broad-except
    pass
  print(json.dumps({
      "benchmark": "gpu_mfu", "model": bench.task.describe(), "dtype": config.model.dtype, "shapes": shapes,
      "device_kind": kind, "devices": n, "batch_size": int(config.batch_size), "max_tokens": int(config.data.max_tokens),
      "trainable_params": bench.trainable, "frozen_params": bench.frozen, "compile_s": round(compile_s, 2),
      "step_s": round(step_s, 5), "step_s_mean": round(sum(times) / len(times), 5),
      "examples_per_s": round(config.batch_size / step_s, 2), "flops_per_step": flops,
      "peak_flops_per_device": peak, "settings": args.set,
      "mfu": None if (flops is None or peak is None) else round(flops / step_s / (peak * n), 4), **mem,
      **monitor.report(),
  }), flush=True)


if __name__ == "__main__":
  main()
