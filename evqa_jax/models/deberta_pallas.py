"""DeBERTa-v2's disentangled attention as one Pallas TPU (Mosaic) kernel, forward and backward
(`DebertaV2Config.relative_gather = "pallas"`).

Per (head, batch row) one kernel step holds a whole (padded) sequence in VMEM and computes, without writing any
token-pair array to HBM:

    scores = q k^T + skew(q Kr^T) + skew(k Qr^T)^T          [S, S] float32 (c2p, p2c from the relative rows)
    probs  = softmax(where(mask, scores / scale, min))       float32, cast to the model dtype
    out    = dropout(probs) v

Kr / Qr are the projected relative rows gathered along the Toeplitz diagonal of the relative-position index
(`Kr[m] = pos_key[diag[2S - 2 - m]]`, `Qr[m] = pos_query[diag[m]]`, 2S - 1 rows zero-padded to W = 2S: a
weight-sized gather outside the kernel, with the scatter-free backward of `relative_gather.gather_along_last`), so
c2p(i, j) = E[i, j + S - 1 - i] with E = q Kr^T: the skew is `pltpu.roll` with a per-row stride (row i rolled by
i - (S - 1)) and its backward the inverse roll (stride W - 1, i.e. -1 modulo W). Same values as the XLA paths
(`relative_gather = "scores" | "rows"`) up to the summation order of the matmuls (scores accumulate in float32
here). The backward recomputes the scores and softmax (no [S, S] residual is saved) and returns dq, dk, dv and the
gradients of Kr and Qr (summed over the batch in the kernel, float32), which flow back through the gather to the
projections and the relative LayerNorm.

Sequence padding: the wrapper pads S to a multiple of `SEQ_ALIGN` (128: the lane width; the skew rolls lanes of
width 2 S); padded keys are masked out (exp = 0, so a fully masked row is uniform over the real keys only, as in the
XLA path) and padded query rows are dropped. The mask must be an outer product valid_q x valid_k (what the
encoder builds); the kernel takes the two vectors (mask.any over keys / queries), not the [S, S] mask.

Dropout of the attention probabilities: the keep mask is drawn outside the kernel from the key nn.Dropout would use
(same bits as the XLA path), by the forward and again by the backward (nothing [S, S] is saved between them), and
passed in as int8 [b, heads, S, S]: values, gradients and a resumed run are identical to the XLA path's; the cost is
one byte per token pair read by each kernel (declared in the CostEstimate) and the XLA fusion that writes it. The TPU
PRNG (`pltpu.prng_seed`) would remove those bytes but give bits no other path (nor interpret mode) reproduces.

`pl.CostEstimate`: flops of the matmuls, exp count, and bytes_accessed exactly as the BlockSpecs move them
(grid (heads, batch): the relative rows are fetched once per head).
"""

import contextlib
import dataclasses
import functools
import math
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evqa_jax.models.relative_gather import gather_along_last

SEQ_ALIGN = 128
_F32 = jnp.float32
_INTERPRET = [None]  # stack of the active interpret() contexts' row alignments (None: compile for the TPU)


@contextlib.contextmanager
def interpret(align: int = SEQ_ALIGN):
  """Runs the kernels traced inside in Pallas' interpret mode (on CPU: the parity tests), padding sequences to a
  multiple of `align` (a multiple of 8; interpret mode has no lane tiling, so tests may pad less than a TPU)."""
  if align % 8:
    raise ValueError(f"interpret(align={align}): a multiple of 8 needed")
  _INTERPRET.append(align)
  try:
    yield
  finally:
    _INTERPRET.pop()


@dataclasses.dataclass(frozen=True)
class _Static:
  seq: int  # real sequence length (<= padded length)
  scale: float
  keep_prob: float  # 1 - attention dropout rate (1.0: no dropout input)
  c2p: bool
  p2c: bool
  dropout: bool


def _dot(a, b, contract_a=1, contract_b=1):
  return jax.lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=_F32)


def _skew(e, length):
  """e [L, W] -> [L, L], out[i, j] = e[i, j + L - 1 - i] (row i rolled by i - (L - 1))."""
  width = e.shape[1]
  return pltpu.roll(e, (width - (length - 1)) % width, 1, stride=1, stride_axis=0)[:, :length]


def _reverse_rows(x):
  """x[::-1] along rows (Mosaic lowers no `rev`): whole 8-row groups reordered by static slices, rows inside a
  group by 8 static sublane rolls and selects (row 8 g + k takes row 8 g + 7 - k)."""
  rows = x.shape[0]
  if rows % 8:
    raise ValueError(f"_reverse_rows: {rows} rows, a multiple of 8 needed")
  x = jnp.concatenate([x[g:g + 8] for g in range(rows - 8, -1, -8)], axis=0) if rows > 8 else x
  k = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0) % 8
  out = x
  for r in range(8):
    shift = (2 * r - 7) % rows
    out = jnp.where(k == r, pltpu.roll(x, shift, 0) if shift else x, out)
  return out


def _unskew_reversed(g, width):
  """The transpose of `_skew` with its rows reversed: g [L, L] -> R [L, W] with R[L - 1 - i] = unskew(g)[i],
  unskew(g)[i, m] = g[i, m - (L - 1) + i] (0 outside). The transpose rolls row i by (L - 1) - i, a negative stride
  that Mosaic's strided roll does not take; on the reversed rows the stride is + 1."""
  length = g.shape[0]
  g = _reverse_rows(g)
  g = jnp.concatenate([g, jnp.zeros((length, width - length), g.dtype)], axis=1)
  return pltpu.roll(g, 0, 1, stride=1, stride_axis=0)


def _scores(st, q, k, kr, qr, qv, kv):
  """-> (masked float32 scores / scale [L, L], keep-in-softmax mask [L, L])."""
  length = q.shape[0]
  s = _dot(q, k)
  if st.c2p:
    s = s + _skew(_dot(q, kr), length)
  if st.p2c:
    s = s + _skew(_dot(k, qr), length).T
  s = s / st.scale
  mask = (qv != 0) & (kv != 0)  # [L, 1] & [1, L]
  s = jnp.where(mask, s, jnp.finfo(_F32).min)
  real = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) < st.seq
  if st.seq < length:
    s = jnp.where(real, s, -jnp.inf)  # padded keys: exp = 0, even in a fully masked row
  return s, mask & real


def _softmax(s):
  e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
  return e / jnp.sum(e, axis=-1, keepdims=True)


def _unpack(st, refs, n_out):
  refs = list(refs)
  q, k, v = refs[:3]
  i = 3
  kr = qr = keep = None
  if st.c2p:
    kr, i = refs[i], i + 1
  if st.p2c:
    qr, i = refs[i], i + 1
  qv, kv, i = refs[i], refs[i + 1], i + 2
  if st.dropout:
    keep, i = refs[i], i + 1
  rest = refs[i:]
  return q, k, v, kr, qr, qv, kv, keep, rest[:len(rest) - n_out], rest[len(rest) - n_out:]


def _load(ref):
  return None if ref is None else ref[...]


def _dropped(st, probs, keep):
  if not st.dropout:
    return probs
  return jnp.where(keep != 0, probs / jnp.asarray(st.keep_prob, probs.dtype), jnp.zeros_like(probs))


def _fwd_kernel(st, *refs):
  q, k, v, kr, qr, qv, kv, keep, rest, (out,) = _unpack(st, refs, 1)
  del rest
  s, _ = _scores(st, q[...], k[...], _load(kr), _load(qr), qv[...], kv[...])
  probs = _softmax(s).astype(v.dtype)
  probs = _dropped(st, probs, _load(keep))
  out[...] = _dot(probs, v[...], 1, 0).astype(out.dtype)


def _bwd_kernel(st, *refs):
  n_out = 3 + st.c2p + st.p2c
  q_ref, k_ref, v_ref, kr_ref, qr_ref, qv, kv, keep_ref, (do_ref,), outs = _unpack(st, refs, n_out)
  dq_ref, dk_ref, dv_ref = outs[:3]
  dkr_ref = outs[3] if st.c2p else None
  dqr_ref = outs[3 + st.c2p] if st.p2c else None
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  kr, qr, keep = _load(kr_ref), _load(qr_ref), _load(keep_ref)
  s, valid = _scores(st, q, k, kr, qr, qv[...], kv[...])
  p = _softmax(s)
  pd = _dropped(st, p.astype(v.dtype), keep)
  dv_ref[...] = _dot(pd, do, 0, 0).astype(dv_ref.dtype)
  dp = _dot(do, v)  # d(dropped probs) [L, L] float32
  if st.dropout:
    dp = jnp.where(keep != 0, dp / st.keep_prob, 0.0)
  ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))
  ds = jnp.where(valid, ds, 0.0) / st.scale  # gradient of the raw (unscaled) scores
  dsc = ds.astype(q.dtype)
  dq = _dot(dsc, k, 1, 0)
  dk = _dot(dsc, q, 0, 0)
  width = (kr if st.c2p else qr).shape[0]

  @pl.when(pl.program_id(1) == 0)
  def _():
    for ref in (dkr_ref, dqr_ref):
      if ref is not None:
        ref[...] = jnp.zeros(ref.shape, ref.dtype)

  if st.c2p:  # dE = unskew(ds) = rev(R): dq += rev(R Kr), dKr += R^T rev(q)
    r = _unskew_reversed(ds, width).astype(q.dtype)  # [L, W]
    dq = dq + _reverse_rows(_dot(r, kr, 1, 0))
    dkr_ref[...] += _dot(r, _reverse_rows(q.astype(_F32)).astype(q.dtype), 0, 0)
  if st.p2c:
    r = _unskew_reversed(ds.T, width).astype(k.dtype)
    dk = dk + _reverse_rows(_dot(r, qr, 1, 0))
    dqr_ref[...] += _dot(r, _reverse_rows(k.astype(_F32)).astype(k.dtype), 0, 0)
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)


def _specs(st, length, width, dim):
  tok = pl.BlockSpec((None, None, length, dim), lambda h, b: (b, h, 0, 0))
  rows = pl.BlockSpec((None, width, dim), lambda h, b: (h, 0, 0))
  specs = [tok, tok, tok] + [rows] * (st.c2p + st.p2c)
  specs += [pl.BlockSpec((None, length, 1), lambda h, b: (b, 0, 0)),
            pl.BlockSpec((None, 1, length), lambda h, b: (b, 0, 0))]
  if st.dropout:
    specs.append(pl.BlockSpec((None, None, length, length), lambda h, b: (b, h, 0, 0)))
  return tok, rows, specs


def _nbytes(x):
  return int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize


def cost(st, q, width, backward):
  """The kernel's pl.CostEstimate: matmul flops, exps, and HBM bytes as its BlockSpecs move them."""
  batch, heads, length, dim = q.shape
  isz = jnp.dtype(q.dtype).itemsize
  pos = st.c2p + st.p2c
  square, skewed = 2 * length * length * dim, 2 * length * width * dim
  fwd = 2 * square + pos * skewed  # q.k, probs.v (+ q.Kr, k.Qr)
  tokens = batch * heads * length * dim * isz
  rows = heads * width * dim * isz  # fetched once per head (grid (heads, batch), batch innermost)
  masks = batch * heads * 2 * length * 4 + (batch * heads * length * length if st.dropout else 0)
  if not backward:
    return pl.CostEstimate(flops=batch * heads * fwd, transcendentals=batch * heads * length * length,
                           bytes_accessed=4 * tokens + pos * rows + masks)
  # recompute (q.k + skews) + do.v, pd.do, ds.k, ds.q (+ per relative term: de.Kr, de.q)
  bwd = (square + pos * skewed) + 4 * square + 2 * pos * skewed
  return pl.CostEstimate(flops=batch * heads * bwd, transcendentals=batch * heads * length * length,
                         bytes_accessed=7 * tokens + pos * rows + pos * heads * width * dim * 4 + masks)


def _params():
  return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=96 * 2**20)


_KINDS = ("tok", "tok", "tok", "rows", "rows", "vec", "vec", "tok")  # q, k, v, kr, qr, qv, kv, keep


def _on_mesh(fn, args, kinds, out_kinds):
  """fn(*args) per shard under the context mesh (`jax.set_mesh`; Mosaic kernels are not partitioned
  automatically): batch and heads split as the logical rules split "batch" and "heads". Outputs of kind "rows"
  (the relative rows' gradients, each shard's batch part) are summed over the batch shards. No mesh: fn(*args)."""
  if not jax.sharding.get_abstract_mesh().axis_names:
    return fn(*args)
  tok = nn.logical_to_mesh_axes(("batch", "heads", None, None))
  spec = {"tok": tok, "rows": nn.logical_to_mesh_axes(("heads", None, None)),
          "vec": nn.logical_to_mesh_axes(("batch", None, None))}
  batch_axes = tok[0]

  def body(*a):
    out = fn(*a)
    if batch_axes is None or not isinstance(out, (list, tuple)):
      return out
    return [jax.lax.psum(o, batch_axes) if kind == "rows" else o for o, kind in zip(out, out_kinds)]

  out_specs = [spec[k] for k in out_kinds] if isinstance(out_kinds, list) else spec[out_kinds]
  return jax.shard_map(body, in_specs=tuple(spec[k] for k in kinds), out_specs=out_specs, check_vma=False)(*args)


def _present(arrays):
  return ([a for a in arrays if a is not None], [k for a, k in zip(arrays, _KINDS + ("tok",)) if a is not None])


def _width(st, q, kr, qr):
  return (kr if st.c2p else qr).shape[1] if (st.c2p or st.p2c) else 2 * q.shape[2]


def _forward(st, q, k, v, kr, qr, qv, kv, keep):
  width = _width(st, q, kr, qr)

  def call(*args):
    batch, heads, length, dim = args[0].shape
    tok, _, specs = _specs(st, length, width, dim)
    return pl.pallas_call(functools.partial(_fwd_kernel, st), grid=(heads, batch), in_specs=specs, out_specs=tok,
                          out_shape=jax.ShapeDtypeStruct(args[0].shape, args[0].dtype), compiler_params=_params(),
                          interpret=_INTERPRET[-1] is not None, cost_estimate=cost(st, args[0], width, False),
                          name="deberta_attention_fwd")(*args)

  args, kinds = _present((q, k, v, kr, qr, qv, kv, keep))
  return _on_mesh(call, args, kinds, "tok")


def _keep_mask(st, key, q):
  """The attention-dropout keep mask [b, heads, P, P] int8 from the step's dropout key: nn.Dropout's own draw
  (`jax.random.bernoulli(key, keep_prob, [b, heads, S, S])`, the same bits as the XLA path), padded. Drawn again
  by the backward, so no [S, S] mask is kept alive between the two."""
  if not st.dropout:
    return None
  batch, heads, length, _ = q.shape
  keep = jax.random.bernoulli(key, st.keep_prob, (batch, heads, st.seq, st.seq))
  pad = length - st.seq
  return jnp.pad(keep, ((0, 0), (0, 0), (0, pad), (0, pad))).astype(jnp.int8)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, kr, qr, qv, kv, key):
  return _forward(st, q, k, v, kr, qr, qv, kv, _keep_mask(st, key, q))


def _attention_fwd(st, q, k, v, kr, qr, qv, kv, key):
  out = _forward(st, q, k, v, kr, qr, qv, kv, _keep_mask(st, key, q))
  return out, (q, k, v, kr, qr, qv, kv, key)


def _attention_bwd(st, res, do):
  q, k, v, kr, qr, qv, kv, key = res
  keep = _keep_mask(st, key, q)
  width = _width(st, q, kr, qr)
  out_kinds = ["tok"] * 3 + ["rows"] * (st.c2p + st.p2c)

  def call(*args):
    batch, heads, length, dim = args[0].shape
    tok, rows, specs = _specs(st, length, width, dim)
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args[:3]]
    out_shape += [jax.ShapeDtypeStruct((heads, width, dim), _F32)] * (st.c2p + st.p2c)
    return pl.pallas_call(functools.partial(_bwd_kernel, st), grid=(heads, batch), in_specs=specs + [tok],
                          out_specs=[tok] * 3 + [rows] * (st.c2p + st.p2c), out_shape=out_shape,
                          compiler_params=_params(), interpret=_INTERPRET[-1] is not None,
                          cost_estimate=cost(st, args[0], width, True), name="deberta_attention_bwd")(*args)

  args, kinds = _present((q, k, v, kr, qr, qv, kv, keep, do))
  grads = _on_mesh(call, args, kinds, out_kinds)
  dq, dk, dv = grads[:3]
  rest = list(grads[3:])
  dkr = rest.pop(0).astype(kr.dtype) if kr is not None else None
  dqr = rest.pop(0).astype(qr.dtype) if qr is not None else None
  return dq, dk, dv, dkr, dqr, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def padded_length(seq: int) -> int:
  align = _INTERPRET[-1] or SEQ_ALIGN
  return -(-seq // align) * align


def padded_diagonal(diag: Tuple[int, ...], padded: int) -> Tuple[int, ...]:
  """The Toeplitz diagonal of length 2 S - 1 extended to 2 P - 1 by its end values (offsets only padded positions
  reach; equal values stay contiguous, as `gather_along_last`'s backward needs)."""
  extra = padded - (len(diag) + 1) // 2
  return (diag[0],) * extra + tuple(diag) + (diag[-1],) * extra


def disentangled_attention(q, k, v, pos_key, pos_query, diag: Tuple[int, ...], mask, scale: float,
                           dropout_key: Optional[jax.Array] = None, keep_prob: float = 1.0):
  """q, k, v [b, S, heads, d]; pos_key / pos_query [R, heads, d] the projected relative rows (None: no c2p / p2c
  term); diag the static Toeplitz diagonal (2 S - 1 rows of pos_*); mask [b, S, S] bool (an outer product
  valid_q x valid_k); dropout_key: the attention dropout's key (None: no dropout; the keep mask is
  `jax.random.bernoulli(dropout_key, keep_prob, [b, heads, S, S])`, as nn.Dropout draws it). -> [b, S, heads, d]."""
  batch, seq, heads, dim = q.shape
  length = padded_length(seq)
  pad = length - seq
  diag_p = padded_diagonal(diag, length)
  width = 2 * length

  def rows(rel, d):  # [R, n, d] -> [n, W, d]: rel[d[m]] and a zero row
    g = gather_along_last(jnp.moveaxis(rel, 0, -1), d, rel.shape[0])  # [n, d, 2P - 1]
    return jnp.pad(jnp.swapaxes(g, -1, -2), ((0, 0), (0, width - g.shape[-1]), (0, 0)))

  def tokens(x):
    return jnp.pad(jnp.transpose(x, (0, 2, 1, 3)), ((0, 0), (0, 0), (0, pad), (0, 0)))

  kr = None if pos_key is None else rows(pos_key.astype(q.dtype), tuple(diag_p[::-1]))
  qr = None if pos_query is None else rows(pos_query.astype(q.dtype), tuple(diag_p))
  qv = jnp.pad(jnp.any(mask, axis=-1), ((0, 0), (0, pad))).astype(jnp.int32)[:, :, None]
  kv = jnp.pad(jnp.any(mask, axis=-2), ((0, 0), (0, pad))).astype(jnp.int32)[:, None, :]
  st = _Static(seq=seq, scale=float(scale), keep_prob=float(keep_prob), c2p=kr is not None, p2c=qr is not None,
               dropout=dropout_key is not None)
  out = _attention(st, tokens(q), tokens(k), tokens(v), kr, qr, qv, kv, dropout_key)
  return jnp.transpose(out[:, :, :seq], (0, 2, 1, 3))
