"""CLIP text tower with its projection (Flax linen), Hugging Face weight import by parameter name.

Mirrors `transformers.CLIPTextModelWithProjection` (parity tested in fp32): token + learned position embeddings,
pre-LN transformer layers under a causal mask (the vision tower's layers, clip_common.CLIPEncoderLayer),
`final_layer_norm`, the hidden state at the end-of-text token (the largest id, as OpenAI's `encode_text` and
Hugging Face with `eos_token_id == 2`; else the first `eos_token_id`), then `text_projection` (no bias). Used by
the OVQA zero-shot CLIP baseline (launch/ovqa_zero_shot_baselines.py: CLIP's text features of each "question +
answer" against the release's CLIP frame features, as FrozenBiLM's videoqa_clip.py).

Parameter paths: embeddings/{token_embedding, position_embedding}/embedding, encoder_layers_{i}/... (as the vision
tower), final_layer_norm/{scale,bias}, text_projection/kernel. Checkpoints of `CLIPTextModelWithProjection` and of
the full `CLIPModel` (keys under "text_model.", vision tower ignored) load.
"""

import dataclasses
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from evqa_jax.models import clip_common, hf_utils, layers


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
  """The Hugging Face `CLIPTextConfig` fields the tower uses (+ `projection_dim`). `dtype` is the compute dtype."""
  vocab_size: int = 49408
  hidden_size: int = 512
  intermediate_size: int = 2048
  num_hidden_layers: int = 12
  num_attention_heads: int = 8
  max_position_embeddings: int = 77
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  initializer_range: float = 0.02
  projection_dim: int = 512
  eos_token_id: int = 2
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    layers.check_encoder_config(self)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "CLIPTextConfig":
    """A text config dict, or a full CLIP config dict (its `text_config`, and its `projection_dim`)."""
    if "text_config" in d and isinstance(d["text_config"], dict):
      d = dict(d["text_config"], **({"projection_dim": d["projection_dim"]} if "projection_dim" in d else {}))
    return hf_utils.config_from_dict(cls, d, overrides)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "CLIPTextConfig":
    return hf_utils.config_from_hf_dir(cls, path, **overrides)


class CLIPTextModel(nn.Module):
  """input_ids `[n, L]` (L <= max_position_embeddings; padding after the end-of-text token is never attended by it)
  -> {"last_hidden_state": [n, L, D], "pooler_output": [n, D], "text_embeds": [n, projection_dim]}."""
  config: CLIPTextConfig

  @nn.compact
  def __call__(self, input_ids):
    cfg = self.config
    n, length = input_ids.shape
    if length > cfg.max_position_embeddings:
      raise ValueError(f"CLIPTextModel: {length} tokens > max_position_embeddings {cfg.max_position_embeddings}")
    embed = lambda num, name: nn.Embed(num, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                       embedding_init=layers.encoder_init(cfg, (None, "embed")), name=name)
    x = embed(cfg.vocab_size, "embeddings_token_embedding")(input_ids)
    x = x + embed(cfg.max_position_embeddings, "embeddings_position_embedding").embedding[:length].astype(cfg.dtype)
    causal = jnp.where(jnp.tril(jnp.ones((length, length), bool)), 0.0, jnp.finfo(jnp.float32).min)
    for i in range(cfg.num_hidden_layers):
      x = clip_common.CLIPEncoderLayer(cfg, name=f"encoder_layers_{i}")(x, causal[None, None])
    x = layers.encoder_layer_norm(cfg, "final_layer_norm")(x)
    if cfg.eos_token_id == 2:  # Hugging Face's legacy rule, OpenAI's: the end-of-text token has the largest id
      eos = jnp.argmax(input_ids, axis=-1)
    else:
      eos = jnp.argmax(input_ids == cfg.eos_token_id, axis=-1)
    pooled = x[jnp.arange(n), eos]
    proj = nn.Dense(cfg.projection_dim, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                    kernel_init=nn.initializers.normal(cfg.initializer_range), name="text_projection")
    return {"last_hidden_state": x, "pooler_output": pooled, "text_embeds": proj(pooled)}


def hf_rules(config: CLIPTextConfig) -> Dict[str, hf_utils.Rule]:
  """Our flat param path -> its Hugging Face key (after stripping "text_model."; the projection keeps its name)."""
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {
      "embeddings_token_embedding/embedding": rule(("embeddings.token_embedding.weight",)),
      "embeddings_position_embedding/embedding": rule(("embeddings.position_embedding.weight",)),
      "final_layer_norm/scale": rule(("final_layer_norm.weight",)),
      "final_layer_norm/bias": rule(("final_layer_norm.bias",)),
      "text_projection/kernel": rule(("text_projection.weight",), lin),
  }
  rules.update(clip_common.encoder_layer_rules(config))  # the vision tower's layers, the same names
  return rules


_IGNORE = (r"^vision_model\.", r"^visual_projection\.", r"^logit_scale$", r"position_ids$")


def load_hf_params(config: CLIPTextConfig, path: str):
  """Imports a Hugging Face CLIP checkpoint (directory or file: `CLIPTextModelWithProjection` or `CLIPModel`) into
  `CLIPTextModel` params; every parameter must come from it, shapes checked (ValueError naming the parameter)."""
  file = hf_utils.resolve_checkpoint_file(path)
  ckpt = hf_utils.strip_prefix(hf_utils.read_checkpoint(file), "text_model.")
  expected = hf_utils.flatten_params(jax.eval_shape(lambda: nn.meta.unbox(CLIPTextModel(config).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))["params"])))
  flat, report = hf_utils.assemble(expected, ckpt, hf_rules(config), source=file, init=None, ignore=_IGNORE,
                                   required=("",), config_source=hf_utils.config_file_of(path))
  return hf_utils.unflatten_params(flat), report
