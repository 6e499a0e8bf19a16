"""Layers shared by the encoders: bottleneck adapters and the visual prefix projection."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


def adapter_init(stddev: float = 1e-3, clip: float = 2e-3):
  """N(0, stddev) clipped to [-clip, clip], as FrozenBiLM initialises its adapters (near-identity at start)."""

  def init(key, shape, dtype=jnp.float32):
    return jnp.clip(stddev * jax.random.normal(key, shape, dtype), -clip, clip)

  return init


class Adapter(nn.Module):
  """x + up(dropout(relu(down(x)))) on `[batch, length, hidden]`; bottleneck = hidden // reduction.

  Placed after the attention output projection and after the FFN output projection, before the residual + LayerNorm.
  """
  hidden_size: int
  reduction: int = 8
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    bottleneck = self.hidden_size // self.reduction
    h = nn.Dense(bottleneck, dtype=self.dtype, param_dtype=self.param_dtype, name="down",
                 kernel_init=nn.with_logical_partitioning(adapter_init(), ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(adapter_init(), ("mlp",)))(x)
    h = nn.relu(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = nn.Dense(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name="up",
                 kernel_init=nn.with_logical_partitioning(adapter_init(), ("mlp", "embed")),
                 bias_init=nn.with_logical_partitioning(adapter_init(), ("embed",)))(h)
    return x + h


class VisualProjection(nn.Module):
  """Linear(visual_dim -> hidden) on frame features `[batch, frames, visual_dim]` -> `[batch, frames, hidden]`."""
  hidden_size: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, frames):
    return nn.Dense(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name="dense",
                    kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(frames)
