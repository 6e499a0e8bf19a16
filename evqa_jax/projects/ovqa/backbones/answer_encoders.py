"""The frozen answer encoders of the pixel backbones' "+" heads (All-in-one+, VIOLET+): `config.model.answer_encoder`.

The OVQA paper (Ko et al., ICCV 2023, arXiv 2308.09363) scores the backbone's video-question feature against answer
embeddings made by a frozen answer encoder, "DeBERTa" by default, CLIP's text tower in its Table 7 ablation:
- "deberta": the mean of a frozen masked LM's input word embeddings over the answer's sub-words (at most
  config.data.answer_max_subwords, no special tokens), exactly FrozenBiLM+'s answer embedding
  (evqa_jax/projects/ovqa/model.py `mean_subword_embeddings`). The folder is any Hugging Face masked-LM checkpoint
  (microsoft/deberta-v2-xlarge as the paper; the demo's MiniLM-L6): only its word-embedding matrix is read.
- "clip": CLIP's text tower with its projection (evqa_jax/models/clip_text.py) over `<|startoftext|> answer
  <|endoftext|>`, its projected end-of-text feature.

Both come from a local folder named by `config.pretrained.answer_dir` (tokenizer: `config.pretrained.answer_tokenizer`,
default the same folder); `config.pretrained.answer_shape` (a config dict) builds one with random weights instead
(tests, compiles). The encoder's parameters sit in the model's tree under `answer_encoder/` (checkpointed with the
run, never trained: `FROZEN_PATTERN`), and the backbone computes its outputs over the vocabulary once per split
(`Backbone.precompute_aux`).

Use: `spec = build(config)`; `spec.module(name="answer_encoder")` inside the model (`(ids, mask) -> [A, spec.dim]`);
`spec.tokens(answers, pad_to)` for the aux inputs; `spec.load(params)` fills the `answer_encoder` subtree.
"""

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from evqa_jax import pretrained
from evqa_jax.models import clip_text, hf_utils, layers

KINDS = ("deberta", "clip")
#: Parameter paths of the frozen answer encoder (excluded from the trained parameters).
FROZEN_PATTERN = r"^answer_encoder/"


class WordEmbeddingMean(nn.Module):
  """ids, mask `[A, S]` -> `[A, dim]`: the mean of the frozen word embeddings over the valid sub-words."""
  vocab_size: int
  dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, ids, mask):
    from evqa_jax.projects.ovqa.model import mean_subword_embeddings
    table = self.param("word_embeddings", layers.normal(0.02, ("vocab", "embed")), (self.vocab_size, self.dim))
    return mean_subword_embeddings(table.astype(self.dtype), ids, mask)


class ClipTextEncoder(nn.Module):
  """ids, mask `[A, S]` -> `[A, projection_dim]`: CLIP's projected end-of-text feature (mask unused: CLIP's causal
  attention never lets the end-of-text token see the padding after it)."""
  config: Any

  @nn.compact
  def __call__(self, ids, mask):
    del mask
    return clip_text.CLIPTextModel(self.config, name="clip")(ids)["text_embeds"]


def _folder_config(path: str) -> dict:
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"config.pretrained.answer_dir = {path!r} has no config.json: download the answer "
                            "encoder's Hugging Face checkpoint (microsoft/deberta-v2-xlarge, or a CLIP model for "
                            "model.answer_encoder = 'clip') to a local folder, or give config.pretrained.answer_shape")
  with open(file) as f:
    return json.load(f)


@dataclasses.dataclass
class AnswerEncoderSpec:
  """One configured answer encoder: its kind, folder, Flax module, tokenizer and output size."""
  kind: str
  folder: str  # resolved local folder ("" with a shape and no weights)
  dim: int
  max_subwords: int
  tokenizer: Any
  module_config: Any  # (vocab_size, dim) for deberta; clip_text.CLIPTextConfig for clip
  dtype: Any = jnp.float32

  def module(self, name: str = "answer_encoder") -> nn.Module:
    if self.kind == "deberta":
      vocab, dim = self.module_config
      return WordEmbeddingMean(vocab, dim, self.dtype, name=name)
    return ClipTextEncoder(dataclasses.replace(self.module_config, dtype=self.dtype), name=name)

  @property
  def token_len(self) -> int:
    """deberta: the sub-words alone; clip: plus its start and end tokens."""
    return self.max_subwords + (2 if self.kind == "clip" else 0)

  def tokens(self, answers, pad_to: int):
    """`[pad_to, token_len]` int32 ids and bool mask of `answers` (rows past len(answers) empty)."""
    n = self.token_len
    ids = np.zeros((pad_to, n), np.int32)
    mask = np.zeros((pad_to, n), np.bool_)
    if self.kind == "deberta":
      from evqa_jax.projects.ovqa.backbones.frozenbilm import tokenize_answers
      ids[:], mask[:] = tokenize_answers(self.tokenizer, answers, n, pad_to)
      return ids, mask
    if len(answers):
      from evqa_jax.projects.ovqa.backbones.text import padded_tokens
      ids[:len(answers)], mask[:len(answers)] = padded_tokens(self.tokenizer, list(answers), n)
    return ids, mask

  def load(self, params: dict) -> dict:
    """The `answer_encoder` subtree `params` (host arrays) with the folder's weights; unchanged without a folder."""
    params = hf_utils.params_of(params)
    if not self.folder or not pretrained.has_checkpoint(self.folder):
      return params
    if self.kind == "clip":
      loaded, _ = clip_text.load_hf_params(self.module_config, self.folder)
      return {"clip": loaded}
    ckpt = hf_utils.read_checkpoint(self.folder)
    keys = [k for k in ckpt if k.endswith("embeddings.word_embeddings.weight")]
    if len(keys) != 1:
      raise ValueError(f"{self.folder}: expected one '*embeddings.word_embeddings.weight' tensor (a masked LM's word "
                       f"embeddings), found {keys or 'none'}")
    table = ckpt[keys[0]]
    want = tuple(np.shape(params["word_embeddings"]))
    if table.shape != want:
      raise ValueError(f"{self.folder}: {keys[0]} has shape {table.shape}, the answer encoder expects {want}")
    return {"word_embeddings": table.astype(np.asarray(params["word_embeddings"]).dtype)}


def build(config, dtype=jnp.float32) -> AnswerEncoderSpec:
  """The answer encoder of `config` (config.model.answer_encoder, config.pretrained.answer_dir / answer_tokenizer /
  answer_shape, config.data.answer_max_subwords)."""
  kind = config.model.answer_encoder
  if kind not in KINDS:
    raise ValueError(f"config.model.answer_encoder = {kind!r}: expected one of {KINDS}")
  pc = config.pretrained
  folder = pretrained.resolve(pc.answer_dir) if pc.answer_dir else ""
  shape = dict(pc.answer_shape) if pc.get("answer_shape") else None
  if shape is None:
    if not folder:
      raise ValueError("config.pretrained.answer_dir is empty: name the answer encoder's local folder (or give "
                       "config.pretrained.answer_shape for random weights)")
    shape = _folder_config(folder)
  tok_path = pc.answer_tokenizer or pc.answer_dir
  if not tok_path:
    raise ValueError("config.pretrained.answer_tokenizer and config.pretrained.answer_dir are both empty: one must "
                     "name a local folder with the answer encoder's tokenizer")
  from evqa_jax import spm_tokenizer
  tokenizer = spm_tokenizer.load_tokenizer(pretrained.resolve(tok_path),
                                           config_key="config.pretrained.answer_tokenizer / answer_dir")
  if kind == "clip":
    cfg = clip_text.CLIPTextConfig.from_dict(shape)
    module_config, dim = cfg, cfg.projection_dim
  else:
    if "vocab_size" not in shape or "hidden_size" not in shape:
      raise ValueError(f"the answer encoder's config ({folder or 'config.pretrained.answer_shape'}) has no "
                       "vocab_size / hidden_size")
    module_config, dim = (int(shape["vocab_size"]), int(shape["hidden_size"])), int(shape["hidden_size"])
    if len(tokenizer) > module_config[0]:
      raise ValueError(f"the answer tokenizer has {len(tokenizer)} ids but the answer encoder's vocabulary is "
                       f"{module_config[0]} (config.pretrained.answer_tokenizer / answer_dir / answer_shape)")
  return AnswerEncoderSpec(kind=kind, folder=folder if pretrained.has_checkpoint(folder) else "", dim=dim,
                           max_subwords=int(config.data.answer_max_subwords), tokenizer=tokenizer,
                           module_config=module_config, dtype=dtype)
