"""BERT-family bidirectional masked LM (Flax linen) with a FrozenBiLM-style visual prefix and adapters.

Parameters are named after the Hugging Face `BertForMaskedLM` modules so `load_hf_params` is a renaming:

  embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding, embeddings/LayerNorm
  visual_proj/dense                                  (only when num_visual_tokens > 0)
  encoder/layer_{i}/attention/self/{query,key,value} kernel [embed, heads, kv]
  encoder/layer_{i}/attention/output/{dense,adapter_attn,LayerNorm}
  encoder/layer_{i}/intermediate/dense, encoder/layer_{i}/output/{dense,adapter_ffn,LayerNorm}
  cls/predictions/transform/{dense,LayerNorm}, cls/predictions/bias   (decoder tied to the word embeddings)

Visual tokens (FrozenBiLM, `model/bert.py` of github.com/antoyang/FrozenBiLM): the T frame features go through
`VisualProjection` and are prepended to the word embeddings; position embeddings 0..T+L-1 and token-type embeddings
(type 0 for the visual slots) are then added over the whole T+L sequence, and the embedding LayerNorm + dropout are
applied to it. So text token j sits at position T+j, exactly what Hugging Face `BertModel` computes when given
`inputs_embeds = concat(visual_proj(video), word_embeddings(ids))`. The attention mask is
concat(visual_mask, attention_mask); `mask_index` indexes the full T+L sequence.

Adapters (`use_adapters`): `Adapter` after the attention output dense ("adapter_attn") and after the FFN output dense
("adapter_ffn"), before dropout + residual + LayerNorm.
"""

import dataclasses
import functools
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import hf_utils
from evqa_jax.models import layers
from evqa_jax.models.layers import ACTIVATIONS, VisualProjection

SUPPORTED_MODEL_TYPES = ("bert",)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hugging Face BERT fields plus the visual prefix / adapter options. `dtype` is the compute dtype."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-12
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  pad_token_id: int = 0
  initializer_range: float = 0.02
  position_embedding_type: str = "absolute"
  num_visual_tokens: int = 0
  visual_dim: int = 768
  use_adapters: bool = False
  adapter_reduction: int = 8
  adapter_dropout: float = 0.1
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: str = "none"  # per-layer jax.checkpoint policy: none | full | dots_saveable (layers.REMAT_POLICIES)

  def __post_init__(self):
    layers.check_remat(self.remat)
    layers.check_encoder_config(self)
    if self.position_embedding_type != "absolute":
      raise ValueError(f"BertConfig: position_embedding_type {self.position_embedding_type!r} not supported "
                       "(only 'absolute')")
    if self.num_visual_tokens < 0:
      raise ValueError(f"BertConfig: num_visual_tokens must be >= 0, got {self.num_visual_tokens}")
    if self.num_visual_tokens > self.max_position_embeddings:
      raise ValueError(f"BertConfig: num_visual_tokens {self.num_visual_tokens} exceeds "
                       f"max_position_embeddings {self.max_position_embeddings}")
    if self.use_adapters and self.hidden_size // self.adapter_reduction < 1:
      raise ValueError(f"BertConfig: adapter_reduction {self.adapter_reduction} leaves no bottleneck for "
                       f"hidden_size {self.hidden_size}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "BertConfig":
    """Known fields of `d` (a Hugging Face config dict; other keys such as `architectures` are ignored), then
    `overrides`, which must all be fields. A `model_type` other than 'bert' is rejected (RoBERTa etc. differ)."""
    model_type = d.get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"BertConfig: model_type {model_type!r} is not a BERT checkpoint "
                       f"(supported: {SUPPORTED_MODEL_TYPES})")
    return hf_utils.config_from_dict(cls, d, overrides)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "BertConfig":
    """Reads `path/config.json` (or `path` itself when it is a file)."""
    return hf_utils.config_from_hf_dir(cls, path, **overrides)


def key_mask_bias(mask):
  """`[batch, S]` key mask (1 = attend) -> the additive float32 bias `[batch, 1, 1, S]` (0 or float32 min), kept
  in fp32 (scores are fp32) so that bf16 cannot overflow it."""
  return jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)


def _constrain(x):
  return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class BertEmbeddings(nn.Module):
  """Word (+ visual prefix) + position + token-type embeddings, LayerNorm, dropout -> `[batch, T+L, hidden]`."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    self.word_embeddings = embed(cfg.vocab_size, embedding_init=layers.encoder_init(cfg, ("vocab", "embed")))
    self.position_embeddings = embed(cfg.max_position_embeddings,
                                     embedding_init=layers.encoder_init(cfg, (None, "embed")))
    self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=layers.encoder_init(cfg, (None, "embed")))
    self.LayerNorm = layers.encoder_layer_norm(self.config, "LayerNorm")  # pylint: disable=invalid-name
    self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, visual_embeds=None, deterministic: bool = True):
    """input_ids/token_type_ids `[batch, L]` (token types may also cover T+L); visual_embeds `[batch, T, hidden]`."""
    x = self.word_embeddings(input_ids)
    if visual_embeds is not None:
      x = jnp.concatenate([visual_embeds.astype(x.dtype), x], axis=1)
    length = x.shape[1]
    if token_type_ids.shape[1] != length:
      token_type_ids = jnp.pad(token_type_ids, ((0, 0), (length - token_type_ids.shape[1], 0)))
    x = x + self.position_embeddings.embedding[:length].astype(x.dtype)[None]
    x = x + self.token_type_embeddings(token_type_ids)
    x = self.LayerNorm(x)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x):
    """x `[..., hidden]` @ word_embeddings^T -> `[..., vocab]` (the tied MLM decoder)."""
    return self.word_embeddings.attend(x)


class _HeadsProjection(nn.Module):
  """`[batch, S, hidden]` -> `[batch, heads, S, head_dim]` (kernel `[embed, heads, kv]`, HF Linear reshaped).

  Producing the heads-major layout in the projection einsum lets XLA feed the attention matmuls without separate
  transposes (measurably faster on CPU than DenseGeneral's `[batch, S, heads, head_dim]`).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    shape = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)
    kernel = self.param("kernel", layers.encoder_init(cfg, ("embed", "heads", "kv")), shape, cfg.param_dtype)
    bias = self.param("bias", layers.zeros(("heads", "kv")), shape[1:], cfg.param_dtype)
    y = jnp.einsum("bsh,hnd->bnsd", x.astype(cfg.dtype), kernel.astype(cfg.dtype))
    return y + bias.astype(cfg.dtype)[None, :, None, :]


class _HeadsMerge(nn.Module):
  """`[batch, heads, S, head_dim]` -> `[batch, S, hidden]` (kernel `[heads, kv, embed]`): the attention output dense."""
  config: BertConfig

  @nn.compact
  def __call__(self, context):
    cfg = self.config
    shape = (cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size)
    kernel = self.param("kernel", layers.encoder_init(cfg, ("heads", "kv", "embed")), shape, cfg.param_dtype)
    bias = self.param("bias", layers.zeros(("embed",)), (cfg.hidden_size,), cfg.param_dtype)
    return jnp.einsum("bnsd,nde->bse", context, kernel.astype(cfg.dtype)) + bias.astype(cfg.dtype)


class BertSelfAttention(nn.Module):
  """Multi-head self-attention context `[batch, heads, Q, head_dim]` (before the output dense).

  Keys/values come from `x` `[batch, S, hidden]`, queries from `query` `[batch, Q, hidden]` (default: `x`).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask_bias, deterministic: bool = True, query=None):
    cfg = self.config
    query = x if query is None else query
    # Scaling q (b*Q*H values) is cheaper than scaling the scores (b*heads*Q*S).
    q = _HeadsProjection(cfg, name="query")(query) * jnp.asarray(1.0 / np.sqrt(cfg.head_dim), cfg.dtype)
    k = _HeadsProjection(cfg, name="key")(x)
    v = _HeadsProjection(cfg, name="value")(x)
    scores = jnp.einsum("bnqd,bnkd->bnqk", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores + mask_bias, axis=-1).astype(cfg.dtype)
    if not deterministic and cfg.attention_probs_dropout_prob > 0:
      probs = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=False)
    return jnp.einsum("bnqk,bnkd->bnqd", probs, v)


class BertSelfOutput(nn.Module):
  """dense(context) -> [adapter_attn] -> dropout -> LayerNorm(. + residual)."""
  config: BertConfig

  @nn.compact
  def __call__(self, context, residual, deterministic: bool = True):
    """context `[batch, heads, S, head_dim]`, residual `[batch, S, hidden]`."""
    cfg = self.config
    h = _HeadsMerge(cfg, name="dense")(context)
    h = layers.encoder_adapter(cfg, "adapter_attn", h, deterministic)
    h = nn.Dropout(cfg.hidden_dropout_prob)(h, deterministic=deterministic)
    return layers.encoder_layer_norm(cfg, "LayerNorm")(h + residual)


class BertAttention(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask_bias, deterministic: bool = True, query=None):
    query = x if query is None else query
    context = BertSelfAttention(self.config, name="self")(x, mask_bias, deterministic, query=query)
    return BertSelfOutput(self.config, name="output")(context, query, deterministic)


class BertIntermediate(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    return ACTIVATIONS[cfg.hidden_act](layers.encoder_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "dense")(x))


class BertOutput(nn.Module):
  """dense(ffn) -> [adapter_ffn] -> dropout -> LayerNorm(. + residual)."""
  config: BertConfig

  @nn.compact
  def __call__(self, h, residual, deterministic: bool = True):
    cfg = self.config
    h = layers.encoder_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "dense")(h)
    h = layers.encoder_adapter(cfg, "adapter_ffn", h, deterministic)
    h = nn.Dropout(cfg.hidden_dropout_prob)(h, deterministic=deterministic)
    return layers.encoder_layer_norm(cfg, "LayerNorm")(h + residual)


class BertLayer(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask_bias, deterministic: bool = True, query=None):
    """x `[batch, S, hidden]` (keys/values), query `[batch, Q, hidden]` (default x) -> `[batch, Q, hidden]`."""
    x = BertAttention(self.config, name="attention")(x, mask_bias, deterministic, query=query)
    h = BertIntermediate(self.config, name="intermediate")(x)
    out = BertOutput(self.config, name="output")(h, x, deterministic)
    return _constrain(out) if query is None else out


class BertEncoder(nn.Module):
  """The layer stack. With `mask_index` `[batch]` it also returns the last layer at those rows only, `[batch, H]`.

  Every op of a layer after the keys/values is per query row, so the last layer run with the [MASK] row as its only
  query equals the full layer at that row. A caller that reads only the [MASK] feature (OVQA) thereby never needs
  the full last layer, and XLA drops it (1 / num_layers of the encoder, forward and backward).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask_bias, deterministic: bool = True, mask_index=None):
    layer_cls = layers.maybe_remat(BertLayer, self.config.remat, static_argnums=(3,))  # deterministic
    blocks = [layer_cls(self.config, name=f"layer_{i}") for i in range(self.config.num_hidden_layers)]
    prev = x
    for layer in blocks:
      prev = x
      x = layer(x, mask_bias, deterministic)
    if mask_index is None:
      return x, None
    query = jnp.take_along_axis(prev, mask_index.astype(jnp.int32)[:, None, None], axis=1)
    return x, blocks[-1](prev, mask_bias, deterministic, query=query)[:, 0]


class BertPredictionHeadTransform(nn.Module):
  """dense -> activation -> LayerNorm on `[..., hidden]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = layers.encoder_dense(cfg, cfg.hidden_size, (None, "embed"), "dense")(x)
    return layers.encoder_layer_norm(cfg, "LayerNorm")(ACTIVATIONS[cfg.hidden_act](x))


class BertLMPredictionHead(nn.Module):
  config: BertConfig

  def setup(self):
    self.transform = BertPredictionHeadTransform(self.config)
    self.bias = self.param("bias", layers.zeros(("vocab",)), (self.config.vocab_size,), self.config.param_dtype)

  def __call__(self, x):
    return self.transform(x)

  def add_bias(self, logits):
    return logits + self.bias.astype(logits.dtype)


class BertOnlyMLMHead(nn.Module):
  """Holds `predictions` (HF `cls.predictions`); the decoder matrix is the tied word embedding table."""
  config: BertConfig

  def setup(self):
    self.predictions = BertLMPredictionHead(self.config)

  def __call__(self, x):
    return self.predictions(x)

  def add_bias(self, logits):
    return self.predictions.add_bias(logits)


class BertLM(nn.Module):
  """BERT encoder + MLM head with an optional visual prefix; see the module docstring.

  __call__(input_ids [b, L] int, attention_mask [b, L], *, token_type_ids=None ([b, L] or [b, T+L]),
           visual=None [b, T, visual_dim], visual_mask=None [b, T], mask_index=None [b] int (into T+L),
           deterministic=True, decode=False, decode_positions=None [b, P] int (into T+L)) -> {"hidden": [b, T+L, H],
           "mask_feature": [b, H] (with mask_index), "logits": [b, T+L, vocab] (with decode) or [b, P, vocab] at
           decode_positions (a masked-LM loss over a few positions without the full [b, T+L, vocab] logits)}
  Dropout needs the "dropout" rng when deterministic=False.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, *, token_type_ids=None, visual=None, visual_mask=None,
               mask_index=None, deterministic: bool = True, decode: bool = False, decode_positions=None):
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"BertLM: input_ids must be [batch, length], got shape {input_ids.shape}")
    if attention_mask.shape != input_ids.shape:
      raise ValueError(f"BertLM: attention_mask shape {attention_mask.shape} != input_ids shape {input_ids.shape}")
    batch, text_len = input_ids.shape
    t = cfg.num_visual_tokens
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if token_type_ids.shape not in ((batch, text_len), (batch, t + text_len)):
      raise ValueError(f"BertLM: token_type_ids shape {token_type_ids.shape} is neither [b, L] nor [b, T+L]")

    visual_embeds = None
    mask = attention_mask
    if t > 0:
      if visual is None:
        raise ValueError(f"BertLM: config.num_visual_tokens={t} but no `visual` input was given")
      if visual.shape != (batch, t, cfg.visual_dim):
        raise ValueError(f"BertLM: visual must be [batch={batch}, num_visual_tokens={t}, "
                         f"visual_dim={cfg.visual_dim}], got {visual.shape}")
      visual_embeds = VisualProjection(cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                       name="visual_proj")(visual.astype(cfg.dtype))
      if visual_mask is None:
        visual_mask = jnp.ones((batch, t), attention_mask.dtype)
      if visual_mask.shape != (batch, t):
        raise ValueError(f"BertLM: visual_mask must be [{batch}, {t}], got {visual_mask.shape}")
      mask = jnp.concatenate([visual_mask.astype(attention_mask.dtype), attention_mask], axis=1)
    elif visual is not None:
      raise ValueError("BertLM: `visual` was given but config.num_visual_tokens is 0")
    if t + text_len > cfg.max_position_embeddings:
      raise ValueError(f"BertLM: sequence of {t} visual + {text_len} text tokens exceeds "
                       f"config.max_position_embeddings={cfg.max_position_embeddings}")

    embeddings = BertEmbeddings(cfg, name="embeddings")
    x = _constrain(embeddings(input_ids, token_type_ids, visual_embeds, deterministic))
    # Additive key mask, kept in fp32 (scores are fp32) so bf16 cannot overflow it.
    mask_bias = key_mask_bias(mask)
    if mask_index is not None and mask_index.shape != (batch,):
      raise ValueError(f"BertLM: mask_index must be [batch={batch}], got {mask_index.shape}")
    hidden, at_mask = BertEncoder(cfg, name="encoder")(x, mask_bias, deterministic, mask_index=mask_index)
    out = {"hidden": hidden}

    head = BertOnlyMLMHead(cfg, name="cls")
    if mask_index is not None:
      out["mask_feature"] = head(at_mask)
    if decode:
      out["logits"] = head.add_bias(embeddings.attend(head(hidden)))
    elif decode_positions is not None:
      picked = jnp.take_along_axis(hidden, decode_positions[..., None].astype(jnp.int32), axis=1)
      out["logits"] = head.add_bias(embeddings.attend(head(picked)))
    elif mask_index is None and self.is_initializing():
      head.add_bias(embeddings.attend(head(hidden[:, :1])))  # create the head params whatever the init call
    return out


# ------------------------------------------------------------------------------------------ helpers


def dummy_inputs(config: BertConfig, batch: int = 1, length: int = 8) -> Dict[str, Any]:
  """Keyword inputs of the right shapes for `BertLM(config).init` (all tokens valid)."""
  inputs = {"input_ids": jnp.ones((batch, length), jnp.int32),
            "attention_mask": jnp.ones((batch, length), jnp.int32)}
  if config.num_visual_tokens:
    inputs["visual"] = jnp.zeros((batch, config.num_visual_tokens, config.visual_dim), jnp.float32)
  return inputs


@functools.lru_cache(maxsize=16)
def _jitted_init(config: BertConfig, length: int):
  inputs = dummy_inputs(config, 1, length)
  ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
  return jax.jit(lambda r: BertLM(config).init(r, ids, mask, **inputs))


def init_variables(config: BertConfig, rng, length: int = 8):
  """`BertLM(config).init` on dummy inputs: the boxed variables {"params": ...} (logical axis metadata kept)."""
  return _jitted_init(config, length)(rng)


def word_embeddings(params) -> jax.Array:
  """The input word-embedding matrix `[vocab, hidden]` of a params tree (or {"params": ...}, boxed or not)."""
  tree = hf_utils.params_of(params)
  try:
    return tree["embeddings"]["word_embeddings"]["embedding"]
  except (KeyError, TypeError) as e:
    raise KeyError("word_embeddings: no embeddings/word_embeddings/embedding in the params tree") from e


def embedding_rules() -> Dict[str, hf_utils.Rule]:
  """`BertEmbeddings` (ours `embeddings/...`) from a Hugging Face `embeddings.*` (BERT, LXMERT)."""
  rule = hf_utils.Rule
  rules = {f"embeddings/{n}/embedding": rule((f"embeddings.{n}.weight",))
           for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
  rules["embeddings/LayerNorm/scale"] = rule(("embeddings.LayerNorm.weight",))
  rules["embeddings/LayerNorm/bias"] = rule(("embeddings.LayerNorm.bias",))
  return rules


def layer_norm_rules(ours: str, hf: str) -> Dict[str, hf_utils.Rule]:
  return {f"{ours}/scale": hf_utils.Rule((f"{hf}.weight",)), f"{ours}/bias": hf_utils.Rule((f"{hf}.bias",))}


def linear_rules(ours: str, hf: str) -> Dict[str, hf_utils.Rule]:
  """An `nn.Dense` from a PyTorch `nn.Linear` (weight [out, in] transposed)."""
  return {f"{ours}/kernel": hf_utils.Rule((f"{hf}.weight",), hf_utils.linear_kernel),
          f"{ours}/bias": hf_utils.Rule((f"{hf}.bias",))}


def attention_rules(config: BertConfig, ours: str, hf: str, self_name: str = "self") -> Dict[str, hf_utils.Rule]:
  """`BertAttention` at `ours` (`self/{query,key,value}`, `output/{dense,LayerNorm}`) from the Hugging Face module at
  `hf` whose query/key/value live under `self_name` (BERT's "self", LXMERT's cross-attention "att")."""
  h, nh, hd = config.hidden_size, config.num_attention_heads, config.head_dim
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}
  for name in ("query", "key", "value"):
    rules[f"{ours}/self/{name}/kernel"] = rule((f"{hf}.{self_name}.{name}.weight",),
                                               lambda w: lin(w).reshape(h, nh, hd))
    rules[f"{ours}/self/{name}/bias"] = rule((f"{hf}.{self_name}.{name}.bias",), lambda b: b.reshape(nh, hd))
  rules[f"{ours}/output/dense/kernel"] = rule((f"{hf}.output.dense.weight",), lambda w: lin(w).reshape(nh, hd, h))
  rules[f"{ours}/output/dense/bias"] = rule((f"{hf}.output.dense.bias",))
  rules.update(layer_norm_rules(f"{ours}/output/LayerNorm", f"{hf}.output.LayerNorm"))
  return rules


def ffn_rules(ours_inter: str, hf_inter: str, ours_out: str, hf_out: str) -> Dict[str, hf_utils.Rule]:
  """`BertIntermediate` + `BertOutput` (dense, dense + LayerNorm) from their Hugging Face modules."""
  rules = linear_rules(f"{ours_inter}/dense", f"{hf_inter}.dense")
  rules.update(linear_rules(f"{ours_out}/dense", f"{hf_out}.dense"))
  rules.update(layer_norm_rules(f"{ours_out}/LayerNorm", f"{hf_out}.LayerNorm"))
  return rules


def layer_rules(config: BertConfig, ours: str, hf: str) -> Dict[str, hf_utils.Rule]:
  """One `BertLayer` at `ours` from a Hugging Face BERT-style layer at `hf` (BERT's and LXMERT's `LxmertLayer`)."""
  rules = attention_rules(config, f"{ours}/attention", f"{hf}.attention")
  rules.update(ffn_rules(f"{ours}/intermediate", f"{hf}.intermediate", f"{ours}/output", f"{hf}.output"))
  return rules


def hf_rules(config: BertConfig) -> Dict[str, hf_utils.Rule]:
  """Our flat param path -> how to compute it from a (prefix-stripped) Hugging Face BERT state dict."""
  rules = embedding_rules()
  rules["cls/predictions/bias"] = hf_utils.Rule(("cls.predictions.bias",))
  rules.update(linear_rules("cls/predictions/transform/dense", "cls.predictions.transform.dense"))
  rules.update(layer_norm_rules("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm"))
  for i in range(config.num_hidden_layers):
    rules.update(layer_rules(config, f"encoder/layer_{i}", f"encoder.layer.{i}"))
  return rules


# The tensors a BERT config implies (embeddings and every layer's attention, FFN and norms); the MLM head, adapters
# and the visual projection may be absent from a checkpoint (from init).
REQUIRED = (r"^embeddings/(word_embeddings|position_embeddings|token_type_embeddings|LayerNorm)/",
            r"^encoder/layer_\d+/(attention/self|attention/output/(dense|LayerNorm)|intermediate/dense|"
            r"output/(dense|LayerNorm))/")


def load_hf_params(config: BertConfig, path: str, init_params=None):
  """Imports a Hugging Face BERT checkpoint (directory or model.safetensors / pytorch_model.bin file).

  Accepts `BertModel` (no prefix) and `BertForMaskedLM` / `BertForPreTraining` ("bert." prefix, "cls.*") state
  dicts. Parameters absent from the checkpoint (visual_proj, adapters, the MLM head of checkpoints without
  cls.predictions.*) come from `init_params` ({"params": ...} or a params tree, boxed or not); when it is None they
  come from `init_variables(config, PRNGKey(0))`. Shapes are checked (ValueError naming the parameter).

  Returns (params, report): `params` is the plain (unboxed) params tree, to be used as
  `BertLM(config).apply({"params": params}, ...)`; `report` is an `hf_utils.LoadReport` (loaded / missing =
  filled from init / unused checkpoint keys, e.g. the pooler, and notes).
  """
  file = hf_utils.resolve_checkpoint_file(path)
  ckpt = hf_utils.rename_legacy_layernorm(hf_utils.strip_prefix(hf_utils.read_checkpoint(file), "bert."))
  notes = []
  if init_params is None:
    init_params = init_variables(config, jax.random.PRNGKey(0))
    notes.append("no init_params given: parameters absent from the checkpoint initialised with PRNGKey(0)")
  init_flat = hf_utils.flatten_params(hf_utils.params_of(init_params))
  flat, report = hf_utils.assemble(init_flat, ckpt, hf_rules(config), source=file, init=init_flat,
                                   ignore=(r"(^|\.)position_ids$",), required=REQUIRED,
                                   config_source=hf_utils.config_file_of(path))
  report.notes.extend(notes)

  # The decoder is tied to the word embeddings; older checkpoints also store the tied copies.
  emb = ckpt.get("embeddings.word_embeddings.weight")
  for key, tied in (("cls.predictions.decoder.weight", emb), ("cls.predictions.decoder.bias",
                                                               ckpt.get("cls.predictions.bias"))):
    if key in report.unused:
      if tied is not None and ckpt[key].shape == tied.shape and np.allclose(ckpt[key], tied):
        report.unused.remove(key)
      else:
        report.notes.append(f"{key} differs from the tied tensor; this model ties the decoder, so it is ignored")
  if any(p.startswith("cls/") for p in report.missing):
    report.notes.append("checkpoint has no MLM head (cls.predictions.*): the MLM head parameters come from "
                        "init_params")
  params = jax.tree.map(jnp.asarray, hf_utils.unflatten_params(flat))
  return params, report
