"""Compile time of DeBERTa-v2's attention alone for a TPU chip: N chained attention calls (forward + backward, the
paper's shapes: 32 rows, 24 heads, 266 tokens, head dim 64, bf16, dropout) through the fused Pallas kernel or the
XLA `rows` path; CPU seconds of this process (robust to a busy host, unlike wall time) and XLA's FLOPs.

    python benchmarks/attention_compile_time.py --relative_gather=pallas --calls=1,3
    python benchmarks/attention_compile_time.py --relative_gather=rows --calls=1,3

Whether the kernel makes a deep program's compile grow per layer: identical Pallas kernels compile once (Mosaic),
an XLA attention is compiled per call site.
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_calls(calls: int, relative_gather: str, device, batch: int = 32, seq: int = 266) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from evqa_jax.models import deberta_pallas as P  # pylint: disable=import-outside-toplevel
  from evqa_jax.models import deberta_v2 as D  # pylint: disable=import-outside-toplevel

  cfg = D.DebertaV2Config.xlarge()
  heads, dim = cfg.num_attention_heads, cfg.head_dim
  index = D.relative_position_index(cfg, seq)
  diag = D.toeplitz_diagonal(index - index.min())
  rows = int(index.max() - index.min()) + 1
  scale = math.sqrt(3 * dim)

  def attention(q, k, v, pos_key, pos_query, mask, key):
    if relative_gather == "pallas":
      return P.disentangled_attention(q, k, v, pos_key, pos_query, diag, mask, scale, key, 0.9)
    s = (jnp.einsum("bqnd,bknd->bnqk", q, k) + D.toeplitz_scores(q, pos_key, diag)
         + jnp.swapaxes(D.toeplitz_scores(k, pos_query, diag[::-1]), -1, -2))
    s = jnp.where(mask[:, None], s.astype(jnp.float32) / scale, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, -1).astype(q.dtype)
    p = jnp.where(jax.random.bernoulli(key, 0.9, p.shape), p / 0.9, 0)
    return jnp.einsum("bnqk,bknd->bqnd", p, v)

  def step(q, k, v, pos_key, pos_query, valid):
    mask = valid[:, :, None] & valid[:, None, :]

    def loss(q, k, v, pos_key, pos_query):
      x = q
      for i in range(calls):  # each call's output is the next one's queries: nothing can be shared
        x = attention(x, k, v, pos_key * (i + 1), pos_query, mask, jax.random.key(i))
      return x.astype(jnp.float32).sum()
    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, pos_key, pos_query)

  sharding = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # noqa: E731
  t0 = time.process_time()
  compiled = jax.jit(step).lower(*[spec((batch, seq, heads, dim))] * 3, *[spec((rows, heads, dim))] * 2,
                                 spec((batch, seq), jnp.bool_)).compile()
  return {"calls": calls, "compile_cpu_s": round(time.process_time() - t0, 1),
          "flops": compiled.cost_analysis()["flops"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--relative_gather", default="pallas", choices=["pallas", "rows"])
  parser.add_argument("--calls", default="1,3")
  parser.add_argument("--topology", default="v5e:2x2")
  args = parser.parse_args()
  from evqa_jax.train import aot  # pylint: disable=import-outside-toplevel
  device = aot.topology_devices(args.topology)[0]
  for n in (int(x) for x in args.calls.split(",")):
    print(json.dumps(dict(compile_calls(n, args.relative_gather, device), relative_gather=args.relative_gather,
                          device_kind=device.device_kind)), flush=True)


if __name__ == "__main__":
  main()
