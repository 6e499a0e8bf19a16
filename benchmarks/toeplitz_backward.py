"""DeBERTa-v2's relative-position gather backward: segmented scan against per-position gathers, side by side.

    python benchmarks/toeplitz_backward.py [--out FILE]

Compiles the gradient of the DeBERTa-v2 encoder (DeBERTa-v3-xsmall shapes, the OVQA benchmark's batch and
74 tokens: benchmarks/ovqa_vs_torch.py) twice in one process, once with `toeplitz_gather`'s backward forced onto the
segmented associative scan (`MAX_GATHERED_RUN = 0`) and once with the default per-position gathers, then times them
in alternating blocks (median block, seconds per gradient) and reports the largest gradient difference. Prints
one JSON object with the machine and the load verdict (benchmarks/machine.py).

    python benchmarks/toeplitz_backward.py --gather-only [--out FILE]

Times the relative gather alone instead: the gradient of one c2p gather, x [batch, heads, L, rows] -> [batch,
heads, L, L] with the encoder's own index at these shapes (L = text + visual tokens, rows = the relative embedding
rows that L reaches), three ways side by side: `toeplitz_gather` with the scan backward, with the gathers, and
`jnp.take_along_axis` (whose backward is a scatter-add; what the encoder used before toeplitz_gather).
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
  parser.add_argument("--steps", type=int, default=None,
                      help="gradients per timed block (default 3; 500 with --gather-only, whose gradient takes ~2 ms: "
                           "a block must be long against the 10 ms CPU-time tick of the load check)")
  parser.add_argument("--gather-only", action="store_true",
                      help="time the gradient of one relative gather (scan / gathers / take_along_axis), not the encoder")
  parser.add_argument("--out", default="")
  machine.add_arguments(parser)
  args = parser.parse_args(argv)
  if args.steps is None:
    args.steps = 500 if args.gather_only else 3

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from evqa_jax.models import deberta_v2  # pylint: disable=g-import-not-at-top

  cfg = deberta_v2.DebertaV2Config.from_dict(ovqa_vs_torch.deberta_shape(args))
  length = args.text_len + args.frames
  rng = np.random.default_rng(0)
  default = deberta_v2.MAX_GATHERED_RUN
  if args.gather_only:
    index = deberta_v2.relative_position_index(cfg, length)
    index = index - index.min()
    rows = int(index.max()) + 1
    diag = deberta_v2.toeplitz_diagonal(index)
    shape = (args.batch, cfg.num_attention_heads, length, rows)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    weight = jnp.asarray(rng.standard_normal(shape[:-1] + (length,)), jnp.float32)  # a dense cotangent
    sides = {"scan": (lambda v: deberta_v2.toeplitz_gather(v, diag), 0),
             "gathers": (lambda v: deberta_v2.toeplitz_gather(v, diag), default),
             "take_along_axis": (lambda v: jnp.take_along_axis(v, jnp.asarray(index)[None, None], axis=-1), default)}
    args_of = (x,)

    def gradient(f):
      return jax.jit(jax.grad(lambda v: (f(v) * weight).sum()))
    setting = {"batch": args.batch, "heads": cfg.num_attention_heads, "tokens": length, "rows": rows,
               "x_shape": list(shape), "max_gathered_run": default, "gather_only": True}
  else:
    emb = jnp.asarray(rng.standard_normal((args.batch, length, cfg.hidden_size)), jnp.float32)
    valid = jnp.ones((args.batch, length), bool)
    encoder = deberta_v2.DebertaV2Encoder(cfg)
    params = encoder.init(jax.random.key(0), emb, valid)
    sides = {"scan": (None, 0), "gathers": (None, default)}
    args_of = (params, emb)

    def gradient(_):
      return jax.jit(jax.grad(lambda p, e: (encoder.apply(p, e, valid)[0] ** 2).sum(), argnums=(0, 1)))
    setting = {"batch": args.batch, "tokens": length, "deberta_layers": cfg.num_hidden_layers,
               "hidden": cfg.hidden_size, "max_gathered_run": default}
  compiled = {}
  for name, (f, max_run) in sides.items():
    deberta_v2.MAX_GATHERED_RUN = max_run  # read when the backward is traced
    try:
      compiled[name] = gradient(f).lower(*args_of).compile()
    finally:
      deberta_v2.MAX_GATHERED_RUN = default
  monitor = machine.monitor_from_args(args)
  seconds = {name: [] for name in compiled}
  for r in range(args.rounds):
    for name in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
      fn = compiled[name]
      jax.block_until_ready(fn(*args_of))
      with monitor.block(f"{name}/{r}") as block:
        for _ in range(args.steps):
          jax.block_until_ready(fn(*args_of))
      seconds[name].append(block.record["wall_s"] / args.steps)
  reference = jax.tree.leaves(compiled["gathers"](*args_of))
  difference = {name: float(max(jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(fn(*args_of)), reference)))
                for name, fn in compiled.items() if name != "gathers"}
  out = {"benchmark": "toeplitz_backward", "setting": setting,
         "seconds_per_gradient": {name: float(np.median(v)) for name, v in seconds.items()},
         "seconds_per_gradient_blocks": seconds,
         # largest |gradient - gradient with the gathers| over all leaves, per side
         "max_abs_gradient_difference": difference}
  out.update(monitor.report())
  line = json.dumps(out)
  print(line)
  if args.out:
    with open(args.out, "w") as f:
      f.write(line + "\n")
  return out


if __name__ == "__main__":
  main()
