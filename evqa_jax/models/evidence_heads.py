"""E-VQA evidence heads: per-frame temporal evidence, question-conditioned segmentation, evidence-aware answers.

All three read the cross-modal encoder's output (`q`: the pooled question tokens `[batch, H]`; `h_vis`: the hidden
states at the visual-prefix positions `[batch, T, H]`, which have attended to the question and the options) together
with the frame encoder's patch features `[batch, T, P, D]`.

- `TemporalHead` -> per-frame evidence logits `[batch, T]`: an additive MLP over (h_vis_t, q, pooled frame feature,
  statistics of the frame's question-conditioned mask logits), a temporal convolution over frames (evidence comes in
  runs, so neighbouring frames should agree), a bilinear question x frame term, and a direct term from the frame's
  largest mask logit: a frame is evidence when the object the question refers to is visible in it.
- `SegmentationHead` -> per-frame mask logits on the patch grid `[batch, T, gh, gw]` and upsampled (bilinear,
  `jax.image.resize`) to the pixel size `[batch, T, H, W]`. The projected patch features are FiLM-modulated by the
  question (scale and shift from q), so pixel embeddings depend on what is asked. K evidence-query tokens per frame (learned embeddings +
  a projection of q + a projection of h_vis_t) cross-attend to that frame's patch features (one decoder layer:
  attention + MLP, pre-LN), then each query's mask is the scaled dot product with the projected patch features; the
  K masks are merged by a max over queries, because the ground truth merges all evidence objects into one mask.
- `AnswerHead` -> option logits `[batch, C]` from each option's pooled hidden state, conditioned on an evidence
  readout vector (see `evidence_readout`).

Every parameter carries logical axis names (embed / mlp / heads / kv) and activations are constrained to
(batch, frames, length, embed), so the heads shard over a (data, model) mesh by config rules alone.
"""

from typing import Any, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import layers


class TemporalHead(nn.Module):
  """(h_vis `[b, T, H]`, q `[b, H]`, frame features g `[b, T, G]`) -> evidence logits `[b, T]`."""
  dim: int = 128
  kernel_size: int = 5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h_vis, q, g, mask_stats=None, descriptors=None):
    """mask_stats `[b, T, S]` (optional): statistics of the question-conditioned mask logits of each frame
    (`mask_statistics`); the queried object being visible in a frame is the most direct temporal evidence.
    descriptors `[b, T, E]` (optional): what the mask shows in each frame (`frame_descriptors`: silhouette,
    position, size, motion), added to the MLP and matched against the question by a second bilinear term."""
    d = self.dim
    h = (layers.dense(d, ("embed", "mlp"), "vis", self.dtype)(layers.layer_norm("vis_LayerNorm", self.dtype)(h_vis))
         + layers.dense(d, ("embed", "mlp"), "question", self.dtype)(
             layers.layer_norm("q_LayerNorm", self.dtype)(q))[:, None]
         + layers.dense(d, ("embed", "mlp"), "frame", self.dtype)(layers.layer_norm("g_LayerNorm", self.dtype)(g)))
    if mask_stats is not None:
      h = h + layers.dense(d, (None, "mlp"), "mask_stats", self.dtype)(mask_stats.astype(self.dtype))
    if descriptors is not None:
      desc = layers.layer_norm("desc_LayerNorm", self.dtype, axis=None)(descriptors.astype(self.dtype))
      h = h + layers.dense(d, (None, "mlp"), "descriptors", self.dtype)(desc)
    h = nn.with_logical_constraint(nn.gelu(h), ("batch", "frames", "mlp"))
    # Temporal context: evidence windows are contiguous runs of frames.
    h = h + nn.gelu(nn.Conv(d, (self.kernel_size,), padding="SAME", dtype=self.dtype, name="temporal_conv",
                            kernel_init=layers.lecun_normal((None, None, "mlp")),
                            bias_init=layers.zeros(("mlp",)))(h))
    logits = layers.dense(1, ("mlp", None), "out", self.dtype)(h)[..., 0]
    qb = layers.dense(d, ("embed", "mlp"), "bilinear_q", self.dtype)(q)
    gb = layers.dense(d, ("embed", "mlp"), "bilinear_g", self.dtype)(g)
    logits = logits + jnp.einsum("bd,btd->bt", qb, gb) / jnp.sqrt(jnp.asarray(d, self.dtype))
    if descriptors is not None:
      qd = layers.dense(d, ("embed", "mlp"), "bilinear_q_desc", self.dtype)(q)
      dd = layers.dense(d, (None, "mlp"), "bilinear_desc", self.dtype)(desc)
      logits = logits + jnp.einsum("bd,btd->bt", qd, dd) / jnp.sqrt(jnp.asarray(d, self.dtype))
    if mask_stats is not None:
      # A direct path from "the mask fires in this frame" to "this frame is evidence" (a learned affine map of the
      # frame's largest mask logit), so the temporal head agrees with the segmentation head from the first steps.
      scale = self.param("mask_max_scale", nn.with_logical_partitioning(nn.initializers.constant(1.0), ()), ())
      logits = logits + scale * mask_stats[..., 0].astype(self.dtype)
    return logits.astype(jnp.float32)


def mask_statistics(grid_logits):
  """`[b, T, gh, gw]` mask logits -> `[b, T, 3]`: max logit, log of the soft area (sum of probabilities, +1) and the
  mean logit, per frame."""
  flat = grid_logits.reshape(grid_logits.shape[:2] + (-1,)).astype(jnp.float32)
  return jnp.stack([jnp.max(flat, -1), jnp.log1p(jnp.sum(jax.nn.sigmoid(flat), -1)), jnp.mean(flat, -1)], axis=-1)


class QuestionPool(nn.Module):
  """Multi-head attention pooling of the question tokens: (tokens `[b, L, H]`, mask `[b, L]`) -> `[b, 2H]`.

  concat(mean over the question tokens, `num_heads` learned attention poolings projected back to H). A plain mean
  drowns the one or two words that name the object ("red", "circle") among the rest of the question; learned
  per-token weights let each pooling head pick them out, which is what ties the evidence heads to the question.
  """
  num_heads: int = 4
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens, mask):
    b, _, hdim = tokens.shape
    m = (mask > 0)
    x = layers.layer_norm("LayerNorm", self.dtype)(tokens)
    scores = layers.dense(self.num_heads, ("embed", "heads"), "score", self.dtype)(x)
    scores = scores.astype(jnp.float32)  # [b, L, h]
    scores = jnp.where(m[..., None], scores, -1e9)
    probs = jax.nn.softmax(scores, axis=1).astype(self.dtype) * m[..., None].astype(self.dtype)
    pooled = jnp.einsum("blh,bld->bhd", probs, x).reshape(b, self.num_heads * hdim)
    pooled = layers.dense(hdim, ("mlp", "embed"), "out", self.dtype)(pooled)
    mf = m.astype(self.dtype)
    mean = jnp.einsum("bl,bld->bd", mf, tokens) / jnp.maximum(jnp.sum(mf, -1, keepdims=True), 1.0)
    return jnp.concatenate([mean, pooled], axis=-1)


class HeadProjection(nn.Module):
  """x `[..., in]` -> `[..., heads, head_dim]` (kernel `[in, heads, head_dim]`), or with `to_heads=False`
  `[..., heads, head_dim]` -> `[..., out]`.

  Written out instead of nn.DenseGeneral: DenseGeneral creates its kernel flat and reshapes it, so a 3-name logical
  box sees a rank-2 value and fails under a mesh (jax.set_mesh) when flax re-derives the parameter's shape.
  """
  features: tuple
  names: tuple
  bias_names: tuple
  to_heads: bool = True
  init_std: float = 0.0  # 0: 1 / sqrt(fan_in)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    if self.to_heads:
      shape = (x.shape[-1],) + tuple(self.features)
      fan_in = x.shape[-1]
    else:
      shape = tuple(x.shape[-2:]) + tuple(self.features)
      fan_in = x.shape[-1] * x.shape[-2]
    init = nn.initializers.normal(self.init_std or 1.0 / np.sqrt(fan_in))
    kernel = self.param("kernel", nn.with_logical_partitioning(init, self.names), shape,
                        self.param_dtype).astype(self.dtype)
    bias = self.param("bias", layers.zeros(self.bias_names), tuple(self.features), self.param_dtype).astype(self.dtype)
    if self.to_heads:
      return jnp.einsum("...i,ihd->...hd", x.astype(self.dtype), kernel) + bias
    return jnp.einsum("...hd,hdo->...o", x.astype(self.dtype), kernel) + bias


class CrossAttention(nn.Module):
  """Queries `[b, T, K, d]` attend to keys/values `[b, T, P, d]` of the same frame -> `[b, T, K, d]`."""
  dim: int
  num_heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, queries, context):
    if self.dim % self.num_heads:
      raise ValueError(f"CrossAttention: dim {self.dim} is not a multiple of num_heads {self.num_heads}")
    hd = self.dim // self.num_heads

    def proj(name):
      return HeadProjection((self.num_heads, hd), ("embed", "heads", "kv"), ("heads", "kv"), dtype=self.dtype,
                            name=name)

    q = proj("query")(queries) / jnp.sqrt(jnp.asarray(hd, self.dtype))
    k = proj("key")(context)
    v = proj("value")(context)
    q = nn.with_logical_constraint(q, ("batch", "frames", None, "heads", "kv"))
    k = nn.with_logical_constraint(k, ("batch", "frames", "length", "heads", "kv"))
    scores = jnp.einsum("btqhd,btphd->bthqp", q, k).astype(jnp.float32)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    ctx = jnp.einsum("bthqp,btphd->btqhd", probs, v)
    return HeadProjection((self.dim,), ("heads", "kv", "embed"), ("embed",), to_heads=False, dtype=self.dtype,
                          name="out")(ctx)


class SegmentationHead(nn.Module):
  """Evidence masks; see the module docstring.

  __call__(patch_features [b, T, P, D], q [b, H], h_vis [b, T, H]) ->
    (grid_logits [b, T, gh, gw], pixel_logits [b, T, out_size[0], out_size[1]])

  Attributes:
    grid: (gh, gw) patch grid of the frame encoder (P = gh * gw).
    out_size: (H, W) pixel size the logits are upsampled to (the frames' resolution).
    dim, num_heads, mlp_dim: decoder width, attention heads, MLP width.
    num_queries: evidence-query tokens per frame (their masks are merged by a max).
  """
  grid: Tuple[int, int]
  out_size: Tuple[int, int]
  dim: int = 64
  num_heads: int = 4
  mlp_dim: int = 128
  num_queries: int = 2
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, patch_features, q, h_vis):
    b, t, p, _ = patch_features.shape
    gh, gw = self.grid
    if p != gh * gw:
      raise ValueError(f"SegmentationHead: {p} patches per frame but grid {gh}x{gw}")
    d, k = self.dim, self.num_queries
    feats = layers.dense(d, ("embed", "mlp"), "patch_proj", self.dtype)(
        layers.layer_norm("patch_LayerNorm", self.dtype)(patch_features))
    # FiLM by the question: the pixel embeddings themselves depend on what is asked, so "the red circle" and
    # "the blue square" light up different pixels of the same frame (the referring-segmentation recipe).
    film = layers.dense(2 * d, ("embed", "mlp"), "film", self.dtype, stddev=1e-3)(
        layers.layer_norm("film_LayerNorm", self.dtype)(q))
    gamma, beta = film[:, None, None, :d], film[:, None, None, d:]
    feats = nn.gelu(feats * (1.0 + gamma) + beta)
    feats = nn.with_logical_constraint(feats, ("batch", "frames", "length", "embed"))

    query_embed = self.param("query_embed", layers.normal(0.02, (None, "embed")), (k, d))
    from_q = layers.dense(k * d, ("embed", "mlp"), "query_from_question", self.dtype)(
        layers.layer_norm("q_LayerNorm", self.dtype)(q)).reshape(b, 1, k, d)
    from_v = layers.dense(d, ("embed", "mlp"), "query_from_frame", self.dtype)(
        layers.layer_norm("vis_LayerNorm", self.dtype)(h_vis))[:, :, None]
    queries = query_embed.astype(self.dtype)[None, None] + from_q + from_v
    queries = nn.with_logical_constraint(queries, ("batch", "frames", None, "embed"))

    ctx = layers.layer_norm("ctx_LayerNorm", self.dtype)(feats)
    queries = queries + CrossAttention(d, self.num_heads, dtype=self.dtype, name="cross_attention")(
        layers.layer_norm("attn_LayerNorm", self.dtype)(queries), ctx)
    h = layers.dense(self.mlp_dim, ("embed", "mlp"), "mlp_in", self.dtype)(
        layers.layer_norm("mlp_LayerNorm", self.dtype)(queries))
    queries = queries + layers.dense(d, ("mlp", "embed"), "mlp_out", self.dtype)(nn.gelu(h))
    queries = nn.with_logical_constraint(queries, ("batch", "frames", None, "embed"))

    mask_embed = layers.dense(d, ("embed", "mlp"), "mask_embed", self.dtype)(
        layers.layer_norm("out_LayerNorm", self.dtype)(queries))
    pixel_embed = layers.dense(d, ("embed", "mlp"), "pixel_embed", self.dtype)(feats)
    logits = jnp.einsum("btkd,btpd->btkp", mask_embed, pixel_embed) / jnp.sqrt(jnp.asarray(d, self.dtype))
    bias = self.param("mask_bias", nn.with_logical_partitioning(nn.initializers.constant(-2.0), ()), ())
    logits = jnp.max(logits.astype(jnp.float32), axis=2) + bias
    grid_logits = logits.reshape(b, t, gh, gw)
    grid_logits = nn.with_logical_constraint(grid_logits, ("batch", "frames", None, None))
    pixel_logits = upsample_logits(grid_logits, self.out_size)
    return grid_logits, nn.with_logical_constraint(pixel_logits, ("batch", "frames", None, None))


def upsample_logits(grid_logits, out_size):
  """`[..., gh, gw]` -> `[..., H, W]` bilinear (half-pixel centres, as jax.image.resize "bilinear")."""
  shape = tuple(grid_logits.shape[:-2]) + tuple(out_size)
  return jax.image.resize(grid_logits, shape, method="bilinear")


def _centroids(m, grid):
  """m `[b, T, P]` mask probabilities -> (confident mass `[b, T]`, centroid `[b, T, 2]` (x, y) in grid fractions).
  Only the confident part (probability > 0.5) counts, so the faint background of a large grid does not pull the
  centroid towards the centre."""
  gh, gw = grid
  ys, xs = jnp.meshgrid(jnp.arange(gh, dtype=jnp.float32), jnp.arange(gw, dtype=jnp.float32), indexing="ij")
  pos = jnp.stack([xs.reshape(-1), ys.reshape(-1)], axis=-1) / jnp.asarray([gw, gh], jnp.float32)  # [P, 2] in [0,1)
  confident = m * (m > 0.5)
  mass = jnp.sum(confident, axis=-1)
  return mass, jnp.einsum("btp,pc->btc", confident, pos) / (mass[..., None] + 1e-4)


def _silhouettes(m, centroid, grid, window: int, radius: float):
  """m `[b, T, P]`, centroid `[b, T, 2]` -> `[b, T, window^2]`: m sampled bilinearly on a window x window lattice
  spanning +-radius grid cells around each frame's centroid (row-major, y then x; 0 outside the frame)."""
  b, t, _ = m.shape
  gh, gw = grid
  offsets = jnp.linspace(-radius, radius, window)
  sy = (centroid[..., 1] * gh)[..., None, None] + offsets[None, None, :, None]  # [b, T, S, 1]
  sx = (centroid[..., 0] * gw)[..., None, None] + offsets[None, None, None, :]  # [b, T, 1, S]
  sy, sx = jnp.broadcast_arrays(sy, sx)
  sample = jax.vmap(lambda img, y, x: jax.scipy.ndimage.map_coordinates(img, [y, x], order=1, mode="constant"))
  return sample(m.reshape(b * t, gh, gw), sy.reshape(b * t, window, window),
                sx.reshape(b * t, window, window)).reshape(b, t, window * window)


class MaskGeometry(NamedTuple):
  """The segmentation head's grid mask, summarised per frame (gradients stopped); see `mask_geometry`."""
  probs: jax.Array  # [b, T, P] float32 mask probabilities
  mass: jax.Array  # [b, T] confident mass (cells with probability > 0.5, weighted by it)
  centroid: jax.Array  # [b, T, 2] (x, y) of the confident part, in grid fractions
  silhouette: Optional[jax.Array]  # [b, T, S*S] the mask around its centroid; None when S = 0


def mask_geometry(grid_logits, grid, shape_window: int = 0, shape_radius: float = 0.0) -> MaskGeometry:
  """`[b, T, gh, gw]` mask logits -> their `MaskGeometry`, computed once per step and shared by
  `frame_descriptors` (temporal head) and `evidence_readout` (answer head).

  shape_window: S > 0 adds the silhouette: the mask probabilities sampled (bilinearly) on an S x S lattice spanning
  +-shape_radius grid cells around each frame's centroid (row-major, y then x; 0 outside the frame).
  """
  b, t, gh, gw = grid_logits.shape
  m = jax.lax.stop_gradient(jax.nn.sigmoid(grid_logits.astype(jnp.float32))).reshape(b, t, gh * gw)
  mass, centroid = _centroids(m, grid)
  sil = _silhouettes(m, centroid, grid, shape_window, shape_radius) if shape_window > 0 else None
  return MaskGeometry(m, mass, centroid, sil)


def frame_descriptors(geometry: MaskGeometry, frame_mask, grid):
  """What the predicted mask shows in each frame, for the temporal head (gradients stopped).

  `mask_geometry(...)` -> `[b, T, S*S + 5]`: the silhouette around the mask's centroid (if the geometry has one), the
  centroid (x, y), the confident area (fraction of the frame) and the centroid's velocity from the previous to the
  next frame (grid fractions per frame x 30; 0 where a neighbour is padded or has no mask).
  With these a frame can be matched against "the circle" or "the object that moves left" even when the mask itself
  fires on whatever object is on screen.
  """
  gh, gw = grid
  mass, centroid = geometry.mass, geometry.centroid
  present = (mass >= 1.0) & (frame_mask > 0)  # at least one confident cell
  prev = jnp.concatenate([centroid[:, :1], centroid[:, :-1]], axis=1)
  nxt = jnp.concatenate([centroid[:, 1:], centroid[:, -1:]], axis=1)
  has_prev = jnp.concatenate([jnp.zeros_like(present[:, :1]), present[:, :-1]], axis=1) & present
  has_next = jnp.concatenate([present[:, 1:], jnp.zeros_like(present[:, :1])], axis=1) & present
  span = has_prev.astype(jnp.float32) + has_next.astype(jnp.float32)
  velocity = ((nxt - centroid) * has_next[..., None] + (centroid - prev) * has_prev[..., None]) / jnp.maximum(
      span, 1.0)[..., None]
  parts = [centroid * present[..., None], (mass / (gh * gw))[..., None], 30.0 * velocity]
  if geometry.silhouette is not None:
    parts.insert(0, geometry.silhouette * present[..., None])
  return jnp.concatenate(parts, axis=-1)


def factorized_mask_logits(frame_logits, mask_logits):
  """logit(sigmoid(frame) * sigmoid(mask)): a pixel is evidence when its frame is evidence and it belongs to the
  object there. `[b, T]`, `[b, T, H, W]` -> `[b, T, H, W]`, computed in log space."""
  lp = jax.nn.log_sigmoid(frame_logits.astype(jnp.float32))[..., None, None] + jax.nn.log_sigmoid(
      mask_logits.astype(jnp.float32))
  lp = jnp.minimum(lp, -1e-6)
  return lp - jnp.log(-jnp.expm1(lp))


def readout_dim(feature_dim: int, shape_window: int = 0) -> int:
  """Width of `evidence_readout`'s vector."""
  return feature_dim + 5 + shape_window * shape_window


def evidence_readout(patch_features, geometry: MaskGeometry, frame_logits, frame_mask):
  """What the predicted evidence looks like, how it moves and what shape it has, for the answer head.

  Weights are the predicted evidence itself (sigmoid of the temporal and mask logits, gradients stopped: the
  evidence heads are trained by their own losses, the answer loss only shapes the features read out).
  Args:
    patch_features `[b, T, P, D]`, geometry: `mask_geometry` of the grid mask logits `[b, T, gh, gw]`,
    frame_logits `[b, T]`, frame_mask `[b, T]`.
    If the geometry has a silhouette (shape_window S > 0) it is averaged over evidence frames and appended. The mask
    is trained on pixels, so its outline is the most direct shape evidence there is ("what shape is the red
    object?"), independent of where the object is.
  Returns:
    `[b, readout_dim(D, S)]`: mask-weighted mean patch feature over evidence frames, the mask centroid's velocity
    (grid fractions per frame x 30, x and y, from a weighted least-squares line over frames), the mean centroid
    (x, y), the mean mask area (fraction of the frame), then the S * S silhouette (row-major, y then x).
    Centroids and areas use the confident part of the mask (probability > 0.5), so the faint background of a
    large grid does not pull them towards the centre.
  """
  _, t, p, _ = patch_features.shape
  w_t = jax.lax.stop_gradient(jax.nn.sigmoid(frame_logits.astype(jnp.float32))) * (frame_mask > 0)
  mass, centroid = geometry.mass, geometry.centroid
  weights = w_t[..., None] * geometry.probs
  feat = jnp.einsum("btp,btpd->bd", weights, patch_features) / (jnp.sum(weights, axis=(1, 2))[:, None] + 1e-4)

  # Frames count by evidence weight times whether there is a mask at all.
  fw = w_t * jnp.clip(mass, 0.0, 1.0)
  fw_sum = jnp.sum(fw, axis=1, keepdims=True) + 1e-4
  tau = jnp.arange(t, dtype=jnp.float32)[None]
  tau_mean = jnp.sum(fw * tau, axis=1, keepdims=True) / fw_sum
  c_mean = jnp.einsum("bt,btc->bc", fw, centroid) / fw_sum
  dt = (tau - tau_mean) * fw
  var = jnp.sum(dt * (tau - tau_mean), axis=1) + 1e-2
  velocity = jnp.einsum("bt,btc->bc", dt, centroid - c_mean[:, None]) / var[:, None]
  area = jnp.sum(fw * mass, axis=1) / fw_sum[:, 0] / p
  # Velocity in grid fractions per frame is ~0.03; scale it to O(1).
  parts = [feat, 30.0 * velocity, c_mean, area[:, None]]
  if geometry.silhouette is not None:
    parts.append(jnp.einsum("bt,bts->bs", fw, geometry.silhouette) / fw_sum)
  return jnp.concatenate(parts, axis=-1)


class AnswerHead(nn.Module):
  """(option hidden `[b, C, H]`, evidence readout `[b, E]`, option_valid `[b, C]`) -> logits `[b, C]`.

  logit_c = w . gelu(A h_c + B e) + <U h_c, V e> / sqrt(d); padded options get a large negative logit.

  evidence_norm: how the readout e is normalised first.
    "joint": one LayerNorm over the whole vector.
    "grouped" (needs feature_dim): the layout of `evidence_readout` is used. The mean patch feature (feature_dim
      values) and the silhouette (the rest after the 5 geometry values) each get their own LayerNorm. Velocity,
      centroid and area pass through as they are: they are O(1) by construction, and a LayerNorm shared with 100+
      other values would shrink the two velocity numbers among them.
  """
  dim: int = 128
  evidence_norm: str = "joint"
  feature_dim: int = 0
  dtype: Any = jnp.float32

  def _normalize_evidence(self, evidence):
    if self.evidence_norm == "joint":
      return layers.layer_norm("evidence_LayerNorm", self.dtype, axis=None)(evidence)
    if self.evidence_norm != "grouped":
      raise ValueError(f"config.model.evidence_norm = {self.evidence_norm!r}: expected 'joint' or 'grouped'")
    d = self.feature_dim
    if not (0 < d and d + 5 <= evidence.shape[-1]):
      raise ValueError(f"evidence_norm='grouped' needs 0 < feature_dim and feature_dim + 5 <= the readout width "
                       f"{evidence.shape[-1]}, got feature_dim={d}")
    parts = [layers.layer_norm("evidence_feature_LayerNorm", self.dtype, axis=None)(evidence[..., :d]),
             evidence[..., d:d + 5].astype(self.dtype)]
    if evidence.shape[-1] > d + 5:
      parts.append(layers.layer_norm("evidence_shape_LayerNorm", self.dtype, axis=None)(evidence[..., d + 5:]))
    return jnp.concatenate(parts, axis=-1)

  @nn.compact
  def __call__(self, option_hidden, evidence, option_valid):
    d = self.dim
    h = layers.layer_norm("option_LayerNorm", self.dtype)(option_hidden)
    e = self._normalize_evidence(evidence)
    x = (layers.dense(d, ("embed", "mlp"), "option", self.dtype)(h)
         + layers.dense(d, (None, "mlp"), "evidence", self.dtype)(e)[:, None])
    logits = layers.dense(1, ("mlp", None), "out", self.dtype)(nn.gelu(x))[..., 0]
    hb = layers.dense(d, ("embed", "mlp"), "bilinear_option", self.dtype)(h)
    eb = layers.dense(d, (None, "mlp"), "bilinear_evidence", self.dtype)(e)
    logits = logits + jnp.einsum("bcd,bd->bc", hb, eb) / jnp.sqrt(jnp.asarray(d, self.dtype))
    return jnp.where(option_valid > 0, logits.astype(jnp.float32), -1e9)
