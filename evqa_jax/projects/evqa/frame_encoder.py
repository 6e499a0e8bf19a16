"""Small convolutional frame encoder, trained from scratch (the E-VQA demo's vision tower).

Each frame goes through a patchifying convolution (kernel = stride = `patch_size`), then `num_blocks` residual blocks
(LayerNorm -> 3x3 conv -> GELU -> 3x3 conv) on the patch grid, plus a learned position embedding per grid cell.
With `output_stride` < `patch_size` the features are brought to a finer grid FPN-style: the coarse features,
upsampled bilinearly, plus a cheap stride-`output_stride` 3x3 stem convolution of the input (which keeps exact
colour edges), LayerNorm'd. Masks decoded on that finer grid have boundaries accurate to about a pixel, which the
DAVIS boundary measure (tolerance ~1 px on small frames) needs; the expensive blocks still run on the coarse grid.
With `temporal_shift` > 0 each residual block first shifts that fraction of its channels one frame forward and the
same fraction one frame back in time (the temporal shift module of TSM, Lin et al. 2019): zero extra parameters or
FLOPs, and the 3x3 convolutions then see the same place in the neighbouring frames, so patch features can encode
motion ("the red square moving left") instead of a single still. Padded frames (frame_mask 0) shift in zeros.
With `frame_difference` the patchifying convolution also sees each frame's pixel differences to the previous and the
next frame (zero at the ends and next to padded frames; the "RGB difference" input of TSN, Wang et al. 2016): the
leading and trailing edges of a moving object light up there, so its direction is visible to the first layer.
The position embedding matters downstream: convolutions are translation-equivariant, so without it the pooled
per-frame feature could not tell *where* an object is, and motion questions ("which way does it move?") would be
unanswerable.

  FrameEncoder(...)(frames uint8/float [batch, frames, H, W, 3], frame_mask [batch, frames] = None)
      -> patch features [batch, frames, P, dim]
  with P = (H / output_stride) * (W / output_stride), row-major over the grid.

`pool_frames(features, frame_mask)` gives the per-frame visual prefix tokens of the cross-modal encoder:
concat(mean over patches, max over patches) -> [batch, frames, 2 * dim].
"""

from typing import Any, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from evqa_jax.models import layers

# Pixel normalisation for uint8 RGB input: (x / 255 - 0.5) / 0.25.
_PIXEL_MEAN = 0.5
_PIXEL_STD = 0.25


def frame_differences(pixels, num_frames: int, frame_mask=None):
  """`[batch * T, H, W, C]` -> `[batch * T, H, W, 2C]`: (x_t - x_{t-1}, x_{t+1} - x_t), zero where the other frame
  is outside the video or padded (frame_mask `[batch, T]`)."""
  n, h, w, c = pixels.shape
  x = pixels.reshape(n // num_frames, num_frames, h, w, c)
  valid = (jnp.ones(x.shape[:2], bool) if frame_mask is None else frame_mask > 0)
  pair = (valid[:, 1:] & valid[:, :-1]).astype(x.dtype)[:, :, None, None, None]  # [b, T-1]: both frames real
  diff = (x[:, 1:] - x[:, :-1]) * pair  # diff[t] = x_{t+1} - x_t
  zero = jnp.zeros_like(x[:, :1])
  back = jnp.concatenate([zero, diff], axis=1)
  ahead = jnp.concatenate([diff, zero], axis=1)
  return jnp.concatenate([back, ahead], axis=-1).reshape(n, h, w, 2 * c)


def temporal_shift(x, num_frames: int, channels: int, frame_mask=None):
  """TSM's shift on `[batch * T, gh, gw, D]`: channels `[:c]` of frame t come from frame t - 1, channels `[c:2c]`
  from frame t + 1 (zeros past either end and from padded frames), the rest stay. `frame_mask` `[batch, T]`."""
  if channels <= 0:
    return x
  n, gh, gw, d = x.shape
  if 2 * channels > d:
    raise ValueError(f"temporal_shift: shifting 2 x {channels} channels needs at least that many, got {d}")
  x5 = x.reshape(n // num_frames, num_frames, gh, gw, d)
  src = x5 if frame_mask is None else x5 * (frame_mask > 0).astype(x.dtype)[:, :, None, None, None]
  zero = jnp.zeros_like(src[:, :1, ..., :channels])
  forward = jnp.concatenate([zero, src[:, :-1, ..., :channels]], axis=1)
  backward = jnp.concatenate([src[:, 1:, ..., channels:2 * channels], zero], axis=1)
  return jnp.concatenate([forward, backward, x5[..., 2 * channels:]], axis=-1).reshape(n, gh, gw, d)


class ConvBlock(nn.Module):
  """Pre-LN residual block on `[n, gh, gw, dim]`: x + conv3(gelu(conv3(shift(LN(x))))); `shift` is the temporal
  shift of `shift_channels` channels each way over `num_frames` (n = batch * num_frames), or nothing."""
  dim: int
  num_frames: int = 1
  shift_channels: int = 0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, frame_mask=None):
    h = layers.layer_norm("LayerNorm", self.dtype)(x)
    h = temporal_shift(h, self.num_frames, self.shift_channels, frame_mask)
    h = nn.Conv(self.dim, (3, 3), padding="SAME", dtype=self.dtype, name="conv1",
                kernel_init=layers.lecun_normal((None, None, "embed", "mlp")), bias_init=layers.zeros(("mlp",)))(h)
    h = nn.gelu(h)
    h = nn.Conv(self.dim, (3, 3), padding="SAME", dtype=self.dtype, name="conv2",
                kernel_init=layers.zeros((None, None, "mlp", "embed")),
                bias_init=layers.zeros(("embed",)))(h)
    return x + h


class FrameEncoder(nn.Module):
  """Patch features of every frame; see the module docstring.

  Attributes:
    dim: feature width D.
    patch_size: stride of the patchifying convolution; H and W must be multiples of it.
    num_blocks: residual conv blocks on the patch grid.
    image_size: (H, W) of the input frames (fixes the position-embedding table).
    output_stride: pixels per cell of the output grid (0 = patch_size); must divide patch_size.
    temporal_shift: fraction of the channels each block shifts one frame forward (and as many back); 0 = per-frame.
    frame_difference: add the differences to the previous and next frame as 6 more input channels.
  """
  dim: int = 64
  patch_size: int = 4
  num_blocks: int = 2
  image_size: Tuple[int, int] = (64, 64)
  output_stride: int = 0
  temporal_shift: float = 0.0
  frame_difference: bool = False
  dtype: Any = jnp.float32

  @property
  def stride(self) -> int:
    s = self.output_stride or self.patch_size
    if self.patch_size % s:
      raise ValueError(f"FrameEncoder: output_stride {s} does not divide patch_size {self.patch_size}")
    return s

  def _grid(self, step: int) -> Tuple[int, int]:
    h, w = self.image_size
    if h % step or w % step:
      raise ValueError(f"FrameEncoder: image size {h}x{w} is not a multiple of {step} (patch_size / output_stride)")
    return h // step, w // step

  @property
  def grid(self) -> Tuple[int, int]:
    """The output grid (gh, gw)."""
    return self._grid(self.stride)

  @nn.compact
  def __call__(self, frames, frame_mask=None):
    """frames `[batch, T, H, W, 3]` (uint8 0..255 or float already in 0..255), frame_mask `[batch, T]` (only used
    by the temporal shift) -> `[batch, T, P, dim]`."""
    if frames.ndim != 5 or frames.shape[-1] != 3:
      raise ValueError(f"FrameEncoder: frames must be [batch, frames, H, W, 3], got {frames.shape}")
    b, t, h, w, _ = frames.shape
    if (h, w) != tuple(self.image_size):
      raise ValueError(f"FrameEncoder: frames are {h}x{w} but image_size is {tuple(self.image_size)}")
    gh, gw = self._grid(self.patch_size)
    pixels = frames.reshape(b * t, h, w, 3).astype(self.dtype)
    pixels = (pixels / 255.0 - _PIXEL_MEAN) / _PIXEL_STD
    inputs = pixels
    if self.frame_difference:
      inputs = jnp.concatenate([pixels, frame_differences(pixels, t, frame_mask)], axis=-1)
    x = nn.Conv(self.dim, (self.patch_size, self.patch_size), strides=(self.patch_size, self.patch_size),
                padding="VALID", dtype=self.dtype, name="patch_embed",
                kernel_init=layers.lecun_normal((None, None, None, "embed")),
                bias_init=layers.zeros(("embed",)))(inputs)
    pos = self.param("pos_embedding", layers.normal(0.02, (None, None, "embed")), (gh, gw, self.dim))
    x = x + pos[None].astype(self.dtype)
    shift = int(round(self.dim * self.temporal_shift))
    for i in range(self.num_blocks):
      x = ConvBlock(self.dim, num_frames=t, shift_channels=shift, dtype=self.dtype, name=f"block_{i}")(x, frame_mask)
    if self.stride != self.patch_size:
      fh, fw = self.grid
      x = jax.image.resize(x, (b * t, fh, fw, self.dim), method="bilinear")
      stem = nn.Conv(self.dim, (3, 3), strides=(self.stride, self.stride), padding="SAME", dtype=self.dtype,
                     name="stem", kernel_init=layers.lecun_normal((None, None, None, "embed")),
                     bias_init=layers.zeros(("embed",)))(inputs)
      x = x + layers.dense(self.dim, (None, "embed"), "stem_proj", self.dtype)(nn.gelu(stem))
      gh, gw = fh, fw
    x = layers.layer_norm("out_LayerNorm", self.dtype)(x)
    x = x.reshape(b, t, gh * gw, self.dim)
    return nn.with_logical_constraint(x, ("batch", "frames", "length", "embed"))


def pool_frames(features, frame_mask=None):
  """`[batch, T, P, D]` patch features -> `[batch, T, 2D]` = concat(mean, max) over patches; padded frames -> 0."""
  pooled = jnp.concatenate([jnp.mean(features, axis=2), jnp.max(features, axis=2)], axis=-1)
  if frame_mask is not None:
    pooled = pooled * (frame_mask[..., None] > 0).astype(pooled.dtype)
  return pooled
