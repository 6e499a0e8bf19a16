"""DistilBERT-architecture text encoder (Flax linen), the encoder of Just Ask's question and answer towers.

DistilBERT is BERT without token types and pooler, with post-LayerNorm blocks named differently and no dropout after
the attention output projection. The blocks (`Transformer`) also make Just Ask's multi-modal transformer, which the
authors build from the same DistilBERT `TransformerBlock` (github.com/antoyang/just-ask, model/multimodal_transformer.py).
The config is `bert.BertConfig` (its token-type and adapter fields are not read here), filled from a DistilBERT
config.json by `config_from_dict`; a BERT config.json (MiniLM, the demo's encoder) is read as it is.

Parameters are named after Hugging Face `DistilBertModel`, so `hf_rules` is a renaming:

  embeddings/{word_embeddings,position_embeddings}/embedding, embeddings/LayerNorm
  transformer/layer_{i}/attention/{q_lin,k_lin,v_lin} kernel [embed, heads, kv], attention/out_lin [heads, kv, embed]
  transformer/layer_{i}/{sa_layer_norm,ffn/lin1,ffn/lin2,output_layer_norm}

A BERT checkpoint maps onto the same tree exactly: its token-type row 0, which BERT adds to every token, is folded
into the position table (`bert_rules`).
"""

import functools
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import bert
from evqa_jax.models import hf_utils
from evqa_jax.models import layers
from evqa_jax.models.layers import ACTIVATIONS

BertConfig = bert.BertConfig

# DistilBERT config.json field -> BertConfig field.
_FIELDS = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size", "activation": "hidden_act",
           "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
           "max_position_embeddings": "max_position_embeddings", "initializer_range": "initializer_range",
           "pad_token_id": "pad_token_id"}


def config_from_dict(d: Dict[str, Any], **overrides) -> BertConfig:
  """A Hugging Face DistilBERT (model_type "distilbert") or BERT config dict -> `BertConfig` (+ `overrides`).

  DistilBERT's LayerNorms are all eps 1e-12 (not a config field). Its `sinusoidal_pos_embds` only initialises the
  position table, which the checkpoint holds either way."""
  model_type = d.get("model_type")
  if model_type == "distilbert":
    d = {ours: d[theirs] for theirs, ours in _FIELDS.items() if theirs in d}
    d.update(layer_norm_eps=1e-12, type_vocab_size=0)
  elif model_type not in (None, "bert"):
    raise ValueError(f"model_type {model_type!r} is neither a DistilBERT nor a BERT checkpoint")
  return BertConfig.from_dict(d, **overrides)


def config_from_hf_dir(path: str, **overrides) -> BertConfig:
  """Reads `path/config.json` of a DistilBERT (or BERT) folder."""
  file, d = hf_utils.read_hf_config(path)
  try:
    return config_from_dict(d, **overrides)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{file}: {e}") from e


def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
  """`[num_positions, dim]` float32: sin on even, cos on odd columns, of pos / 10000^(2 (j // 2) / dim), computed in
  float64 as DistilBERT's (and Just Ask's) `create_sinusoidal_embeddings`."""
  pos = np.arange(num_positions, dtype=np.float64)[:, None]
  j = np.arange(dim)[None, :]
  angle = pos / np.power(10000, 2 * (j // 2) / dim)
  out = np.empty((num_positions, dim), np.float64)
  out[:, 0::2] = np.sin(angle[:, 0::2])
  out[:, 1::2] = np.cos(angle[:, 1::2])
  return out.astype(np.float32)


def mask_bias(mask):
  """`[batch, S]` key mask (> 0 = valid) -> additive `[batch, 1, 1, S]` float32 bias (0 or the float32 minimum; the
  authors' -inf would give NaN on a fully masked row, which never occurs with a [CLS] token in every sequence)."""
  return jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)


class MultiHeadSelfAttention(nn.Module):
  """q/k/v projections, softmax(q k^T / sqrt(d) + mask) with attention dropout, output projection:
  `[batch, S, H]` -> `[batch, S, H]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool = True):
    cfg = self.config
    # BERT's heads-major projections (`[embed, heads, kv]` kernels): the same maths as DistilBERT's Linear + view.
    q = bert._HeadsProjection(cfg, name="q_lin")(x) * jnp.asarray(1.0 / np.sqrt(cfg.head_dim), cfg.dtype)  # pylint: disable=protected-access
    k = bert._HeadsProjection(cfg, name="k_lin")(x)  # pylint: disable=protected-access
    v = bert._HeadsProjection(cfg, name="v_lin")(x)  # pylint: disable=protected-access
    scores = jnp.einsum("bnqd,bnkd->bnqk", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores + bias, axis=-1).astype(cfg.dtype)
    if not deterministic and cfg.attention_probs_dropout_prob > 0:
      probs = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=False)
    context = jnp.einsum("bnqk,bnkd->bnqd", probs, v)
    return bert._HeadsMerge(cfg, name="out_lin")(context)  # pylint: disable=protected-access


class FFN(nn.Module):
  """lin1 -> activation -> lin2 -> dropout on `[batch, S, H]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    h = ACTIVATIONS[cfg.hidden_act](layers.encoder_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "lin1")(x))
    h = layers.encoder_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "lin2")(h)
    return nn.Dropout(cfg.hidden_dropout_prob)(h, deterministic=deterministic)


class TransformerBlock(nn.Module):
  """DistilBERT's block: sa_layer_norm(attention(x) + x), then output_layer_norm(ffn(.) + .)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, bias, deterministic: bool = True):
    cfg = self.config
    h = MultiHeadSelfAttention(cfg, name="attention")(x, bias, deterministic)
    h = layers.encoder_layer_norm(cfg, "sa_layer_norm")(h + x)
    out = layers.encoder_layer_norm(cfg, "output_layer_norm")(FFN(cfg, name="ffn")(h, deterministic) + h)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))


class Transformer(nn.Module):
  """`config.num_hidden_layers` blocks `layer_{i}`: x `[batch, S, H]`, mask `[batch, S]` -> `[batch, S, H]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True):
    block = layers.maybe_remat(TransformerBlock, self.config.remat, static_argnums=(3,))  # deterministic
    bias = mask_bias(mask)
    for i in range(self.config.num_hidden_layers):
      x = block(self.config, name=f"layer_{i}")(x, bias, deterministic)
    return x


class DistilBert(nn.Module):
  """`DistilBertModel`: input_ids `[batch, L]`, attention_mask `[batch, L]` -> last hidden states `[batch, L, H]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, deterministic: bool = True):
    cfg = self.config
    length = input_ids.shape[1]
    if length > cfg.max_position_embeddings:
      raise ValueError(f"DistilBert: {length} tokens exceed max_position_embeddings={cfg.max_position_embeddings}")
    x = Embeddings(cfg, name="embeddings")(input_ids, deterministic)
    return Transformer(cfg, name="transformer")(x, attention_mask, deterministic)


class Embeddings(nn.Module):
  """word + position embeddings -> LayerNorm -> dropout: `[batch, L]` ids -> `[batch, L, H]`."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, deterministic: bool = True):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    x = embed(cfg.vocab_size, embedding_init=layers.encoder_init(cfg, ("vocab", "embed")),
              name="word_embeddings")(input_ids)
    positions = embed(cfg.max_position_embeddings, embedding_init=layers.encoder_init(cfg, (None, "embed")),
                      name="position_embeddings")
    x = x + positions.embedding[:input_ids.shape[1]].astype(cfg.dtype)[None]
    x = layers.encoder_layer_norm(cfg, "LayerNorm")(x)
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


# ------------------------------------------------------------------------------------------ weight import

# DistilBERT module names of one block (ours == theirs, with '/' for '.') and their BERT equivalents.
_BLOCK = {"attention/q_lin": "attention.self.query", "attention/k_lin": "attention.self.key",
          "attention/v_lin": "attention.self.value", "attention/out_lin": "attention.output.dense",
          "sa_layer_norm": "attention.output.LayerNorm", "ffn/lin1": "intermediate.dense", "ffn/lin2": "output.dense",
          "output_layer_norm": "output.LayerNorm"}


def block_rules(config: BertConfig, ours: str, theirs: str, bert_names: bool = False) -> Dict[str, hf_utils.Rule]:
  """Rules for the blocks under our `ours` ('transformer', 'mmt') from the state-dict prefix `theirs`
  ('transformer.layer', 'mmt.layer'; BERT's 'encoder.layer' with `bert_names`)."""
  h, nh, hd = config.hidden_size, config.num_attention_heads, config.head_dim
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}
  for i in range(config.num_hidden_layers):
    for mod, bert_mod in _BLOCK.items():
      src = f"{theirs}.{i}.{bert_mod if bert_names else mod.replace('/', '.')}"
      dst = f"{ours}/layer_{i}/{mod}"
      if mod.endswith("layer_norm"):
        rules[f"{dst}/scale"] = rule((f"{src}.weight",))
        rules[f"{dst}/bias"] = rule((f"{src}.bias",))
      elif mod in ("attention/q_lin", "attention/k_lin", "attention/v_lin"):
        rules[f"{dst}/kernel"] = rule((f"{src}.weight",), lambda w: lin(w).reshape(h, nh, hd))
        rules[f"{dst}/bias"] = rule((f"{src}.bias",), lambda b: b.reshape(nh, hd))
      elif mod == "attention/out_lin":
        rules[f"{dst}/kernel"] = rule((f"{src}.weight",), lambda w: lin(w).reshape(nh, hd, h))
        rules[f"{dst}/bias"] = rule((f"{src}.bias",))
      else:
        rules[f"{dst}/kernel"] = rule((f"{src}.weight",), lin)
        rules[f"{dst}/bias"] = rule((f"{src}.bias",))
  return rules


def hf_rules(config: BertConfig, ours: str = "", theirs: str = "") -> Dict[str, hf_utils.Rule]:
  """Our flat path -> rule over a DistilBERT state dict, `ours` / `theirs` prefixing both sides (for a DistilBERT
  nested in a bigger model, as Just Ask's 'amodel.bert.bert.')."""
  rule = hf_utils.Rule
  rules = {"embeddings/word_embeddings/embedding": rule((f"{theirs}embeddings.word_embeddings.weight",)),
           "embeddings/position_embeddings/embedding": rule((f"{theirs}embeddings.position_embeddings.weight",)),
           "embeddings/LayerNorm/scale": rule((f"{theirs}embeddings.LayerNorm.weight",)),
           "embeddings/LayerNorm/bias": rule((f"{theirs}embeddings.LayerNorm.bias",))}
  rules.update(block_rules(config, "transformer", f"{theirs}transformer.layer"))
  return {ours + k: v for k, v in rules.items()}


def bert_rules(config: BertConfig) -> Dict[str, hf_utils.Rule]:
  """Our flat path -> rule over a (prefix-stripped) BERT state dict: BERT's token-type row 0, which it adds to every
  token, joins the position table, so the encoder computes BERT's hidden states exactly."""
  rule = hf_utils.Rule
  rules = {"embeddings/word_embeddings/embedding": rule(("embeddings.word_embeddings.weight",)),
           "embeddings/position_embeddings/embedding": rule(
               ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"),
               lambda pos, types: pos + types[:1]),
           "embeddings/LayerNorm/scale": rule(("embeddings.LayerNorm.weight",)),
           "embeddings/LayerNorm/bias": rule(("embeddings.LayerNorm.bias",))}
  rules.update(block_rules(config, "transformer", "encoder.layer", bert_names=True))
  return rules


def init_params(config: BertConfig, rng, length: int = 8):
  """Plain (unboxed) params of `DistilBert(config)`."""
  ids = jnp.ones((1, length), jnp.int32)
  return hf_utils.params_of(DistilBert(config).init(rng, ids, ids))


def load_hf_params(config: BertConfig, path: str, init_params_tree=None):
  """Imports a Hugging Face DistilBERT (`DistilBertModel`, or `DistilBertForMaskedLM` with its 'distilbert.' prefix)
  or BERT checkpoint (directory or weights file) into `DistilBert(config)`'s params.

  Which one is read from the folder's config.json (`model_type`; DistilBERT when there is none). Returns (params,
  `hf_utils.LoadReport`); the MLM heads of *ForMaskedLM checkpoints are reported unused."""
  file = hf_utils.resolve_checkpoint_file(path)
  model_type = "distilbert"
  folder = path if not path.endswith((".bin", ".safetensors", ".pth", ".json")) else None
  if folder:
    try:
      model_type = hf_utils.read_hf_config(folder)[1].get("model_type", model_type)
    except FileNotFoundError:
      pass
  ckpt = hf_utils.read_checkpoint(file)
  if model_type == "bert":
    rules = bert_rules(config)
    ckpt = hf_utils.rename_legacy_layernorm(hf_utils.strip_prefix(ckpt, "bert."))
  else:
    rules = hf_rules(config)
    ckpt = hf_utils.strip_prefix(ckpt, "distilbert.")
  if init_params_tree is None:
    init_params_tree = init_params(config, jax.random.PRNGKey(0))
  init_flat = hf_utils.flatten_params(hf_utils.params_of(init_params_tree))
  flat, report = hf_utils.assemble(init_flat, ckpt, rules, source=file, init=init_flat,
                                   ignore=(r"(^|\.)position_ids$",))
  if report.missing:
    raise ValueError(f"{file}: not a {model_type} checkpoint of this shape; missing "
                     + ", ".join(report.missing[:8]))
  return jax.tree.map(jnp.asarray, hf_utils.unflatten_params(flat)), report

