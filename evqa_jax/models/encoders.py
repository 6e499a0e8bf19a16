"""Name -> class table of the bidirectional LM encoders, with their config classes and weight importers."""

import importlib

_TABLE = {
    "bert": ("evqa_jax.models.bert", "BertLM", "BertConfig"),
    "deberta_v2": ("evqa_jax.models.deberta_v2", "DebertaV2LM", "DebertaV2Config"),
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


def load_hf_params(name: str, config, path: str, init_params):
  return _module(name).load_hf_params(config, path, init_params=init_params)
