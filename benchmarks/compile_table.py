"""The compile table: AOT compiles of train steps for accelerator topologies, one JSON line per row.

    python benchmarks/compile_table.py --out docs/benchmarks/compile_table.jsonl -- \\
        "--config=configs/ovqa_msrvtt.py:scale,shapes_only,bf16 --config.model.remat=full \\
         --mesh=4x1 --topology=v5e:2x2" \\
        "--config=configs/violin.py:small --mesh=2x2 --topology=v5e:2x2"
    python benchmarks/compile_table.py --markdown docs/benchmarks/compile_table.jsonl   # the table
    python benchmarks/compile_table.py --summary docs/benchmarks/compile_table.jsonl    # best OVQA row per slice

Each row is the arguments of one `launch/aot_check.py` run (config, `--config.` overrides, mesh, topology), run in
its own process, one at a time: the trainer's own train step, lowered and compiled with no data batches and no
weights (evqa_jax/train/aot.py; a TPU topology needs libtpu, not a TPU). To the check's report (per device: argument
/ output / temp / alias bytes, the peak estimate, XLA's FLOPs and bytes accessed, compile seconds) the row adds the
chip's HBM and whether the peak fits in it, the machine and its load while the row compiled (the table quotes
compile seconds only from a row whose machine was otherwise idle: `compile_seconds_usable`), and the roofline
(benchmarks/chips.py: the chip's published peak FLOP/s and HBM): step time max(FLOPs / peak FLOP/s, bytes / HBM
bandwidth), the MFU ceiling it implies (XLA's FLOPs, backward, recomputation and optimizer included, so it bounds MFU
from above) and examples/s at that step time; with `model_flops` (a step without remat reports its own FLOPs;
`launch/aot_check.py --model_flops` compiles the step without remat to count them) also `mfu_ceiling_model`: the model
FLOPs (no recompute) over the same roofline time, the ceiling of MFU as model FLOPs count it. A Pallas kernel
(model.relative_gather=pallas) counts by its declared pl.CostEstimate. A row that fails to compile is kept, with its
error: a failure is a finding. Rows are written to --out as they finish (so a long
table survives an interruption), each with its exact command and the git commit it compiled: a new row replaces the
row of the same command in place (the table holds each command's latest compile), others are appended; the file is
rewritten through a temporary file and a rename, never left half-written.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import chips  # noqa: E402  pylint: disable=wrong-import-position
import machine  # noqa: E402  pylint: disable=wrong-import-position

GIB = 2**30


def run_row(args_text: str, timeout: float) -> dict:
  """Runs launch/aot_check.py with `args_text`; -> its report plus the roofline, or the error it stopped with."""
  argv = shlex.split(args_text)
  command = "python launch/aot_check.py " + args_text
  t0 = time.time()
  monitor = machine.Monitor()
  try:
    with monitor.block(command):
      proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "aot_check.py")] + argv, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, PYTHONPATH=ROOT,
                                     JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu")))
  except subprocess.TimeoutExpired:
    return {"command": command, "error": f"timed out after {timeout:.0f} s"}
  # The compile's wall time is a speed figure: quotable only when nothing else ran (benchmarks/machine.py).
  verdict = monitor.report(log=False)
  row = {"command": command, "wall_s": round(time.time() - t0, 1), "machine": verdict["machine"],
         "load": verdict["load"], "compile_seconds_usable": verdict["usable"]}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode != 0 or not lines:
    err = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    row["error"] = err[-1] if err else f"exit status {proc.returncode}"
    return row
  report = json.loads(lines[-1])
  row.update(report)
  row.update(chips.roofline(report, chips.peak_flops(report.get("device_kind", ""))))
  return row


def markdown(rows) -> str:
  """The README table of `rows` (per device; GiB = 2^30 bytes)."""
  head = ("| command | device | mesh (data x model) | arguments GiB | temp GiB | peak GiB / HBM | fits | "
          "FLOPs/step/device | compile s | roofline step s | MFU ceiling | examples/s | model MFU ceiling |")
  out = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in map(with_roofline, rows):
    cmd = f"`{r['command']}`"
    if "error" in r:
      out.append(f"| {cmd} | | | | | | error: {r['error']} | | | | | | |")
      continue
    g = lambda key: f"{r[key] / GIB:.2f}" if key in r else ""  # noqa: E731
    hbm = f" / {r['hbm_bytes'] / GIB:.0f}" if "hbm_bytes" in r else ""
    mesh = " x ".join(str(v) for v in r["mesh"].values())
    fits = {True: "yes", False: "**no**"}.get(r.get("fits"), "")
    flops = f"{r['flops']:.3g}" if r.get("flops") is not None else "n/a"  # XLA gave no count: not 0
    roof = f"{r['roofline_step_s']:.3g} ({r['roofline_bound']})" if "roofline_step_s" in r else ""
    mfu = f"{r['mfu_ceiling']:.2f}" if "mfu_ceiling" in r else ""
    rate = f"{r['roofline_examples_per_s']:.0f}" if "roofline_examples_per_s" in r else ""
    model = f"{r['mfu_ceiling_model']:.2f}" if "mfu_ceiling_model" in r else ""
    compile_s = r["compile_seconds"] if r.get("compile_seconds_usable") else "–"  # busy machine: not quoted
    out.append(f"| {cmd} | {r['device_kind']} x {r['devices']} | {mesh} | {g('argument_size_in_bytes')} | "
               f"{g('temp_size_in_bytes')} | {g('peak_estimate_bytes')}{hbm} | {fits} | {flops} | "
               f"{compile_s} | {roof} | {mfu} | {rate} | {model} |")
  return "\n".join(out)


# Train-set sizes (question-answer pairs) of the OVQA paper's datasets, as its section 4 gives them ("For
# training/testing, MSVD-QA is split into 32K/13K. MSRVTT-QA follows 159K/73K. ActivityNet-QA splits into 32K/8K.
# TGIF-FrameQA uses 39K/13K."), and its 20 epochs (configs/ovqa_common.py total_epochs).
OVQA_TRAIN_SIZES = {"MSRVTT-QA": 159_000, "MSVD-QA": 32_000, "ActivityNet-QA": 32_000, "TGIF-FrameQA": 39_000}
OVQA_EPOCHS = 20
# What the authors ran: mlvlab/OVQA README, `torch.distributed.launch --nproc_per_node 4 ... --batch_size 8`
# (4 GPUs x 8 = the paper's batch 32); neither the paper nor the README names the GPU or a training time.
AUTHORS_HARDWARE = "4 GPUs x batch 8 (mlvlab/OVQA README; GPU type and training time not published)"


def with_roofline(r: dict) -> dict:
  """`r` with its roofline figures computed from its recorded counts by benchmarks/chips.py (rows recorded before a
  figure was added get it too)."""
  if "error" in r or r.get("flops") is None:
    return r
  return dict(r, **chips.roofline(r, chips.peak_flops(r.get("device_kind", ""))))


def _slice(r) -> str:
  return f"{r['device_kind']} x {r['devices']}"


def best_rows(rows, task="ovqa", label=lambda r: True):
  """{slice: the fitting row of `task` with the most roofline examples/s on it} over `rows` that `label` keeps."""
  best = {}
  for r in map(with_roofline, rows):
    if r.get("task") != task or not r.get("fits") or "roofline_examples_per_s" not in r or not label(r):
      continue
    key = _slice(r)
    if key not in best or r["roofline_examples_per_s"] > best[key]["roofline_examples_per_s"]:
      best[key] = r
  return best


def summary(rows) -> str:
  """The OVQA paper step's best fitting setting per TPU slice (roofline figures from XLA's compiled cost analysis)
  and the time to train each OVQA dataset for 20 epochs at that rate."""
  # The paper's model: DeBERTa-v2-xlarge (all 24 layers) with the GNN verbalizer (not :baseline / :cvqa / :xxlarge,
  # nor the other backbone, :justask).
  paper = best_rows(rows, label=lambda r: not any(x in r["command"] for x in (
      "num_hidden_layers", "xxlarge", "baseline", "cvqa", "justask")))
  out = ["| slice | best fitting setting (command) | per-chip batch | peak GiB / HBM | roofline step s | "
         "MFU ceiling (compiled cost analysis) | examples/s | " + " | ".join(
             f"{name} x {OVQA_EPOCHS} epochs" for name in OVQA_TRAIN_SIZES) + " |"]
  out.append("|" + "---|" * (7 + len(OVQA_TRAIN_SIZES)))
  for key in sorted(paper):
    r = paper[key]
    rate = r["roofline_examples_per_s"]
    hours = [f"{size * OVQA_EPOCHS / rate / 3600:.2f} h" for size in OVQA_TRAIN_SIZES.values()]
    out.append(f"| {key} | `{r['command']}` | {r['global_batch_size'] // r['devices']} | "
               f"{r['peak_estimate_bytes'] / GIB:.2f} / {r['hbm_bytes'] / GIB:.0f} | {r['roofline_step_s']:.3g} | "
               f"{r['mfu_ceiling']:.2f} | {rate:.0f} | " + " | ".join(hours) + " |")
  out.append(f"| authors | {AUTHORS_HARDWARE} | 8 | | | | | " + " | ".join("" for _ in OVQA_TRAIN_SIZES) + " |")
  return "\n".join(out)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("rows", nargs="*", help="one quoted launch/aot_check.py argument string per row")
  parser.add_argument("--out", help="write each row's JSON line to this file (replacing the same command's row)")
  parser.add_argument("--timeout", type=float, default=3600, help="seconds per row")
  parser.add_argument("--markdown", metavar="JSONL", help="print the Markdown table of a JSONL file and exit")
  parser.add_argument("--summary", metavar="JSONL", help="print the OVQA best-setting and time-to-train table of a "
                      "JSONL file and exit")
  args = parser.parse_args()
  if args.markdown or args.summary:
    with open(args.markdown or args.summary) as f:
      rows = [json.loads(l) for l in f if l.strip()]
    print(markdown(rows) if args.markdown else summary(rows))
    return
  if not args.rows:
    parser.error("give at least one row (a quoted launch/aot_check.py argument string)")
  for text in args.rows:
    row = run_row(text, args.timeout)
    line = json.dumps(row, sort_keys=True)
    print(line, flush=True)
    if args.out:
      write_row(args.out, row)


def write_row(path: str, row: dict) -> None:
  """Puts `row` into the JSONL table at `path`: in place of the row with the same command, else at the end.
  Written row by row (finished rows survive an interrupted table), each time through a temp file + rename."""
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      for n, text in enumerate(f, 1):
        if text.strip():
          try:
            rows.append(json.loads(text))
          except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not a JSON line ({e}); fix or move the file before adding rows") from e
  same = [i for i, r in enumerate(rows) if r.get("command") == row["command"]]
  if same:
    rows[same[0]] = row
    rows = [r for i, r in enumerate(rows) if i not in same[1:]]
  else:
    rows.append(row)
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  io.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))  # temp file + rename


if __name__ == "__main__":
  main()
