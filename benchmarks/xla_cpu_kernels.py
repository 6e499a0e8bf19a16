"""The OVQA demo step's matmuls, XLA:CPU against PyTorch, and the step under candidate XLA:CPU flags.

`benchmarks/ovqa_vs_torch.py` times whole steps; this script looks one level down, at what bounds them on a CPU:

  python benchmarks/xla_cpu_kernels.py --out docs/benchmarks/xla_cpu_kernels.json
  python benchmarks/xla_cpu_kernels.py --flag-sets='--xla_cpu_use_xnnpack=true;--xla_cpu_use_onednn=true' ...

1. GEMMs: every matmul shape of one MiniLM-L6 layer of the demo step (batch x (text + visual tokens) rows, hidden
   384, 12 heads of 32, FFN 1536): the dense projections (forward, and the backward's data gradient, which contracts
   the weight's other dimension), and the attention's two batched matmuls ([batch, heads] small matrices).
   `jnp.matmul`/`jnp.einsum` under `jax.jit` against `torch.matmul` on the same arrays (parity checked), blocks
   alternating; GFLOP/s per shape and the shape's share of the layer's matmul FLOPs (forward).
2. Flag screen (`--flag-sets`, `;`-separated, each a string of XLA flags): for each set, and for jax's defaults
   before and after them, a subprocess builds the OVQA MiniLM demo step exactly as ovqa_vs_torch.py does (the
   trainer's StepFns, real MiniLM weights) with XLA_FLAGS = the environment's flags + the set, and times the train
   and eval steps (JAX only: the sets do not touch PyTorch). It also reports the first three train losses to every
   digit, so a set that changes the numerics (a different kernel, a different summation order) shows as
   `same_numerics: false`.

The whole run is one `machine.Monitor` (each subprocess is a block whose CPU counts as this run's own), so the JSON
says whether the machine was idle enough to quote (`usable`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402  pylint: disable=wrong-import-position
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HIDDEN, HEADS, HEAD_DIM, FFN = 384, 12, 32, 1536  # MiniLM-L6 (all-MiniLM-L6-v2)
# Flags of this jaxlib that choose other matmul / fusion kernels or another scheduler (the default screen).
DEFAULT_FLAG_SETS = (
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_use_xnnpack=true --xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
    "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "--xla_cpu_experimental_ynn_fusion_type=dot",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_prefer_vector_width=512",
    "--xla_cpu_enable_concurrency_optimized_scheduler=true",
)


def gemm_shapes(batch: int, tokens: int) -> list[dict]:
  """One encoder layer's matmuls: name, einsum equation, operand shapes, FLOPs (2 per multiply-add) and how many
  times the forward pass runs it per layer."""
  rows = batch * tokens
  bh = (batch, HEADS)
  return [
      dict(name="dense_hxh", eq="sh,ho->so", a=(rows, HIDDEN), b=(HIDDEN, HIDDEN), per_layer=4,
           what="query/key/value/output projections"),
      dict(name="ffn_up", eq="sh,ho->so", a=(rows, HIDDEN), b=(HIDDEN, FFN), per_layer=1, what="FFN up"),
      dict(name="ffn_down", eq="sh,ho->so", a=(rows, FFN), b=(FFN, HIDDEN), per_layer=1, what="FFN down"),
      dict(name="ffn_down_dx", eq="so,ho->sh", a=(rows, HIDDEN), b=(FFN, HIDDEN), per_layer=0,
           what="backward: FFN down's input gradient (the weight's other dimension contracted)"),
      dict(name="attn_scores", eq="bnqd,bnkd->bnqk", a=bh + (tokens, HEAD_DIM), b=bh + (tokens, HEAD_DIM),
           per_layer=1, what="attention scores, one small matmul per (example, head)"),
      dict(name="attn_context", eq="bnqk,bnkd->bnqd", a=bh + (tokens, tokens), b=bh + (tokens, HEAD_DIM),
           per_layer=1, what="attention context"),
  ]


def gemm_flops(spec: dict) -> int:
  """2 x the product of the einsum's distinct index sizes (every index of a matmul appears once in the product)."""
  lhs, rest = spec["eq"].split(",")
  rhs, _ = rest.split("->")
  sizes = dict(zip(lhs, spec["a"]))
  sizes.update(zip(rhs, spec["b"]))
  n = 2
  for v in sizes.values():
    n *= v
  return n


def run_gemms(args, monitor) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  torch.set_num_threads(args.threads)
  specs = gemm_shapes(args.batch, args.text_len + args.frames)
  fwd_total = sum(gemm_flops(s) * s["per_layer"] for s in specs)
  rng = np.random.default_rng(0)
  out = {}
  for s in specs:
    a = rng.standard_normal(s["a"]).astype(np.float32)
    b = rng.standard_normal(s["b"]).astype(np.float32)
    f = jax.jit(lambda x, y, eq=s["eq"]: jnp.einsum(eq, x, y))
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    g = lambda x, y, eq=s["eq"]: torch.einsum(eq, x, y)  # noqa: E731  (torch.einsum dispatches to bmm/mm)
    want = np.einsum(s["eq"], a.astype(np.float64), b.astype(np.float64))
    got_j, got_t = np.asarray(f(ja, jb)), g(ta, tb).numpy()
    scale = float(np.max(np.abs(want)))
    parity = {"jax": float(np.max(np.abs(got_j - want))) / scale, "torch": float(np.max(np.abs(got_t - want))) / scale}
    if max(parity.values()) > 1e-5:
      raise RuntimeError(f"{s['name']}: a side disagrees with float64 numpy (relative max error {parity})")
    flops = gemm_flops(s)
    reps = max(1, int(args.gemm_seconds * 100e9 / flops / args.repeats))  # ~100 GFLOP/s: blocks of about that long

    def jax_block(n):
      for _ in range(n):
        y = f(ja, jb)
      y.block_until_ready()

    def torch_block(n):
      for _ in range(n):
        g(ta, tb)

    sides = {"jax": jax_block, "torch": torch_block}
    for fn in sides.values():
      fn(2)
    rates = {k: [] for k in sides}
    for r in range(args.repeats):
      for side in (("jax", "torch") if r % 2 == 0 else ("torch", "jax")):
        with monitor.block(f"gemm/{s['name']}/{side}/{r}"):
          t0 = time.perf_counter()
          sides[side](reps)
          rates[side].append(reps * flops / (time.perf_counter() - t0) / 1e9)
    raw = {k: statistics.median(v) for k, v in rates.items()}
    med = {k: float(f"{x:.4g}") for k, x in raw.items()}  # 4 significant digits: tiny test shapes run at < 0.1
    out[s["name"]] = {"what": s["what"], "einsum": s["eq"], "a": list(s["a"]), "b": list(s["b"]), "flops": flops,
                      "share_of_layer_forward_flops": round(gemm_flops(s) * s["per_layer"] / fwd_total, 4),
                      "gflops_per_s": med, "ratio_jax_over_torch": round(raw["jax"] / raw["torch"], 3),
                      "blocks_gflops_per_s": {k: [float(f"{x:.4g}") for x in v] for k, v in rates.items()},
                      "relative_error_vs_float64": parity, "calls_per_block": reps}
    print(f"[gemm] {s['name']:>13}: jax {med['jax']:.1f} torch {med['torch']:.1f} GFLOP/s "
          f"({out[s['name']]['ratio_jax_over_torch']}x)", file=sys.stderr, flush=True)
  return out


# ------------------------------------------------------------------------------------------------ flag screen


def step_child(args) -> dict:
  """In a subprocess with the set's XLA_FLAGS: the OVQA MiniLM demo step (ovqa_vs_torch's build), JAX only."""
  import ovqa_vs_torch as ovt

  config = ovt.experiment_config("minilm")
  config.batch_size = args.batch
  config.unrolled_cpu_threefry = args.unrolled_threefry
  with tempfile.TemporaryDirectory(prefix="xla_kernels_") as workdir:
    mlm, hf_dir = ovt.build_torch("minilm", args, workdir)
    batch, aux = ovt.make_inputs(args, mlm.config.vocab_size)
    jx = ovt.build_jax("minilm", args, config, hf_dir, batch, aux)
  train, infer = ovt.jax_step_runners(jx, jx["steps"].context)
  t0 = time.perf_counter()
  train(1)
  first_train = time.perf_counter() - t0
  t0 = time.perf_counter()
  infer(1)
  first_infer = time.perf_counter() - t0
  losses = [repr(float(train(1)["loss"])) for _ in range(3)]  # steps 2-4: after the first update
  rates = {"train": [], "infer": []}
  for _ in range(args.repeats):
    for mode, fn in (("train", train), ("infer", infer)):
      t0 = time.perf_counter()
      fn(args.steps)
      rates[mode].append(args.steps * args.batch / (time.perf_counter() - t0))
  return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "first_call_s": {"train": round(first_train, 1),
                                                                          "infer": round(first_infer, 1)},
          "examples_per_s": {m: round(statistics.median(v), 2) for m, v in rates.items()},
          "examples_per_s_blocks": {m: [round(x, 2) for x in v] for m, v in rates.items()}, "losses": losses}


def child_argv(args) -> list[str]:
  argv = ["--child-step", "--batch", str(args.batch), "--text-len", str(args.text_len), "--frames", str(args.frames),
          "--minilm-layers", str(args.minilm_layers), "--visual-dim", str(args.visual_dim), "--answers", str(args.answers),
          "--dropout", str(args.dropout), "--steps", str(args.steps), "--repeats", str(args.repeats)]
  return argv + (["--unrolled-threefry"] if args.unrolled_threefry else [])


def run_flag_screen(args, flag_sets: list[str], monitor) -> dict:
  base_flags = os.environ.get("XLA_FLAGS", "")
  runs = [("default", "")] + [(fs, fs) for fs in flag_sets] + [("default (again)", "")]
  out = []
  for label, flags in runs:
    env = dict(os.environ, XLA_FLAGS=(base_flags + " " + flags).strip())
    cmd = [sys.executable, os.path.abspath(__file__)] + child_argv(args)
    with monitor.block(f"step/{label}"):
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
      tail = (proc.stderr or "")[-1500:]
      out.append({"flags": flags, "error": f"exit status {proc.returncode}", "stderr_tail": tail})
      print(f"[step] {label}: FAILED (exit {proc.returncode})", file=sys.stderr, flush=True)
      continue
    rec = dict(json.loads(lines[-1]), flags=flags)
    out.append(rec)
    print(f"[step] {label}: train {rec['examples_per_s']['train']} infer {rec['examples_per_s']['infer']} ex/s, "
          f"losses {rec['losses']}", file=sys.stderr, flush=True)
  ok = [r for r in out if "error" not in r]
  defaults = [r for r in ok if not r["flags"]]
  if defaults:
    ref = {m: statistics.mean(r["examples_per_s"][m] for r in defaults) for m in ("train", "infer")}
    for r in ok:
      r["same_numerics"] = r["losses"] == defaults[0]["losses"]
      r["vs_default"] = {m: round(r["examples_per_s"][m] / ref[m], 3) for m in ("train", "infer")}
  return {"runs": out, "flag_sets": flag_sets}


def main(argv=None) -> dict:
  import ovqa_vs_torch as ovt

  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ovt.add_model_arguments(p)
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (the GEMM part)")
  p.add_argument("--repeats", type=int, default=3, help="timed blocks per side (GEMMs) / per mode (steps)")
  p.add_argument("--gemm-seconds", type=float, default=1.0, help="about how long each GEMM side is timed, in all")
  p.add_argument("--steps", type=int, default=5, help="steps per timed step block")
  p.add_argument("--flag-sets", default=None,
                 help="';'-separated XLA flag strings to screen on the step (default: the DEFAULT_FLAG_SETS; "
                      "'' for none)")
  p.add_argument("--no-gemms", action="store_true", help="only the flag screen")
  p.add_argument("--unrolled-threefry", action="store_true", help="config.unrolled_cpu_threefry in the step")
  p.add_argument("--child-step", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--out", default="")
  machine.add_arguments(p)
  args = p.parse_args(argv)
  if args.child_step:
    rec = step_child(args)
    print(json.dumps(rec), flush=True)
    return rec
  flag_sets = (list(DEFAULT_FLAG_SETS) if args.flag_sets is None
               else [s.strip() for s in args.flag_sets.split(";") if s.strip()])
  monitor = machine.monitor_from_args(args)
  result = {"benchmark": "xla_cpu_kernels",
            "setting": {"batch": args.batch, "tokens": args.text_len + args.frames, "hidden": HIDDEN,
                        "heads": HEADS, "head_dim": HEAD_DIM, "ffn": FFN, "dtype": "float32",
                        "torch_threads": args.threads, "repeats": args.repeats, "steps_per_block": args.steps,
                        "minilm_layers": args.minilm_layers, "unrolled_cpu_threefry": args.unrolled_threefry}}
  if not args.no_gemms:
    result["gemms"] = run_gemms(args, monitor)
  if flag_sets:
    result["flag_screen"] = run_flag_screen(args, flag_sets, monitor)
  result.update(monitor.report())
  text = json.dumps(result, indent=1)
  if args.out:
    from evqa_jax import io as io_lib  # pylint: disable=import-outside-toplevel
    io_lib.write_text(args.out, text + "\n")
  print(text)
  return result


if __name__ == "__main__":
  main()
