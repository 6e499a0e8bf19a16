"""Per-device memory of the GNN verbalizer's part of the OVQA train step, compiled for a TPU topology; one JSON line.

    python benchmarks/verbalizer_memory.py                                  # the compile table's OVQA row, v5e:2x2
    python benchmarks/verbalizer_memory.py --mesh 2x2 --config configs/ovqa_msrvtt.py:scale,shapes_only,bf16
    python benchmarks/verbalizer_memory.py --dump /tmp/verb_dump            # + XLA's HLO and buffer assignment

What compiles is `evqa_jax.train.aot.lower_verbalizer_step`: answer and node embeddings from the frozen
word-embedding table, the config's verbalizer over its answer graph, the scores of batch-sharded [MASK] features
against the answers and the gradient of their cross-entropy for the verbalizer, with the train step's shapes,
dtypes, shardings and logical rules. The LM is left out, so it compiles in seconds rather than the full step's
quarter of an hour, and its temporaries are the verbalizer's own (the full step's minus the `:baseline` row's, up to
what XLA overlaps). Memory is per device (XLA's memory_analysis); compile seconds are recorded with the load around
them (benchmarks/machine.py) and are not for quoting unless `usable`.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  pylint: disable=wrong-import-position

GIB = 2**30


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/ovqa_msrvtt.py:scale,shapes_only,bf16",
                      help="an OVQA config with a GNN verbalizer, configs/x.py[:variants]")
  parser.add_argument("--mesh", default="4x1", help="data x model mesh")
  parser.add_argument("--topology", default="v5e:2x2", help="TPU topology to compile for (needs libtpu)")
  parser.add_argument("--dump", default=None, help="write XLA's optimized HLO and buffer assignment to this folder")
  parser.add_argument("--out", default=None, help="also write the JSON here")
  machine.add_arguments(parser)
  args = parser.parse_args()
  os.chdir(ROOT)  # the configs name their synthetic worlds relative to the repository
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiling for a topology needs libtpu, not a TPU

  from data_prep import worlds
  from evqa_jax.train import aot, overrides
  config = overrides.load_config(args.config)
  worlds.ensure_synthetic_world(config)
  mesh = tuple(int(x) for x in args.mesh.lower().split("x"))
  options = None
  if args.dump:
    options = {"xla_dump_to": args.dump, "xla_dump_hlo_as_text": True, "xla_dump_hlo_pass_re": ""}
  monitor = machine.monitor_from_args(args)
  with monitor.block("lower+compile"):
    report = aot.compile_verbalizer_step(config, mesh_shape=mesh, topology=args.topology, compiler_options=options)
  report.update({"config": args.config, "topology": args.topology})
  report.update({k.replace("_in_bytes", "_gib").replace("_bytes", "_gib"): round(report[k] / GIB, 3)
                 for k in ("argument_size_in_bytes", "temp_size_in_bytes", "peak_estimate_bytes") if k in report})
  report.update(monitor.report())
  line = json.dumps(report, sort_keys=True)
  print(line, flush=True)
  if args.out:
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
      f.write(line + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
  main()
