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
import jax
import jax.numpy as jnp
import jraph
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


class FrozenAnswerHead:
  """The "+" head's answer side, shared by the pixel backbones' Flax models (a mixin of an nn.Module whose setup
  sets `answer_encoder_module` (`spec.module()`), `verbalizer` (config or None) and `verbalizer_module`, and which
  has `verbalizer_call`): the frozen encoder's outputs over the vocabulary, once per split (`encode_vocab`), the answer
  embeddings through the GNN verbalizer when configured, and the logits of a feature against them (`score`)."""

  def _encoded(self, vocab, kind: str):
    if f"{kind}_encodings" in vocab:
      return vocab[f"{kind}_encodings"]
    out = self.answer_encoder_module(vocab[f"{kind}_tokens"], vocab[f"{kind}_token_mask"])
    return jax.lax.stop_gradient(out)

  def encode_vocab(self, vocab):
    """`vocab` with the answer (and graph-node) tokens replaced by the frozen encoder's outputs
    (`answer_encodings`, `node_encodings`): computed once per split (the backbone's precompute_aux)."""
    vocab = dict(vocab)
    for kind in ("answer", "node"):
      if f"{kind}_tokens" in vocab:
        vocab[f"{kind}_encodings"] = self._encoded(vocab, kind)
        del vocab[f"{kind}_tokens"], vocab[f"{kind}_token_mask"]
    return vocab

  def answer_embeddings(self, vocab, deterministic: bool = True):
    """-> `[A, E]` the active vocabulary's answer embeddings, through the verbalizer when configured."""
    del deterministic
    answers = self._encoded(vocab, "answer")
    if self.verbalizer is None:
      return answers
    if "node_features" in vocab:  # the OVQA authors' graphs carry DeBERTa-xlarge node features
      nodes = vocab["node_features"]
      if nodes.shape[-1] != answers.shape[-1]:
        raise ValueError(f"the answer graphs' node features are {nodes.shape[-1]}-d but the answer encoder's "
                         f"embeddings are {answers.shape[-1]}-d (config.model.answer_encoder / graph.source)")
    else:
      nodes, answers = self._encoded(vocab, "node"), None  # the first A nodes are the answers themselves
    graph = jraph.GraphsTuple(nodes=nodes, edges=None, globals=None, senders=vocab["senders"],
                              receivers=vocab["receivers"], n_node=vocab["n_node"], n_edge=vocab["n_edge"])
    return self.verbalizer_module(graph, vocab["answer_mask"].shape[0], vocab["is_base"], answers=answers,
                                  **(self.verbalizer_call or {}))

  def score(self, out, vocab, num_classes: int, closed: bool, title: str):
    """The head's output `[b, k]` (closed: the classifier's logits over the top-k answers) or `[b, E]` (the answer
    feature) -> logits `[b, A]` over the padded answer vocabulary (padding at the float32 minimum)."""
    n = vocab["answer_mask"].shape[0]
    if closed:
      if n < num_classes:
        raise ValueError(f"{title}: the vocabulary pads to {n} < {num_classes} classes")
      logits = jnp.pad(out, ((0, 0), (0, n - num_classes)))
    else:
      logits = out @ self.answer_embeddings(vocab).astype(jnp.float32).T
    return jnp.where(vocab["answer_mask"][None, :], logits, jnp.finfo(jnp.float32).min)


class FrozenAnswerBackbone:
  """The frozen answer encoder's part of a pixel backbone (a mixin placed before `Backbone`; its model mixes in
  `FrozenAnswerHead` and has `encode_vocab`): the spec of config.model.answer_encoder, the answer tokens of head
  "open" (the closed classifier reads none), the encoder's weights, its parameters kept out of training, and its
  outputs computed once per split."""

  @property
  def answer_spec(self) -> AnswerEncoderSpec:
    if getattr(self, "_answer_spec", None) is None:
      from evqa_jax.models import encoders  # pylint: disable=g-import-not-at-top
      self._answer_spec = build(self.config, encoders.dtype(self.config.model.dtype))  # pylint: disable=attribute-defined-outside-init
    return self._answer_spec

  def answer_tokens(self, inp, answers, pad_to: int):
    """The frozen answer encoder's tokens (head "open"); the classifier reads none (one empty column)."""
    del inp
    if self.config.model.head == "cvqa":
      return np.zeros((pad_to, 1), np.int32), np.zeros((pad_to, 1), np.bool_)
    return self.answer_spec.tokens(answers, pad_to)

  def load_answer_encoder(self, params: dict) -> dict:
    """Host params -> params with the `answer_encoder` subtree from the spec's folder (when the model has one)."""
    params = dict(hf_utils.params_of(params))
    if "answer_encoder" in params:
      params["answer_encoder"] = self.answer_spec.load(params["answer_encoder"])
      if self.answer_spec.folder:
        from evqa_jax import log  # pylint: disable=g-import-not-at-top
        log.info(f"Loaded the frozen {self.answer_spec.kind} answer encoder from {self.answer_spec.folder}")
    return params

  @property
  def trainable_patterns(self) -> tuple:
    """config.trainable, less the frozen answer encoder."""
    return tuple(f"^(?!answer_encoder/).*(?:{p})" for p in self.config.trainable)

  @property
  def precomputes_aux(self) -> bool:
    """Head "open": the frozen answer encoder's outputs over the answers / graph nodes, once per split."""
    return self.config.model.head == "open"

  def precompute_aux(self, frozen_params, aux):
    if not self.precomputes_aux:
      return aux
    return self.model.apply({"params": frozen_params}, aux, method=self.model.encode_vocab)
