"""DeBERTa-v2 masked LM in Flax linen: the frozen bidirectional LM of FrozenBiLM+ (paper: DeBERTa-v2-xlarge).

Semantics follow the transformers 5.24 PyTorch implementation (`DebertaV2Model`, `DebertaV2ForMaskedLM`) and
FrozenBiLM (github.com/antoyang/FrozenBiLM, model/deberta.py) for the video prefix, the adapters and the enhanced
mask decoder (EMD):

- Disentangled attention: score(i, j) = [q_i.k_j + c2p(i, j) + p2c(i, j)] / sqrt(head_dim * (1 + #pos_att_type)),
  with c2p(i, j) = q_i . Kr[idx(i, j)], p2c(i, j) = k_j . Qr[idx(i, j)], idx(i, j) = clamp(bucket(i - j) + span,
  0, 2 span - 1) and Kr/Qr the relative embeddings (LayerNorm'ed when norm_rel_ebd has "layer_norm") projected by
  the key/query projections (share_att_key) or by pos_key_proj/pos_query_proj. Relative-position gathers are
  from a [query, key] index table built once per sequence length (`toeplitz_gather`, scatter-free in the backward,
  when queries and keys are the same positions, or with relative_gather="rows" `toeplitz_scores`, which gathers
  the projected relative rows instead of the scores; `take_along_axis` for the EMD's query rows); only the relative rows
  that table reaches are projected (a sequence shorter than the span uses fewer than 2 span rows).
- Masked attention scores are filled with the dtype minimum before the softmax (as transformers 5.24; a padded query
  row therefore attends uniformly, which only changes padded positions, never valid ones).
- A ConvLayer after the first layer (conv over the embedding output, masked, act, LayerNorm with the layer output).
- Visual tokens (FrozenBiLM): `visual` [batch, T, visual_dim] -> `visual_proj` (Linear) -> prepended to the word
  embeddings before the embedding LayerNorm; the sequence then has T + L tokens and every position-dependent term
  runs over the full sequence: relative positions, absolute position ids 0..T+L-1 (visual tokens take positions
  0..T-1; absolute positions enter the embeddings only when position_biased_input, and always the EMD) and token
  type 0 for the visual tokens. The attention mask is concat(visual_mask, attention_mask).
- Adapters (`layers.Adapter`) after attention.output.dense ("adapter_attn") and output.dense ("adapter_ffn"),
  before dropout + residual + LayerNorm.
- Enhanced mask decoder (FrozenBiLM `emd_context_layer`, also the original DeBERTa MLM): when
  position_biased_input is False, the LAST layer is applied twice more with keys/values = the input of the last
  layer and queries = (that input + absolute position embeddings), then its own output. The MLM head (dense -> act
  -> LayerNorm, then word_embeddings^T + bias) reads the EMD output. For "mask_feature" only the [MASK] row is
  decoded (every op after the attention scores is per query row, so this equals the full-sequence EMD at that row).
  `enhanced_mask_decoder=False` gives transformers' DebertaV2ForMaskedLM instead (head on the last hidden state).

Parameter names follow the Hugging Face modules (deberta/embeddings/word_embeddings, deberta/encoder/layer_3/
attention/self/query_proj, lm_predictions/lm_head/dense, ...); layers are `layer_{i}`. Checkpoint import:
`load_hf_params` (Hugging Face / original Microsoft checkpoints) and `load_frozenbilm_checkpoint` (FrozenBiLM .pth).
"""

import dataclasses
import functools
import math
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import deberta_pallas, hf_utils, layers
from evqa_jax.models.relative_gather import gather_along_last
from evqa_jax.models.layers import ACTIVATIONS, VisualProjection

_POS_ATT_TYPES = ("c2p", "p2c")
# FrozenBiLM's emd_context_layer (and the original DeBERTa MLM) runs the shared last layer twice.
_EMD_STEPS = 2
RELATIVE_GATHERS = ("scores", "rows", "pallas", "dpa")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _as_dtype(value, field: str):
  if isinstance(value, str):
    if value not in _DTYPES:
      raise ValueError(f"DebertaV2Config.{field}: unknown dtype {value!r} (one of {sorted(_DTYPES)})")
    return _DTYPES[value]
  return value


@dataclasses.dataclass(frozen=True)
class DebertaV2Config:
  """Hugging Face DebertaV2Config fields (defaults = what transformers assumes when config.json omits a key) + ours.

  `DebertaV2Config.xlarge()` is the paper's DeBERTa-v2-xlarge.
  """
  vocab_size: int = 128100
  hidden_size: int = 1536
  num_hidden_layers: int = 24
  num_attention_heads: int = 24
  intermediate_size: int = 6144
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 0
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-7
  relative_attention: bool = False
  max_relative_positions: int = -1
  position_buckets: int = -1
  pos_att_type: Tuple[str, ...] = ()
  share_att_key: bool = False
  position_biased_input: bool = True
  norm_rel_ebd: str = "none"
  conv_kernel_size: int = 0
  conv_groups: int = 1
  conv_act: str = "tanh"
  attention_head_size: Optional[int] = None  # None: hidden_size // num_attention_heads
  pad_token_id: int = 0
  # ours
  num_visual_tokens: int = 0
  visual_dim: int = 768
  use_adapters: bool = False
  adapter_reduction: int = 8
  adapter_dropout: float = 0.1
  enhanced_mask_decoder: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: str = "none"  # per-layer jax.checkpoint policy: none | full | dots_saveable (layers.REMAT_POLICIES)
  # Where the full-sequence relative attention gathers by the Toeplitz index: "scores" (`toeplitz_gather` of the
  # [b, heads, S, rows] c2p / p2c scores) or "rows" (`toeplitz_scores`: of the projected relative rows, a weight-sized
  # gather, then one matmul and a skew). Same values; "rows" keeps activation-sized gathers out of every layer.
  # "pallas": the whole attention (scores, c2p, p2c, skew, mask, softmax, dropout, value product) in one Pallas TPU
  # kernel, forward and backward (evqa_jax/models/deberta_pallas.py; TPU only, or its interpret mode); the EMD's
  # query rows (not Toeplitz) use "rows". "dpa": the c2p + p2c terms as "rows" builds them, passed as the bias of
  # `jax.nn.dot_product_attention` (cuDNN's fused attention on a GPU; no attention-probability dropout, so training
  # needs attention_probs_dropout_prob = 0).
  relative_gather: str = "scores"
  # True: the layers between the first (which the conv follows) and the last (which the EMD reuses) run as one
  # `nn.scan` over parameters stacked on a leading axis (encoder/layers/layer/..., `stack_layers`): XLA compiles
  # one layer body instead of L - 2. Same values as False (tests/test_deberta_v2.py).
  scan_layers: bool = False

  def __post_init__(self):
    layers.check_remat(self.remat)
    if self.relative_gather not in RELATIVE_GATHERS:
      raise ValueError(f"DebertaV2Config.relative_gather = {self.relative_gather!r}: expected one of "
                       f"{RELATIVE_GATHERS}")
    pos = self.pos_att_type
    if pos is None:
      pos = ()
    elif isinstance(pos, str):
      pos = tuple(x.strip() for x in pos.lower().split("|") if x.strip())
    else:
      pos = tuple(str(x).strip().lower() for x in pos)
    for p in pos:
      if p not in _POS_ATT_TYPES:
        raise ValueError(f"DebertaV2Config.pos_att_type: unsupported entry {p!r} (supported: {_POS_ATT_TYPES}; "
                         "transformers 5 dropped p2p)")
    object.__setattr__(self, "pos_att_type", pos)
    object.__setattr__(self, "dtype", _as_dtype(self.dtype, "dtype"))
    object.__setattr__(self, "param_dtype", _as_dtype(self.param_dtype, "param_dtype"))
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"DebertaV2Config: hidden_size {self.hidden_size} is not a multiple of "
                       f"num_attention_heads {self.num_attention_heads}")
    if self.head_dim * self.num_attention_heads != self.hidden_size:
      raise ValueError(f"DebertaV2Config.attention_head_size {self.attention_head_size} x num_attention_heads "
                       f"{self.num_attention_heads} != hidden_size {self.hidden_size} (the attention output dense "
                       "of transformers' DeBERTa-v2 takes hidden_size inputs)")
    for field in ("hidden_act", "conv_act"):
      if getattr(self, field) not in ACTIVATIONS:
        raise ValueError(f"DebertaV2Config.{field}: unknown activation {getattr(self, field)!r} "
                         f"(one of {sorted(ACTIVATIONS)})")
    if self.conv_kernel_size > 0 and self.conv_kernel_size % 2 == 0:
      raise ValueError(f"DebertaV2Config.conv_kernel_size must be odd (got {self.conv_kernel_size}): the "
                       "PyTorch ConvLayer pads (k - 1) // 2 on each side")
    if self.conv_kernel_size > 0 and self.hidden_size % self.conv_groups:
      raise ValueError(f"DebertaV2Config.conv_groups {self.conv_groups} does not divide hidden_size")
    if self.use_adapters and self.hidden_size % self.adapter_reduction:
      raise ValueError(f"DebertaV2Config.adapter_reduction {self.adapter_reduction} does not divide hidden_size")
    if self.num_visual_tokens < 0:
      raise ValueError(f"DebertaV2Config.num_visual_tokens must be >= 0 (got {self.num_visual_tokens})")

  # -- derived sizes
  @property
  def head_dim(self) -> int:
    return self.attention_head_size or self.hidden_size // self.num_attention_heads

  @property
  def max_relative(self) -> int:
    return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

  @property
  def att_span(self) -> int:
    """Half the number of relative embeddings (position_buckets when bucketing, else max_relative)."""
    return self.position_buckets if self.position_buckets > 0 else self.max_relative

  @property
  def rel_layer_norm(self) -> bool:
    return "layer_norm" in [x.strip() for x in self.norm_rel_ebd.lower().split("|")]

  @property
  def uses_emd(self) -> bool:
    return self.enhanced_mask_decoder and not self.position_biased_input

  @property
  def has_position_embeddings(self) -> bool:
    return self.position_biased_input or self.uses_emd

  # -- constructors
  @classmethod
  def from_dict(cls, d: Mapping[str, Any], **overrides) -> "DebertaV2Config":
    """Known fields from `d` (a Hugging Face config.json dict or ours) then `overrides`; unknown keys ignored."""
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in overrides:
      if key not in fields:
        raise ValueError(f"DebertaV2Config: unknown override {key!r}")
    if "embedding_size" in d and d["embedding_size"] not in (None, d.get("hidden_size")):
      raise ValueError(f"DebertaV2Config: embedding_size {d['embedding_size']} != hidden_size "
                       f"{d.get('hidden_size')} (embed_proj) is not supported")
    kwargs = {k: v for k, v in d.items() if k in fields}
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "DebertaV2Config":
    """Reads `path`/config.json (or `path` itself when it is a file). The HF `dtype`/`torch_dtype` is ignored."""
    file, d = hf_utils.read_hf_config(path)
    model_type = d.get("model_type")
    if model_type not in (None, "deberta-v2"):
      raise ValueError(f"{file}: model_type is {model_type!r}, expected 'deberta-v2'")
    d = {k: v for k, v in d.items() if k not in ("dtype", "torch_dtype")}
    return cls.from_dict(d, **overrides)

  @classmethod
  def xlarge(cls, **overrides) -> "DebertaV2Config":
    """microsoft/deberta-v2-xlarge, the LM of FrozenBiLM+."""
    d = dict(vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
             intermediate_size=6144, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0,
             layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1, position_buckets=256,
             pos_att_type=("p2c", "c2p"), share_att_key=True, position_biased_input=False,
             norm_rel_ebd="layer_norm", conv_kernel_size=3, conv_act="gelu", attention_head_size=64)
    d.update(overrides)
    return cls(**d)


# ----------------------------------------------------------------------------------------------- positions


def make_log_bucket_position(relative_pos: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
  """Log-bucketed relative positions, in float32 exactly as the PyTorch reference computes them."""
  relative_pos = np.asarray(relative_pos, np.int64)
  sign = np.sign(relative_pos)
  mid = bucket_size // 2
  abs_pos = np.where((relative_pos < mid) & (relative_pos > -mid), mid - 1, np.abs(relative_pos))
  with np.errstate(divide="ignore"):
    log_pos = np.ceil(np.log(abs_pos.astype(np.float32) / np.float32(mid))
                      / np.log(np.float32((max_position - 1) / mid)) * np.float32(mid - 1)) + np.float32(mid)
  return np.where(abs_pos <= mid, relative_pos.astype(np.float32), log_pos * sign).astype(np.int64)


def relative_position_index(config: DebertaV2Config, length: int) -> np.ndarray:
  """[length, length] int32: idx(i, j) = clamp(bucket(i - j) + span, 0, 2 span - 1), the relative embedding row."""
  ids = np.arange(length)
  rel = ids[:, None] - ids[None, :]
  if config.position_buckets > 0:
    rel = make_log_bucket_position(rel, config.position_buckets, config.max_relative)
  span = config.att_span
  return np.clip(rel + span, 0, 2 * span - 1).astype(np.int32)


def toeplitz_diagonal(index: np.ndarray) -> Tuple[int, ...]:
  """[L, L] index that depends only on i - j -> static tuple T of its 2L - 1 values: idx(i, j) = T[i - j + L - 1]."""
  index = np.asarray(index)
  diag = np.concatenate([index[0, ::-1], index[1:, 0]])
  length = index.shape[0]
  offsets = np.arange(length)[:, None] - np.arange(length)[None, :] + length - 1
  if index.shape != (length, length) or not np.array_equal(diag[offsets], index):
    raise ValueError(f"relative index of shape {index.shape} is not Toeplitz (a function of i - j)")
  return tuple(int(t) for t in diag)


def toeplitz_gather(x, diag: Tuple[int, ...]):
  """`jnp.take_along_axis(x, index, -1)` for a Toeplitz index idx(i, j) = diag[i - j + L - 1].

  x [..., L, R], diag a static tuple of 2L - 1 ints in [0, R) whose equal values are contiguous (the relative
  positions of DeBERTa are monotone in i - j) -> [..., L, L]. The same values are copied (bit-identical forward).
  Why: the backward of take_along_axis is a scatter-add, and XLA's TPU scheduler kept every layer's two scatter
  outputs alive until the end of the backward (README, Compiles for real TPUs). Here the forward is a static gather
  E[..., i, m] = x[..., i, diag[2L - 2 - m]] ([..., L, 2L - 1]) and a skew: out[i, j] = E[i, j + L - 1 - i], read
  from E flattened at (L - 1) + i (2L - 2) + j; its backward is pad/reshape, that of the gather a segment sum.
  """
  length = x.shape[-2]
  if len(diag) != 2 * length - 1:
    raise ValueError(f"toeplitz_gather: diag has {len(diag)} values, {2 * length - 1} needed for length {length}")
  return _skew(gather_along_last(x, tuple(diag[::-1]), x.shape[-1]))


def _skew(e):
  """e [..., L, 2L - 1] with E[i, m] the value of offset i - j = L - 1 - m -> [..., L, L], out[i, j] =
  E[i, j + L - 1 - i]: E flattened, read from (L - 1) + i (2L - 2) + j by a slice and reshapes (no gather)."""
  length = e.shape[-2]
  if length == 1:
    return e
  flat = e.reshape(*e.shape[:-2], length * (2 * length - 1))
  flat = flat[..., length - 1:length - 1 + length * (2 * length - 2)]
  return flat.reshape(*e.shape[:-2], length, 2 * length - 2)[..., :length]


def toeplitz_scores(x, rel, diag: Tuple[int, ...]):
  """`toeplitz_gather(einsum("bind,rnd->bnir", x, rel), diag)` without a gather of the scores: the relative rows
  are gathered instead (`rel[diag]`, [2L - 1, n, d], the size of a weight), scored by one matmul and skewed.

  x [b, L, n, d] (queries for c2p, keys for p2c), rel [R, n, d] the projected relative embeddings, diag the static
  Toeplitz diagonal of 2L - 1 rows of `rel` -> [b, n, L, L], out[b, n, i, j] = x[b, i, n] . rel[diag[i - j + L - 1],
  n]. Each value is the same dot product as the gather version's (equal in float32 up to the matmul's summation
  order). Why: an activation-sized gather ([b, n, L, R] -> [b, n, L, 2L - 1] per term and layer) is slow on TPUs
  and counts twice in the bytes the step moves; the matmul costs (2L - 1) / R times the scores' FLOPs instead
  (531 / 391 at 266 tokens), and the rows' gather has the segment-sum backward of `relative_gather.gather_along_last`.
  """
  length = x.shape[-3]
  if len(diag) != 2 * length - 1:
    raise ValueError(f"toeplitz_scores: diag has {len(diag)} values, {2 * length - 1} needed for length {length}")
  rows = gather_along_last(jnp.moveaxis(rel, 0, -1), tuple(diag[::-1]), rel.shape[0])  # [n, d, 2L - 1]
  return _skew(jnp.einsum("bind,ndm->bnim", x, rows))


# ----------------------------------------------------------------------------------------------- modules


def _layer_norm(config, name):
  return layers.encoder_layer_norm(config, name, use_fast_variance=False)


def _embed(config, num, name, names):
  return nn.Embed(num, config.hidden_size, dtype=config.dtype, param_dtype=config.param_dtype, name=name,
                  embedding_init=layers.encoder_init(config, names))


class DebertaV2Embeddings(nn.Module):
  """Word (+ visual prefix) (+ position) (+ token type) embeddings -> LayerNorm -> mask -> dropout."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, input_ids, mask, token_type_ids=None, visual=None, deterministic=True):
    """input_ids [b, L], mask [b, S] (S = T + L), visual [b, T, visual_dim] or None.

    Returns (embeddings [b, S, H], position embeddings [S, H] or None).
    """
    cfg = self.config
    x = _embed(cfg, cfg.vocab_size, "word_embeddings", ("vocab", "embed"))(input_ids)
    num_visual = 0
    if cfg.num_visual_tokens > 0:
      proj = VisualProjection(cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="visual_proj")
      if visual is not None:
        num_visual = visual.shape[1]
        x = jnp.concatenate([proj(visual).astype(x.dtype), x], axis=1)
      elif self.is_initializing():
        proj(jnp.zeros((1, 1, cfg.visual_dim), cfg.dtype))
    seq = x.shape[1]
    pos = None
    if cfg.has_position_embeddings:
      if seq > cfg.max_position_embeddings:
        raise ValueError(f"sequence of {seq} tokens (visual + text) exceeds max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
      table = _embed(cfg, cfg.max_position_embeddings, "position_embeddings", (None, "embed"))
      pos = table(jnp.arange(seq))
      if cfg.position_biased_input:
        x = x + pos[None]
    if cfg.type_vocab_size > 0:
      if token_type_ids is None:
        token_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
      if num_visual:
        token_type_ids = jnp.concatenate(
            [jnp.zeros((input_ids.shape[0], num_visual), token_type_ids.dtype), token_type_ids], axis=1)
      x = x + _embed(cfg, cfg.type_vocab_size, "token_type_embeddings", (None, "embed"))(token_type_ids)
    x = _layer_norm(cfg, "LayerNorm")(x)
    x = x * mask[..., None].astype(x.dtype)
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    return x, pos


class _Projection(nn.Module):
  """Dense layer with a multi-axis kernel created at its full shape (same params as nn.DenseGeneral).

  nn.DenseGeneral builds its kernel flat and reshapes it, which breaks 3-name logical partitioning under a mesh.
  `spec`: einsum of input, kernel -> output; `kernel_shape`/`bias_shape` and their logical axis names.
  """
  spec: str
  kernel_shape: Tuple[int, ...]
  kernel_axes: Tuple[Optional[str], ...]
  bias_axes: Tuple[Optional[str], ...]
  init_std: float
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", layers.normal(self.init_std, self.kernel_axes), self.kernel_shape, self.param_dtype)
    bias_shape = self.kernel_shape[-len(self.bias_axes):]
    bias = self.param("bias", layers.zeros(self.bias_axes), bias_shape, self.param_dtype)
    return jnp.einsum(self.spec, x.astype(self.dtype), kernel.astype(self.dtype)) + bias.astype(self.dtype)


class DisentangledSelfAttention(nn.Module):
  """Multi-head attention with content->position and position->content relative terms."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, hidden, query, mask, rel_embeddings=None, rel_index=None, deterministic=True, rel_rows=None,
               rel_diag=None):
    """hidden [b, Sk, H] (keys/values), query [b, Sq, H], mask [b, Sq, Sk] bool, rel_embeddings [2 span, H],
    rel_index [b or 1, Sq, Sk] int32 rows of `rel_embeddings` (of its rows lo..hi-1 when `rel_rows` = (lo, hi), a
    static pair). `rel_diag` (static tuple of 2 S - 1 ints, Sq = Sk = S) replaces rel_index when it is Toeplitz,
    rel_index(i, j) = rel_diag[i - j + S - 1]: the gathers are then `toeplitz_gather`, whose backward has no
    scatter. Returns the context [b, Sq, heads, head_dim]."""
    cfg = self.config
    heads, dim = cfg.num_attention_heads, cfg.head_dim

    def proj(name):
      return _Projection("...h,hnd->...nd", (cfg.hidden_size, heads, dim), ("embed", "heads", "kv"),
                         ("heads", "kv"), cfg.initializer_range, cfg.dtype, cfg.param_dtype, name=name)

    query_proj, key_proj, value_proj = proj("query_proj"), proj("key_proj"), proj("value_proj")
    q, k, v = query_proj(query), key_proj(hidden), value_proj(hidden)
    scale_factor = 1 + len(cfg.pos_att_type)
    scale = math.sqrt(dim * scale_factor)
    if rel_diag is not None and cfg.relative_gather == "pallas":
      return self._fused(q, k, v, mask, rel_embeddings, rel_rows, rel_diag, scale, proj, key_proj, query_proj,
                         deterministic)
    # "dpa": the relative terms (as "rows" builds them) are the bias of jax.nn.dot_product_attention, which adds q.k.
    dpa = rel_diag is not None and cfg.relative_gather == "dpa"
    scores = jnp.zeros((), cfg.dtype) if dpa else jnp.einsum("bqnd,bknd->bnqk", q, k)
    if cfg.relative_attention and cfg.pos_att_type:
      rel, pos_key_proj, pos_query_proj = self._relative(rel_embeddings, rel_rows, proj, key_proj, query_proj,
                                                         deterministic)
      by_rows = rel_diag is not None and cfg.relative_gather in ("rows", "dpa")
      if "c2p" in cfg.pos_att_type and by_rows:
        scores = scores + toeplitz_scores(q, pos_key_proj(rel), rel_diag)
      elif "c2p" in cfg.pos_att_type:
        c2p = jnp.einsum("bqnd,rnd->bnqr", q, pos_key_proj(rel))
        if rel_diag is not None:
          scores = scores + toeplitz_gather(c2p, rel_diag)
        else:
          scores = scores + jnp.take_along_axis(c2p, rel_index[:, None], axis=-1)
      if "p2c" in cfg.pos_att_type and by_rows:
        scores = scores + jnp.swapaxes(toeplitz_scores(k, pos_query_proj(rel), rel_diag[::-1]), -1, -2)
      elif "p2c" in cfg.pos_att_type:
        p2c = jnp.einsum("bknd,rnd->bnkr", k, pos_query_proj(rel))
        if rel_diag is not None:  # p2c[j, i] = p2c[j, idx(i, j)]: Toeplitz in j - i with the diagonal reversed
          p2c = toeplitz_gather(p2c, rel_diag[::-1])
        else:
          p2c = jnp.take_along_axis(p2c, jnp.swapaxes(rel_index, -1, -2)[:, None], axis=-1)
        scores = scores + jnp.swapaxes(p2c, -1, -2)
    if dpa:
      return _dot_product_attention(cfg, q, k, v, scores, mask, scale, deterministic)
    scores = scores.astype(jnp.float32) / scale
    scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
    probs = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
    return jnp.einsum("bnqk,bknd->bqnd", probs, v)

  def _relative(self, rel_embeddings, rel_rows, proj, key_proj, query_proj, deterministic):
    """(rel, pos_key_proj, pos_query_proj), for both paths: the relative embeddings after their dropout, cut to the
    span (and to `rel_rows`), and the projections of the c2p / p2c terms (None for a term not in pos_att_type)."""
    cfg = self.config
    rel = nn.Dropout(cfg.hidden_dropout_prob)(rel_embeddings, deterministic=deterministic)
    rel = rel[:2 * cfg.att_span].astype(cfg.dtype)
    if rel_rows is not None:
      # A sequence shorter than the span gathers only the rows of its |i - j| < S (147 of 512 at S = 74):
      # projecting and scoring the others (c2p/p2c are [b, heads, S, rows]) would be wasted work. Sliced after the
      # dropout, so its mask (and the random stream) is the same as over all rows.
      rel = rel[rel_rows[0]:rel_rows[1]]
    if cfg.share_att_key:
      return rel, key_proj, query_proj
    return (rel, proj("pos_key_proj") if "c2p" in cfg.pos_att_type else None,
            proj("pos_query_proj") if "p2c" in cfg.pos_att_type else None)

  def _fused(self, q, k, v, mask, rel_embeddings, rel_rows, rel_diag, scale, proj, key_proj, query_proj,
             deterministic):
    """The same attention as __call__'s by `deberta_pallas.disentangled_attention`: the same submodules and
    dropout calls in the same order (same parameters, same dropout bits)."""
    cfg = self.config
    pos_key = pos_query = None
    if cfg.relative_attention and cfg.pos_att_type:
      rel, pos_key_proj, pos_query_proj = self._relative(rel_embeddings, rel_rows, proj, key_proj, query_proj,
                                                         deterministic)
      pos_key = pos_key_proj(rel) if "c2p" in cfg.pos_att_type else None
      pos_query = pos_query_proj(rel) if "p2c" in cfg.pos_att_type else None
    rate = cfg.attention_probs_dropout_prob
    key = None
    if not deterministic and rate > 0:
      # The key of the XLA path's probability dropout (nn.Dropout "Dropout_{i}" of this module; its rel dropout
      # is Dropout_0): the kernel's keep mask has the same bits.
      key = _DropoutKey(name=f"Dropout_{int(pos_key is not None or pos_query is not None)}")()
    return deberta_pallas.disentangled_attention(q, k, v, pos_key, pos_query, rel_diag, mask, scale, key,
                                                 1.0 - rate)


def _dot_product_attention(cfg, q, k, v, relative, mask, scale, deterministic):
  """relative_gather="dpa": `jax.nn.dot_product_attention` with c2p + p2c (`relative`, [b, heads, S, S], or a 0
  scalar without relative terms) / scale as its bias; cuDNN's fused attention on a GPU, XLA's elsewhere. Same
  values as the XLA paths up to rounding (the logits accumulate in float32; masked logits take a large negative
  instead of the dtype minimum: a fully masked row is uniform either way). It has no attention-probability
  dropout, so a training step with attention_probs_dropout_prob > 0 is refused rather than run without it."""
  if not deterministic and cfg.attention_probs_dropout_prob > 0:
    raise ValueError(f"DebertaV2Config.relative_gather = 'dpa' has no attention-probability dropout "
                     f"(jax.nn.dot_product_attention takes none) but attention_probs_dropout_prob = "
                     f"{cfg.attention_probs_dropout_prob}: set it to 0 (config.model.dropout) or use another "
                     "relative_gather")
  bias = None if jnp.ndim(relative) == 0 else (relative / scale).astype(q.dtype)
  implementation = "cudnn" if jax.default_backend() == "gpu" else "xla"
  return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask[:, None], scale=1.0 / scale,
                                      implementation=implementation)


class _DropoutKey(nn.Module):
  """The 'dropout' rng an nn.Dropout of the same name (scope path) would draw."""

  def __call__(self):
    return self.make_rng("dropout")


class DebertaV2SelfOutput(nn.Module):
  """dense -> [adapter_attn] -> dropout -> LayerNorm(+ residual)."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, context, residual, deterministic=True):
    cfg = self.config
    x = _Projection("...nd,ndh->...h", (cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size),
                    ("heads", "kv", "embed"), ("embed",), cfg.initializer_range, cfg.dtype, cfg.param_dtype,
                    name="dense")(context)
    x = layers.encoder_adapter(cfg, "adapter_attn", x, deterministic)
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    return _layer_norm(cfg, "LayerNorm")(x + residual)


class DebertaV2Attention(nn.Module):
  config: DebertaV2Config

  @nn.compact
  def __call__(self, hidden, query, mask, rel_embeddings, rel_index, deterministic=True, rel_rows=None,
               rel_diag=None):
    context = DisentangledSelfAttention(self.config, name="self")(
        hidden, query, mask, rel_embeddings, rel_index, deterministic, rel_rows, rel_diag)
    return DebertaV2SelfOutput(self.config, name="output")(context, query, deterministic)


class DebertaV2Intermediate(nn.Module):
  config: DebertaV2Config

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = layers.encoder_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "dense")(x)
    return ACTIVATIONS[cfg.hidden_act](x)


class DebertaV2Output(nn.Module):
  """dense -> [adapter_ffn] -> dropout -> LayerNorm(+ residual)."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, x, residual, deterministic=True):
    cfg = self.config
    x = layers.encoder_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "dense")(x)
    x = layers.encoder_adapter(cfg, "adapter_ffn", x, deterministic)
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    return _layer_norm(cfg, "LayerNorm")(x + residual)


class DebertaV2Layer(nn.Module):
  config: DebertaV2Config

  @nn.compact
  def __call__(self, hidden, query, mask, rel_embeddings, rel_index, deterministic=True, rel_rows=None,
               rel_diag=None):
    """hidden [b, Sk, H] keys/values, query [b, Sq, H] -> [b, Sq, H]."""
    x = DebertaV2Attention(self.config, name="attention")(
        hidden, query, mask, rel_embeddings, rel_index, deterministic, rel_rows, rel_diag)
    h = DebertaV2Intermediate(self.config, name="intermediate")(x)
    return DebertaV2Output(self.config, name="output")(h, x, deterministic)


class ConvLayer(nn.Module):
  """Conv1d over the embedding output, added to the first layer's output (DeBERTa-v2 'conv' after layer 0)."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, embeddings, layer_output, valid, deterministic=True):
    cfg = self.config
    k = cfg.conv_kernel_size
    out = nn.Conv(cfg.hidden_size, (k,), padding=[((k - 1) // 2, (k - 1) // 2)], feature_group_count=cfg.conv_groups,
                  dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="conv",
                  kernel_init=layers.encoder_init(cfg, (None, None, "embed")),
                  bias_init=layers.zeros(("embed",)))(embeddings)
    m = valid[..., None].astype(out.dtype)
    out = ACTIVATIONS[cfg.conv_act](nn.Dropout(cfg.hidden_dropout_prob)(out * m, deterministic=deterministic))
    return _layer_norm(cfg, "LayerNorm")(layer_output + out) * m


class _ScanStep(nn.Module):
  """One layer as an `nn.scan` step (DebertaV2Encoder with scan_layers): carry x [b, S, H] -> (x, None)."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, x, mask, rel_embeddings, deterministic, rel_rows, rel_diag):
    layer_cls = layers.maybe_remat(DebertaV2Layer, self.config.remat, static_argnums=(6, 7, 8))
    x = layer_cls(self.config, name="layer")(x, x, mask, rel_embeddings, None, deterministic, rel_rows, rel_diag)
    return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


def _middle_layers(config) -> range:
  n = config.num_hidden_layers
  return range(1, n - 1) if config.scan_layers and n > 2 else range(0)


def stack_layers(params, config: DebertaV2Config):
  """Unscanned DebertaV2LM params (encoder/layer_{i}; a params tree or {"params": ...}) -> the scan_layers=True tree: layer_1 .. layer_{L-2} stacked
  on a leading axis as encoder/layers/layer (layer_0 and layer_{L-1} stay). Identity unless config.scan_layers."""
  middle = _middle_layers(config)
  if not middle:
    return params
  if "deberta" not in params and "params" in params:  # {"params": ...} (model.init output)
    return {**params, "params": stack_layers(params["params"], config)}
  enc = dict(params["deberta"]["encoder"])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[enc.pop(f"layer_{i}") for i in middle])
  enc["layers"] = {"layer": stacked}
  return {**params, "deberta": {**params["deberta"], "encoder": enc}}


def unstack_layers(params, config: DebertaV2Config):
  """The inverse of `stack_layers`: encoder/layers/layer [L - 2, ...] -> encoder/layer_1 .. layer_{L-2}."""
  middle = _middle_layers(config)
  if not middle:
    return params
  if "deberta" not in params and "params" in params:
    return {**params, "params": unstack_layers(params["params"], config)}
  enc = dict(params["deberta"]["encoder"])
  stacked = enc.pop("layers")["layer"]
  for j, i in enumerate(middle):
    enc[f"layer_{i}"] = jax.tree.map(lambda x, j=j: x[j], stacked)
  return {**params, "deberta": {**params["deberta"], "encoder": enc}}


class DebertaV2Encoder(nn.Module):
  """The layer stack, relative embeddings, conv, and the enhanced mask decoder (which reuses the last layer)."""
  config: DebertaV2Config

  def setup(self):
    cfg = self.config
    layer_cls = layers.maybe_remat(DebertaV2Layer, cfg.remat, static_argnums=(6, 7, 8))  # deterministic, rel_rows/diag
    n = cfg.num_hidden_layers
    if cfg.scan_layers and n > 2:
      self.layer = [layer_cls(cfg, name="layer_0"), layer_cls(cfg, name=f"layer_{n - 1}")]
      self.layers = nn.scan(_ScanStep, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                            in_axes=nn.broadcast, length=n - 2,
                            metadata_params={nn.PARTITION_NAME: None})(cfg, name="layers")
    else:
      self.layer = [layer_cls(cfg, name=f"layer_{i}") for i in range(n)]
    if cfg.relative_attention:
      self.rel_embeddings = _embed(cfg, 2 * cfg.att_span, "rel_embeddings", (None, "embed"))
      if cfg.rel_layer_norm:
        self.LayerNorm = _layer_norm(cfg, "LayerNorm")  # pylint: disable=invalid-name
    if cfg.conv_kernel_size > 0:
      self.conv = ConvLayer(cfg, name="conv")

  def rel_embedding(self):
    if not self.config.relative_attention:
      return None
    rel = self.rel_embeddings.embedding
    return self.LayerNorm(rel) if self.config.rel_layer_norm else rel.astype(self.config.dtype)

  def rel_index(self, seq: int):
    """-> ([seq, seq] int32 numpy rows into the relative embeddings' rows lo..hi-1, (lo, hi)): only the rows a
    sequence of `seq` tokens gathers (see DisentangledSelfAttention)."""
    index = relative_position_index(self.config, seq)
    lo, hi = int(index.min()), int(index.max()) + 1
    return index - lo, (lo, hi)

  def __call__(self, embeddings, valid, deterministic=True):
    """embeddings [b, S, H], valid [b, S] bool -> (last hidden [b, S, H], input of the last layer [b, S, H])."""
    seq = embeddings.shape[1]
    mask = valid[:, :, None] & valid[:, None, :]
    rel = self.rel_embedding()
    index, rows = self.rel_index(seq) if rel is not None else (None, None)
    diag = None if index is None else toeplitz_diagonal(index)
    x = prev = embeddings
    scanned = self.config.scan_layers and self.config.num_hidden_layers > 2
    for i, layer in enumerate(self.layer):
      if scanned and i == 1:
        x, _ = self.layers(x, mask, rel, deterministic, rows, diag)
      prev = x
      x = layer(x, x, mask, rel, None, deterministic, rows, diag)
      if i == 0 and self.config.conv_kernel_size > 0:
        x = self.conv(embeddings, x, valid, deterministic)
      x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    return x, prev

  def enhanced_mask_decode(self, prev, query, query_positions, valid, deterministic=True):
    """EMD: the last layer run `_EMD_STEPS` times with keys/values `prev` [b, S, H].

    query [b, Q, H] (= prev + absolute position embeddings at `query_positions`), query_positions [b, Q] int32 or
    None for all S positions in order. Returns [b, Q, H].
    """
    seq = prev.shape[1]
    rel = self.rel_embedding()
    index, rows = self.rel_index(seq) if rel is not None else (None, None)
    if query_positions is None:  # all S rows: the index is Toeplitz, gathered by its diagonal
      q_valid = valid
      diag, index = (None, None) if index is None else (toeplitz_diagonal(index), None)
    else:  # the query rows' index is not Toeplitz; Q is small, so its scatter is too
      q_valid = jnp.take_along_axis(valid, query_positions, axis=1)
      diag, index = None, (None if index is None else jnp.asarray(index)[query_positions])
    mask = q_valid[:, :, None] & valid[:, None, :]
    last = self.layer[-1]
    for _ in range(_EMD_STEPS):
      query = last(prev, query, mask, rel, index, deterministic, rows, diag)
    return query


class DebertaV2Model(nn.Module):
  """Embeddings + encoder (Hugging Face `deberta.*`)."""
  config: DebertaV2Config

  def setup(self):
    self.embeddings = DebertaV2Embeddings(self.config)
    self.encoder = DebertaV2Encoder(self.config)

  def __call__(self, input_ids, valid, token_type_ids=None, visual=None, deterministic=True):
    emb, pos = self.embeddings(input_ids, valid, token_type_ids, visual, deterministic)
    hidden, prev = self.encoder(emb, valid, deterministic)
    return hidden, prev, pos

  def enhanced_mask_decode(self, prev, pos, query_positions, valid, deterministic=True):
    if query_positions is None:
      query = prev + pos[None].astype(prev.dtype)
    else:
      query = jnp.take_along_axis(prev, query_positions[..., None], axis=1) + pos[query_positions].astype(prev.dtype)
    return self.encoder.enhanced_mask_decode(prev, query, query_positions, valid, deterministic)


class DebertaV2LMPredictionHead(nn.Module):
  """dense -> act -> LayerNorm (the 'transform'), then optionally word_embeddings^T + bias."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, x, word_embeddings=None):
    cfg = self.config
    bias = self.param("bias", layers.zeros(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
    x = layers.encoder_dense(cfg, cfg.hidden_size, ("embed", None), "dense")(x)
    x = _layer_norm(cfg, "LayerNorm")(ACTIVATIONS[cfg.hidden_act](x))
    if word_embeddings is None:
      return x, None
    logits = jnp.einsum("...h,vh->...v", x, word_embeddings.astype(cfg.dtype)) + bias.astype(cfg.dtype)
    return x, logits


class DebertaV2OnlyMLMHead(nn.Module):
  config: DebertaV2Config

  @nn.compact
  def __call__(self, x, word_embeddings=None):
    return DebertaV2LMPredictionHead(self.config, name="lm_head")(x, word_embeddings)


class DebertaV2LM(nn.Module):
  """DeBERTa-v2 encoder + enhanced mask decoder + MLM head, with an optional visual prefix and adapters."""
  config: DebertaV2Config

  @nn.compact
  def __call__(self, input_ids, attention_mask, *, token_type_ids=None, visual=None, visual_mask=None,
               mask_index=None, deterministic=True, decode=False) -> Dict[str, jax.Array]:
    """input_ids [b, L] int32, attention_mask [b, L], visual [b, T, visual_dim], visual_mask [b, T],
    mask_index [b] int32 into the full T + L sequence.

    Returns {"hidden": [b, S, H]} (S = T + L, visual tokens first), "mask_feature" [b, H] when mask_index is
    given, "logits" [b, S, vocab] when decode. Without `visual` the sequence is the text alone (S = L).
    """
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    valid = attention_mask.astype(bool)
    if visual is not None:
      if cfg.num_visual_tokens <= 0:
        raise ValueError("visual features given but DebertaV2Config.num_visual_tokens is 0")
      if visual.ndim != 3 or visual.shape[1] != cfg.num_visual_tokens or visual.shape[2] != cfg.visual_dim:
        raise ValueError(f"visual must be [batch, num_visual_tokens={cfg.num_visual_tokens}, "
                         f"visual_dim={cfg.visual_dim}], got shape {visual.shape}")
      vmask = (jnp.ones(visual.shape[:2], bool) if visual_mask is None else visual_mask.astype(bool))
      valid = jnp.concatenate([vmask, valid], axis=1)
    model = DebertaV2Model(cfg, name="deberta")
    hidden, prev, pos = model(input_ids, valid, token_type_ids, visual, deterministic)
    out = {"hidden": hidden}
    head = DebertaV2OnlyMLMHead(cfg, name="lm_predictions")
    if self.is_initializing() and mask_index is None and not decode:
      head(hidden[:, :1])
    if not (decode or mask_index is not None):
      return out
    if decode:
      word_emb = nn.meta.unbox(model.embeddings.variables["params"]["word_embeddings"]["embedding"])
      dec = model.enhanced_mask_decode(prev, pos, None, valid, deterministic) if cfg.uses_emd else hidden
      feats, out["logits"] = head(dec, word_emb)
      if mask_index is not None:
        out["mask_feature"] = jnp.take_along_axis(feats, mask_index[:, None, None].astype(jnp.int32), axis=1)[:, 0]
    else:
      idx = mask_index.astype(jnp.int32)[:, None]
      if cfg.uses_emd:
        dec = model.enhanced_mask_decode(prev, pos, idx, valid, deterministic)
      else:
        dec = jnp.take_along_axis(hidden, idx[..., None], axis=1)
      out["mask_feature"] = head(dec)[0][:, 0]
    return out


# ----------------------------------------------------------------------------------------------- helpers


def word_embeddings(params) -> jax.Array:
  """The input word-embedding matrix [vocab, H] inside a params tree (or `{"params": ...}` variables)."""
  tree = hf_utils.params_of(params)
  try:
    return tree["deberta"]["embeddings"]["word_embeddings"]["embedding"]
  except (KeyError, TypeError) as e:
    raise KeyError("params have no deberta/embeddings/word_embeddings/embedding: not DebertaV2LM params") from e


def _heads_kernel(config):
  n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
  return lambda w: np.ascontiguousarray(w.T.reshape(h, n, d))


def _heads_bias(config):
  return lambda b: b.reshape(config.num_attention_heads, config.head_dim)


def _rules(config: DebertaV2Config) -> Dict[str, hf_utils.Rule]:
  """Our flat path -> Rule over canonical checkpoint keys (prefix 'deberta.' removed, head named lm_predictions)."""
  R, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}

  def linear(ours, theirs):
    rules[f"{ours}/kernel"] = R((f"{theirs}.weight",), lin)
    rules[f"{ours}/bias"] = R((f"{theirs}.bias",))

  def layer_norm(ours, theirs):
    rules[f"{ours}/scale"] = R((f"{theirs}.weight",))
    rules[f"{ours}/bias"] = R((f"{theirs}.bias",))

  e = "deberta/embeddings"
  rules[f"{e}/word_embeddings/embedding"] = R(("embeddings.word_embeddings.weight",))
  rules[f"{e}/position_embeddings/embedding"] = R(("embeddings.position_embeddings.weight",))
  rules[f"{e}/token_type_embeddings/embedding"] = R(("embeddings.token_type_embeddings.weight",))
  layer_norm(f"{e}/LayerNorm", "embeddings.LayerNorm")
  linear(f"{e}/visual_proj/dense", "embeddings.linear_video")
  enc = "deberta/encoder"
  rules[f"{enc}/rel_embeddings/embedding"] = R(("encoder.rel_embeddings.weight",))
  layer_norm(f"{enc}/LayerNorm", "encoder.LayerNorm")
  # Conv1d weight [out, in / groups, k] -> flax [k, in / groups, out].
  rules[f"{enc}/conv/conv/kernel"] = R(("encoder.conv.conv.weight",),
                                       lambda w: np.ascontiguousarray(w.transpose(2, 1, 0)))
  rules[f"{enc}/conv/conv/bias"] = R(("encoder.conv.conv.bias",))
  layer_norm(f"{enc}/conv/LayerNorm", "encoder.conv.LayerNorm")
  hk, hb = _heads_kernel(config), _heads_bias(config)
  n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
  for i in range(config.num_hidden_layers):
    ours, theirs = f"{enc}/layer_{i}", f"encoder.layer.{i}"
    for p in ("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj"):
      rules[f"{ours}/attention/self/{p}/kernel"] = R((f"{theirs}.attention.self.{p}.weight",), hk)
      rules[f"{ours}/attention/self/{p}/bias"] = R((f"{theirs}.attention.self.{p}.bias",), hb)
    rules[f"{ours}/attention/output/dense/kernel"] = R(
        (f"{theirs}.attention.output.dense.weight",), lambda w: np.ascontiguousarray(w.T.reshape(n, d, h)))
    rules[f"{ours}/attention/output/dense/bias"] = R((f"{theirs}.attention.output.dense.bias",))
    layer_norm(f"{ours}/attention/output/LayerNorm", f"{theirs}.attention.output.LayerNorm")
    linear(f"{ours}/intermediate/dense", f"{theirs}.intermediate.dense")
    linear(f"{ours}/output/dense", f"{theirs}.output.dense")
    layer_norm(f"{ours}/output/LayerNorm", f"{theirs}.output.LayerNorm")
    for ad, where in (("attention/output/adapter_attn", "attention.output.adapter"),
                      ("output/adapter_ffn", "output.adapter")):
      linear(f"{ours}/{ad}/down", f"{theirs}.{where}.down")
      linear(f"{ours}/{ad}/up", f"{theirs}.{where}.up")
  head = "lm_predictions/lm_head"
  linear(f"{head}/dense", "lm_predictions.lm_head.dense")
  layer_norm(f"{head}/LayerNorm", "lm_predictions.lm_head.LayerNorm")
  rules[f"{head}/bias"] = R(("lm_predictions.lm_head.bias",))
  return rules


# The tensors a DeBERTa-v2 config implies: word embeddings, the relative-position machinery and every layer's
# attention, FFN and norms. Absolute position embeddings (dropped by transformers when position_biased_input is
# false), token types, adapters, the visual projection and the head may be absent (from init).
REQUIRED = (r"^deberta/embeddings/(word_embeddings|LayerNorm)/", r"^deberta/encoder/(rel_embeddings|LayerNorm|conv)/",
            r"^deberta/encoder/layer_\d+/(attention/self|attention/output/(dense|LayerNorm)|intermediate/dense|"
            r"output/(dense|LayerNorm))/")
# Buffers and tied copies: position ids; the legacy head's decoder (tied to the word embeddings / the head bias);
# FrozenBiLM's lm_head.decoder (an unused Linear kept "for compatibility", its bias aliases lm_head.bias).
_IGNORE = (r"(^|\.)position_ids$", r"^lm_predictions\.lm_head\.decoder\.(weight|bias)$",
           r"^cls\.predictions\.decoder\.(weight|bias)$")
# Legacy transformers head (config.legacy=True, 'cls.predictions.*') -> the original/FrozenBiLM naming.
_HEAD_ALIASES = ((r"^cls\.predictions\.transform\.", "lm_predictions.lm_head."),
                 (r"^cls\.predictions\.bias$", "lm_predictions.lm_head.bias"))


def _canonical(ckpt: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
  out = {}
  for k, v in hf_utils.rename_legacy_layernorm(dict(ckpt)).items():
    k = re.sub(r"^module\.", "", k)
    k = re.sub(r"^deberta\.", "", k)
    for pattern, repl in _HEAD_ALIASES:
      k = re.sub(pattern, repl, k)
    if k in out:
      raise ValueError(f"checkpoint holds two tensors for {k!r} (after removing prefixes)")
    out[k] = v
  return out


def _dummy_inputs(config: DebertaV2Config):
  seq = max(1, min(4, config.max_position_embeddings - config.num_visual_tokens))
  kw = {}
  if config.num_visual_tokens:
    kw["visual"] = jnp.zeros((1, config.num_visual_tokens, config.visual_dim), config.dtype)
  return (jnp.zeros((1, seq), jnp.int32), jnp.ones((1, seq), jnp.int32)), kw


def init_variables(config: DebertaV2Config, rng) -> Dict[str, Any]:
  """DebertaV2LM(config).init on dummy inputs (boxed with logical axis names); every parameter is created."""
  model = DebertaV2LM(config)
  args, kw = _dummy_inputs(config)
  return jax.jit(lambda key: model.init(key, *args, **kw))(rng)


def _load(config, ckpt, source, init_params, config_source="the encoder config", required=REQUIRED):
  if _middle_layers(config):  # scan_layers: import as layer_{i}, then stack
    if init_params is not None:
      init_params = unstack_layers(hf_utils.params_of(init_params), config)
    params, report = _load(dataclasses.replace(config, scan_layers=False), ckpt, source, init_params, config_source,
                           required)
    return stack_layers(params, config), report
  ckpt, rules = _canonical(ckpt), _rules(config)
  notes = []
  if init_params is None:
    model = DebertaV2LM(config)
    args, kw = _dummy_inputs(config)
    shapes = hf_utils.flatten_params(hf_utils.params_of(jax.eval_shape(lambda: model.init(
        jax.random.PRNGKey(0), *args, **kw))))
    if any(p not in rules or not all(k in ckpt for k in rules[p].keys) for p in shapes):
      init_params = init_variables(config, jax.random.PRNGKey(0))
      notes.append("no init_params given: parameters absent from the checkpoint initialised with PRNGKey(0)")
  if init_params is None:
    expected, init_flat = shapes, None
  else:
    expected = init_flat = hf_utils.flatten_params(hf_utils.params_of(init_params))
  flat, report = hf_utils.assemble(expected, ckpt, rules, source, init=init_flat, ignore=_IGNORE,
                                   required=required, config_source=config_source)
  report.notes.extend(notes)
  abstract = [p for p in report.missing if isinstance(flat[p], jax.ShapeDtypeStruct)]
  if abstract:
    raise ValueError(f"{source}: parameters absent from the checkpoint and init_params holds only their shapes "
                     f"(jax.eval_shape output): {', '.join(abstract)}")
  if config.uses_emd and "deberta/embeddings/position_embeddings/embedding" in report.missing:
    report.notes.append("absolute position embeddings are absent (transformers drops them when "
                        "position_biased_input is false) but the enhanced mask decoder needs them: they come from "
                        "init_params, so mask_feature/logits are not the pretrained model's")
  return jax.tree.map(jnp.asarray, hf_utils.unflatten_params(flat)), report


def load_hf_params(config: DebertaV2Config, path: str, init_params=None):
  """Reads a Hugging Face checkpoint (directory or file) into DebertaV2LM params.

  Accepts transformers' DebertaV2Model / DebertaV2ForMaskedLM (legacy 'cls.predictions' or 'lm_predictions'
  head) and the original Microsoft checkpoints (which carry position_embeddings for the EMD). Parameters absent
  from the checkpoint (visual_proj, adapters, head, ...) come from `init_params` (model.init output or a params
  tree, boxed or not); when it is None they come from `init_variables(config, PRNGKey(0))` (only computed when
  something is absent). Returns (params, report): the plain (unboxed) params tree, to be used as
  `DebertaV2LM(config).apply({"params": params}, ...)`, and an `hf_utils.LoadReport`.
  """
  return _load(config, hf_utils.read_checkpoint(path), path, init_params, hf_utils.config_file_of(path))


def read_frozenbilm_checkpoint(path: str, trust_pickles: bool = False):
  """{state-dict name: numpy array} of a FrozenBiLM / OVQA training checkpoint (weights_only; see below)."""
  import argparse  # pylint: disable=g-import-not-at-top
  return hf_utils.read_checkpoint(path, trust_pickles=trust_pickles, safe_globals=(argparse.Namespace,))


def load_frozenbilm_checkpoint(config: DebertaV2Config, path: str, init_params=None, trust_pickles: bool = False,
                               checkpoint=None):
  """Reads a FrozenBiLM training checkpoint ({"model": state_dict, "optimizer": ..., "args": Namespace}, torch.save)
  of DebertaV2ForMaskedLM: deberta.* with embeddings.linear_video and attention.output.adapter / output.adapter,
  lm_predictions.lm_head.*; answer_embeddings/answer_bias are reported unused. The file is read with torch's
  weights_only unpickler, which allows tensors, containers and (allow-listed here) the argparse Namespace of the
  training arguments; any other object is refused unless trust_pickles=True (config.trust_pickles; unsafe: unpickling
  runs code from the file). `checkpoint`: the file's {name: array} when the caller has read it already
  (`read_frozenbilm_checkpoint`; an OVQA checkpoint is read once for the LM and its verbalizer). Returns (params
  tree, report) as `load_hf_params`.
  """
  ckpt = read_frozenbilm_checkpoint(path, trust_pickles) if checkpoint is None else checkpoint
  flat = _canonical(ckpt)
  if config.num_visual_tokens > 0 and "embeddings.linear_video.weight" not in flat:
    raise ValueError(f"{path}: config has num_visual_tokens={config.num_visual_tokens} but the checkpoint has no "
                     "deberta.embeddings.linear_video (not a FrozenBiLM video checkpoint?)")
  if config.use_adapters and not any(".adapter." in k for k in flat):
    raise ValueError(f"{path}: config.use_adapters is set but the checkpoint has no adapter weights")
  # Most released FrozenBiLM checkpoints hold only the parameters FrozenBiLM trains ("only contain updated
  # parameters"): laid over `init_params` (the Hugging Face LM, whose load checked every tensor its config implies),
  # the rest legitimately comes from there. Without init_params the checkpoint is the LM and must hold all of it.
  return _load(config, ckpt, path, init_params, required=REQUIRED if init_params is None else ())
