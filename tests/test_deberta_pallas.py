"""DeBERTa-v2's fused attention kernel (evqa_jax/models/deberta_pallas.py, relative_gather="pallas") against the XLA
path in float32, in Pallas' interpret mode on CPU; and one ahead-of-time Mosaic compile of it for a v5e chip."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evqa_jax.models import deberta_pallas as P
from evqa_jax.models import deberta_v2 as D

TOL = dict(atol=1e-5, rtol=1e-5)


def _xla_attention(q, k, v, pos_key, pos_query, diag, mask, scale, keep, keep_prob):
  """The XLA path's arithmetic (DisentangledSelfAttention with relative_gather="rows")."""
  s = jnp.einsum("bqnd,bknd->bnqk", q, k) + D.toeplitz_scores(q, pos_key, diag)
  s = s + jnp.swapaxes(D.toeplitz_scores(k, pos_query, diag[::-1]), -1, -2)
  s = jnp.where(mask[:, None], s / scale, jnp.finfo(jnp.float32).min)
  p = jax.nn.softmax(s, axis=-1)
  if keep is not None:
    p = jnp.where(keep, p / keep_prob, 0.0)
  return jnp.einsum("bnqk,bknd->bqnd", p, v)


def test_kernel_values_and_gradients_match_xla():
  """40 tokens (padded to 48 in interpret mode; 128 on a TPU) with log buckets (make_log_bucket_position: 32
  buckets, max position 128, so distances >= 16 share rows, as xlarge's 256 / 512 do from 128 on), a padded batch
  row (and so fully masked query rows), attention dropout (the kernel draws its keep mask from the key; the XLA path
  is given the same draw): the output and the gradients of q, k, v and both projected relative-row tables equal the
  XLA path's within 1e-5."""
  cfg = D.DebertaV2Config(hidden_size=32, num_attention_heads=2, relative_attention=True, position_buckets=32,
                          max_relative_positions=128, pos_att_type=("c2p", "p2c"))
  seq, heads, dim = 40, 2, 16
  index = D.relative_position_index(cfg, seq)
  lo = int(index.min())
  diag = D.toeplitz_diagonal(index - lo)
  assert len(set(diag)) < len(diag)  # log buckets: some distances share a row
  rows = int(index.max()) + 1 - lo
  ks = jax.random.split(jax.random.key(0), 7)
  q, k, v = (jax.random.normal(ks[i], (2, seq, heads, dim)) for i in range(3))
  pos_key, pos_query = (jax.random.normal(ks[3 + i], (rows, heads, dim)) for i in range(2))
  valid = jnp.arange(seq)[None] < jnp.asarray([[seq], [29]])
  mask = valid[:, :, None] & valid[:, None, :]
  keep = jax.random.bernoulli(ks[5], 0.9, (2, heads, seq, seq))  # what the kernel draws from ks[5]
  weight = jax.random.normal(ks[6], q.shape)
  scale = math.sqrt(3 * dim)

  def loss(fn, dropout):
    def f(*args):
      out = fn(*args, diag, mask, scale, dropout, 0.9)
      return (out * weight).sum(), out
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))

  with P.interpret(align=16):
    (_, got), got_grads = loss(P.disentangled_attention, ks[5])(q, k, v, pos_key, pos_query)
  (_, want), want_grads = loss(_xla_attention, keep)(q, k, v, pos_key, pos_query)
  np.testing.assert_allclose(got, want, **TOL)
  for name, a, b in zip(("q", "k", "v", "pos_key", "pos_query"), got_grads, want_grads):
    np.testing.assert_allclose(a, b, err_msg=name, **TOL)


def test_layer_with_the_flag_matches_rows():
  """A whole DeBERTa-v2 layer (attention, output, FFN; separate pos_key/pos_query projections; LayerNorm'ed relative
  embeddings passed in) with model.relative_gather="pallas" against "rows", dropout on (the same rng: the kernel
  draws nn.Dropout's own mask): output and the gradients of every parameter, the hidden states and the relative
  embeddings within 1e-5."""
  base = dict(vocab_size=61, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=40, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
              share_att_key=False, position_biased_input=False, norm_rel_ebd="layer_norm",
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2)
  seq = 11
  rows_cfg = D.DebertaV2Config.from_dict(base, relative_gather="rows")
  kernel_cfg = D.DebertaV2Config.from_dict(base, relative_gather="pallas")
  index, rel_rows = D.DebertaV2Encoder(rows_cfg).rel_index(seq)
  diag = D.toeplitz_diagonal(index)
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.standard_normal((2, seq, 32)), jnp.float32)
  rel = jnp.asarray(rng.standard_normal((2 * rows_cfg.att_span, 32)), jnp.float32)
  valid = jnp.ones((2, seq), bool).at[1, 8:].set(False)
  mask = valid[:, :, None] & valid[:, None, :]
  params = D.DebertaV2Layer(rows_cfg).init(jax.random.key(0), hidden, hidden, mask, rel, None, True, rel_rows, diag)

  def grads(cfg):
    def f(p, h, r):
      out = D.DebertaV2Layer(cfg).apply(p, h, h, mask, r, None, False, rel_rows, diag,
                                        rngs={"dropout": jax.random.key(3)})
      return (out * jnp.cos(out)).sum(), out
    return jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))(params, hidden, rel)

  with P.interpret(align=16):
    got, got_out = grads(kernel_cfg)
  want, want_out = grads(rows_cfg)
  np.testing.assert_allclose(got_out, want_out, **TOL)
  for path, a in jax.tree_util.tree_leaves_with_path(got):
    b = jax.tree_util.tree_leaves_with_path(want)[[p for p, _ in jax.tree_util.tree_leaves_with_path(want)].index(
        path)][1]
    np.testing.assert_allclose(a, b, err_msg=jax.tree_util.keystr(path), **TOL)


def test_kernel_compiles_for_v5e():
  """Mosaic compiles the forward and backward kernels ahead of time for a v5e chip (266 tokens, padded to 384, bf16,
  dropout): XLA's cost analysis counts the backward kernel's declared CostEstimate."""
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.skip(f"SKIPPED LOUDLY: libtpu is not importable ({e}); no Mosaic compile was checked")
  from evqa_jax.train import aot  # pylint: disable=import-outside-toplevel
  device = aot.topology_devices("v5e:2x2")[0]
  cfg = D.DebertaV2Config(hidden_size=128, num_attention_heads=2, relative_attention=True, position_buckets=256,
                          max_relative_positions=512, pos_att_type=("c2p", "p2c"))
  seq, batch, heads, dim = 266, 2, 2, 64
  index = D.relative_position_index(cfg, seq)
  diag = D.toeplitz_diagonal(index - index.min())
  rows = int(index.max() - index.min()) + 1

  def step(q, k, v, pos_key, pos_query, valid):
    mask = valid[:, :, None] & valid[:, None, :]

    def loss(*a):
      out = P.disentangled_attention(*a, diag, mask, math.sqrt(3 * dim), jax.random.key(0), 0.9)
      return out.astype(jnp.float32).sum()
    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, pos_key, pos_query)

  sharding = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # noqa: E731
  compiled = jax.jit(step).lower(
      *[spec((batch, seq, heads, dim))] * 3, *[spec((rows, heads, dim))] * 2, spec((batch, seq), jnp.bool_)).compile()
  length = P.padded_length(seq)
  assert length == 384
  st = P._Static(seq=seq, scale=1.0, keep_prob=0.9, c2p=True, p2c=True,  # pylint: disable=protected-access
                 dropout=True)
  declared = P.cost(st, jax.ShapeDtypeStruct((batch, heads, length, dim), jnp.bfloat16), 2 * length, True)
  cost = compiled.cost_analysis()
  assert cost["transcendentals"] == declared.transcendentals
  assert declared.flops <= cost["flops"] < 1.05 * declared.flops  # the kernel, the keep-mask draw, the XLA ops around


def test_kernel_under_a_mesh_matches_one_device():
  """Under a 2 x 2 (data x model) mesh the kernels run per shard (shard_map over the logical batch and heads axes):
  output and gradients equal the unsharded call's; the relative rows' gradients are summed over the batch shards."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  if len(devices) < 4:
    pytest.skip(f"needs 4 devices, found {len(devices)}")
  seq, heads, dim = 10, 2, 8
  diag = tuple(int(x) for x in np.clip(np.arange(2 * seq - 1) - seq + 1 + 4, 0, 7))  # clipped distances, 8 rows
  ks = jax.random.split(jax.random.key(1), 6)
  q, k, v = (jax.random.normal(ks[i], (4, seq, heads, dim)) for i in range(3))
  pos_key, pos_query = (jax.random.normal(ks[3 + i], (8, heads, dim)) for i in range(2))
  valid = jnp.arange(seq)[None] < jnp.asarray([[seq], [6], [seq], [3]])
  mask = valid[:, :, None] & valid[:, None, :]

  def grads(*args):
    f = lambda *a: (P.disentangled_attention(*a, diag, mask, 2.0) * jnp.sin(a[0])).sum()  # noqa: E731
    return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4)))(*args)

  mesh = jax.sharding.Mesh(np.asarray(devices[:4]).reshape(2, 2), ("data", "model"))
  with P.interpret(align=16):
    want = grads(q, k, v, pos_key, pos_query)
    with jax.set_mesh(mesh), nn.logical_axis_rules((("batch", "data"), ("heads", "model"))):
      got = grads(q, k, v, pos_key, pos_query)
  for name, a, b in zip(("q", "k", "v", "pos_key", "pos_query"), got, want):
    np.testing.assert_allclose(a, b, err_msg=name, **TOL)
