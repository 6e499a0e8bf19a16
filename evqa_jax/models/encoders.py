"""Name -> class table of the bidirectional LM encoders, with their config classes and weight importers, and how a
project builds one: its config (`encoder_config`), the model's settings on top (`lm_overrides`), its pretrained
weights (`load_encoder_weights`). Where the checkpoint files live is evqa_jax.pretrained.
"""

import importlib

import jax.numpy as jnp

from evqa_jax import log
from evqa_jax import pretrained

# Config dtype names -> compute dtypes (`config.model.dtype`).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

_TABLE = {
    "bert": ("evqa_jax.models.bert", "BertLM", "BertConfig"),
    "deberta_v2": ("evqa_jax.models.deberta_v2", "DebertaV2LM", "DebertaV2Config"),
    "lxmert": ("evqa_jax.models.lxmert", "LxmertLM", "LxmertConfig"),
}


def _module(name: str):
  if name not in _TABLE:
    raise ValueError(f"config.model.encoder = {name!r}: expected one of {sorted(_TABLE)}")
  return importlib.import_module(_TABLE[name][0])


class _Encoders:
  def __getitem__(self, name):
    return getattr(_module(name), _TABLE[name][1])


ENCODERS = _Encoders()


def config_class(name: str):
  return getattr(_module(name), _TABLE[name][2])


def word_embeddings(name: str, params):
  """The frozen input word-embedding matrix `[vocab, H]` inside an encoder's params tree."""
  return _module(name).word_embeddings(params)


def dummy_inputs(name: str, config) -> dict:
  """Keyword inputs of the right shapes for `ENCODERS[name](config).init`: the module's own `dummy_inputs` where it
  has one (BERT, LXMERT), else ids and mask [1, 8] (+ the visual prefix when the config has one)."""
  module = _module(name)
  if hasattr(module, "dummy_inputs"):
    return module.dummy_inputs(config)
  ids = jnp.ones((1, 8), jnp.int32)
  inputs = {"input_ids": ids, "attention_mask": jnp.ones_like(ids)}
  if config.num_visual_tokens:
    inputs["visual"] = jnp.zeros((1, config.num_visual_tokens, config.visual_dim))
  return inputs


def load_hf_params(name: str, config, path: str, init_params):
  return _module(name).load_hf_params(config, path, init_params=init_params)


def dtype(name: str, key: str = "config.model.dtype"):
  if name not in DTYPES:
    raise ValueError(f"{key} = {name!r}: expected one of {sorted(DTYPES)}")
  return DTYPES[name]


def encoder_config(encoder: str, pc, **overrides):
  """The encoder's config: `config.pretrained.shape` when set (benchmarks, tests), else the checkpoint's config.json
  in `config.pretrained.dir`; then `overrides` (visual prefix, adapters, dtype, dropout)."""
  cfg_cls = config_class(encoder)
  if pc.shape:
    return cfg_cls.from_dict(dict(pc.shape), **overrides)
  path = pretrained.checkpoint_dir(pc)
  if not pretrained.has_checkpoint(path):
    raise FileNotFoundError(
        f"config.pretrained.dir = {pc.dir!r} has no config.json: download the Hugging Face checkpoint (e.g. "
        "microsoft/deberta-v2-xlarge, bert-base-uncased) to a local directory and point config.pretrained.dir at it, "
        "or give the architecture in config.pretrained.shape")
  return cfg_cls.from_hf_dir(path, **overrides)


def lm_overrides(use_adapters: bool, adapter_reduction: int, dropout, dtype_name: str, remat: str = "none") -> dict:
  """Encoder-config fields set by a model's adapter, dropout (None: the checkpoint's), dtype and remat settings."""
  out = dict(use_adapters=use_adapters, adapter_reduction=adapter_reduction, dtype=dtype(dtype_name), remat=remat)
  if dropout is not None:
    out.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, adapter_dropout=dropout)
  return out


def load_encoder_weights(encoder: str, config, path, params):
  """Encoder params (host numpy) with the checkpoint in `path` filled in; unchanged when `path` holds none."""
  if not pretrained.has_checkpoint(path):
    return params
  params, report = load_hf_params(encoder, config, path, params)
  log.info(f"Loaded {encoder} weights from {path}: {report.summary()}")
  return params
