"""OVQA: open-vocabulary video QA with the backbone of `config.model.backbone` (backbones/: FrozenBiLM+ or JustAsk+,
optionally + the GNN soft verbalizer, or their CVQA rows).

Input (records, answer vocabularies and graphs): input.py, with the backbone's question and answer tokens. Model and
weights: the backbone's. Loss: cross-entropy over the active answer vocabulary (V_train in training, V_test in
evaluation), plus the backbone's auxiliary loss. Evaluation: evaluator.py (the official prediction CSV and metrics).
"""

import jax
import jax.numpy as jnp
import optax

from evqa_jax.models.verbalizer import LEARNED_VARIANTS, canonical_variant
from evqa_jax.projects import base
from evqa_jax.projects.ovqa import backbones
from evqa_jax.projects.ovqa import evaluator
from evqa_jax.projects.ovqa import input as input_lib


class Task(base.Task):
  """The OVQA task of every backbone: `self.backbone` (the entry of config.model.backbone in backbones.BACKBONES)
  gives the question and answer tokens, the model, its weights and what it changes in training."""
  main_metric = "mAcc"

  def __init__(self, config):
    super().__init__(config)
    self.backbone = backbones.build(config)  # its start point and head checked before any data is read
    self.input = input_lib.Input(config, head=config.model.head, backbone=self.backbone)
    self.model = self.backbone.build_model(self.input)

  # -- data (input.py) ------------------------------------------------------------------------------------------
  def source(self, split: str):
    return self.input.source(split)

  def preprocess(self, example: dict, train: bool) -> dict:
    return self.input.preprocess(example, train)

  def preprocess_train(self, example: dict, key: tuple) -> dict:
    return self.input.preprocess(example, True, key)

  def aux_inputs(self, split: str) -> dict:
    return self.input.aux_inputs(split)

  def aux_logical_axes(self, aux=None):
    return self.input.aux_logical_axes(aux)

  # -- model ----------------------------------------------------------------------------------------------------
  def init_params(self, rng):
    open_head = self.model.head != "cvqa_mlp"  # scored against answer embeddings: needs the vocabulary
    aux = jax.tree.map(jnp.asarray, self.aux_inputs(self.config.data.train_split)) if open_head else None
    return self.model.init({"params": rng}, self.backbone.dummy_batch(), aux)["params"]

  def load_pretrained(self, params: dict) -> dict:
    return self.backbone.load_pretrained(params)

  def check_zero_shot(self) -> None:
    """Scoring the start weights (launch/evaluate.py --zero_shot, the paper's Table 6) with a learned verbalizer
    that no checkpoint filled would apply an untrained GNN / MLP: refused."""
    vc = self.config.verbalizer
    if (self.input.use_graph and canonical_variant(vc.variant) in LEARNED_VARIANTS
        and not self.backbone.verbalizer_from_checkpoint):
      raise ValueError(
          f"--zero_shot scores untrained weights, but config.verbalizer.variant = {vc.variant!r} is a learned "
          f"verbalizer that config.pretrained.init_from does not hold: the zero-shot Table 6 is "
          f"{self.backbone.title}+ without a verbalizer: use --config=configs/ovqa_{self.config.dataset}.py:"
          f"{','.join(filter(None, (self.backbone.variant, 'baseline')))} (or "
          "--config.verbalizer.variant=A), or give an OVQA-trained checkpoint (with its GNN) as init_from")

  @property
  def trainable_patterns(self) -> tuple:
    return self.backbone.trainable_patterns

  @property
  def precomputes_aux(self) -> bool:
    return self.backbone.precomputes_aux

  def precompute_aux(self, frozen_params, aux):
    return self.backbone.precompute_aux(frozen_params, aux)

  def _logits(self, params, batch, aux, rng, train: bool):
    rngs = {"dropout": rng} if train else {}
    return self.model.apply({"params": params}, batch, aux if self.model.head != "cvqa_mlp" else None,
                            deterministic=not train, rngs=rngs)

  def loss(self, params, batch, aux, rng, train: bool = True):
    logits = self._logits(params, batch, aux, rng, train)
    labels = batch["label"]
    valid = labels >= 0  # evaluation rows whose answer is outside the scored vocabulary carry no loss
    if "_valid" in batch:
      valid = valid & (batch["_valid"] > 0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    denom = jnp.maximum(jnp.sum(valid), 1)
    loss = jnp.sum(jnp.where(valid, ce, 0.0)) / denom
    acc = jnp.sum(jnp.where(valid, jnp.argmax(logits, -1) == labels, False)) / denom
    if train:
      return self.backbone.train_loss(params, batch, rng, loss, {"accuracy": acc})
    return loss, {"accuracy": acc}

  def predict(self, params, batch, aux) -> dict:
    logits = self._logits(params, batch, aux, None, train=False)
    top = jax.lax.top_k(logits, 5)
    return {"pred": top[1][:, 0].astype(jnp.int32), "top5": top[1].astype(jnp.int32)}

  # -- evaluation (evaluator.py) --------------------------------------------------------------------------------
  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    # Prediction ids index the vocabulary aux_inputs(split) scored: V_train for the train split, else V_test.
    answers = self.input.answers_train if split == self.config.data.train_split else self.input.answers_eval
    return evaluator.evaluate(self.input.data_dir, answers, split, outputs, out_dir)

  def console_metrics(self) -> tuple:
    return ("base", "common", "rare", "unseen", "total", "mAcc", "BNG")  # Table 2's columns and Table 8's BNG

  def describe(self) -> str:
    return self.backbone.describe(self.input)
