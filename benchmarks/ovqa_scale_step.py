"""The OVQA train step at MSRVTT scale on this host, with and without the GNN verbalizer; prints one JSON line.

    python benchmarks/ovqa_scale_step.py [--steps 3 --rounds 3 --batch 32]
    python benchmarks/ovqa_scale_step.py --quick          # 1 round of 1 step: a smoke run, not for quoting

The world is `configs/ovqa_msrvtt.py:demo,scale`: the MSRVTT-scale synthetic world (4,000 train answers, 1,600
test-only ones, k = 10, 2-hop GloVe answer graphs; built on first use, a few minutes) with the demo's encoder
(MiniLM-L6 + adapters, 32 tokens). Two steps are built by benchmarks/train_throughput.Bench (the trainer's
StepFns, same config, same seed, the same prepared batches): the config's GNN verbalizer (variant E) and none
(variant A: answer embeddings = the frozen sub-word means). Their difference is the verbalizer's cost, given as
its share of the step. Timed blocks alternate between the two (`--rounds` x `--steps` steps each, after one
warm-up step); the figure is each side's median step. The JSON also gives the graph sizes (nodes, edges, the
padded budget the step runs on) and the load around every block (benchmarks/machine.py: quote only usable runs).
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  pylint: disable=wrong-import-position
import train_throughput  # noqa: E402  pylint: disable=wrong-import-position


def graph_sizes(task) -> dict:
  """Answers / nodes / edges of the train and test answer graphs and the padded budget the compiled step uses."""
  inp = task.input
  out = {split: {"answers": g.num_answers, "nodes": g.num_nodes, "edges": g.num_edges,
                 "nodes_per_hop": g.info.get("nodes_per_hop"), "k": g.info.get("k"), "hops": g.info.get("hops")}
         for split, g in (("train", inp.graphs["train"]), ("test", inp.graphs["eval"]))}
  out["padded"] = dict(inp.budget)
  out["verbalizer_call"] = {k: int(v) for k, v in (inp.verbalizer_call() or {}).items()}
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=3, help="timed steps per block")
  parser.add_argument("--rounds", type=int, default=3, help="blocks per side, sides alternating")
  parser.add_argument("--batch", type=int, default=None, help="global batch (default: the config's, 32)")
  parser.add_argument("--quick", action="store_true", help="1 round of 1 step (smoke run)")
  parser.add_argument("--out", default=None, help="also write the JSON here")
  machine.add_arguments(parser)
  args = parser.parse_args()
  if args.quick:
    args.steps, args.rounds = 1, 1
  import jax
  monitor = machine.monitor_from_args(args)

  sides = {}
  for name, variant in (("gnn", None), ("no_verbalizer", "A")):
    config = train_throughput.make_config("ovqa", "demo", args.batch, variants="scale")
    if variant:
      config.verbalizer.variant = variant
    bench = train_throughput.Bench(config)
    compile_s, compiled = bench.compile()
    sides[name] = {"bench": bench, "compile_s": round(compile_s, 2), "flops": train_throughput.step_flops(compiled),
                   "times": []}
    bench.run(0, warmup=1)
    print(f"[{name}] built and compiled in {compile_s:.1f}s", file=sys.stderr, flush=True)

  for r in range(args.rounds):
    order = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for name in order:
      with monitor.block(f"{name}/round{r}"):
        sides[name]["times"] += sides[name]["bench"].run(args.steps, warmup=0)

  gnn, plain = sides["gnn"], sides["no_verbalizer"]
  result = {"benchmark": "ovqa_scale_step", "config": "configs/ovqa_msrvtt.py:demo,scale",
            "backend": jax.default_backend(), "devices": jax.device_count(),
            "batch_size": int(gnn["bench"].config.batch_size), "steps": args.steps, "rounds": args.rounds,
            "graphs": graph_sizes(gnn["bench"].task)}
  for name, side in sides.items():
    bench = side["bench"]
    result[name] = {"describe": bench.task.describe(), "trainable_params": bench.trainable,
                    "frozen_params": bench.frozen, "compile_s": side["compile_s"],
                    "flops_per_step_per_device": side["flops"],
                    "step_s_median": round(statistics.median(side["times"]), 4),
                    "step_s_min": round(min(side["times"]), 4), "times_s": [round(t, 4) for t in side["times"]]}
  t_gnn, t_plain = result["gnn"]["step_s_median"], result["no_verbalizer"]["step_s_median"]
  result["verbalizer_s"] = round(t_gnn - t_plain, 4)
  result["verbalizer_share_of_step"] = round((t_gnn - t_plain) / t_gnn, 4)
  if gnn["flops"] and plain["flops"]:
    result["verbalizer_share_of_flops"] = round((gnn["flops"] - plain["flops"]) / gnn["flops"], 4)
  result.update(monitor.report())
  line = json.dumps(result)
  if args.out:
    from evqa_jax import io as evqa_io
    with evqa_io.atomic_path(args.out) as tmp:
      with open(tmp, "w") as f:
        f.write(line + "\n")
  print(line, flush=True)


if __name__ == "__main__":
  main()
