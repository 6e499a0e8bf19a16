"""What CLIP's vision and text towers share (clip_vision.py, clip_text.py): the pre-LN transformer layer (layer_norm1
-> self_attn -> residual, layer_norm2 -> mlp(fc1, act, fc2) -> residual) and its Hugging Face weight names.

The config is either tower's (`CLIPVisionConfig`, `CLIPTextConfig`): the fields read here are hidden_size,
intermediate_size, num_attention_heads, head_dim, num_hidden_layers, hidden_act, layer_norm_eps, initializer_range,
dtype and param_dtype.
"""

import functools
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from evqa_jax.models import hf_utils, layers
from evqa_jax.models.evidence_heads import HeadProjection
from evqa_jax.models.layers import ACTIVATIONS


class CLIPAttention(nn.Module):
  """Multi-head self-attention; `bias` (broadcastable to `[b, h, q, k]`, e.g. the text tower's causal mask) is added
  to the scores."""
  config: Any

  @nn.compact
  def __call__(self, x, bias=None):
    cfg = self.config
    proj = functools.partial(HeadProjection, (cfg.num_attention_heads, cfg.head_dim), ("embed", "heads", "kv"),
                             ("heads", "kv"), init_std=cfg.initializer_range, dtype=cfg.dtype,
                             param_dtype=cfg.param_dtype)
    q = proj(name="q_proj")(x) * jnp.asarray(cfg.head_dim ** -0.5, cfg.dtype)
    k = proj(name="k_proj")(x)
    v = proj(name="v_proj")(x)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    if bias is not None:
      scores = scores + bias
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return HeadProjection((cfg.hidden_size,), ("heads", "kv", "embed"), ("embed",), to_heads=False,
                          init_std=cfg.initializer_range, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                          name="out_proj")(ctx)


class CLIPMLP(nn.Module):
  config: Any

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    h = layers.encoder_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "fc1")(x)
    h = ACTIVATIONS[cfg.hidden_act](h)
    return layers.encoder_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "fc2")(h)


class CLIPEncoderLayer(nn.Module):
  config: Any

  @nn.compact
  def __call__(self, x, bias=None):
    x = x + CLIPAttention(self.config, name="self_attn")(layers.encoder_layer_norm(self.config, "layer_norm1")(x),
                                                         bias)
    x = x + CLIPMLP(self.config, name="mlp")(layers.encoder_layer_norm(self.config, "layer_norm2")(x))
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


def encoder_layer_rules(config) -> Dict[str, hf_utils.Rule]:
  """The flat param paths of the `CLIPEncoderLayer`s named encoder_layers_{i} -> their Hugging Face keys
  (encoder.layers.{i}...., after the tower's prefix is stripped)."""
  d, nh, hd = config.hidden_size, config.num_attention_heads, config.head_dim
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}
  for i in range(config.num_hidden_layers):
    ours, hf = f"encoder_layers_{i}", f"encoder.layers.{i}"
    for name in ("q_proj", "k_proj", "v_proj"):
      rules[f"{ours}/self_attn/{name}/kernel"] = rule((f"{hf}.self_attn.{name}.weight",),
                                                      lambda w: lin(w).reshape(d, nh, hd))
      rules[f"{ours}/self_attn/{name}/bias"] = rule((f"{hf}.self_attn.{name}.bias",), lambda b: b.reshape(nh, hd))
    rules[f"{ours}/self_attn/out_proj/kernel"] = rule((f"{hf}.self_attn.out_proj.weight",),
                                                      lambda w: lin(w).reshape(nh, hd, d))
    rules[f"{ours}/self_attn/out_proj/bias"] = rule((f"{hf}.self_attn.out_proj.bias",))
    for name in ("fc1", "fc2"):
      rules[f"{ours}/mlp/{name}/kernel"] = rule((f"{hf}.mlp.{name}.weight",), lin)
      rules[f"{ours}/mlp/{name}/bias"] = rule((f"{hf}.mlp.{name}.bias",))
    for name in ("layer_norm1", "layer_norm2"):
      rules[f"{ours}/{name}/scale"] = rule((f"{hf}.{name}.weight",))
      rules[f"{ours}/{name}/bias"] = rule((f"{hf}.{name}.bias",))
  return rules
