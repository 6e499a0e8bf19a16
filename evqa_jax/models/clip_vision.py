"""CLIP ViT vision tower (Flax linen) with Hugging Face weight import by parameter name.

Mirrors `transformers.CLIPVisionModel` exactly (parity tested in fp32): patch embedding (conv, no bias) + class token
+ learned position embeddings, `pre_layrnorm`, pre-LN transformer layers (clip_common.CLIPEncoderLayer: layer_norm1
-> self_attn -> residual, layer_norm2 -> mlp(fc1, quick_gelu, fc2) -> residual), and `post_layernorm` on the class
token for the pooled output.
`last_hidden_state` is the encoder output *without* the post LayerNorm, as in Hugging Face.

Parameter paths follow the Hugging Face module names, so importing is a renaming plus transposes/reshapes:
  embeddings/{class_embedding, patch_embedding/kernel, position_embedding/embedding}, pre_layrnorm/{scale,bias},
  encoder/layers_{i}/{layer_norm1, self_attn/{q_proj,k_proj,v_proj,out_proj}, layer_norm2, mlp/{fc1,fc2}},
  post_layernorm.
Checkpoints of `CLIPVisionModel` and of the full `CLIPModel` (keys under "vision_model.", text tower ignored) load.

`ClipFrameEncoder` wraps the tower for videos: uint8 frames [batch, T, H, W, 3] -> patch features [batch, T, P, D]
(the last hidden state without the class token), with CLIP's pixel normalisation.
"""

import dataclasses
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import clip_common, hf_utils, layers

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)



@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
  """The Hugging Face `CLIPVisionConfig` fields used by the vision tower. `dtype` is the compute dtype."""
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  num_channels: int = 3
  image_size: int = 224
  patch_size: int = 32
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  initializer_range: float = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    layers.check_encoder_config(self)
    if self.image_size % self.patch_size:
      raise ValueError(f"CLIPVisionConfig: image_size {self.image_size} is not a multiple of "
                       f"patch_size {self.patch_size}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_patches(self) -> int:
    return self.grid * self.grid

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "CLIPVisionConfig":
    """A vision config dict, or a full CLIP config dict (its `vision_config` is used); unknown keys are ignored."""
    if "vision_config" in d and isinstance(d["vision_config"], dict):
      d = d["vision_config"]
    return hf_utils.config_from_dict(cls, d, overrides)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "CLIPVisionConfig":
    """Reads `path/config.json` (or `path` itself when it is a file)."""
    return hf_utils.config_from_hf_dir(cls, path, **overrides)


class CLIPVisionEmbeddings(nn.Module):
  config: CLIPVisionConfig

  @nn.compact
  def __call__(self, pixels):
    """pixels `[n, H, W, C]` (normalised) -> `[n, 1 + P, D]`."""
    cfg = self.config
    n = pixels.shape[0]
    cls_tok = self.param("class_embedding", layers.encoder_init(cfg, ("embed",)), (cfg.hidden_size,), cfg.param_dtype)
    patches = nn.Conv(cfg.hidden_size, (cfg.patch_size, cfg.patch_size), strides=(cfg.patch_size, cfg.patch_size),
                      padding="VALID", use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      kernel_init=layers.encoder_init(cfg, (None, None, None, "embed")), name="patch_embedding")(pixels)
    patches = patches.reshape(n, -1, cfg.hidden_size)  # row-major over the grid, as torch flatten(2)
    x = jnp.concatenate([jnp.broadcast_to(cls_tok.astype(cfg.dtype), (n, 1, cfg.hidden_size)), patches], axis=1)
    pos = nn.Embed(cfg.num_patches + 1, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   embedding_init=layers.encoder_init(cfg, (None, "embed")), name="position_embedding")
    return x + pos.embedding.astype(cfg.dtype)[None]


class CLIPVisionModel(nn.Module):
  """pixels `[n, H, W, C]` (already CLIP-normalised, channels last) ->
  {"last_hidden_state": [n, 1 + P, D], "pooler_output": [n, D]}."""
  config: CLIPVisionConfig

  @nn.compact
  def __call__(self, pixels):
    cfg = self.config
    if pixels.ndim != 4 or pixels.shape[1:] != (cfg.image_size, cfg.image_size, cfg.num_channels):
      raise ValueError(f"CLIPVisionModel: pixels must be [n, {cfg.image_size}, {cfg.image_size}, "
                       f"{cfg.num_channels}], got {pixels.shape}")
    x = CLIPVisionEmbeddings(cfg, name="embeddings")(pixels.astype(cfg.dtype))
    x = layers.encoder_layer_norm(cfg, "pre_layrnorm")(x)
    for i in range(cfg.num_hidden_layers):
      x = clip_common.CLIPEncoderLayer(cfg, name=f"encoder_layers_{i}")(x)
    pooled = layers.encoder_layer_norm(cfg, "post_layernorm")(x[:, 0])
    return {"last_hidden_state": x, "pooler_output": pooled}


class ClipFrameEncoder(nn.Module):
  """Video frames -> CLIP patch features.

  frames `[batch, T, S, S, 3]` uint8 RGB (S = config.image_size) -> `[batch, T, P, D]` (class token dropped).
  """
  config: CLIPVisionConfig

  @property
  def grid(self):
    return self.config.grid, self.config.grid

  @nn.compact
  def __call__(self, frames):
    cfg = self.config
    b, t = frames.shape[:2]
    x = frames.reshape((b * t,) + frames.shape[2:]).astype(jnp.float32) / 255.0
    x = (x - jnp.asarray(CLIP_MEAN)) / jnp.asarray(CLIP_STD)
    out = CLIPVisionModel(cfg, name="clip")(x.astype(cfg.dtype))
    feats = out["last_hidden_state"][:, 1:]
    feats = feats.reshape(b, t, cfg.num_patches, cfg.hidden_size)
    return nn.with_logical_constraint(feats, ("batch", "frames", "length", "embed"))


# ------------------------------------------------------------------------------------------ weight import


def init_params_boxed(config: CLIPVisionConfig, rng) -> Dict[str, Any]:
  """Boxed params of `CLIPVisionModel(config)` (dummy batch of one image)."""
  dummy = jnp.zeros((1, config.image_size, config.image_size, config.num_channels), jnp.float32)
  return CLIPVisionModel(config).init(rng, dummy)["params"]


def hf_rules(config: CLIPVisionConfig) -> Dict[str, hf_utils.Rule]:
  """Our flat param path -> its Hugging Face `CLIPVisionModel` state-dict key (after stripping "vision_model.")."""
  rule = hf_utils.Rule
  rules = {
      "embeddings/class_embedding": rule(("embeddings.class_embedding",)),
      # torch Conv2d [out, in, kh, kw] -> flax [kh, kw, in, out]
      "embeddings/patch_embedding/kernel": rule(("embeddings.patch_embedding.weight",),
                                                lambda w: np.ascontiguousarray(w.transpose(2, 3, 1, 0))),
      "embeddings/position_embedding/embedding": rule(("embeddings.position_embedding.weight",)),
  }
  for ours, hf in (("pre_layrnorm", "pre_layrnorm"), ("post_layernorm", "post_layernorm")):
    rules[f"{ours}/scale"] = rule((f"{hf}.weight",))
    rules[f"{ours}/bias"] = rule((f"{hf}.bias",))
  rules.update(clip_common.encoder_layer_rules(config))
  return rules


# Keys of a full CLIPModel checkpoint that the vision tower does not use (not reported as unused).
_IGNORE = (r"^text_model\.", r"^text_projection\.", r"^visual_projection\.", r"^logit_scale$", r"position_ids$")


def load_hf_params(config: CLIPVisionConfig, path: str, init_params=None):
  """Imports a Hugging Face CLIP checkpoint (directory or file) into `CLIPVisionModel` params.

  Returns (params, report) with plain (unboxed) params. Without `init_params` every parameter must come from the
  checkpoint (ValueError listing the missing ones); with it, absent parameters are filled from it and listed in
  `report.missing`. Shapes are checked (ValueError naming the parameter and the checkpoint key).
  """
  file = hf_utils.resolve_checkpoint_file(path)
  ckpt = hf_utils.strip_prefix(hf_utils.read_checkpoint(file), "vision_model.")
  if init_params is None:
    expected = hf_utils.flatten_params(jax.eval_shape(
        lambda: nn.meta.unbox(init_params_boxed(config, jax.random.PRNGKey(0)))))
    init = None
  else:
    expected = init = hf_utils.flatten_params(hf_utils.params_of(init_params))
  flat, report = hf_utils.assemble(expected, ckpt, hf_rules(config), source=file, init=init, ignore=_IGNORE,
                                   required=("",), config_source=hf_utils.config_file_of(path))  # all of it
  return hf_utils.unflatten_params(flat), report
