"""Layers shared by the encoders: bottleneck adapters, the visual prefix projection, per-layer rematerialisation."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


# config.model.remat -> what a rematerialised encoder layer keeps from its forward pass for the backward pass.
REMAT_POLICIES = {
    "none": None,                                              # no remat: every intermediate is kept
    "full": jax.checkpoint_policies.nothing_saveable,          # keep only the layer's inputs; recompute the rest
    "dots_saveable": jax.checkpoint_policies.dots_saveable,    # keep matmul outputs; recompute the elementwise ops
}


def check_remat(name: str) -> str:
  if name not in REMAT_POLICIES:
    raise ValueError(f"config.model.remat = {name!r}: expected one of {sorted(REMAT_POLICIES)}")
  return name


def maybe_remat(layer_cls, name: str, static_argnums: tuple):
  """`layer_cls`, or its `nn.remat` with the named policy (`static_argnums` count `self` as 0: the Python bools).

  Parameter names and values are unchanged, so checkpoints load either way; the loss and gradients are the same
  computation, only the activation memory of the backward pass changes.
  """
  policy = REMAT_POLICIES[check_remat(name)]
  if policy is None:
    return layer_cls
  return nn.remat(layer_cls, policy=policy, static_argnums=static_argnums)


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
