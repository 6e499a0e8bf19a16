"""Video Swin Transformer (Liu et al., "Video Swin Transformer", arXiv:2106.13230) in Flax, as VIOLET runs it.

The module follows `video_swin.py` of github.com/tsujuifu/pytorch_violet (itself the SwinTransformer3D of
SwinTransformer/Video-Swin-Transformer) step for step, channels-last throughout (theirs permutes to [B, C, D, H, W]
between stages; the numbers are the same):
- `PatchEmbed3D`: W and H zero-padded up to a multiple of the patch, then always ONE zero frame appended at the end of
  time, then a Conv3d of kernel `patch_size` (2, 4, 4) and stride (1, 4, 4) (so T frames give T tokens in time), then
  LayerNorm (eps 1e-5, torch's default).
- `BasicLayer` (a stage): `depth` blocks alternating plain and shifted windows (shift = window // 2 on odd blocks), then
  `PatchMerging` except in the last stage. The window and shift are shrunk per dimension where the input is not larger
  than the window (`get_window_size`: window = size, shift 0 there). The shifted blocks' attention mask (`compute_mask`,
  -100 between tokens from different regions of the rolled volume) is computed on the sizes padded up to a multiple of
  the window.
- `SwinBlock3D`: x + attn(norm1(x)) (the volume padded to whole windows, rolled by -shift, split into windows,
  attention, merged, rolled back, cropped), then x + mlp(norm2(x)); MLP = fc1 -> exact GELU -> fc2 (hidden
  mlp_ratio * C); stochastic depth (`drop_path`, linearly 0 .. drop_path_rate over all blocks) in training only.
- `WindowAttention3D`: qkv (with bias), q scaled by head_dim^-0.5, plus the relative position bias
  `table[index[:N, :N]]` where `index` is built for the configured window (8, 7, 7): the authors slice it to the first N
  rows and columns when a dimension's window was shrunk (exact for a shrunk time window, which is the leading flattened
  dimension; for a shrunk spatial window it is their code's reading, kept as is), plus the mask, softmax, proj.
- `PatchMerging`: H, W padded to even, [x(0::2, 0::2), x(1::2, 0::2), x(0::2, 1::2), x(1::2, 1::2)] concatenated on
  channels, LayerNorm(4C), Linear(4C -> 2C, no bias).
- The final LayerNorm over the last stage's features.

Parameter names follow theirs ("patch_embed/proj", "layers_{i}/blocks_{j}/norm1", ".../fc1", ".../attn/
relative_position_bias_table", "layers_{i}/downsample/reduction", ...), so `load_rules` is a renaming of a state dict
(the `enc_img.swin.` keys of VIOLET's checkpoints: models/violet.py). The attention's qkv Linear is `attn/kernel`
`[C, 3, heads, head_dim]` and `attn/bias` `[3, heads, head_dim]`, its output projection `attn/proj_kernel`
`[heads, head_dim, C]` and `attn/proj_bias`: sharded over heads (logical axes as in bert.py).
"""

import dataclasses
import functools
from typing import Any, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import hf_utils
from evqa_jax.models import layers

_gelu = layers.ACTIVATIONS["gelu"]  # torch.nn.GELU(): the exact (erf) GELU


@dataclasses.dataclass(frozen=True)
class VideoSwinConfig:
  """SwinTransformer3D's arguments. The defaults are the model VIOLET builds (`SwinTransformer3D()`: Swin-B's
  window, Swin-S's depths: 96 wide, depths (2, 2, 18, 2), heads (3, 6, 12, 24), window (8, 7, 7): 768 features)."""
  patch_size: Tuple[int, int, int] = (2, 4, 4)
  in_chans: int = 3
  embed_dim: int = 96
  depths: Tuple[int, ...] = (2, 2, 18, 2)
  num_heads: Tuple[int, ...] = (3, 6, 12, 24)
  window_size: Tuple[int, int, int] = (8, 7, 7)
  mlp_ratio: float = 4.0
  qkv_bias: bool = True
  drop_path_rate: float = 0.2
  patch_norm: bool = True
  layer_norm_eps: float = 1e-5  # torch.nn.LayerNorm's default
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    for name in ("patch_size", "depths", "num_heads", "window_size"):
      object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if len(self.depths) != len(self.num_heads):
      raise ValueError(f"VideoSwinConfig: depths {self.depths} and num_heads {self.num_heads} differ in length")
    if len(self.patch_size) != 3 or len(self.window_size) != 3:
      raise ValueError(f"VideoSwinConfig: patch_size {self.patch_size} and window_size {self.window_size} must be "
                       "(time, height, width)")
    for i, heads in enumerate(self.num_heads):
      if (self.embed_dim * 2 ** i) % heads:
        raise ValueError(f"VideoSwinConfig: stage {i} is {self.embed_dim * 2 ** i} wide, not a multiple of its "
                         f"{heads} heads")

  @property
  def num_features(self) -> int:
    return self.embed_dim * 2 ** (len(self.depths) - 1)

  @property
  def stride(self) -> int:
    """The spatial downsampling of the whole network (patch stride times 2 per merge): 32 for (4, 4) patches."""
    return self.patch_size[1] * 2 ** (len(self.depths) - 1)

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "VideoSwinConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names) + sorted(set(overrides) - names)
    if unknown:
      raise ValueError(f"VideoSwinConfig: unknown field(s) {unknown}; fields are {sorted(names)}")
    return cls(**{**d, **overrides})


# ------------------------------------------------------------------------------------------ static geometry


def get_window_size(x_size, window_size, shift_size):
  """Their get_window_size: where a dimension is not larger than the window, the window is the dimension, shift 0."""
  window, shift = list(window_size), list(shift_size)
  for i, size in enumerate(x_size):
    if size <= window_size[i]:
      window[i] = size
      shift[i] = 0
  return tuple(window), tuple(shift)


def window_partition(x, window):
  """`[B, D, H, W, C]` -> `[B * nW, prod(window), C]` (windows in (d, h, w) order, tokens in (d, h, w) order)."""
  b, d, h, w, c = x.shape
  x = x.reshape(b, d // window[0], window[0], h // window[1], window[1], w // window[2], window[2], c)
  return x.transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(-1, window[0] * window[1] * window[2], c)


def window_reverse(windows, window, b, d, h, w):
  x = windows.reshape(b, d // window[0], h // window[1], w // window[2], window[0], window[1], window[2], -1)
  return x.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, d, h, w, -1)


@functools.lru_cache(maxsize=64)
def compute_mask(d, h, w, window, shift) -> np.ndarray:
  """Their compute_mask: `[nW, N, N]` float32, 0 within a region of the rolled volume, -100 across regions."""
  img_mask = np.zeros((1, d, h, w, 1), np.float32)
  cnt = 0
  for ds in slice(-window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None):
    for hs in slice(-window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None):
      for ws in slice(-window[2]), slice(-window[2], -shift[2]), slice(-shift[2], None):
        img_mask[:, ds, hs, ws, :] = cnt
        cnt += 1
  windows = window_partition(img_mask, window)[..., 0]
  diff = windows[:, None, :] - windows[:, :, None]
  return np.where(diff != 0, -100.0, 0.0).astype(np.float32)


@functools.lru_cache(maxsize=16)
def relative_position_index(window) -> np.ndarray:
  """`[N, N]` rows of the relative position bias table for the window (d, h, w), as their WindowAttention3D builds."""
  coords = np.stack(np.meshgrid(*[np.arange(s) for s in window], indexing="ij")).reshape(3, -1)
  rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0).copy()
  for i in range(3):
    rel[:, :, i] += window[i] - 1
  rel[:, :, 0] *= (2 * window[1] - 1) * (2 * window[2] - 1)
  rel[:, :, 1] *= 2 * window[2] - 1
  return rel.sum(-1)


# ------------------------------------------------------------------------------------------ modules


def _norm(cfg: VideoSwinConfig, name: str, axis="embed"):
  return layers.layer_norm(name, cfg.dtype, epsilon=cfg.layer_norm_eps, param_dtype=cfg.param_dtype, axis=axis)


def _dense(cfg: VideoSwinConfig, features: int, axes, name: str, use_bias: bool = True):
  return nn.Dense(features, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name,
                  kernel_init=layers.normal(0.02, axes), bias_init=layers.zeros(axes[-1:]))


class WindowAttention3D(nn.Module):
  """Windows `[B_, N, C]` (mask `[nW, N, N]` or None) -> `[B_, N, C]`."""
  config: VideoSwinConfig
  dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x, mask):
    cfg, nh = self.config, self.num_heads
    b_, n, c = x.shape
    hd = c // nh
    wd, wh, ww = cfg.window_size
    table = self.param("relative_position_bias_table", layers.normal(0.02, (None, "heads")),
                       ((2 * wd - 1) * (2 * wh - 1) * (2 * ww - 1), nh), cfg.param_dtype)
    kernel = self.param("kernel", layers.normal(0.02, ("embed", None, "heads", "kv")), (c, 3, nh, hd),
                        cfg.param_dtype)
    qkv = jnp.einsum("bnc,cthd->tbhnd", x.astype(cfg.dtype), kernel.astype(cfg.dtype))
    if cfg.qkv_bias:
      bias = self.param("bias", layers.zeros((None, "heads", "kv")), (3, nh, hd), cfg.param_dtype)
      qkv = qkv + bias.astype(cfg.dtype)[:, None, :, None, :]
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * jnp.asarray(hd ** -0.5, cfg.dtype)
    attn = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    index = relative_position_index(cfg.window_size)[:n, :n].reshape(-1)
    rel = table[index].reshape(n, n, nh).transpose(2, 0, 1).astype(jnp.float32)
    attn = attn + rel[None]
    if mask is not None:
      nw = mask.shape[0]
      attn = attn.reshape(b_ // nw, nw, nh, n, n) + jnp.asarray(mask)[None, :, None]
      attn = attn.reshape(-1, nh, n, n)
    attn = jax.nn.softmax(attn, axis=-1).astype(cfg.dtype)
    out = jnp.einsum("bhqk,bhkd->bhqd", attn, v)
    proj = self.param("proj_kernel", layers.normal(0.02, ("heads", "kv", "embed")), (nh, hd, c), cfg.param_dtype)
    proj_bias = self.param("proj_bias", layers.zeros(("embed",)), (c,), cfg.param_dtype)
    return jnp.einsum("bhnd,hdc->bnc", out, proj.astype(cfg.dtype)) + proj_bias.astype(cfg.dtype)


def drop_path(module: nn.Module, x, rate: float, deterministic: bool):
  """Stochastic depth (their drop_path): per example, x / keep with probability keep, else 0; identity at eval."""
  if deterministic or rate == 0.0:
    return x
  keep = 1.0 - rate
  rng = module.make_rng("dropout")
  mask = jnp.floor(keep + jax.random.uniform(rng, (x.shape[0],) + (1,) * (x.ndim - 1), x.dtype))
  return x / keep * mask


class SwinBlock3D(nn.Module):
  """`[B, D, H, W, C]` -> same; `shift` (0, 0, 0) or the stage's shift; `mask` the stage's (used when shifted)."""
  config: VideoSwinConfig
  dim: int
  num_heads: int
  shift: Tuple[int, int, int]
  drop_path_rate: float = 0.0

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True):
    cfg = self.config
    b, d, h, w, c = x.shape
    window, shift = get_window_size((d, h, w), cfg.window_size, self.shift)
    shortcut = x
    y = _norm(cfg, "norm1")(x)
    pads = [(window[i] - s % window[i]) % window[i] for i, s in enumerate((d, h, w))]
    y = jnp.pad(y, ((0, 0), (0, pads[0]), (0, pads[1]), (0, pads[2]), (0, 0)))
    _, dp, hp, wp, _ = y.shape
    shifted = any(s > 0 for s in shift)
    if shifted:
      y = jnp.roll(y, shift=(-shift[0], -shift[1], -shift[2]), axis=(1, 2, 3))
    windows = nn.with_logical_constraint(window_partition(y, window), ("batch", "length", "embed"))
    windows = WindowAttention3D(cfg, self.dim, self.num_heads, name="attn")(windows, mask if shifted else None)
    y = window_reverse(windows, window, b, dp, hp, wp)
    if shifted:
      y = jnp.roll(y, shift=shift, axis=(1, 2, 3))
    y = y[:, :d, :h, :w, :]
    x = shortcut + drop_path(self, y, self.drop_path_rate, deterministic)
    hidden = int(self.dim * cfg.mlp_ratio)
    y = _norm(cfg, "norm2")(x)
    y = _dense(cfg, self.dim, ("mlp", "embed"), "fc2")(_gelu(_dense(cfg, hidden, ("embed", "mlp"), "fc1")(y)))
    return x + drop_path(self, y, self.drop_path_rate, deterministic)


class PatchMerging(nn.Module):
  """`[B, D, H, W, C]` -> `[B, D, ceil(H/2), ceil(W/2), 2C]`."""
  config: VideoSwinConfig
  dim: int

  @nn.compact
  def __call__(self, x):
    _, _, h, w, _ = x.shape
    x = jnp.pad(x, ((0, 0), (0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    x = jnp.concatenate([x[:, :, 0::2, 0::2], x[:, :, 1::2, 0::2], x[:, :, 0::2, 1::2], x[:, :, 1::2, 1::2]], -1)
    x = _norm(self.config, "norm", axis=None)(x)
    return _dense(self.config, 2 * self.dim, (None, "embed"), "reduction", use_bias=False)(x)


class BasicLayer(nn.Module):
  """One stage: `depth` blocks (odd ones shifted) and, unless last, PatchMerging."""
  config: VideoSwinConfig
  index: int

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg, i = self.config, self.index
    dim, depth = cfg.embed_dim * 2 ** i, cfg.depths[i]
    half = tuple(s // 2 for s in cfg.window_size)
    _, d, h, w, _ = x.shape
    window, shift = get_window_size((d, h, w), cfg.window_size, half)
    padded = tuple(int(np.ceil(s / win)) * win for s, win in zip((d, h, w), window))
    mask = compute_mask(*padded, window, shift) if any(shift) else None
    rates = np.linspace(0.0, cfg.drop_path_rate, sum(cfg.depths))[sum(cfg.depths[:i]):sum(cfg.depths[:i + 1])]
    for j in range(depth):
      x = SwinBlock3D(cfg, dim, cfg.num_heads[i], (0, 0, 0) if j % 2 == 0 else half, float(rates[j]),
                      name=f"blocks_{j}")(x, mask, deterministic)
    if i < len(cfg.depths) - 1:
      x = PatchMerging(cfg, dim, name="downsample")(x)
    return x


class PatchEmbed3D(nn.Module):
  """Frames `[B, T, H, W, C]` (channels last) -> `[B, T, H/4, W/4, embed_dim]`."""
  config: VideoSwinConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    pd, ph, pw = cfg.patch_size
    _, _, h, w, _ = x.shape
    pad_h = ph - h % ph if h % ph else 0
    pad_w = pw - w % pw if w % pw else 0
    x = jnp.pad(x, ((0, 0), (0, 1), (0, pad_h), (0, pad_w), (0, 0)))  # their F.pad(x, (0, 0, 0, 0, 0, 1)): time + 1
    x = nn.Conv(cfg.embed_dim, kernel_size=(pd, ph, pw), strides=(1, ph, pw), padding="VALID", dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, name="proj",
                kernel_init=layers.normal(0.02, (None, None, None, None, "embed")),
                bias_init=layers.zeros(("embed",)))(x.astype(cfg.dtype))
    if cfg.patch_norm:
      x = _norm(cfg, "norm")(x)
    return x


class SwinTransformer3D(nn.Module):
  """Normalised frames `[B, T, H, W, 3]` -> features `[B, T, ceil(H/32), ceil(W/32), num_features]`."""
  config: VideoSwinConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    x = PatchEmbed3D(cfg, name="patch_embed")(x)
    for i in range(len(cfg.depths)):
      x = BasicLayer(cfg, i, name=f"layers_{i}")(x, deterministic)
    return _norm(cfg, "norm")(x)


# ------------------------------------------------------------------------------------------ weight import


def load_rules(config: VideoSwinConfig, ours: str = "", theirs: str = "") -> Dict[str, hf_utils.Rule]:
  """Our flat param path (under `ours`) -> rule over a SwinTransformer3D state dict (keys under `theirs`, e.g.
  "enc_img.swin."). The `relative_position_index` buffers are not parameters (recomputed: `relative_position_index`)."""
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}

  def norm(our, their):
    rules[f"{ours}{our}/scale"] = rule((f"{theirs}{their}.weight",))
    rules[f"{ours}{our}/bias"] = rule((f"{theirs}{their}.bias",))

  def linear(our, their, bias=True):
    rules[f"{ours}{our}/kernel"] = rule((f"{theirs}{their}.weight",), lin)
    if bias:
      rules[f"{ours}{our}/bias"] = rule((f"{theirs}{their}.bias",))

  rules[f"{ours}patch_embed/proj/kernel"] = rule((f"{theirs}patch_embed.proj.weight",),
                                                 lambda w: np.ascontiguousarray(w.transpose(2, 3, 4, 1, 0)))
  rules[f"{ours}patch_embed/proj/bias"] = rule((f"{theirs}patch_embed.proj.bias",))
  if config.patch_norm:
    norm("patch_embed/norm", "patch_embed.norm")
  for i, depth in enumerate(config.depths):
    dim, nh = config.embed_dim * 2 ** i, config.num_heads[i]
    hd = dim // nh
    for j in range(depth):
      our, their = f"layers_{i}/blocks_{j}", f"layers.{i}.blocks.{j}"
      norm(f"{our}/norm1", f"{their}.norm1")
      norm(f"{our}/norm2", f"{their}.norm2")
      rules[f"{ours}{our}/attn/relative_position_bias_table"] = rule((f"{theirs}{their}.attn.relative_position_bias_"
                                                                      "table",))
      rules[f"{ours}{our}/attn/kernel"] = rule(
          (f"{theirs}{their}.attn.qkv.weight",),
          functools.partial(lambda w, d, n, k: np.ascontiguousarray(w.T.reshape(d, 3, n, k)), d=dim, n=nh, k=hd))
      if config.qkv_bias:
        rules[f"{ours}{our}/attn/bias"] = rule((f"{theirs}{their}.attn.qkv.bias",),
                                               functools.partial(lambda b, n, k: b.reshape(3, n, k), n=nh, k=hd))
      rules[f"{ours}{our}/attn/proj_kernel"] = rule(
          (f"{theirs}{their}.attn.proj.weight",),
          functools.partial(lambda w, d, n, k: np.ascontiguousarray(w.T.reshape(n, k, d)), d=dim, n=nh, k=hd))
      rules[f"{ours}{our}/attn/proj_bias"] = rule((f"{theirs}{their}.attn.proj.bias",))
      linear(f"{our}/fc1", f"{their}.mlp.fc1")
      linear(f"{our}/fc2", f"{their}.mlp.fc2")
    if i < len(config.depths) - 1:
      norm(f"layers_{i}/downsample/norm", f"layers.{i}.downsample.norm")
      linear(f"layers_{i}/downsample/reduction", f"layers.{i}.downsample.reduction", bias=False)
  norm("norm", "norm")
  return rules


# Buffers of their state dict that are not parameters (recomputed here, checked by `check_buffers`).
BUFFERS = r"\.attn\.relative_position_index$"


def check_buffers(config: VideoSwinConfig, ckpt: Dict[str, np.ndarray], theirs: str, source: str) -> None:
  """Their `relative_position_index` buffers, where present, must be the index of config.window_size (a checkpoint
  of another window would silently read the bias table in another order)."""
  expected = relative_position_index(config.window_size)
  for key, value in ckpt.items():
    if key.startswith(theirs) and key.endswith(".attn.relative_position_index"):
      if np.shape(value) != expected.shape or not np.array_equal(np.asarray(value), expected):
        raise ValueError(f"{source}: {key} is not the relative position index of window_size "
                         f"{config.window_size} (shape {np.shape(value)}): the checkpoint's window differs")
