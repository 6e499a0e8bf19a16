"""Where a compiled train step's bytes and FLOPs go: XLA's optimized HLO of the step, per top-level instruction,
grouped by the JAX operation it came from; one JSON line (and a Markdown table with --markdown).

    python benchmarks/step_breakdown.py --config=configs/ovqa_msrvtt.py:scale,shapes_only,bf16 \\
        --config.model.remat=full --config.pretrained.shape.num_hidden_layers=2 --mesh=8x1 --topology=v5e:2x4

What compiles is the trainer's own step (evqa_jax.train.aot.lower_train_step, as launch/aot_check.py). Bytes of an
instruction = its operands' bytes + its result's bytes, as XLA's cost analysis charges a fusion (an async
copy or slice: the bytes it moves, once for the start/done pair); instructions
inside a while loop's body are counted once per static trip count when XLA states it (`known_trip_count`), else
once. FLOPs are counted for dots and convolutions (2 x result elements x contracted size), in fusions too. Groups:
the instruction's opcode (a fusion by its kind) and the `op_name` metadata's innermost named JAX scope (e.g.
`DisentangledSelfAttention`, `Verbalizer`), so the table says which layer of the model moves the bytes. The totals
are printed beside XLA's `cost_analysis()` totals: the parse is an estimate of the same quantity, not a second
measurement.
"""

import collections
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import chips  # noqa: E402  pylint: disable=wrong-import-position

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
         "replica-id", "iota", "opt-barrier"}


def shape_bytes(text: str) -> int:
  """Total bytes of every array type in `text` (a result type or an operand list)."""
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    total += n * _BYTES.get(dtype, 4)
  return total


def _dims(text: str):
  m = _SHAPE.search(text)
  return [int(d) for d in m.group(2).split(",") if d] if m else []


def _dot_flops(result: str, rest: str, types=None, operands=()) -> float:
  """2 x result elements x contracted size of a dot (`lhs_contracting_dims`) or convolution; operand types from
  `types` (named operands) or inline in `rest`."""
  out = 1
  for d in _dims(result):
    out *= d
  shapes = [types.get(o, "") for o in operands] if types else []
  operand_dims = [_dims(t) for t in shapes if t] or [[int(d) for d in m[1].split(",") if d]
                                                     for m in _SHAPE.findall(rest)]
  if not operand_dims:
    return 0.0
  lhs = operand_dims[0]
  m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
  if m:
    k = 1
    for i in m.group(1).split(","):
      if i and int(i) < len(lhs):
        k *= lhs[int(i)]
    return 2.0 * out * k
  m = re.search(r"dim_labels=(\w+)_(\w+)->", rest)
  if m and len(operand_dims) > 1:  # convolution: contracted = input features x kernel window
    k = 1
    for label, size in zip(m.group(2), operand_dims[1]):
      if label != "o":
        k *= size
    return 2.0 * out * k
  return 0.0


def parse_hlo(text: str):
  """Optimized HLO module text -> (computations {name: [instruction dicts]}, entry name, {instruction: result type}).
  Computations start at an unindented line ending in "{"; operands are named, so their types come from the table."""
  comps, entry, current, types = {}, None, None, {}
  for line in text.splitlines():
    if line[:1] not in (" ", "\t", "") and line.rstrip().endswith("{"):
      m = _COMP.match(line)
      if m:
        current = m.group(1)
        comps[current] = []
        if line.startswith("ENTRY"):
          entry = current
      continue
    if current is None:
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, result, opcode, rest = m.groups()
    types[name] = result
    meta = re.search(r'op_name="([^"]*)"', rest)
    calls = re.findall(r"(?:calls|body|to_apply|condition|branch_computations)=\{?([%\w.\-, ]+)\}?", rest)
    trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
    kind = re.search(r"kind=(k\w+)", rest)
    depth, end = 1, 0
    for i, ch in enumerate(rest):  # the operand list: up to the parenthesis that closes opcode(
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        end = i
        break
    operands = re.findall(r"%([\w.\-]+)", rest[:end])
    comps[current].append(dict(name=name, result=result, opcode=opcode, rest=rest, operands=operands,
                               op_name=meta.group(1) if meta else "", kind=kind.group(1) if kind else "",
                               calls=[c.strip().lstrip("%") for cs in calls for c in cs.split(",") if c.strip()],
                               body=re.findall(r"body=%?([\w.\-]+)", rest),
                               trip=int(trip.group(1)) if trip else 1))
  return comps, entry, types


def _fusion_flops(comps, name, types) -> float:
  total = 0.0
  for ins in comps.get(name, []):
    if ins["opcode"] in ("dot", "convolution"):
      total += _dot_flops(ins["result"], ins["rest"], types, ins["operands"])
    for c in ins["calls"]:
      total += _fusion_flops(comps, c, types)
  return total


def scope_of(op_name: str, depth: int = 6) -> str:
  """A JAX op_name as a module path: transformation wrappers dropped, layer numbers folded (`layer_*`), the final
  primitive dropped, at most `depth` components; "bwd:" when it came from a transpose (the backward pass)."""
  backward = "transpose(" in op_name
  parts = [p for p in op_name.split("/") if p and not re.match(r"^(jit|jvp|transpose|remat|checkpoint|vmap)\(", p)]
  parts = [re.sub(r"^layer_\d+$", "layer_*", p) for p in parts][:-1]
  parts = [p for p in parts if p not in ("Model.mask_feature", "lm", "deberta")]
  return ("bwd:" if backward else "") + ("/".join(parts[:depth]) or "?")


def token_pair_dims(seq_len: int) -> tuple:
  """The dimension sizes of a token-pair array of a sequence of `seq_len` positions: S (query or key), 2S - 1 and
  2S - 2 (DeBERTa's relative rows, before and after the skew), and their flattened products S x (2S - 1), S x (2S - 2),
  S x S (a reshape of the skew)."""
  s = int(seq_len)
  single = (s, 2 * s - 1, 2 * s - 2)
  return single, (s * s, s * (2 * s - 1), s * (2 * s - 2))


def is_token_pair(dims, pair_dims) -> bool:
  """An array that grows with the square of the sequence (attention scores, c2p / p2c products and their skew):
  two dimensions of the token-pair sizes, or one flattened token-pair dimension."""
  single, flat = pair_dims
  return sum(1 for d in dims if d in single) >= 2 or any(d in flat for d in dims)


def _arrays(text: str):
  for dtype, dims in _SHAPE.findall(text):
    ds = [int(d) for d in dims.split(",") if d]
    n = 1
    for d in ds:
      n *= d
    yield ds, n * _BYTES.get(dtype, 4)


def breakdown(text: str, seq_len: int = 0) -> dict:
  """Bytes and dot FLOPs of the module's top-level work (entry and loop bodies), by opcode and by scope. With
  `seq_len` (the padded sequence the LM attends over), also each array's bytes split into token-pair arrays
  (`is_token_pair`) and the rest, inside the LM's layers (an op_name with `layer_N`, the enhanced mask decoder
  excluded) and outside them: `bytes_token_pair`."""
  comps, entry, types = parse_hlo(text)
  pair_dims = token_pair_dims(seq_len) if seq_len else None
  pairs = collections.Counter()
  by_op, by_scope = collections.Counter(), collections.Counter()
  flops_op, flops_scope = collections.Counter(), collections.Counter()
  totals = {"bytes": 0.0, "dot_flops": 0.0}

  def walk(name, times, seen):
    if name in seen:
      return
    for ins in comps.get(name, []):
      op = ins["opcode"]
      if op == "while":
        for c in ins["body"]:
          walk(c, times * ins["trip"], seen | {name})
        continue
      if op in ("call", "conditional") and ins["calls"]:
        for c in ins["calls"]:
          walk(c, times, seen | {name})
        continue
      if op in _FREE:
        continue
      read = sum(shape_bytes(types.get(o, "")) for o in ins["operands"])
      if op.endswith("-done"):  # the async pair's transfer is charged once, to its start
        continue
      # An async start's result tuple repeats its operand beside the destination: charge the destination's bytes
      # (what is moved: a slice-start reads only its slice).
      b = (shape_bytes(ins["result"]) - read if op.endswith("-start") else shape_bytes(ins["result"]) + read) * times
      if pair_dims:
        where = "layers" if re.search(r"/layer_\d+/", ins["op_name"]) and "enhanced_mask" not in ins["op_name"] \
            else "rest"
        if op.endswith("-start"):
          kind = "token_pair" if any(is_token_pair(d, pair_dims) for d, _ in _arrays(ins["result"])) else "other"
          pairs[f"{where}:{kind}"] += b
        else:
          arrays = list(_arrays(ins["result"])) + [a for o in ins["operands"] for a in _arrays(types.get(o, ""))]
          for d, nbytes in arrays:
            pairs[f"{where}:{'token_pair' if is_token_pair(d, pair_dims) else 'other'}"] += nbytes * times
      if op == "fusion":
        f = sum(_fusion_flops(comps, c, types) for c in ins["calls"]) * times
        key = f"fusion:{ins['kind']}"
      else:
        f = _dot_flops(ins["result"], ins["rest"], types, ins["operands"]) * times if op in ("dot", "convolution") \
            else 0.0
        key = op
      scope = scope_of(ins["op_name"])
      by_op[key] += b
      by_scope[scope] += b
      flops_op[key] += f
      flops_scope[scope] += f
      totals["bytes"] += b
      totals["dot_flops"] += f

  walk(entry, 1, frozenset())
  top = lambda c, n: [[k, v] for k, v in c.most_common(n)]  # noqa: E731
  report = {"parsed_bytes": totals["bytes"], "parsed_dot_flops": totals["dot_flops"],
            "bytes_by_opcode": top(by_op, 15), "bytes_by_scope": top(by_scope, 30),
            "dot_flops_by_scope": top(flops_scope, 15)}
  if pair_dims:
    report["seq_len"] = int(seq_len)
    report["bytes_token_pair"] = {k: pairs[k] for k in ("layers:token_pair", "layers:other", "rest:token_pair",
                                                        "rest:other")}
  return report


def markdown(report: dict) -> str:
  out = ["| scope | bytes | share of parsed bytes |", "|---|---:|---:|"]
  total = report["parsed_bytes"] or 1.0
  for scope, b in report["bytes_by_scope"]:
    out.append(f"| {scope} | {b:.3g} | {b / total:.1%} |")
  out += ["", "| opcode | bytes | share |", "|---|---:|---:|"]
  for op, b in report["bytes_by_opcode"]:
    out.append(f"| {op} | {b:.3g} | {b / total:.1%} |")
  if "bytes_token_pair" in report:
    out += ["", f"| part (sequence {report['seq_len']}) | bytes | share |", "|---|---:|---:|"]
    for part, b in report["bytes_token_pair"].items():
      out.append(f"| {part} | {b:.3g} | {b / total:.1%} |")
  return "\n".join(out)


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  os.chdir(ROOT)  # the configs name their synthetic worlds relative to the repository
  from data_prep import worlds
  from evqa_jax.train import aot
  worlds.ensure_synthetic_world(FLAGS.config)
  mesh = tuple(int(x) for x in FLAGS.mesh.lower().split("x")) if FLAGS.mesh else None
  lowered, report = aot.lower_train_step(FLAGS.config, mesh_shape=mesh, topology=FLAGS.topology)
  compiled = lowered.compile()
  report.update(aot.analysis(compiled))
  report.update(chips.roofline(report, chips.peak_flops(report.get("device_kind", ""))))
  text = compiled.as_text()
  if FLAGS.hlo_out:
    with open(FLAGS.hlo_out + ".tmp", "w") as f:
      f.write(text)
    os.replace(FLAGS.hlo_out + ".tmp", FLAGS.hlo_out)
  batch = report.get("batch", {})
  seq_len = batch.get("input_ids", [[0, 0]])[0][-1] + batch.get("video", [[0, 0]])[0][1] if "input_ids" in batch else 0
  report.update(breakdown(text, seq_len=seq_len))
  report["command"] = "python benchmarks/step_breakdown.py " + " ".join(sys.argv[1:])
  print(json.dumps(report, sort_keys=True), flush=True)
  if FLAGS.markdown:
    print(markdown(report))


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiling for a topology needs libtpu, not a TPU
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from absl import app, flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<name>.py[:variant]).",
                                  lock_config=True)
  flags.DEFINE_string("mesh", None, "Mesh shape, e.g. 8x1 (data x model); default: config.mesh_shape.")
  flags.DEFINE_string("topology", None, "Target TPU topology, e.g. v5e:2x4.")
  flags.DEFINE_string("hlo_out", None, "Also write the optimized HLO text here.")
  flags.DEFINE_bool("markdown", False, "Print Markdown tables after the JSON line.")
  flags.mark_flags_as_required(["config"])
  from evqa_jax import cli
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  sys.exit(cli.run_absl(main))
