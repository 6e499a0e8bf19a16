"""DeBERTa-v2's relative-position gather backward: segmented scan against per-position gathers, side by side.

    python benchmarks/toeplitz_backward.py [--out FILE]

Compiles the gradient of the DeBERTa-v2 encoder (DeBERTa-v3-xsmall shapes, the OVQA benchmark's batch and
74 tokens: benchmarks/ovqa_vs_torch.py) twice in one process, once with `toeplitz_gather`'s backward forced onto the
segmented associative scan (`MAX_GATHERED_RUN = 0`) and once with the default per-position gathers, then times them
in alternating blocks (median block, seconds per gradient) and reports the largest gradient difference. Prints
one JSON object with the machine and the load verdict (benchmarks/machine.py).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  pylint: disable=wrong-import-position
import ovqa_vs_torch  # noqa: E402  pylint: disable=wrong-import-position


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ovqa_vs_torch.add_model_arguments(parser)
  parser.add_argument("--rounds", type=int, default=4, help="timed blocks per side")
  parser.add_argument("--steps", type=int, default=3, help="gradients per timed block")
  parser.add_argument("--out", default="")
  machine.add_arguments(parser)
  args = parser.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from evqa_jax.models import deberta_v2  # pylint: disable=g-import-not-at-top

  cfg = deberta_v2.DebertaV2Config.from_dict(ovqa_vs_torch.deberta_shape(args))
  length = args.text_len + args.frames
  emb = jnp.asarray(np.random.default_rng(0).standard_normal((args.batch, length, cfg.hidden_size)), jnp.float32)
  valid = jnp.ones((args.batch, length), bool)
  encoder = deberta_v2.DebertaV2Encoder(cfg)
  params = encoder.init(jax.random.key(0), emb, valid)
  default = deberta_v2.MAX_GATHERED_RUN
  compiled = {}
  for name, max_run in (("scan", 0), ("gathers", default)):
    deberta_v2.MAX_GATHERED_RUN = max_run  # read when the backward is traced
    try:
      grad = jax.jit(jax.grad(lambda p, e: (encoder.apply(p, e, valid)[0] ** 2).sum(), argnums=(0, 1)))
      compiled[name] = grad.lower(params, emb).compile()
    finally:
      deberta_v2.MAX_GATHERED_RUN = default
  monitor = machine.monitor_from_args(args)
  seconds = {name: [] for name in compiled}
  for r in range(args.rounds):
    for name in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
      fn = compiled[name]
      jax.block_until_ready(fn(params, emb))
      with monitor.block(f"{name}/{r}") as block:
        for _ in range(args.steps):
          jax.block_until_ready(fn(params, emb))
      seconds[name].append(block.record["wall_s"] / args.steps)
  a, b = compiled["scan"](params, emb), compiled["gathers"](params, emb)
  out = {"benchmark": "toeplitz_backward",
         "setting": {"batch": args.batch, "tokens": length, "deberta_layers": cfg.num_hidden_layers,
                     "hidden": cfg.hidden_size, "max_gathered_run": default},
         "seconds_per_gradient": {name: float(np.median(v)) for name, v in seconds.items()},
         "seconds_per_gradient_blocks": seconds,
         "max_abs_gradient_difference": float(max(jnp.max(jnp.abs(x - y))
                                                  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))}
  out.update(monitor.report())
  line = json.dumps(out)
  print(line)
  if args.out:
    with open(args.out, "w") as f:
      f.write(line + "\n")
  return out


if __name__ == "__main__":
  main()
