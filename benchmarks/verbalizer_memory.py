"""Per-device memory of the GNN verbalizer's part of the OVQA train step, compiled for a TPU topology; one JSON line.

    python benchmarks/verbalizer_memory.py                                  # the compile table's OVQA row, v5e:2x2
    python benchmarks/verbalizer_memory.py --mesh 2x2 --config configs/ovqa_msrvtt.py:scale,shapes_only,bf16
    python benchmarks/verbalizer_memory.py --dump /tmp/verb_dump            # + XLA's HLO and buffer assignment

What compiles is `lower_verbalizer_step` (below): answer and node embeddings from the frozen
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


def lower_verbalizer_step(config, mesh_shape=None, devices=None, topology: str | None = None):
  """-> (`Lowered` gradient of an OVQA config's answer scoring alone, JSON-able description).

  Only the answer path of the train step: the answer and node embeddings from the frozen word-embedding table, the
  GNN verbalizer, the scores of `config.batch_size` [MASK] features (stand-ins for the LM's, batch-sharded) against
  them, their cross-entropy, and its gradient for the verbalizer's parameters; shapes, dtypes, shardings and the
  logical rules are the trainer's. It compiles in seconds where the whole step takes many minutes, so the
  verbalizer's memory can be studied (benchmarks/verbalizer_memory.py).
  """
  import jax
  import jax.numpy as jnp
  import optax
  from flax import traverse_util
  from evqa_jax.models import encoders
  from evqa_jax.train import aot, sharding
  from evqa_jax.train import steps as steps_lib

  if config.task != "ovqa":
    raise ValueError(f"config.task = {config.task!r}: the verbalizer step is OVQA's")
  s = aot.setup(config, mesh_shape, devices, topology)
  state, mesh, aux = s.state, s.mesh, s.aux
  if "verbalizer" not in state["trainable"]:
    raise ValueError("the config has no GNN verbalizer (config.verbalizer.variant 'A' or a closed head)")
  model = s.task.model
  lm = model.encoder_config
  # Of the frozen parameters only the LM's word-embedding table is read (the answer encoder): pass just that leaf,
  # found where the model finds it (encoders.word_embeddings), at its path in the frozen tree.
  if "lm" not in state["frozen"]:
    raise ValueError(f"the frozen parameters hold no 'lm' (the {config.model.encoder} LM): {sorted(state['frozen'])}")
  table = encoders.word_embeddings(model.encoder, state["frozen"]["lm"])
  flat = traverse_util.flatten_dict(state["frozen"])
  frozen = {k: v for k, v in flat.items() if v is table}
  if len(frozen) != 1:
    raise ValueError(f"the {config.model.encoder} LM's word-embedding table is {len(frozen)} leaves of the frozen tree")
  frozen = traverse_util.unflatten_dict(frozen)
  batch_shard = sharding.batch_sharding(mesh, s.rules)
  feature = jax.ShapeDtypeStruct((config.batch_size, lm.hidden_size), lm.dtype, sharding=batch_shard)
  labels = jax.ShapeDtypeStruct((config.batch_size,), jnp.int32, sharding=batch_shard)

  def loss_fn(verbalizer, frozen, aux, feature, labels):
    params = dict(frozen, verbalizer=verbalizer)
    logits = model.apply({"params": params}, feature, aux, method=model.score)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  step = jax.jit(jax.value_and_grad(loss_fn))
  with steps_lib.mesh_context(mesh, s.rules):
    lowered = step.lower(state["trainable"]["verbalizer"], frozen, aux, feature, labels)
  report = aot.describe(config, s.task, mesh, s.devices, state)
  report["verbalizer"] = dict(config.verbalizer)
  report["verbalizer_call"] = {k: int(v) for k, v in (model.verbalizer_call or {}).items()}
  report["aux"] = {k: [list(v.shape), str(v.dtype)] for k, v in aux.items()}
  return lowered, report


def compile_verbalizer_step(config, mesh_shape=None, devices=None, topology: str | None = None,
                            compiler_options=None) -> dict:
  """`lower_verbalizer_step`, compiled (with XLA `compiler_options` such as {"xla_dump_to": DIR}); its report has the
  memory and FLOPs figures of `aot.compile_train_step`."""
  from evqa_jax.train import aot
  return aot.compile_lowered(*lower_verbalizer_step(config, mesh_shape, devices, topology), compiler_options)


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
  from launch import overrides
  config = overrides.load_config(args.config)
  worlds.ensure_synthetic_world(config)
  mesh = tuple(int(x) for x in args.mesh.lower().split("x"))
  options = None
  if args.dump:
    options = {"xla_dump_to": args.dump, "xla_dump_hlo_as_text": True, "xla_dump_hlo_pass_re": ""}
  monitor = machine.monitor_from_args(args)
  with monitor.block("lower+compile"):
    report = compile_verbalizer_step(config, mesh_shape=mesh, topology=args.topology, compiler_options=options)
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
