"""FrozenBiLM+ for open-vocabulary video QA, and its closed-vocabulary (CVQA) counterparts.

The frozen bidirectional LM reads `[visual tokens] Question: ...? Answer: [MASK]. Subtitles: ...`; its [MASK]
feature (MLM-head transform, DeBERTa: after the enhanced mask decoder) is scored
- `head="open"`: by dot product with the embeddings of the active answer vocabulary (mean of the frozen input word
  embeddings over each answer's <= 5 sub-words), optionally refined by the GNN soft verbalizer; no bias, no temperature;
- `head="cvqa"`: FrozenBiLM's own head, the paper's CVQA row: the same dot product with the same frozen answer
  embeddings, over a fixed top-k train vocabulary in training and evaluation (never the GNN verbalizer), so an answer
  outside it can never be predicted. No bias: FrozenBiLM's `set_answer_embeddings` assigns the mean sub-word MLM
  bias to `answer_bias.weight`, an attribute the forward never reads, so its answer bias stays at zero;
- `head="cvqa_mlp"`: an extra baseline, an MLP classifier over the same top-k answers, trained from scratch.
"""

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
from evqa_jax.models import encoders
from evqa_jax.models.verbalizer import LEARNED_VARIANTS, canonical_variant


HEADS = ("open", "cvqa", "cvqa_mlp")


def mean_subword_embeddings(word_embeddings, token_ids, token_mask):
  """Answer encoder: `[vocab, H]`, `[A, S]` ids, `[A, S]` mask -> `[A, H]` mean over the valid sub-words.

  A loop over the S sub-word positions, one `[A, H]` gather at a time: a single gather of all ids would make an
  `[A, S, H]` array, which on TPU pads S (<= 5) to 8 sublanes (1.3 GiB per device in float32 for the 29k nodes of an
  MSRVTT-scale answer graph at H = 1536; benchmarks/verbalizer_memory.py), and unrolled gathers all stay alive.
  """
  mask = token_mask.astype(word_embeddings.dtype)

  def add(total, x):
    ids, m = x
    return total + jnp.take(word_embeddings, ids, axis=0) * m[:, None], None

  init = jnp.zeros((token_ids.shape[0], word_embeddings.shape[-1]), word_embeddings.dtype)
  total, _ = jax.lax.scan(add, init, (token_ids.T, mask.T))
  return total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)


@jax.custom_vjp
def backward_in_order(feature, nodes):
  """Identity on (the LM's [MASK] features, the verbalizer's input node features); in the backward pass the features'
  gradient is released only with the nodes', i.e. after the whole verbalizer backward.

  Without it XLA's TPU scheduler runs the verbalizer's backward edge loops in the middle of the LM's backward and
  defers each LM layer's relative-position gradient past them, keeping two `[L, 2k, batch, heads]` scatters per
  layer alive: about +14 GiB per v5e device for DeBERTa-v2-xlarge at MSRVTT scale (README, compile table). The node
  gradient itself is discarded (the table is frozen); the edge loops' backward computes it anyway, so it costs only
  a `[nodes, D] x [D, D]` product per layer."""
  return feature, nodes


def _in_order_fwd(feature, nodes):
  return (feature, nodes), None


def _in_order_bwd(_, grads):
  return jax.lax.optimization_barrier(grads)


backward_in_order.defvjp(_in_order_fwd, _in_order_bwd)


class CVQAHead(nn.Module):
  """Dense(H) -> GELU -> Dense(k) on the [MASK] feature `[batch, H]` -> `[batch, k]`."""
  num_classes: int
  hidden_size: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.hidden_size, dtype=self.dtype, name="hidden",
                 kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "mlp")))(x)
    x = nn.gelu(x)
    return nn.Dense(self.num_classes, dtype=self.dtype, name="out",
                    kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("mlp", "classes")))(x)


class Model(nn.Module):
  """LM (`encoder` name in evqa_jax.models.encoders) + answer scoring head.

  Built as `Model(**config.model, encoder_config=..., num_classes=..., verbalizer=..., verbalizer_call=...)`: the
  fields down to `dtype` are `config.model`; the rest come from the checkpoint and the data.

  Attributes:
    backbone: "frozenbilm" (the OVQA task's switch; JustAsk's model is justask.Model).
    encoder: "bert" or "deberta_v2".
    head: "open", "cvqa" (FrozenBiLM's head over the top-k answers) or "cvqa_mlp" (an MLP over them).
    use_adapters, adapter_reduction: adapters (hidden / reduction wide) in every LM layer.
    remat: per-LM-layer jax.checkpoint policy (none | full | dots_saveable), a memory lever.
    relative_gather: DeBERTa-v2's relative attention, "scores", "rows", "pallas" or "dpa"
      (DebertaV2Config.relative_gather; same values, "rows" has no activation-sized gather, "pallas" is one fused
      TPU kernel, "dpa" jax.nn.dot_product_attention (cuDNN on a GPU): accelerator levers).
    scan_layers: DeBERTa-v2's middle layers as one nn.scan over stacked params (DebertaV2Config.scan_layers; same
      values, one layer body to compile; checkpoints of the unscanned model convert with deberta_v2.stack_layers).
    dropout: LM and adapter dropout (None: the checkpoint's).
    dtype: compute dtype name ("float32", "bfloat16").
    encoder_config: the checkpoint's encoder architecture with the visual prefix (num_visual_tokens, visual_dim);
      `lm_config` adds this model's adapter, dropout and dtype fields.
    num_classes: CVQA answer-set size (head="cvqa_mlp").
    verbalizer: `config.verbalizer` (the `Verbalizer` module's fields; head="open" only), or None for plain answer
      embeddings.
    verbalizer_call: static work bounds (evqa_jax.graphs.padding.verbalizer_budget).
  """
  backbone: str = "frozenbilm"
  encoder: str = "deberta_v2"
  head: str = "open"
  use_adapters: bool = True
  adapter_reduction: int = 8
  dropout: Optional[float] = 0.1
  dtype: str = "float32"
  remat: str = "none"
  relative_gather: str = "scores"
  scan_layers: bool = False
  encoder_config: Any = None
  num_classes: int = 0
  verbalizer: Optional[dict] = None
  verbalizer_call: Optional[dict] = None

  @property
  def lm_config(self):
    """`encoder_config` with this model's adapter, dropout and dtype settings."""
    overrides = encoders.lm_overrides(self.use_adapters, self.adapter_reduction, self.dropout, self.dtype,
                                        self.remat)
    if self.encoder == "deberta_v2":
      overrides["relative_gather"] = self.relative_gather
      overrides["scan_layers"] = self.scan_layers
    elif self.scan_layers:
      raise ValueError(f"config.model.scan_layers = True is a DeBERTa-v2 setting; config.model.encoder is "
                       f"{self.encoder!r}")
    elif self.relative_gather != "scores":
      raise ValueError(f"config.model.relative_gather = {self.relative_gather!r} is a DeBERTa-v2 setting; "
                       f"config.model.encoder is {self.encoder!r}")
    return dataclasses.replace(self.encoder_config, **overrides)

  def setup(self):
    if self.backbone != "frozenbilm":
      raise ValueError(f"config.model.backbone = {self.backbone!r}: this is the FrozenBiLM model")
    lm_config = self.lm_config
    self.lm = encoders.ENCODERS[self.encoder](lm_config, name="lm")
    if self.head not in HEADS:
      raise ValueError(f"config.model.head = {self.head!r}: expected one of {HEADS}")
    if self.head != "open" and self.verbalizer is not None:
      raise ValueError(f"config.model.head = {self.head!r} scores a fixed answer set: the GNN verbalizer is for "
                       "head 'open' only (set config.verbalizer.variant = 'A')")
    if self.head == "cvqa_mlp":
      self.cvqa_head = CVQAHead(self.num_classes, lm_config.hidden_size, dtype=lm_config.dtype, name="cvqa_head")
    elif self.verbalizer is not None:
      from evqa_jax.models.verbalizer import Verbalizer
      self.verbalizer_module = Verbalizer(**self.verbalizer, dtype=encoders.dtype(self.dtype), name="verbalizer")

  def mask_feature(self, batch, deterministic: bool):
    """-> `[batch, H]` the [MASK] feature of the LM."""
    out = self.lm(batch["input_ids"], batch["attention_mask"], visual=batch["video"],
                  visual_mask=batch["video_mask"], mask_index=batch["mask_index"], deterministic=deterministic)
    return out["mask_feature"]

  def answer_embeddings(self, vocab):
    """-> `[A, H]` embeddings of the (padded) active answer vocabulary, verbalized when configured."""
    return self._answer_embeddings(vocab, None)[0]

  def _answer_embeddings(self, vocab, feature):
    """-> (answer embeddings `[A, H]`, `feature`); a learned verbalizer's backward is ordered before the gradient of
    `feature` is released (`backward_in_order`)."""
    word_emb = encoders.word_embeddings(self.encoder, nn.meta.unbox(self.lm.variables["params"]))
    answers = mean_subword_embeddings(word_emb, vocab["answer_tokens"], vocab["answer_token_mask"])
    if self.verbalizer is None:
      return answers, feature
    if "node_features" in vocab:
      # An imported graph's features (the OVQA authors' x.pth) are the GNN's input only; Eq. 7's V stays the LM's
      # answer embeddings, as in their model.
      nodes = vocab["node_features"]
      if nodes.shape[-1] != answers.shape[-1]:
        raise ValueError(f"the answer graphs' node features are {nodes.shape[-1]}-d but the LM's word embeddings "
                         f"are {answers.shape[-1]}-d: the graphs were made for another LM (config.pretrained)")
    else:
      nodes = mean_subword_embeddings(word_emb, vocab["node_tokens"], vocab["node_token_mask"])
      answers = None  # the graph's first A nodes are the answers themselves (same sub-word tokens): V = theirs
    if feature is not None and canonical_variant(self.verbalizer["variant"]) in LEARNED_VARIANTS:
      feature, nodes = backward_in_order(feature, nodes)
    graph = jraph.GraphsTuple(nodes=nodes, edges=None, globals=None, senders=vocab["senders"],
                              receivers=vocab["receivers"], n_node=vocab["n_node"], n_edge=vocab["n_edge"])
    return self.verbalizer_module(graph, vocab["answer_mask"].shape[0], vocab["is_base"], answers=answers,
                                  **(self.verbalizer_call or {})), feature

  def __call__(self, batch, vocab=None, deterministic: bool = True):
    """-> logits `[batch, A]` (open, cvqa: over the padded answer vocabulary, padding at -inf) or `[batch, k]`
    (cvqa_mlp)."""
    feature = self.mask_feature(batch, deterministic)
    if self.head == "cvqa_mlp":
      return self.cvqa_head(feature)
    return self.score(feature, vocab)

  def score(self, feature, vocab):
    """[MASK] features `[batch, H]` -> logits `[batch, A]` over the padded answer vocabulary (padding at -inf)."""
    answers, feature = self._answer_embeddings(vocab, feature)
    logits = jnp.einsum("bh,ah->ba", feature.astype(jnp.float32), answers.astype(jnp.float32))
    return jnp.where(vocab["answer_mask"][None, :], logits, jnp.finfo(jnp.float32).min)
