"""JustAsk (VQA-T, Yang et al. ICCV 2021) and JustAsk+ (the OVQA paper's open-vocabulary version, optionally with the
GNN soft verbalizer) as a second OVQA backbone, selected by `config.model.backbone = "justask"`.

The model of github.com/antoyang/just-ask (model/multimodal_transformer.py `MMT_VideoQA`, mode "vqa";
model/language_model.py `Bert`, `AModel`), with its parameter names:
- question tower: DistilBERT over `[CLS] question [SEP]` (<= Q tokens) `[b, Q, 768]` -> linear_question -> GELU ->
  norm_question; video: frame features `[b, T, F]` -> linear_video -> GELU -> norm_video (both `[b, *, d_model]`);
- `position`: [question; video] + frozen sinusoidal position embeddings (0..Q+T-1) + modality embeddings (0 for the Q
  question slots, 1 for the T video slots) -> LayerNorm -> dropout;
- `mmt`: a DistilBERT transformer (n_layers, n_heads, d_ff, dropout) over the Q+T tokens, key-masked by
  [question mask; video mask]; fusion = vqproj(dropout(output at slot 0)) `[b, d_model]`;
- answer encoder `amodel`: a second DistilBERT over `[CLS] answer [SEP]` (<= 10 tokens), its [CLS] output ->
  linear_text `[A, d_model]`;
- logits = fusion @ answers^T (no bias, no temperature), cross-entropy. The authors' `head` is this dot product over
  their top-k vocabulary (the CVQA row, `head="cvqa"`); JustAsk+ scores V_train in training and V_test in evaluation
  (`head="open"`), and with a verbalizer the answer embeddings go through the GNN (node features: the answer encoder
  on each node's word(s)).

Loss extras of the authors' fine-tuning (train/train_videoqa.py): with `mlm_prob` > 0 (their --mlm_prob, 0.15 by
default) a masked-LM loss on the question, read through the same multi-modal transformer with the video
(`vocab_transform` -> GELU -> `vocab_norm` -> `vocab_projector`, untied), is added to the VideoQA loss.
"""

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from evqa_jax.models import encoders
from evqa_jax.models import distilbert
from evqa_jax.models import layers
from evqa_jax.models.layers import ACTIVATIONS

HEADS = ("open", "cvqa")
_gelu = ACTIVATIONS["gelu"]  # transformers.activations.gelu: the exact (erf) GELU


def _dense(features, axes, name, dtype):
  """nn.Linear as the authors initialise it (`_init_weights`: N(0, 0.02), zero bias)."""
  return layers.dense(features, axes, name, dtype, stddev=0.02)


def _norm(name, dtype):
  return layers.layer_norm(name, dtype, epsilon=1e-12)


class ModalityEmbeddings(nn.Module):
  """The authors' `Embeddings` (name "position"): x `[b, Q+T, d]` + sinusoidal positions (frozen: not a parameter)
  + modality embeddings (0: the first `question_len` slots, 1: the rest) -> LayerNorm -> dropout."""
  d_model: int
  question_len: int
  dropout: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    length = x.shape[1]
    table = jnp.asarray(distilbert.sinusoidal_table(length, self.d_model), self.dtype)
    modality = nn.Embed(2, self.d_model, dtype=self.dtype, name="modality_embedding",
                        embedding_init=layers.normal(0.02, (None, "embed")))
    ids = (jnp.arange(length) >= self.question_len).astype(jnp.int32)
    x = x.astype(self.dtype) + table[None] + modality(ids)[None]
    x = _norm("LayerNorm", self.dtype)(x)
    return nn.Dropout(self.dropout)(x, deterministic=deterministic)


class AnswerEncoder(nn.Module):
  """The authors' `AModel`: DistilBERT's [CLS] output -> linear_text: ids, mask `[A, S]` -> `[A, d_model]`."""
  text_config: Any
  d_model: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, ids, mask, deterministic: bool = True):
    cls = distilbert.DistilBert(self.text_config, name="bert")(ids, mask, deterministic)[:, 0]
    return _dense(self.d_model, ("embed", "mlp"), "linear_text", self.dtype)(cls)


class Model(nn.Module):
  """JustAsk / JustAsk+; built as `Model(**config.model, text_config=..., feature_dim=..., num_frames=...,
  question_len=..., verbalizer=..., verbalizer_call=...)`: the fields down to `remat` are `config.model`.

  Attributes:
    backbone: "justask" (the OVQA task's switch; FrozenBiLM's model.Model has "frozenbilm").
    head: "open" (JustAsk+: V_train / V_test) or "cvqa" (the top-k train answers in both: the JustAsk row).
    d_model, n_layers, n_heads, d_ff, dropout: the multi-modal transformer (the authors' --embd_dim, --n_layers,
      --n_heads, --ff_dim, --dropout).
    mlm_prob: the authors' --mlm_prob: probability of masking a question token for the auxiliary MLM loss (0: off).
    freeze_answer_encoder: the answer encoder (`amodel`) under stop-gradient and out of the trained parameters
      (JustAsk+'s second stage, which trains the GNN verbalizer over a fixed answer encoder).
    cache_answer_encoder: with freeze_answer_encoder, the frozen encoder's outputs over the answers (or, with the
      verbalizer, the graph nodes) are computed once per split (`encode_vocab`, the task's `precompute_aux`) and the
      steps read them instead of running the encoder (same numbers); False: the step runs it every time.
    dtype: compute dtype name; remat: per-layer jax.checkpoint policy of the three transformers.
    text_config: the DistilBERT (or BERT) architecture of both text towers (`distilbert.config_from_dict`).
    feature_dim: frame feature size F; num_frames: T; question_len: Q (config.data.max_tokens).
    verbalizer, verbalizer_call: as in model.Model (head "open" only).
  """
  backbone: str = "justask"
  head: str = "open"
  d_model: int = 512
  n_layers: int = 2
  n_heads: int = 8
  d_ff: int = 2048
  dropout: float = 0.1
  mlm_prob: float = 0.0
  freeze_answer_encoder: bool = False
  cache_answer_encoder: bool = True
  dtype: str = "float32"
  remat: str = "none"
  text_config: Any = None
  feature_dim: int = 1024
  num_frames: int = 20
  question_len: int = 20
  verbalizer: Optional[dict] = None
  verbalizer_call: Optional[dict] = None

  @property
  def compute_dtype(self):
    return encoders.dtype(self.dtype)

  @property
  def tower_config(self):
    """The text towers' config at this model's dtype and remat policy (dropout: the checkpoint's, as the authors)."""
    return dataclasses.replace(self.text_config, dtype=self.compute_dtype, remat=self.remat)

  @property
  def mmt_config(self):
    """The multi-modal transformer's DistilBERT config (the authors' DistilBertConfig with their overrides)."""
    return distilbert.BertConfig(
        vocab_size=1, hidden_size=self.d_model, num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
        intermediate_size=self.d_ff, hidden_act="gelu", layer_norm_eps=1e-12, type_vocab_size=0,
        hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout,
        max_position_embeddings=self.question_len + self.num_frames, dtype=self.compute_dtype, remat=self.remat)

  def setup(self):
    if self.backbone != "justask":
      raise ValueError(f"config.model.backbone = {self.backbone!r}: this is the JustAsk model")
    if self.head not in HEADS:
      raise ValueError(f"config.model.head = {self.head!r}: JustAsk scores answers by their embeddings, one of "
                       f"{HEADS} (cvqa: its own top-k vocabulary)")
    if self.head != "open" and self.verbalizer is not None:
      raise ValueError(f"config.model.head = {self.head!r} scores a fixed answer set: the GNN verbalizer is for "
                       "head 'open' only (set config.verbalizer.variant = 'A')")
    if self.text_config is None:
      raise ValueError("JustAsk: text_config (the DistilBERT architecture, config.pretrained) is required")
    dt, d = self.compute_dtype, self.d_model
    self.bert = distilbert.DistilBert(self.tower_config)
    self.amodel = AnswerEncoder(self.tower_config, d, dt)
    self.linear_video = _dense(d, (None, "embed"), "linear_video", dt)
    self.norm_video = _norm("norm_video", dt)
    self.linear_question = _dense(d, (None, "embed"), "linear_question", dt)
    self.norm_question = _norm("norm_question", dt)
    self.position = ModalityEmbeddings(d, self.question_len, self.dropout, dt)
    self.mmt = distilbert.Transformer(self.mmt_config)
    self.vqproj = _dense(d, ("embed", "mlp"), "vqproj", dt)
    self.vqproj_dropout = nn.Dropout(self.dropout)
    if self.mlm_prob:
      self.vocab_transform = _dense(d, ("embed", "mlp"), "vocab_transform", dt)
      self.vocab_norm = _norm("vocab_norm", dt)
      self.vocab_projector = _dense(self.text_config.vocab_size, ("embed", "vocab"), "vocab_projector", dt)
    if self.verbalizer is not None:
      from evqa_jax.models.verbalizer import Verbalizer
      self.verbalizer_module = Verbalizer(**self.verbalizer, dtype=dt, name="verbalizer")

  def _check(self, batch):
    b = batch["question_ids"].shape[0]
    for key, shape in (("question_ids", (b, self.question_len)), ("question_mask", (b, self.question_len)),
                       ("video", (b, self.num_frames, self.feature_dim)), ("video_mask", (b, self.num_frames))):
      if batch[key].shape != shape:
        raise ValueError(f"JustAsk: batch[{key!r}] has shape {batch[key].shape}, expected {shape}")

  def encode(self, batch, deterministic: bool, question_ids=None):
    """-> the multi-modal transformer's output `[b, Q+T, d_model]` over [question; video]."""
    self._check(batch)
    ids = batch["question_ids"] if question_ids is None else question_ids
    q_mask = batch["question_mask"]
    q = self.bert(ids, q_mask, deterministic)
    q = self.norm_question(_gelu(self.linear_question(q)))
    v = self.norm_video(_gelu(self.linear_video(batch["video"].astype(self.compute_dtype))))
    x = self.position(jnp.concatenate([q, v], axis=1), deterministic)
    mask = jnp.concatenate([q_mask, batch["video_mask"]], axis=1)
    return self.mmt(x, mask, deterministic)

  def fusion(self, batch, deterministic: bool = True):
    """-> `[b, d_model]`: vqproj(dropout(slot 0 of the multi-modal transformer))."""
    x = self.encode(batch, deterministic)[:, 0]
    return self.vqproj(self.vqproj_dropout(x, deterministic=deterministic))

  def mlm_logits(self, batch, question_ids, deterministic: bool = True):
    """-> `[b, Q, vocab]` masked-LM logits of the question slots, read with the video (the authors' mode "mlm")."""
    x = self.encode(batch, deterministic, question_ids=question_ids)[:, :self.question_len]
    return self.vocab_projector(self.vocab_norm(_gelu(self.vocab_transform(x))))

  def answer_embeddings(self, vocab, deterministic: bool = True):
    """-> `[A, d_model]` embeddings of the (padded) active answer vocabulary, verbalized when configured."""
    if self.verbalizer is None:
      return self._encoded(vocab, "answer", deterministic)
    if "node_features" in vocab:
      raise ValueError("the answer graphs carry their own node features (config.graph.source = 'authors': the OVQA "
                       "authors' graphs, made with FrozenBiLM's DeBERTa); JustAsk+ embeds the node words with its "
                       "own answer encoder: build GloVe graphs (python data_prep/answer_graphs.py --data DIR)")
    # The graph's first A nodes are the answers themselves (same tokens): Eq. 7's V is theirs.
    nodes = self._encoded(vocab, "node", deterministic)
    graph = jraph.GraphsTuple(nodes=nodes, edges=None, globals=None, senders=vocab["senders"],
                              receivers=vocab["receivers"], n_node=vocab["n_node"], n_edge=vocab["n_edge"])
    return self.verbalizer_module(graph, vocab["answer_mask"].shape[0], vocab["is_base"],
                                  **(self.verbalizer_call or {}))

  @property
  def encoded_vocab_key(self) -> str:
    """The tokens the step encodes: the graph nodes' with the verbalizer, else the answers'."""
    return "node" if self.verbalizer is not None else "answer"

  def encode_vocab(self, vocab):
    """The frozen answer encoder's outputs, once: `vocab` with `{kind}_tokens` / `{kind}_token_mask` (kind:
    `encoded_vocab_key`) replaced by `{kind}_encodings` `[N, d_model]`, which `answer_embeddings` then reads as they
    are; the answer tokens, unread from then on, are dropped too. Only for a frozen encoder: its outputs are then a
    function of its loaded weights and the vocabulary alone (no dropout, no gradient)."""
    if not self.freeze_answer_encoder:
      raise ValueError("encode_vocab: the answer encoder trains (config.model.freeze_answer_encoder = False), so its "
                       "outputs change every step and cannot be computed once")
    kind = self.encoded_vocab_key
    vocab = dict(vocab)
    tokens, mask = vocab.pop(f"{kind}_tokens"), vocab.pop(f"{kind}_token_mask")
    vocab.pop("answer_tokens", None)
    vocab.pop("answer_token_mask", None)
    vocab[f"{kind}_encodings"] = self._answers(tokens, mask, deterministic=True)
    return vocab

  def _encoded(self, vocab, kind: str, deterministic: bool):
    """The answer encoder over vocab's `{kind}_tokens` `[N, S]`, or its outputs computed once (`encode_vocab`)."""
    if f"{kind}_encodings" in vocab:
      if not self.freeze_answer_encoder:
        raise ValueError(f"the aux inputs carry {kind}_encodings (precomputed answer-encoder outputs) but the answer "
                         "encoder trains (config.model.freeze_answer_encoder = False)")
      return vocab[f"{kind}_encodings"]
    return self._answers(vocab[f"{kind}_tokens"], vocab[f"{kind}_token_mask"], deterministic)

  def _answers(self, ids, mask, deterministic: bool):
    out = self.amodel(ids, mask, deterministic or self.freeze_answer_encoder)  # a frozen encoder: no dropout
    return jax.lax.stop_gradient(out) if self.freeze_answer_encoder else out

  def __call__(self, batch, vocab, deterministic: bool = True):
    """-> logits `[b, A]` over the padded answer vocabulary (padding at the float32 minimum)."""
    feature = self.fusion(batch, deterministic)
    if self.mlm_prob and self.is_initializing():  # create the MLM head's parameters whatever the init call
      self.vocab_projector(self.vocab_norm(_gelu(self.vocab_transform(feature))))
    return self.score(feature, vocab, deterministic)

  def score(self, feature, vocab, deterministic: bool = True):
    answers = self.answer_embeddings(vocab, deterministic)
    logits = jnp.einsum("bd,ad->ba", feature.astype(jnp.float32), answers.astype(jnp.float32))
    return jnp.where(vocab["answer_mask"][None, :], logits, jnp.finfo(jnp.float32).min)


# ------------------------------------------------------------------------------------------ masked LM


def mask_tokens(rng, ids, special, mask_token_id: int, vocab_size: int, mlm_prob: float):
  """The authors' `mask_tokens` (util.py) in JAX: ids `[b, Q]`, special `[b, Q]` bool (special or padding tokens,
  never masked) -> (masked ids, labels with -100 where no loss). Each other token is picked with `mlm_prob`; a picked
  token becomes [MASK] with p 0.8, else a random id with p 0.5, else stays."""
  k_pick, k_mask, k_rand, k_ids = jax.random.split(rng, 4)
  picked = jax.random.bernoulli(k_pick, mlm_prob, ids.shape) & ~special
  labels = jnp.where(picked, ids, -100)
  to_mask = jax.random.bernoulli(k_mask, 0.8, ids.shape) & picked
  to_rand = jax.random.bernoulli(k_rand, 0.5, ids.shape) & picked & ~to_mask
  random_ids = jax.random.randint(k_ids, ids.shape, 0, vocab_size, dtype=ids.dtype)
  ids = jnp.where(to_mask, mask_token_id, jnp.where(to_rand, random_ids, ids))
  return ids, labels


def mlm_loss(logits, labels):
  """Mean cross-entropy over the positions with a label (torch CrossEntropyLoss's ignore_index=-100); 0 when none
  (torch would give NaN: a batch in which no token was picked)."""
  import optax
  valid = labels >= 0
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.maximum(labels, 0))
  return jnp.sum(jnp.where(valid, ce, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


# ------------------------------------------------------------------------------------------ weight import


def checkpoint_rules(model: Model) -> dict:
  """Our flat param path -> rule over the authors' state dict (`MMT_VideoQA.state_dict()`, "module." stripped)."""
  from evqa_jax.models import hf_utils
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = {}
  rules.update(distilbert.hf_rules(model.tower_config, ours="bert/", theirs="bert.bert."))
  rules.update(distilbert.hf_rules(model.tower_config, ours="amodel/bert/", theirs="amodel.bert.bert."))
  rules.update({f"mmt/{k[len('transformer/'):]}": v
                for k, v in distilbert.block_rules(model.mmt_config, "transformer", "mmt.layer").items()})
  linears = {"amodel/linear_text": "amodel.linear_text", "linear_video": "linear_video",
             "linear_question": "linear_question", "vqproj": "vqproj.1", "vocab_transform": "vocab_transform",
             "vocab_projector": "vocab_projector"}
  for ours, theirs in linears.items():
    rules[f"{ours}/kernel"] = rule((f"{theirs}.weight",), lin)
    rules[f"{ours}/bias"] = rule((f"{theirs}.bias",))
  norms = {"norm_video": "norm_video", "norm_question": "norm_question", "position/LayerNorm": "position.LayerNorm",
           "vocab_norm": "vocab_norm"}
  for ours, theirs in norms.items():
    rules[f"{ours}/scale"] = rule((f"{theirs}.weight",))
    rules[f"{ours}/bias"] = rule((f"{theirs}.bias",))
  rules["position/modality_embedding/embedding"] = rule(("position.modality_embedding.weight",))
  return rules


def load_checkpoint(model: Model, path: str, params: dict, trust_pickles: bool = False):
  """The authors' checkpoint (`torch.save(model.state_dict())` of their nn.DataParallel model: "module." keys; read
  with torch's weights_only unpickler) into `params` (a plain params tree of `model`). Returns (params, report).

  Not read: `position.position_embeddings.weight` (the frozen sinusoidal table, computed here; checked to match),
  the cross-modal matching head of pretraining (`crossmodal_matching.*`) and, with mlm_prob = 0, the MLM head.
  A parameter of `model` absent from the checkpoint is an error, except the verbalizer (JustAsk+'s own)."""
  from evqa_jax.models import hf_utils
  ckpt = hf_utils.strip_prefix(hf_utils.read_checkpoint(path, trust_pickles=trust_pickles), "module.")
  if "linear_video.weight" not in ckpt or "amodel.linear_text.weight" not in ckpt:
    raise ValueError(f"{path}: not a JustAsk (VQA-T) checkpoint: no linear_video.weight / amodel.linear_text.weight "
                     f"(keys: {sorted(ckpt)[:6]} ...)")
  table = ckpt.pop("position.position_embeddings.weight", None)
  if table is not None:
    ours = distilbert.sinusoidal_table(*table.shape)
    if table.shape[1] != model.d_model or not np.allclose(table, ours, atol=1e-6):
      raise ValueError(f"{path}: position.position_embeddings.weight {tuple(table.shape)} is not the sinusoidal "
                       f"table of {model.question_len} + {model.num_frames} positions x {model.d_model}")
    if table.shape[0] != model.question_len + model.num_frames:
      raise ValueError(f"{path}: the checkpoint was trained with Q + T = {table.shape[0]} slots but the config has "
                       f"Q = {model.question_len} (config.data.max_tokens) + T = {model.num_frames} "
                       "(config.data.num_frames)")
  flat_init = hf_utils.flatten_params(hf_utils.params_of(params))
  flat, report = hf_utils.assemble(flat_init, ckpt, checkpoint_rules(model), source=path, init=flat_init,
                                   ignore=(r"(^|\.)position_ids$",))
  missing = [p for p in report.missing if not p.startswith("verbalizer/")]
  if missing:
    raise ValueError(f"{path}: the checkpoint lacks {len(missing)} parameters of this JustAsk config, e.g. "
                     f"{missing[:4]} (do d_model / n_layers / the DistilBERT folder match the checkpoint?)")
  return hf_utils.unflatten_params(flat), report
