"""What one more DeBERTa-v2 layer adds to the OVQA train step on a TPU chip, by XLA's compiled counts: the encoder
stack alone compiled at two depths for one chip (no data, no weights), and the step extrapolated linearly in depth.

    python benchmarks/layer_slope.py --relative_gather=pallas --remat=none --out docs/benchmarks/layer_slope.jsonl
    python benchmarks/layer_slope.py --relative_gather=rows --remat=full      # the check against full-step compiles

Why: a 24-layer paper-shape step compiles in about 6.5 minutes on an idle 2-core host and many times that on a busy
one, while the per-layer figures need only the layer. What compiles: `DebertaV2Encoder` of DeBERTa-v2-xlarge with
the OVQA model's settings (adapters, bf16 compute, the trainable parameters -- adapters and LayerNorms, configs/
ovqa_frozenbilm_common.py `trainable` -- in float32, the frozen ones in bf16 as `frozen_param_dtype=bfloat16`,
dropout on), forward and backward (gradients of the trainable parameters and of the input hidden states, as inside
the step), `--batch` rows of 266 tokens (10 video + 256 text) on one chip of `--topology`, at `--depths` layers
(the first layer carries the conv, so the difference of two depths >= 1 is one plain layer). The slope is the
difference of the two compiles' FLOPs, bytes accessed, transcendentals and temp bytes per added layer. What it
leaves out against the real step: the data-parallel mesh (frozen_fsdp's all-gather of each layer's frozen weights:
at most 2 x 57 MB written and read per layer and pass, about 3% of a layer's bytes at 32 rows). A Pallas kernel
counts by its declared pl.CostEstimate, as in the compile table.

With `--step_row` (a compile-table JSONL row of the full step at depth d0, same batch per chip) the row's FLOPs,
bytes and peak are extrapolated to `--to_depth` layers: X(to) = X(d0) - d0 x slope(row's remat) + to x slope
(what is not a layer does not depend on remat), model FLOPs by the no-remat slope; with the chip's roofline
(benchmarks/chips.py) that gives the step's MFU ceilings, labelled `extrapolated`, with the fit's points.
"""

import argparse
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import chips  # noqa: E402  pylint: disable=wrong-import-position
import machine  # noqa: E402  pylint: disable=wrong-import-position

SEQ = 266  # 10 video tokens + 256 text tokens: the OVQA paper step's sequence
TRAINABLE = re.compile("adapter|LayerNorm")  # configs/ovqa_frozenbilm_common.py `trainable`, within the LM
KEYS = ("flops", "bytes_accessed", "transcendentals", "temp_size_in_bytes")


def compile_encoder(depth: int, relative_gather: str, remat: str, batch: int, device, seq: int = SEQ) -> dict:
  """XLA's analysis of the encoder stack's forward + backward at `depth` layers on `device`."""
  import flax  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from evqa_jax.models import deberta_v2 as D  # pylint: disable=import-outside-toplevel
  from evqa_jax.train import aot  # pylint: disable=import-outside-toplevel

  cfg = D.DebertaV2Config.xlarge(num_hidden_layers=depth, use_adapters=True, dtype=jnp.bfloat16,
                                 relative_gather=relative_gather, remat=remat)
  enc = D.DebertaV2Encoder(cfg)
  hidden = (batch, seq, cfg.hidden_size)
  shapes = jax.eval_shape(lambda: enc.init(jax.random.key(0), jnp.zeros(hidden, jnp.bfloat16),
                                           jnp.ones(hidden[:2], bool)))
  flat = flax.traverse_util.flatten_dict(flax.linen.meta.unbox(shapes)["params"], sep="/")
  sharding = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # noqa: E731
  trainable = {k: spec(v.shape, jnp.float32) for k, v in flat.items() if TRAINABLE.search(k)}
  frozen = {k: spec(v.shape, jnp.bfloat16) for k, v in flat.items() if not TRAINABLE.search(k)}

  def step(trainable, frozen, x, valid, key):
    def loss(trainable, x):
      params = flax.traverse_util.unflatten_dict({**trainable, **frozen}, sep="/")
      out, _ = enc.apply({"params": params}, x, valid, deterministic=False, rngs={"dropout": key})
      return out.astype(jnp.float32).sum()
    return jax.grad(loss, argnums=(0, 1))(trainable, x)

  t0 = time.process_time()
  compiled = jax.jit(step).lower(trainable, frozen, spec(hidden, jnp.bfloat16), spec(hidden[:2], jnp.bool_),
                                 spec((), jax.random.key(0).dtype)).compile()
  report = aot.analysis(compiled)
  report.update(depth=depth, compile_cpu_s=round(time.process_time() - t0, 1))
  return report


def while_loop_counts(device, steps=(1, 2, 4)) -> dict:
  """XLA's FLOPs of grad(sum(tanh(x @ w_i) chained over i)) with the steps as a lax.scan (a while loop) and unrolled:
  whether the compiled cost analysis counts a loop body once per trip (a scanned layer stack's FLOPs)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  sharding = jax.sharding.SingleDeviceSharding(device)

  def body(x, w):
    return jnp.tanh(x @ w), None

  def scanned(x, ws):
    return jax.lax.scan(body, x, ws)[0].sum()

  def unrolled(x, ws):
    for i in range(ws.shape[0]):
      x = body(x, ws[i])[0]
    return x.sum()

  out = {"scanned": [], "unrolled": [], "steps": list(steps)}
  for n in steps:
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=sharding)
    ws = jax.ShapeDtypeStruct((n, 512, 512), jnp.float32, sharding=sharding)
    for name, fn in (("scanned", scanned), ("unrolled", unrolled)):
      out[name].append(jax.jit(jax.grad(fn, argnums=1)).lower(x, ws).compile().cost_analysis()["flops"])
  return out


def extrapolate(row: dict, row_slope: dict, depth0: int, to_depth: int, slope: dict, model_slope: dict) -> dict:
  """The compile-table `row` (the full step at depth0, whose layers have `row_slope`) carried to `to_depth` layers
  of `slope`: X = X(row) - depth0 x row_slope + to_depth x slope (what is not a layer does not depend on remat);
  model FLOPs the same with the no-remat slope; then the chip's roofline."""
  def carry(key, value, s):
    return value - depth0 * row_slope[key] + to_depth * s[key]
  out = {k: carry(k, row[k], slope) for k in ("flops", "bytes_accessed")}
  out["peak_estimate_bytes"] = carry("temp_size_in_bytes", row["peak_estimate_bytes"], slope)
  out["model_flops"] = carry("flops", row["model_flops"], model_slope)
  roof = chips.roofline(dict(row, **out), chips.peak_flops(row.get("device_kind", "")))
  return dict(out, depth=to_depth, **roof)


def earlier_slope(path: str, relative_gather: str, remat: str, batch: int, seq: int) -> dict:
  """slope_per_layer of the last line of `path` (this script's output) with these settings."""
  found = None
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        r = json.loads(line) if line.strip() else {}
        if (r.get("relative_gather"), r.get("remat"), r.get("batch_per_chip"), r.get("seq")) == (
            relative_gather, remat, batch, seq):
          found = r["slope_per_layer"]
  if found is None:
    raise SystemExit(f"{path}: no earlier line with relative_gather={relative_gather} remat={remat} batch={batch} "
                     f"seq={seq} (run that slope first)")
  return found


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--relative_gather", default="pallas")
  parser.add_argument("--remat", default="none")
  parser.add_argument("--batch", type=int, default=32, help="rows on the chip (the step's per-device batch)")
  parser.add_argument("--depths", default="1,2", help="two encoder depths, e.g. 1,2")
  parser.add_argument("--seq", type=int, default=SEQ, help="tokens per row (266: the paper step's; 256: no padding "
                      "of the kernel's sequence, a prompt 10 tokens shorter)")
  parser.add_argument("--topology", default="v5e:2x2", help="TPU topology whose first chip compiles")
  parser.add_argument("--step_row", help="compile-table JSONL file and command substring: FILE::SUBSTRING")
  parser.add_argument("--step_depth", type=int, default=2, help="the --step_row's LM depth")
  parser.add_argument("--step_remat", default=None, help="the --step_row's remat (default --remat); another one's "
                      "slope (and the no-remat slope, for model FLOPs) is read from --out's earlier lines")
  parser.add_argument("--to_depth", type=int, default=24)
  parser.add_argument("--out", help="append the JSON line to this file (temp file + rename)")
  parser.add_argument("--while_loop_check", action="store_true", help="only print XLA's FLOPs of a small scan vs "
                      "the same steps unrolled (does the cost analysis count a loop body per trip?)")
  machine.add_arguments(parser)
  args = parser.parse_args()
  depths = [int(x) for x in args.depths.split(",")]
  if len(depths) != 2 or not 1 <= depths[0] < depths[1]:
    raise SystemExit(f"--depths={args.depths!r}: two increasing depths >= 1, e.g. 1,2")
  from evqa_jax.train import aot  # pylint: disable=import-outside-toplevel
  device = aot.topology_devices(args.topology)[0]
  if args.while_loop_check:
    print(json.dumps(dict(while_loop_counts(device), device_kind=device.device_kind)), flush=True)
    return
  monitor = machine.monitor_from_args(args)
  points = []
  for depth in depths:
    with monitor.block(f"encoder depth {depth}"):
      points.append(compile_encoder(depth, args.relative_gather, args.remat, args.batch, device, args.seq))
    print(json.dumps({k: points[-1].get(k) for k in ("depth", "compile_cpu_s") + KEYS}), file=sys.stderr, flush=True)
  slope = {k: (points[1][k] - points[0][k]) / (depths[1] - depths[0]) for k in KEYS}
  result = {"command": "python benchmarks/layer_slope.py " + " ".join(sys.argv[1:]), "relative_gather":
            args.relative_gather, "remat": args.remat, "batch_per_chip": args.batch, "seq": args.seq,
            "device_kind": device.device_kind, "points": points, "slope_per_layer": slope}
  if args.step_row:
    path, _, needle = args.step_row.partition("::")
    with open(path) as f:
      rows = [json.loads(l) for l in f if l.strip()]
    match = [r for r in rows if needle in r.get("command", "") and "error" not in r]
    if len(match) != 1:
      raise SystemExit(f"--step_row={args.step_row!r}: {len(match)} rows of {path} match (one needed)")
    result["step_row"] = {"command": match[0]["command"], "depth": args.step_depth,
                          **{k: match[0][k] for k in ("flops", "bytes_accessed", "peak_estimate_bytes")}}
    step_remat = args.step_remat or args.remat
    def slope_of(remat):
      return slope if remat == args.remat else earlier_slope(args.out or "", args.relative_gather, remat, args.batch,
                                                                  args.seq)
    result["step_row"]["remat"] = step_remat
    result["extrapolated"] = extrapolate(match[0], slope_of(step_remat), args.step_depth, args.to_depth, slope,
                                         slope_of("none"))
  result.update(monitor.report())
  line = json.dumps(result, sort_keys=True)
  print(line, flush=True)
  if args.out:
    tmp = args.out + ".tmp"
    old = open(args.out).read() if os.path.exists(args.out) else ""
    with open(tmp, "w") as f:
      f.write(old + line + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
  main()
