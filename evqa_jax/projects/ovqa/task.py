"""OVQA: open-vocabulary video QA with FrozenBiLM+ (optionally + the GNN soft verbalizer) or the CVQA baselines.

Input (records, prompts, answer vocabularies and graphs): input.py. Model: model.py, built from `config.model`.
Loss: cross-entropy over the active answer vocabulary (V_train in training, V_test in evaluation). Evaluation:
evaluator.py (the official prediction CSV and metrics).
"""

import os

import jax
import jax.numpy as jnp
import optax

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax import pretrained
from evqa_jax.models import encoders
from evqa_jax.models.verbalizer import LEARNED_VARIANTS, canonical_variant
from evqa_jax.projects import base
from evqa_jax.projects.ovqa import evaluator
from evqa_jax.projects.ovqa import input as input_lib
from evqa_jax.projects.ovqa import model as model_lib


def init_from_path(config) -> str:
  """`config.pretrained.init_from` -> the FrozenBiLM checkpoint to start from, or "" for none ("none" opts out).

  The paper configs (`pretrained.init_from_required`) fine-tune from FrozenBiLM's pretrained checkpoint, as the
  authors' `--load` does: with init_from empty they stop here, before any data is read, rather than quietly training
  from plain DeBERTa (a different model from the paper's)."""
  pc = config.pretrained
  value = str(pc.init_from or "").strip()
  if value.lower() == "none":
    return ""
  if not value and pc.init_from_required:
    raise ValueError(
        f"config.pretrained.init_from is empty, but configs/ovqa_{config.dataset}.py (the paper's "
        "settings) starts from FrozenBiLM's pretrained checkpoint: pass --config.pretrained.init_from=PATH/"
        "frozenbilm.pth, or --config.pretrained.init_from=none to start from plain DeBERTa-v2 instead")
  return value


BACKBONES = ("frozenbilm", "justask")


def make_task(config):
  """The OVQA task of `config.model.backbone`: FrozenBiLM+ (`Task`) or JustAsk+ (justask_task.Task)."""
  backbone = config.model.backbone
  if backbone not in BACKBONES:
    raise ValueError(f"config.model.backbone = {backbone!r}: expected one of {BACKBONES}")
  if backbone == "justask":
    from evqa_jax.projects.ovqa import justask_task
    return justask_task.Task(config)
  return Task(config)


class Task(base.Task):
  """FrozenBiLM+ (and its CVQA rows); JustAsk+ subclasses it (justask_task.py) for its model, inputs and weights."""
  main_metric = "mAcc"

  def __init__(self, config):
    super().__init__(config)
    self.init_from = init_from_path(config)
    self.verbalizer_from_checkpoint = False  # set by load_pretrained
    self.build()

  def build(self):
    """Sets `input`, `model` (and FrozenBiLM's `pretrained_dir`, `encoder_config`)."""
    config = self.config
    if config.model.head not in model_lib.HEADS:
      raise ValueError(f"config.model.head = {config.model.head!r}: expected one of {model_lib.HEADS}")
    self.input = input_lib.Input(config, head=config.model.head)
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    encoder_config = encoders.encoder_config(config.model.encoder, config.pretrained,
                                               num_visual_tokens=config.data.num_frames,
                                               visual_dim=self.input.visual_dim)
    self.model = model_lib.Model(
        **config.model, encoder_config=encoder_config, num_classes=len(self.input.answers_train),
        verbalizer=dict(config.verbalizer) if self.input.use_graph else None,
        verbalizer_call=self.input.verbalizer_call())
    self.encoder_config = self.model.lm_config

  # -- data (input.py) ------------------------------------------------------------------------------------------
  def source(self, split: str):
    return self.input.source(split)

  def preprocess(self, example: dict, train: bool) -> dict:
    return self.input.preprocess(example, train)

  def aux_inputs(self, split: str) -> dict:
    return self.input.aux_inputs(split)

  def aux_logical_axes(self, aux=None):
    return self.input.aux_logical_axes(aux)

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    dc = self.config.data
    return {"input_ids": jnp.zeros((1, dc.max_tokens), jnp.int32),
            "attention_mask": jnp.ones((1, dc.max_tokens), jnp.int32),
            "mask_index": jnp.zeros((1,), jnp.int32),
            "video": jnp.zeros((1, dc.num_frames, self.encoder_config.visual_dim), jnp.float32),
            "video_mask": jnp.ones((1, dc.num_frames), jnp.int32)}

  def init_params(self, rng):
    open_head = self.model.head != "cvqa_mlp"  # scored against answer embeddings: needs the vocabulary
    aux = jax.tree.map(jnp.asarray, self.aux_inputs(self.config.data.train_split)) if open_head else None
    return self.model.init({"params": rng}, self._dummy_batch(), aux)["params"]

  def load_pretrained(self, params: dict) -> dict:
    """The LM from pretrained.dir, then init_from: a FrozenBiLM checkpoint (LM, linear_video, adapters, LayerNorms)
    or an OVQA-trained one (the same, plus its GNN verbalizer: checkpoint.py)."""
    encoder, init_from = self.config.model.encoder, self.init_from
    params = dict(params)
    params["lm"] = encoders.load_encoder_weights(encoder, self.encoder_config, self.pretrained_dir, params["lm"])
    self.verbalizer_from_checkpoint = False
    if init_from:
      from evqa_jax.models import deberta_v2
      from evqa_jax.projects.ovqa import checkpoint
      if encoder != "deberta_v2":
        raise ValueError("config.pretrained.init_from loads a FrozenBiLM checkpoint, which holds a DeBERTa-v2: set "
                         "config.model.encoder = 'deberta_v2'")
      path = io_lib.local_copy(init_from, "init_from")
      ckpt = checkpoint.read(path, self.config.trust_pickles)
      lm, report = deberta_v2.load_frozenbilm_checkpoint(self.encoder_config, path, params["lm"], checkpoint=ckpt)
      log.info(f"Initialised from FrozenBiLM checkpoint {init_from}: {str(report).splitlines()[0]}")
      params["lm"] = lm
      layers = checkpoint.verbalizer_weights(ckpt, path)
      if layers:
        params = checkpoint.load_verbalizer(params, layers, self.config.verbalizer, path)
        self.verbalizer_from_checkpoint = True
        log.info(f"Initialised the GNN verbalizer from {init_from} ({len(layers)} layers)")
    return params

  def check_zero_shot(self) -> None:
    """Scoring the start weights (launch/evaluate.py --zero_shot, the paper's Table 6) with a learned verbalizer
    that no checkpoint filled would apply an untrained GNN / MLP: refused."""
    vc = self.config.verbalizer
    if (self.input.use_graph and canonical_variant(vc.variant) in LEARNED_VARIANTS
        and not self.verbalizer_from_checkpoint):
      raise ValueError(
          f"--zero_shot scores untrained weights, but config.verbalizer.variant = {vc.variant!r} is a learned "
          f"verbalizer that config.pretrained.init_from does not hold: the zero-shot Table 6 is FrozenBiLM+ "
          f"without a verbalizer: use --config=configs/ovqa_{self.config.dataset}.py:baseline (or "
          "--config.verbalizer.variant=A), or give an OVQA-trained checkpoint (with its GNN) as init_from")

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.trainable)

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
    vc, k = self.config.verbalizer, len(self.input.answers_train)
    kind = {"cvqa": f"CVQA (FrozenBiLM's head, top-{k} answers)", "cvqa_mlp": f"CVQA MLP (top-{k} answers)"}.get(
        self.model.head, "FrozenBiLM+" if not self.input.use_graph else f"FrozenBiLM+ with verbalizer {vc.variant} "
        f"eps={vc.eps}")
    return f"OVQA {kind} ({self.config.model.encoder})"
