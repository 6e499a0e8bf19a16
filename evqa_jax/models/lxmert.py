"""LXMERT's encoder (Tan & Bansal, *LXMERT: Learning Cross-Modality Encoder Representations from Transformers*,
EMNLP 2019, arXiv:1908.07490) in Flax linen, weights imported by name from a Hugging Face `LxmertModel` folder.

Three encoders and a pooler, as Hugging Face's `LxmertModel` (transformers' modeling_lxmert.py):
  language   `embeddings` (word + position + token type, LayerNorm: bert.BertEmbeddings) and `l_layers` BERT layers
             (`encoder/layer_{i}`, bert.BertLayer) over the tokens;
  objects    `encoder/visn_fc`: (LayerNorm(visn_fc(features)) + LayerNorm(box_fc(positions))) / 2, then `r_layers`
             BERT layers (`encoder/r_layers_{i}`), the object-relationship encoder;
  cross      `x_layers` cross-modality layers (`encoder/x_layers_{i}`): ONE cross-attention block (`visual_attention`,
             shared by both directions: language queries over the objects, object queries over the language), then a
             self-attention block and an FFN per modality (`lang_self_att`, `visn_self_att`, `lang_inter/output`,
             `visn_inter/output`);
  pooler     `pooler/dense` + tanh on the language side's first token ([CLS]).
Every attention / FFN block is bert.py's (BertAttention, BertIntermediate, BertOutput; keys and values from one
input, queries and residual from the other in the cross direction). LayerNorm epsilon is 1e-12 everywhere, as in
Hugging Face's LXMERT (its config has no epsilon field).

Parameter names follow the Hugging Face state dict (`encoder.x_layers.0.visual_attention.att.query.weight` ->
`encoder/x_layers_0/visual_attention/self/query/kernel`), so `load_hf_params` is a renaming (bert.py's rules).

__call__(input_ids [b, L], attention_mask [b, L], *, token_type_ids=None [b, L], visual [b, N, visual_feat_dim],
         visual_pos [b, N, visual_pos_dim], visual_mask=None [b, N] (None: every object valid), deterministic=True)
  -> {"hidden": language output [b, L, H], "vision": object output [b, N, H], "pooled": [b, H]}
"""

import dataclasses
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

from evqa_jax.models import bert
from evqa_jax.models import hf_utils
from evqa_jax.models import layers

LAYER_NORM_EPS = 1e-12  # hard-coded in every LayerNorm of Hugging Face's LXMERT


@dataclasses.dataclass(frozen=True)
class LxmertConfig(bert.BertConfig):
  """Hugging Face `LxmertConfig` fields (BERT's, plus the three layer counts and the visual input sizes).

  `num_hidden_layers` (BERT's field) is unused: Hugging Face stores a dict of the three counts there.
  """
  l_layers: int = 9
  x_layers: int = 5
  r_layers: int = 5
  visual_feat_dim: int = 2048
  visual_pos_dim: int = 4

  def __post_init__(self):
    super().__post_init__()
    for name in ("l_layers", "x_layers", "r_layers"):
      if getattr(self, name) < 0:
        raise ValueError(f"LxmertConfig: {name} must be >= 0, got {getattr(self, name)}")
    for name in ("visual_feat_dim", "visual_pos_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"LxmertConfig: {name} must be >= 1, got {getattr(self, name)}")
    if self.layer_norm_eps != LAYER_NORM_EPS:
      raise ValueError(f"LxmertConfig: layer_norm_eps is {LAYER_NORM_EPS} in every LXMERT LayerNorm, "
                       f"got {self.layer_norm_eps}")

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "LxmertConfig":
    """Known fields of a Hugging Face LXMERT config dict (`model_type` must be 'lxmert' when given; the
    `num_hidden_layers` dict and None entries are dropped), then `overrides`."""
    model_type = d.get("model_type")
    if model_type is not None and model_type != "lxmert":
      raise ValueError(f"LxmertConfig: model_type {model_type!r} is not an LXMERT checkpoint")
    d = {k: v for k, v in d.items() if v is not None and k not in ("model_type", "num_hidden_layers")}
    return super().from_dict(d, **overrides)


class LxmertVisualFeatureEncoder(nn.Module):
  """(LayerNorm(visn_fc(features)) + LayerNorm(box_fc(positions))) / 2 -> dropout: `[b, N, H]`."""
  config: LxmertConfig

  @nn.compact
  def __call__(self, feats, pos, deterministic: bool = True):
    cfg = self.config
    x = layers.encoder_dense(cfg, cfg.hidden_size, (None, "embed"), "visn_fc")(feats.astype(cfg.dtype))
    x = layers.encoder_layer_norm(cfg, "visn_layer_norm")(x)
    y = layers.encoder_dense(cfg, cfg.hidden_size, (None, "embed"), "box_fc")(pos.astype(cfg.dtype))
    y = layers.encoder_layer_norm(cfg, "box_layer_norm")(y)
    return nn.Dropout(cfg.hidden_dropout_prob)((x + y) / 2, deterministic=deterministic)


class LxmertXLayer(nn.Module):
  """Cross-modality layer: shared cross-attention both ways, then per-modality self-attention and FFN."""
  config: LxmertConfig

  @nn.compact
  def __call__(self, lang, lang_bias, visn, visn_bias, deterministic: bool = True):
    cfg = self.config
    cross = bert.BertAttention(cfg, name="visual_attention")  # one module, both directions (Hugging Face's)
    lang_x = cross(visn, visn_bias, deterministic, query=lang)
    visn_x = cross(lang, lang_bias, deterministic, query=visn)
    lang_x = bert.BertAttention(cfg, name="lang_self_att")(lang_x, lang_bias, deterministic)
    visn_x = bert.BertAttention(cfg, name="visn_self_att")(visn_x, visn_bias, deterministic)
    lang_out = bert.BertOutput(cfg, name="lang_output")(bert.BertIntermediate(cfg, name="lang_inter")(lang_x), lang_x,
                                                         deterministic)
    visn_out = bert.BertOutput(cfg, name="visn_output")(bert.BertIntermediate(cfg, name="visn_inter")(visn_x), visn_x,
                                                         deterministic)
    return lang_out, visn_out


class LxmertEncoder(nn.Module):
  """Object encoding, language layers, object-relationship layers, cross-modality layers (Hugging Face's order)."""
  config: LxmertConfig

  @nn.compact
  def __call__(self, lang, lang_bias, visual, visual_pos, visn_bias, deterministic: bool = True):
    cfg = self.config
    visn = LxmertVisualFeatureEncoder(cfg, name="visn_fc")(visual, visual_pos, deterministic)
    for i in range(cfg.l_layers):
      lang = bert.BertLayer(cfg, name=f"layer_{i}")(lang, lang_bias, deterministic)
    for i in range(cfg.r_layers):
      visn = bert.BertLayer(cfg, name=f"r_layers_{i}")(visn, visn_bias, deterministic)
    for i in range(cfg.x_layers):
      lang, visn = LxmertXLayer(cfg, name=f"x_layers_{i}")(lang, lang_bias, visn, visn_bias, deterministic)
    return lang, visn


class LxmertLM(nn.Module):
  """LXMERT's encoder and pooler (Hugging Face `LxmertModel`); see the module docstring."""
  config: LxmertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, *, token_type_ids=None, visual=None, visual_pos=None,
               visual_mask=None, deterministic: bool = True):
    cfg = self.config
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
      raise ValueError(f"LxmertLM: input_ids and attention_mask must be [batch, length] alike, got {input_ids.shape} "
                       f"and {attention_mask.shape}")
    batch, length = input_ids.shape
    if length > cfg.max_position_embeddings:
      raise ValueError(f"LxmertLM: {length} tokens exceed config.max_position_embeddings={cfg.max_position_embeddings}")
    if visual is None or visual.ndim != 3 or visual.shape[0] != batch or visual.shape[2] != cfg.visual_feat_dim:
      raise ValueError(f"LxmertLM: visual must be [batch={batch}, objects, visual_feat_dim={cfg.visual_feat_dim}], "
                       f"got {None if visual is None else visual.shape}")
    objects = visual.shape[1]
    if visual_pos is None or visual_pos.shape != (batch, objects, cfg.visual_pos_dim):
      raise ValueError(f"LxmertLM: visual_pos must be [{batch}, {objects}, visual_pos_dim={cfg.visual_pos_dim}], got "
                       f"{None if visual_pos is None else visual_pos.shape}")
    if visual_mask is None:
      visual_mask = jnp.ones((batch, objects), jnp.int32)
    if visual_mask.shape != (batch, objects):
      raise ValueError(f"LxmertLM: visual_mask must be [{batch}, {objects}], got {visual_mask.shape}")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)

    lang = bert.BertEmbeddings(cfg, name="embeddings")(input_ids, token_type_ids, None, deterministic)
    lang, visn = LxmertEncoder(cfg, name="encoder")(lang, bert.key_mask_bias(attention_mask), visual, visual_pos,
                                                     bert.key_mask_bias(visual_mask), deterministic)
    pooled = jnp.tanh(LxmertPooler(cfg, name="pooler")(lang[:, 0]))
    return {"hidden": lang, "vision": visn, "pooled": pooled}


class LxmertPooler(nn.Module):
  """`dense` of the [CLS] state (the caller applies tanh)."""
  config: LxmertConfig

  @nn.compact
  def __call__(self, x):
    return layers.encoder_dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense")(x)


# ------------------------------------------------------------------------------------------ helpers


def dummy_inputs(config: LxmertConfig, batch: int = 1, length: int = 8) -> Dict[str, Any]:
  """Keyword inputs of the right shapes for `LxmertLM(config).init` (one object, all tokens valid)."""
  return {"input_ids": jnp.ones((batch, length), jnp.int32), "attention_mask": jnp.ones((batch, length), jnp.int32),
          "visual": jnp.zeros((batch, 1, config.visual_feat_dim), jnp.float32),
          "visual_pos": jnp.zeros((batch, 1, config.visual_pos_dim), jnp.float32)}


def init_variables(config: LxmertConfig, rng, length: int = 8):
  """`LxmertLM(config).init` on dummy inputs: the boxed variables {"params": ...}."""
  inputs = dummy_inputs(config, 1, length)
  ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
  return jax.jit(lambda r: LxmertLM(config).init(r, ids, mask, **inputs))(rng)


def param_shapes(config: LxmertConfig) -> Dict[str, Any]:
  """The plain params tree of `LxmertLM(config)` as ShapeDtypeStructs (traced, nothing computed or compiled)."""
  return hf_utils.params_of(jax.eval_shape(lambda: init_variables(config, jax.random.PRNGKey(0))))


def word_embeddings(params) -> jax.Array:
  """The word-embedding matrix `[vocab, hidden]` of a params tree."""
  return bert.word_embeddings(params)


def hf_rules(config: LxmertConfig) -> Dict[str, hf_utils.Rule]:
  """Our flat param path -> its Hugging Face `LxmertModel` state-dict key(s) (prefix "lxmert." stripped)."""
  rules = bert.embedding_rules()
  for name in ("visn_fc", "box_fc"):
    rules.update(bert.linear_rules(f"encoder/visn_fc/{name}", f"encoder.visn_fc.{name}"))
  for name in ("visn_layer_norm", "box_layer_norm"):
    rules.update(bert.layer_norm_rules(f"encoder/visn_fc/{name}", f"encoder.visn_fc.{name}"))
  for kind, count in (("layer", config.l_layers), ("r_layers", config.r_layers)):
    for i in range(count):
      rules.update(bert.layer_rules(config, f"encoder/{kind}_{i}", f"encoder.{kind}.{i}"))
  for i in range(config.x_layers):
    ours, hf = f"encoder/x_layers_{i}", f"encoder.x_layers.{i}"
    rules.update(bert.attention_rules(config, f"{ours}/visual_attention", f"{hf}.visual_attention", self_name="att"))
    for side in ("lang", "visn"):
      rules.update(bert.attention_rules(config, f"{ours}/{side}_self_att", f"{hf}.{side}_self_att"))
      rules.update(bert.ffn_rules(f"{ours}/{side}_inter", f"{hf}.{side}_inter", f"{ours}/{side}_output",
                                  f"{hf}.{side}_output"))
  rules.update(bert.linear_rules("pooler/dense", "pooler.dense"))
  return rules


def load_hf_params(config: LxmertConfig, path: str, init_params=None):
  """Imports a Hugging Face LXMERT checkpoint (directory or weights file): `LxmertModel` (no prefix) or
  `LxmertForPreTraining` / `LxmertForQuestionAnswering` ("lxmert." prefix; their heads are reported unused).

  Every encoder and pooler tensor must be in the checkpoint (ValueError naming the missing ones, and shapes are
  checked naming the parameter); `init_params` only gives the expected tree (default: `param_shapes(config)`).
  Returns (plain params tree, hf_utils.LoadReport).
  """
  file = hf_utils.resolve_checkpoint_file(path)
  ckpt = hf_utils.strip_prefix(hf_utils.read_checkpoint(file), "lxmert.")
  if init_params is None:
    init_params = param_shapes(config)
  init_flat = hf_utils.flatten_params(hf_utils.params_of(init_params))
  flat, report = hf_utils.assemble(init_flat, ckpt, hf_rules(config), source=file, init=None,
                                   ignore=(r"(^|\.)position_ids$",), required=(r".",),
                                   config_source=hf_utils.config_file_of(path))
  return jax.tree.map(jnp.asarray, hf_utils.unflatten_params(flat)), report
