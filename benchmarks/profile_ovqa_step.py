"""Where the time of the jitted OVQA train and eval steps goes: op-time shares by category, from a jax.profiler trace.

  python benchmarks/profile_ovqa_step.py [--models minilm,deberta --steps 5 --out prof.json --hlo-dir DIR]
  python benchmarks/profile_ovqa_step.py --models minilm --batch 4 --text-len 16 --frames 2 --answers 64  # smoke

The steps are the trainer's own (`steps.StepFns` built exactly as benchmarks/ovqa_vs_torch.py builds them: the
demo's MiniLM + adapters, and DeBERTa-v2 with xsmall shapes; same batch, same shapes and flags). For each step:
- XLA's `cost_analysis` of the compiled step (FLOPs, transcendentals, bytes accessed);
- the optimized HLO: every top-level instruction (a fusion, a dot, a while loop, ...) classified by what it holds,
  using the ops inside it and their jax `op_name` metadata (primitive and Flax module path), into CATEGORIES;
- a jax.profiler trace of `--steps` steady steps: XLA:CPU emits one event per executed top-level instruction
  (thunk), so each category's share = its summed event time / all events' time. The shares are relative, so they
  hold on a busy machine too (the absolute times do not); `host_share` = 1 - (union of the op intervals / traced
  wall time) is the part of a step outside the traced ops (Python dispatch, argument handling, transfers, and the
  iterations of top-level while loops, which emit no events of their own); `idle_gaps` splits it by the op before
  each gap.
Also the share by model part (attention, FFN, adapters, embeddings, answer head, optimiser) and by pass (forward,
backward, optimiser). Prints a table per step to stderr and one JSON line to stdout (and --out).
"""

import argparse
import collections
import contextlib
import glob
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import machine  # noqa: E402  pylint: disable=wrong-import-position
import ovqa_vs_torch  # noqa: E402  pylint: disable=wrong-import-position

# Categories, first match wins. A fusion holding a dot counts as matmul (the dot dominates what is fused into it).
CATEGORIES = ("matmul", "dropout RNG", "GELU (erf)", "softmax", "LayerNorm", "gather/scatter", "optimizer",
              "data movement", "other elementwise/reduce")
_RNG = re.compile(r"_bernoulli|_uniform|threefry|random_bits|random_fold_in|rng_bit_generator|random_split")
_MOVE = {"copy", "transpose", "bitcast", "reshape", "concatenate", "slice", "pad", "broadcast", "tuple",
         "get-tuple-element", "parameter", "constant", "copy-start", "copy-done", "iota", "convert"}
_GATHER = {"gather", "scatter", "dynamic-slice", "dynamic-update-slice", "select-and-scatter"}
PARTS = (("answer head", re.compile(r"answer|/lm/cls|lm_predictions|mean_subword|softmax_cross_entropy|top_k")),
         ("adapters", re.compile(r"adapter")), ("attention", re.compile(r"/attention/|rel_embeddings")),
         ("FFN", re.compile(r"/intermediate/|/output/")), ("embeddings", re.compile(r"embeddings|visual_proj")))

_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"\b(?:calls|body|condition|to_apply)=%?([\w.\-]+)|"
                     r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_OPNAME = re.compile(r'op_name="([^"]*)"')


def parse_hlo(text: str):
  """Optimized HLO text -> (entry instruction names in order, {instruction: (opcodes, op_names)} with every op of the
  computations it calls, recursively)."""
  comps, entry, cur = {}, None, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and "=" not in line.split("{")[0].split("(")[0]:
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
      continue
    if cur is None:
      continue
    if line.strip() == "}":
      cur = None
      continue
    m = _INSTR.match(line)
    if m:
      name, opcode, rest = m.groups()
      called = [c.strip().lstrip("%") for one, many in _CALLED.findall(rest) for c in (one or many).split(",")
                if c.strip()]
      op_name = _OPNAME.search(rest)
      comps[cur].append((name, opcode, op_name.group(1) if op_name else "", called))
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")

  def contents(comp, seen):
    ops, names = [], []
    for _, opcode, op_name, called in comps.get(comp, []):
      ops.append(opcode)
      names.append(op_name)
      for c in called:
        if c not in seen:
          seen.add(c)
          o, n = contents(c, seen)
          ops += o
          names += n
    return ops, names

  top = {}
  for name, opcode, op_name, called in comps[entry]:
    ops, names = [opcode], [op_name]
    for c in called:
      o, n = contents(c, {c})
      ops += o
      names += n
    top[name] = (ops, names)
  return [n for n, *_ in comps[entry]], top


def categorize(ops, op_names) -> str:
  ops_set, joined = set(ops), "\n".join(op_names)
  if ops_set & {"dot", "convolution"} or "custom-call" in ops_set and re.search(r"dot_general|matmul", joined):
    return "matmul"
  if _RNG.search(joined) or "rng-bit-generator" in ops_set:
    return "dropout RNG"
  if ops_set & {"erf", "erfc"} or re.search(r"/erfc?$", joined, re.M):  # jax's exact GELU is x * erfc(-x/√2) / 2
    return "GELU (erf)"
  if "exponential" in ops_set or re.search(r"/(exp|softmax)$", joined, re.M):
    return "softmax"
  named = [n for n in op_names if n]
  if named and "train_step" in joined and not any("jvp(" in n or "transpose(" in n for n in named):
    return "optimizer"  # the train step outside the loss's forward and backward: Adam, clipping, gradient norm
  if "LayerNorm" in joined or "rsqrt" in ops_set:
    return "LayerNorm"
  if ops_set & _GATHER:
    return "gather/scatter"
  if ops_set - {"fusion"} <= _MOVE:  # e.g. a weight transposed for the backward dot, a layout change
    return "data movement"
  return "other elementwise/reduce"


def model_part(op_names) -> str:
  names = [n for n in op_names if n]
  if not names:
    return "other"
  votes = collections.Counter()
  for n in names:
    if "train_step" in n and "jvp(" not in n and "transpose(" not in n:
      votes["optimizer"] += 1
      continue
    for part, rx in PARTS:
      if rx.search(n):
        votes[part] += 1
        break
    else:
      votes["other"] += 1
  return votes.most_common(1)[0][0]


def pass_of(op_names) -> str:
  joined = "\n".join(n for n in op_names if n)
  if "transpose(" in joined:
    return "backward"
  if "jvp(" in joined or (joined and "train_step" not in joined):  # the eval step is all forward
    return "forward"
  return "optimizer/other" if joined else "other"


def trace_events(trace_dir: str, names: set):
  """[(name, start_ns, duration_ns)] of the trace's host-plane events named like a top-level instruction."""
  import jax
  paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {trace_dir}")
  data = jax.profiler.ProfileData.from_file(sorted(paths)[-1])
  out = []
  for plane in data.planes:
    for line in plane.lines:
      for ev in line.events:
        if ev.name in names:
          out.append((ev.name, ev.start_ns, ev.duration_ns))
  return out


def union_ns(intervals) -> float:
  total, end = 0.0, None
  for s, d in sorted(intervals):
    e = s + d
    if end is None or s >= end:
      total += d
      end = e
    elif e > end:
      total += e - end
      end = e
  return total


def idle_gaps(events, kinds: dict, wall_ns: float, steps: int) -> dict:
  """Where the host share goes: the idle intervals between the traced ops (after merging overlapping ones), each
  charged to the category of the op that ends right before it. {"count_per_step", "share_of_wall", "us": {p50, p90,
  p99, max}, "share_of_wall_by_previous_op", "over_50us_per_step", "largest": [(previous op, next op, us)]}.
  Many short gaps spread over every kind of op mean per-op dispatch / thread wake-ups in XLA:CPU's executor; long
  ones after a `while` loop are its iterations (XLA:CPU emits events for top-level ops only, so a loop's body runs
  "between" them: jax's looped threefry shows up this way); long ones at step boundaries are Python or transfers."""
  spans = sorted((s, s + d, name) for name, s, d in events)
  gaps, end, last = [], None, None
  for s, e, name in spans:
    if end is not None and s > end:
      gaps.append((s - end, last, name))
    if end is None or e >= end:
      end, last = e, name
  if not gaps:
    return {"count_per_step": 0.0, "share_of_wall": 0.0}
  us = sorted(g / 1e3 for g, _, _ in gaps)
  pick = lambda q: round(us[min(len(us) - 1, int(q * len(us)))], 1)  # noqa: E731
  by_prev = collections.defaultdict(float)
  for g, prev, _ in gaps:
    by_prev[kinds.get(prev, "other elementwise/reduce")] += g
  total = sum(g for g, _, _ in gaps)
  return {"count_per_step": round(len(gaps) / steps, 1), "share_of_wall": round(total / wall_ns, 4),
          "us": {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": round(us[-1], 1)},
          "share_of_wall_by_previous_op": {k: round(v / wall_ns, 4)
                                           for k, v in sorted(by_prev.items(), key=lambda kv: -kv[1])},
          "over_50us_per_step": round(sum(1 for g, _, _ in gaps if g > 50e3) / steps, 1),
          "largest": [[prev, nxt, round(g / 1e3, 1)] for g, prev, nxt in sorted(gaps, key=lambda x: -x[0])[:5]]}


def shares(values: dict) -> dict:
  total = sum(values.values()) or 1.0
  return {k: round(v / total, 4) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}


def profile_step(name, fn, call, steps: int, hlo_dir: str) -> dict:
  """Compile `fn` for the arguments `call()` passes, analyse its HLO and cost, trace `steps` steady calls."""
  import jax
  args = call.args()
  compiled = fn.lower(*args).compile()
  text = compiled.as_text()
  if hlo_dir:
    os.makedirs(hlo_dir, exist_ok=True)
    with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
      f.write(text)
  order, top = parse_hlo(text)
  kinds = {n: categorize(*top[n]) for n in order}
  # Instructions that run (parameters, tuples and bitcasts are bookkeeping, not executed as thunks).
  executed = [n for n in order if top[n][0][0] not in ("parameter", "constant", "tuple", "get-tuple-element",
                                                       "bitcast")]
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  cost = {k: float(cost[k]) for k in ("flops", "transcendentals", "bytes accessed") if cost and k in cost}
  for _ in range(2):  # compile and warm up the real call path
    call.run(1)
  with tempfile.TemporaryDirectory(prefix="ovqa_prof_") as tdir:
    jax.profiler.start_trace(tdir)
    t0 = time.perf_counter()
    call.run(steps)
    wall_ns = (time.perf_counter() - t0) * 1e9
    jax.profiler.stop_trace()
    events = trace_events(tdir, set(order))
  if not events:
    raise RuntimeError(f"{name}: the trace holds no per-op events (XLA:CPU thunk events); cannot attribute time")
  by_cat, by_part, by_pass, by_op = (collections.defaultdict(float) for _ in range(4))
  for op, _, dur in events:
    ops, names = top[op]
    by_cat[kinds[op]] += dur
    by_part[model_part(names)] += dur
    by_pass[pass_of(names)] += dur
    by_op[op] += dur
  if hlo_dir:  # per-instruction op time next to the HLO, to reclassify or compare runs offline
    with open(os.path.join(hlo_dir, f"{name}.op_ns.json"), "w") as f:
      json.dump({op: d / steps for op, d in sorted(by_op.items(), key=lambda kv: -kv[1])}, f)
  op_total = sum(by_cat.values())
  busy = union_ns([(s, d) for _, s, d in events])
  top_ops = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
  return {
      "cost_analysis": cost, "hlo_top_level_ops": len(executed),
      "hlo_ops_per_category": dict(collections.Counter(kinds[n] for n in executed)),
      "hlo_dots": sum(top[n][0].count("dot") for n in executed),
      "traced_steps": steps, "events": len(events),
      "share_by_category": shares(by_cat), "share_by_model_part": shares(by_part), "share_by_pass": shares(by_pass),
      "host_share": round(max(0.0, 1.0 - busy / wall_ns), 4),
      "idle_gaps": idle_gaps(events, kinds, wall_ns, steps),
      "op_time_over_wall": round(op_total / wall_ns, 3),  # > 1 where ops ran on several threads at once
      "top_ops": [{"op": op, "category": kinds[op], "part": model_part(top[op][1]),
                   "share": round(d / op_total, 4)} for op, d in top_ops],
      "wall_ms_per_step_not_for_quoting": round(wall_ns / steps / 1e6, 2)}


class _Call:
  def __init__(self, args_fn, run_fn):
    self.args, self.run = args_fn, run_fn


def profile_model(model: str, args, workdir: str, monitor) -> dict:
  import jax
  config = ovqa_vs_torch.experiment_config(model)
  config.batch_size = args.batch
  config.unrolled_cpu_threefry = args.unrolled_threefry
  mlm, hf_dir = ovqa_vs_torch.build_torch(model, args, workdir)
  batch, aux = ovqa_vs_torch.make_inputs(args, mlm.config.vocab_size)
  del mlm
  jx = ovqa_vs_torch.build_jax(model, args, config, hf_dir, batch, aux)
  steps = jx["steps"]
  ctx = steps.context if model == "minilm" else contextlib.nullcontext  # see ovqa_vs_torch.run_model
  state = {"s": jx["state"]}

  def train(n):
    with ctx():
      for _ in range(n):
        state["s"], m = steps.train_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(m)

  def infer(n):
    with ctx():
      for _ in range(n):
        o = steps.eval_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(o)

  out = {}
  for mode, fn, run in (("train", steps.train_step, train), ("eval", steps.eval_step, infer)):
    print(f"[{model}] profiling the {mode} step", file=sys.stderr, flush=True)
    with ctx():
      with monitor.block(f"{model}/{mode}"):
        out[mode] = profile_step(f"{model}_{mode}", fn, _Call(lambda: (state["s"], jx["batch"], jx["aux"]), run),
                                 args.steps, args.hlo_dir)
    print_table(model, mode, out[mode])
  return out


def print_table(model, mode, r) -> None:
  print(f"\n{model} {mode} step: {r['cost_analysis'].get('flops', 0):.3g} FLOPs, host share "
        f"{r['host_share']:.1%}", file=sys.stderr)
  for cat, share in r["share_by_category"].items():
    print(f"  {cat:<28s} {share:6.1%}", file=sys.stderr)
  print("  by part: " + ", ".join(f"{k} {v:.1%}" for k, v in r["share_by_model_part"].items()), file=sys.stderr)
  print("  by pass: " + ", ".join(f"{k} {v:.1%}" for k, v in r["share_by_pass"].items()), file=sys.stderr, flush=True)
  g = r.get("idle_gaps") or {}
  if g.get("count_per_step"):
    print(f"  idle between ops: {g['share_of_wall']:.1%} of wall in {g['count_per_step']:.0f} gaps per step "
          f"(median {g['us']['p50']} us, p90 {g['us']['p90']} us, max {g['us']['max']} us)", file=sys.stderr, flush=True)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ovqa_vs_torch.add_model_arguments(p)  # the shared builders read these
  p.add_argument("--steps", type=int, default=5, help="traced steady steps per step function")
  p.add_argument("--hlo-dir", default="", help="write each step's optimized HLO text and per-op time here")
  p.add_argument("--out", default="")
  p.add_argument("--unrolled-threefry", action="store_true",
                 help="config.unrolled_cpu_threefry: evqa_jax's steps draw dropout masks with the unrolled threefry")
  machine.add_arguments(p)
  args = p.parse_args(argv)
  import transformers
  transformers.logging.set_verbosity_error()
  monitor = machine.monitor_from_args(args)
  result = {"benchmark": "profile_ovqa_step",
            "setting": {"batch": args.batch, "visual_tokens": args.frames, "text_tokens": args.text_len,
                        "answers": args.answers, "dropout": args.dropout, "deberta_layers": args.deberta_layers,
                        "traced_steps": args.steps, "unrolled_cpu_threefry": args.unrolled_threefry},
            "models": {}}
  with tempfile.TemporaryDirectory(prefix="ovqa_prof_") as workdir:
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
      if model not in ("minilm", "deberta"):
        raise SystemExit(f"--models: unknown model {model!r} (minilm, deberta)")
      result["models"][model] = profile_model(model, args, workdir, monitor)
  # Shares are relative and hold under load; the verdict still says whether the wall times could be quoted.
  result.update(monitor.report())
  line = json.dumps(result)
  print(line, flush=True)
  if args.out:
    from evqa_jax import io as io_lib
    io_lib.write_text(args.out, line + "\n")
  return result


if __name__ == "__main__":
  main()
