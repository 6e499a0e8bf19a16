"""Layers shared by the encoders: sharded Dense / LayerNorm / initialisers, bottleneck adapters, the visual prefix,
per-layer rematerialisation.

Every parameter is created with the logical axis names of its dimensions (MaxText `layers/linears.py` style:
`kernel_axes`), which `config.logical_axis_rules` map onto the mesh. Parameter names and initial values are those of
plain nn.Dense / nn.LayerNorm, so Hugging Face weight import addresses them by the same names.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


# Hugging Face activation names (`hidden_act`) -> functions, for every encoder.
ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_new": functools.partial(nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(nn.gelu, approximate=True),
    "gelu_fast": functools.partial(nn.gelu, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
    "tanh": jnp.tanh,
}


def check_encoder_config(cfg) -> None:
  """The checks an encoder config's `__post_init__` shares (BERT, CLIP's towers): `dtype` / `param_dtype` stored as
  numpy dtypes (config files give "bfloat16" etc.; hashable), hidden_size a multiple of num_attention_heads and
  hidden_act one of ACTIVATIONS (ValueError naming the config class)."""
  name = type(cfg).__name__
  object.__setattr__(cfg, "dtype", jnp.dtype(cfg.dtype))
  object.__setattr__(cfg, "param_dtype", jnp.dtype(cfg.param_dtype))
  if cfg.hidden_size % cfg.num_attention_heads:
    raise ValueError(f"{name}: hidden_size {cfg.hidden_size} is not a multiple of "
                     f"num_attention_heads {cfg.num_attention_heads}")
  if cfg.hidden_act not in ACTIVATIONS:
    raise ValueError(f"{name}: hidden_act {cfg.hidden_act!r} not supported ({sorted(ACTIVATIONS)})")


def normal(stddev: float, axes):
  """N(0, stddev) initialiser of a parameter whose dimensions carry the logical axis names `axes`."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros, axes)


def ones(axes):
  return nn.with_logical_partitioning(nn.initializers.ones, axes)


def lecun_normal(axes):
  return nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)


def dense(features: int, kernel_axes, name: str, dtype: Any, *, stddev: float | None = None,
          param_dtype: Any = jnp.float32) -> nn.Dense:
  """nn.Dense `[..., in]` -> `[..., features]`: kernel `[in, features]` on logical axes `kernel_axes`, initialised
  N(0, stddev) (None: lecun_normal, flax's default), and a zero bias on `kernel_axes[-1:]`."""
  kernel_axes = tuple(kernel_axes)
  return nn.Dense(features, dtype=dtype, param_dtype=param_dtype, name=name,
                  kernel_init=lecun_normal(kernel_axes) if stddev is None else normal(stddev, kernel_axes),
                  bias_init=zeros(kernel_axes[-1:]))


def layer_norm(name: str, dtype: Any, *, epsilon: float = 1e-6, param_dtype: Any = jnp.float32,
               axis: str | None = "embed", use_fast_variance: bool = True) -> nn.LayerNorm:
  """nn.LayerNorm over the last dimension (logical axis `axis`): scale ones, bias zeros.

  `use_fast_variance=False` computes the variance as E[(x - mean)^2] instead of E[x^2] - mean^2 (DeBERTa-v2).
  """
  return nn.LayerNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_fast_variance=use_fast_variance,
                      name=name, scale_init=ones((axis,)), bias_init=zeros((axis,)))


def encoder_init(cfg, axes):
  """N(0, cfg.initializer_range) on logical axes `axes`: an encoder config's weight initialiser."""
  return normal(cfg.initializer_range, axes)


def encoder_dense(cfg, features: int, kernel_axes, name: str) -> nn.Dense:
  """`dense` with an encoder config's init (N(0, cfg.initializer_range)), cfg.dtype and cfg.param_dtype."""
  return dense(features, kernel_axes, name, stddev=cfg.initializer_range, dtype=cfg.dtype,
               param_dtype=cfg.param_dtype)


def encoder_layer_norm(cfg, name: str, **kwargs) -> nn.LayerNorm:
  """`layer_norm` with an encoder config's cfg.layer_norm_eps, cfg.dtype and cfg.param_dtype."""
  return layer_norm(name, epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype, **kwargs)


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


def encoder_adapter(cfg, name: str, x, deterministic: bool):
  """x `[batch, length, hidden]` through the encoder's `Adapter` called `name` when cfg.use_adapters (size, reduction,
  dropout and dtypes from the BERT / DeBERTa-v2 config), else x unchanged. Both encoders call it after the attention
  output dense ("adapter_attn") and the FFN output dense ("adapter_ffn"), as FrozenBiLM places its adapters."""
  if not cfg.use_adapters:
    return x
  return Adapter(cfg.hidden_size, cfg.adapter_reduction, cfg.adapter_dropout, dtype=cfg.dtype,
                 param_dtype=cfg.param_dtype, name=name)(x, deterministic=deterministic)


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
