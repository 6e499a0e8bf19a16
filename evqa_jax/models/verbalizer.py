"""GNN-based soft verbalizer (OVQA paper section 3.4, Eq. 5-7) and the verbalizer variants of its Table 5.

Input: a padded answer graph (`evqa_jax.graphs.padding.pad_graph`) whose nodes are the frozen answer-encoder embeddings
`[nodes, D]`; answers are the first `num_answers_padded` nodes. Output: answer embeddings `[num_answers_padded, D]`
  H_hat = eps * stop_gradient(V) + (1 - eps) * H[:|V|]                                               (Eq. 7)
with eps per answer: `eps` everywhere (paper), or 1.0 on base answers when `eps_base_fixed` (authors' code).

Variants (Table 5), chosen by name or letter; all take the same padded graph:
  A "none":       H_hat = V (no verbalizer, eps ignored).
  B "hard":       H = mean of the answer's in-neighbours incl. itself (its GloVe neighbours that are not other answers,
                  whose edges the answer graph drops), one hop, nothing learned.
  C "soft":       B followed by a residual MLP, x + W2 relu(W1 x), near-identity at init.
  D "graph_mean": `num_layers` rounds of mean aggregation over in-edges (incl. self-loops), nothing learned.
  E "gat":        `num_layers` bilinear GAT layers as the authors' code implements them:
                  alpha_ij = softmax_{j in N(i)} LeakyReLU_0.2((W_dst h_i) . (W_src h_j)), h_i' = sum_j alpha_ij h_j,
                  W_dst, W_src D x D identity-initialised; no value projection, bias or activation between layers.
Eps mixing applies to B-E alike, so eps = 0 gives the variant's raw output.

Cost: W_dst and W_src act per node, never per edge; with `use_product` the score is h_i^T (W_dst^T W_src) h_j, one
D x D product and one per-node projection of the targets. The last layer computes the answer nodes only, inner layers
only the nodes before `num_receivers_padded` when given (`padding.verbalizer_budget`), each layer on its prefix of
edges. The edge softmax + aggregation (`edge_attention`) walks the edges in chunks with a hand-written backward:
memory O(nodes * D + edges), no `[edges, D]` array.

Inspection: `edge_attention_weights` gives a layer's alpha_ij per edge; applied with `mutable=["intermediates"]`,
each GAT layer sows them as intermediates/<...>/gat_<l>/attention (the OVQA paper's Fig. 6: launch/ovqa_figures.py).
"""

import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

_VARIANTS = {
    "a": "none", "none": "none",
    "b": "hard", "hard": "hard",
    "c": "soft", "soft": "soft",
    "d": "graph_mean", "graph_mean": "graph_mean",
    "e": "gat", "gat": "gat",
}

LEARNED_VARIANTS = ("soft", "gat")  # the variants with parameters


def canonical_variant(name: str) -> str:
  """Maps a Table 5 letter (A-E) or a variant name to its canonical name."""
  key = str(name).lower()
  if key not in _VARIANTS:
    raise ValueError(f"unknown verbalizer variant {name!r}; choose one of A-E or {sorted(set(_VARIANTS.values()))}")
  return _VARIANTS[key]


def reads_graph(name: str) -> bool:
  """Whether variant `name` (`config.verbalizer.variant`: a letter or a name, any case) runs on the answer graphs:
  every variant but A ("none"), which uses the LM's answer embeddings as they are."""
  return canonical_variant(name) != "none"


def _route_receivers(receivers, num_targets: int, num_nodes: int):
  """Edge receivers and segment count when only nodes [0, num_targets) are computed.

  Edges into other nodes go to one extra dummy segment that is sliced away; unlike out-of-range ids (which jraph
  drops), the dummy keeps every gathered value finite, so no NaN can reach a gradient.
  """
  if num_targets >= num_nodes:
    return receivers, num_nodes
  return jnp.where(receivers < num_targets, receivers, num_targets), num_targets + 1


def mean_aggregate(h, senders, receivers, num_targets: int):
  """Mean of in-neighbour features: `[nodes, D]` -> `[num_targets, D]`; nodes without in-edges get zeros."""
  recv, num_seg = _route_receivers(receivers, num_targets, h.shape[0])
  total = jraph.segment_sum(h[senders], recv, num_seg)
  deg = jraph.segment_sum(jnp.ones(senders.shape, h.dtype), recv, num_seg)
  return (total / jnp.maximum(deg, 1)[:, None])[:num_targets]


def _edge_chunks(senders, receivers, num_targets: int, chunk: int):
  """Edge indices `[chunks, chunk]`; receivers outside [0, num_targets) and padding go to dummy segment num_targets."""
  num_edges = senders.shape[0]
  chunk = max(1, min(chunk, num_edges))
  num_chunks = -(-num_edges // chunk)
  pad = num_chunks * chunk - num_edges
  recv = jnp.where(receivers < num_targets, receivers, num_targets)
  recv = jnp.pad(recv, (0, pad), constant_values=num_targets).reshape(num_chunks, chunk)
  send = jnp.pad(senders, (0, pad)).reshape(num_chunks, chunk)
  return send, recv


def _edge_scores(q, k, senders, receivers, num_targets, negative_slope, chunk):
  """(send, recv `[chunks, chunk]`, q_ext, raw scores, alpha `[chunks * chunk]`) of the chunked edge loop."""
  send, recv = _edge_chunks(senders, receivers, num_targets, chunk)
  q_ext = jnp.concatenate([q, jnp.zeros((1, q.shape[-1]), q.dtype)], axis=0)

  def score_chunk(_, idx):
    s, r = idx
    return None, jnp.sum(q_ext[r] * k[s], axis=-1)

  _, raw = jax.lax.scan(score_chunk, None, (send, recv))
  raw = raw.reshape(-1)
  alpha = jraph.segment_softmax(jax.nn.leaky_relu(raw, negative_slope), recv.reshape(-1), num_targets + 1)
  return send, recv, q_ext, raw, alpha


def edge_attention_weights(q, k, senders, receivers, num_targets: int, negative_slope: float = 0.2,
                           chunk: int = 16384):
  """The attention coefficients alpha_ij of `edge_attention`, one per edge `[edges]` (edge e: j = senders[e] ->
  i = receivers[e]; Eq. 5): the weights over each target's in-edges sum to 1; edges into nodes outside
  [0, num_targets) get 0. The same computation as the forward pass, for inspection (the OVQA paper's Fig. 6)."""
  _, _, _, _, alpha = _edge_scores(q, k, senders, receivers, num_targets, negative_slope, chunk)
  alpha = alpha[:senders.shape[0]]
  return jnp.where(receivers < num_targets, alpha, jnp.zeros_like(alpha))


def _edge_attention_fwd(q, k, v, senders, receivers, num_targets, negative_slope, chunk):
  send, recv, q_ext, raw, alpha = _edge_scores(q, k, senders, receivers, num_targets, negative_slope, chunk)

  def aggregate_chunk(acc, x):
    s, r, a = x
    return acc.at[r].add(a[:, None] * v[s]), None

  out, _ = jax.lax.scan(aggregate_chunk, jnp.zeros((num_targets + 1, v.shape[-1]), v.dtype),
                        (send, recv, alpha.reshape(send.shape)))
  return out[:num_targets], (q_ext, k, v, send, recv, raw, alpha)


def _edge_attention_bwd(num_targets, negative_slope, chunk, res, g):
  del chunk
  q_ext, k, v, send, recv, raw, alpha = res
  g = jnp.concatenate([g, jnp.zeros((1, g.shape[-1]), g.dtype)], axis=0)  # the dummy segment's output is discarded

  def dalpha_chunk(_, idx):
    s, r = idx
    return None, jnp.sum(g[r] * v[s], axis=-1)

  _, dalpha = jax.lax.scan(dalpha_chunk, None, (send, recv))
  dalpha = dalpha.reshape(-1)
  flat_recv = recv.reshape(-1)
  seg_dot = jraph.segment_sum(alpha * dalpha, flat_recv, num_targets + 1)
  dlogit = alpha * (dalpha - seg_dot[flat_recv])
  draw = jnp.where(raw >= 0, dlogit, negative_slope * dlogit).reshape(send.shape)

  def grad_chunk(carry, x):
    dq, dk, dv = carry
    s, r, a, d = x
    dv = dv.at[s].add(a[:, None] * g[r])
    dq = dq.at[r].add(d[:, None] * k[s])
    dk = dk.at[s].add(d[:, None] * q_ext[r])
    return (dq, dk, dv), None

  init = (jnp.zeros_like(q_ext), jnp.zeros_like(k), jnp.zeros_like(v))
  (dq, dk, dv), _ = jax.lax.scan(grad_chunk, init, (send, recv, alpha.reshape(send.shape), draw))
  return dq[:num_targets], dk, dv, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def edge_attention(q, k, v, senders, receivers, num_targets: int, negative_slope: float = 0.2,
                   chunk: int = 16384):
  """out_i = sum_{e: j -> i} softmax_e(LeakyReLU(q_i . k_j)) v_j for targets i in [0, num_targets).

  q `[num_targets, D]`, k / v `[nodes, D]`, senders / receivers `[edges]` -> `[num_targets, D]`; edges into other
  nodes are ignored. Edges are processed `chunk` at a time in both passes with a hand-written backward, so no
  `[edges, D]` array is ever alive: memory is O(nodes * D + edges + chunk * D).
  """
  return _edge_attention_fwd(q, k, v, senders, receivers, num_targets, negative_slope, chunk)[0]


edge_attention.defvjp(_edge_attention_fwd, _edge_attention_bwd)


def _identity_init(key, shape, dtype=jnp.float32):
  del key
  if len(shape) != 2 or shape[0] != shape[1]:
    raise ValueError(f"identity init needs a square matrix, got {shape}")
  return jnp.eye(shape[0], dtype=dtype)


class GATLayer(nn.Module):
  """One bilinear GAT layer on `[nodes, D]` node states -> `[num_targets, D]` states of nodes [0, num_targets)."""
  negative_slope: float = 0.2
  use_product: bool = True
  edge_chunk: int = 16384
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h, senders, receivers, num_targets: int):
    d = h.shape[-1]
    # Stored as [in, out] kernels: row-vector q_i = h_i w_dst is (W_dst h_i)^T with W_dst = w_dst^T.
    w_dst = self.param("w_dst", nn.with_logical_partitioning(_identity_init, ("embed", "mlp")), (d, d),
                       self.param_dtype).astype(self.dtype)
    w_src = self.param("w_src", nn.with_logical_partitioning(_identity_init, ("embed", "mlp")), (d, d),
                       self.param_dtype).astype(self.dtype)
    targets = h[:num_targets]
    if self.use_product:
      # (W_dst h_i).(W_src h_j) = (h_i w_dst w_src^T) . h_j: one D x D product, then only targets are projected.
      q = targets @ (w_dst @ w_src.T)
      k = h
    else:
      q = targets @ w_dst
      k = h @ w_src
    q = nn.with_logical_constraint(q, ("nodes", "embed"))
    k = nn.with_logical_constraint(k, ("nodes", "embed"))
    if self.is_mutable_collection("intermediates"):
      # apply(..., mutable=["intermediates"]): the layer's alpha_ij per edge `[edges]` (edge_attention_weights),
      # stored as ("attention",); training never asks for it, so it costs nothing there.
      self.sow("intermediates", "attention",
               edge_attention_weights(q, k, senders, receivers, num_targets, self.negative_slope, self.edge_chunk))
    out = edge_attention(q, k, h, senders, receivers, num_targets, self.negative_slope, self.edge_chunk)
    return nn.with_logical_constraint(out, ("nodes", "embed"))


class ResidualMLP(nn.Module):
  """x + W2 relu(W1 x) on `[answers, D]`; small init so it starts near the identity (variant C)."""
  mlp_dim: Optional[int] = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    init = nn.initializers.normal(1e-3)
    y = nn.Dense(self.mlp_dim or d, dtype=self.dtype, param_dtype=self.param_dtype, name="mlp_in",
                 kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
    y = nn.relu(y)
    y = nn.Dense(d, dtype=self.dtype, param_dtype=self.param_dtype, name="mlp_out",
                 kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(y)
    return x + y


class Verbalizer(nn.Module):
  """Answer embeddings from a padded answer graph (module docstring).

  Attributes:
    variant: Table 5 variant, a letter A-E or none / hard / soft / graph_mean / gat.
    num_layers: L for graph_mean and gat.
    eps: the convex-combination weight of the input embeddings V in Eq. 7.
    eps_base_fixed: authors' code: eps = 1 on base answers (`is_base`), `eps` on the rest.
    use_product: score through W_dst^T W_src (cheaper when nodes > D); same function either way.
    mlp_dim: hidden size of variant C's MLP (default D).
    edge_chunk: edges per step of the GAT's chunked edge loop (bounds its `[chunk, D]` temporaries).
  """
  variant: str = "gat"
  num_layers: int = 2
  eps: float = 0.7
  eps_base_fixed: bool = False
  negative_slope: float = 0.2
  use_product: bool = True
  mlp_dim: Optional[int] = None
  edge_chunk: int = 16384
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, graph: jraph.GraphsTuple, num_answers_padded: int, is_base=None,
               num_receivers_padded: Optional[int] = None, num_receiver_edges_padded: Optional[int] = None,
               num_answer_edges_padded: Optional[int] = None, answers=None):
    """graph.nodes `[nodes, D]`, is_base `[num_answers_padded]` bool -> `[num_answers_padded, D]`.

    `answers` `[num_answers_padded, D]`: Eq. 7's V when it is not the answer nodes' input features (an imported
    graph's own features, as the OVQA authors' model mixes its LM answer embeddings with the GNN of x.pth).

    The optional static bounds come from `padding.verbalizer_budget` and only skip work that cannot change the
    result: with `num_receivers_padded` R (every edge into a node >= R is a self-loop) inner layers update nodes
    [0, R) only, since a node whose only in-edges are self-loops keeps its state under mean and attention
    aggregation; `num_receiver_edges_padded` / `num_answer_edges_padded` are prefixes of the receiver-sorted edges
    that hold every edge into nodes < R / into answers (the inner / last layer's edges).
    """
    variant = canonical_variant(self.variant)
    h0 = nn.with_logical_constraint(jnp.asarray(graph.nodes, self.dtype), ("nodes", "embed"))
    num_nodes = h0.shape[0]
    if not 0 < num_answers_padded <= num_nodes:
      raise ValueError(f"num_answers_padded={num_answers_padded} must be in (0, {num_nodes}] (graph nodes)")
    senders, receivers = graph.senders, graph.receivers
    v = jax.lax.stop_gradient(h0[:num_answers_padded] if answers is None else jnp.asarray(answers, self.dtype))
    if variant == "none":
      return v

    def edges(prefix):
      return (senders, receivers) if prefix is None else (senders[:prefix], receivers[:prefix])

    if variant in ("hard", "soft"):
      h = mean_aggregate(h0, *edges(num_answer_edges_padded), num_answers_padded)
      if variant == "soft":
        h = ResidualMLP(self.mlp_dim, self.dtype, self.param_dtype, name="mlp")(h)
    else:
      if self.num_layers < 1:
        raise ValueError(f"num_layers must be >= 1 for variant {variant!r}, got {self.num_layers}")
      inner = num_nodes if num_receivers_padded is None else min(int(num_receivers_padded), num_nodes)
      if inner < num_answers_padded:
        raise ValueError(f"num_receivers_padded={num_receivers_padded} < num_answers_padded={num_answers_padded}")
      h = h0
      for layer in range(self.num_layers):
        last = layer == self.num_layers - 1
        # Only the answers' final states are read, so the last layer computes just those targets.
        targets = num_answers_padded if last else inner
        s, r = edges(num_answer_edges_padded if last else num_receiver_edges_padded)
        if variant == "gat":
          new = GATLayer(self.negative_slope, self.use_product, self.edge_chunk, self.dtype, self.param_dtype,
                         name=f"gat_{layer}")(h, s, r, targets)
        else:
          new = mean_aggregate(h, s, r, targets)
        if targets < h.shape[0] and layer < self.num_layers - 1:
          new = jnp.concatenate([new, h[targets:]], axis=0)
        h = nn.with_logical_constraint(new, ("nodes", "embed"))

    eps = jnp.full((num_answers_padded,), self.eps, self.dtype)
    if self.eps_base_fixed:
      if is_base is None:
        raise ValueError("Verbalizer(eps_base_fixed=True) needs the per-answer `is_base` mask")
      is_base = jnp.asarray(is_base, bool)
      if is_base.shape != (num_answers_padded,):
        raise ValueError(f"is_base has shape {is_base.shape}, expected ({num_answers_padded},)")
      eps = jnp.where(is_base, jnp.ones_like(eps), eps)
    eps = eps[:, None]
    return eps * v + (1 - eps) * h
