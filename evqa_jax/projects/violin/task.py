"""VIOLIN: video-and-language inference (does a statement follow from a video with subtitles?).

Input (records, annotation, tokens, cached frozen text features): input.py. Models (`config.model_name`): model.py.
Loss: the paired loss mean(-log p(pos) - log(1 - p(neg))) over both statements of each pair, which share the clip's
subtitles and video. Evaluation: evaluator.py (the official predictions JSON and accuracy).

Inputs of the Table 3 ablations (`config.model.use_video / use_subtitles / single_frame`): statement only,
+ subtitles, + video, + both, and the single middle frame.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from evqa_jax import pretrained

from evqa_jax.models import encoders
from evqa_jax.projects import base
from evqa_jax.projects.violin import baseline
from evqa_jax.projects.violin import evaluator
from evqa_jax.projects.violin import input as input_lib
from evqa_jax.projects.violin import model as model_lib


class Task(base.Task):
  main_metric = "accuracy"

  def __init__(self, config):
    super().__init__(config)
    mc, dc = config.model, config.data
    cls = model_lib.model_class(config)
    crossmodal = issubclass(cls, model_lib.ViolinCrossModal)  # one joint encoder (the cross-modal LM or LXMERT)
    if not crossmodal and mc.text_features not in ("online", "cached"):
      raise ValueError(f"config.model.text_features = {mc.text_features!r}: expected 'online' or 'cached'")
    if mc.single_frame and not mc.use_video:
      raise ValueError("config.model.single_frame = True needs config.model.use_video = True")
    self.glove = not crossmodal and mc.encoder == "glove"
    if self.glove and mc.text_features != "online":
      raise ValueError(f"config.model.text_features = {mc.text_features!r}: the GloVe text encoder (an embedding "
                       "table and an LSTM, both trained) has no frozen features to cache; use 'online'")
    self.online = crossmodal or mc.text_features == "online"
    self.input = input_lib.Input(config, online=self.online)
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    if crossmodal and config.pretrained.init_from:
      raise ValueError("config.pretrained.init_from (the BERT fine-tuning stage's workdir) is read by the baseline "
                       f"model only; the {config.model_name} model starts from config.pretrained.dir")
    if self.glove and config.pretrained.init_from:
      raise ValueError("config.pretrained.init_from (the BERT fine-tuning stage's workdir) has no use with the GloVe "
                       "text encoder (config.model.encoder = 'glove'); leave it empty")
    if self.glove:  # word ids -> GloVe table (load_pretrained) -> the baseline's LSTM text encoder
      self.model = cls(**mc, feature_dim=self.input.feature_dim, vocab_size=len(self.input.words),
                       word_dim=config.word_vectors.dim)
    elif cls is model_lib.ViolinLxmert:  # the frames are LXMERT's objects, read by its own visn_fc
      encoder_config = encoders.encoder_config(mc.encoder, config.pretrained)
      if getattr(encoder_config, "visual_feat_dim", None) != self.input.feature_dim:
        raise ValueError(f"config.model_name = 'lxmert': the records' frames are {self.input.feature_dim}-d "
                         f"(config.data.feature_dim) but the LXMERT checkpoint (config.pretrained.dir / shape) reads "
                         f"{getattr(encoder_config, 'visual_feat_dim', None)}-d objects (visual_feat_dim); convert "
                         "2048-d features (--feature det or resnet) for it")
      self.model = cls(**mc, encoder_config=encoder_config)
    elif crossmodal:  # the LM reads the frames itself: one visual token per frame slot
      encoder_config = encoders.encoder_config(mc.encoder, config.pretrained, num_visual_tokens=dc.max_frames,
                                                 visual_dim=self.input.feature_dim)
      self.model = cls(**mc, encoder_config=encoder_config)
    else:
      encoder_config = encoders.encoder_config(mc.encoder, config.pretrained)
      self.model = cls(**mc, encoder_config=encoder_config, feature_dim=self.input.feature_dim)
    self.encoder_config = self.model.lm_config
    self._encoder_params = None
    if not self.online:  # build (or open) the caches now, not inside the data loader's first batch
      self.input.use_text_encoder(mc.encoder, self.encoder_config, self.encoder_params, self.weights_identity())
      self.input.text_cache("statement")
      if mc.use_subtitles:
        self.input.text_cache("subtitle")

  def encoder_params(self) -> dict:
    """Host params of the frozen text encoder (computed once): the fine-tuning stage's (config.pretrained.init_from),
    else config.pretrained.dir's, else a seeded random init."""
    if self._encoder_params is None:
      pc = self.config.pretrained
      if pc.init_from:
        self._encoder_params, self._weights_identity = input_lib.fine_tuned_encoder_params(
            pc.init_from, self.config.model.encoder, self.encoder_config, self.config.checkpoint.allow_unverified)
      else:
        self._encoder_params = input_lib.frozen_encoder_params(self.config.model.encoder, self.encoder_config,
                                                               self.pretrained_dir, pc.encoder_seed)
    return self._encoder_params

  def weights_identity(self) -> str:
    """What the frozen encoder's weights are (the text-feature cache key)."""
    if self.config.pretrained.init_from:
      self.encoder_params()
      return self._weights_identity
    return input_lib.weights_identity(self.pretrained_dir, self.config.pretrained.encoder_seed)

  # -- data (input.py) ------------------------------------------------------------------------------------------
  def source(self, split: str):
    return self.input.source(split)

  def preprocess(self, example: dict, train: bool) -> dict:
    return self.input.preprocess(example, train)

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    mc, dc = self.config.model, self.config.data
    ls, lu = dc.max_statement_tokens, dc.max_subtitle_tokens
    h = None if self.online else self.encoder_config.hidden_size
    batch = {"statement_mask": jnp.ones((1, 2, ls), jnp.int32)}
    if self.online:
      batch["statement_ids"] = jnp.ones((1, 2, ls), jnp.int32)
    else:
      batch["statement_feat"] = jnp.zeros((1, 2, ls, h), jnp.float32)
    if mc.use_subtitles:
      batch["subtitle_mask"] = jnp.ones((1, lu), jnp.int32)
      if self.online:
        batch["subtitle_ids"] = jnp.ones((1, lu), jnp.int32)
      else:
        batch["subtitle_feat"] = jnp.zeros((1, lu, h), jnp.float32)
    if mc.use_video:
      batch["video"] = jnp.zeros((1, dc.max_frames, self.input.feature_dim), jnp.float32)
      batch["video_mask"] = jnp.ones((1, dc.max_frames), jnp.int32)
    return batch

  def init_params(self, rng):
    return self.model.init({"params": rng, "dropout": rng}, self._dummy_batch(), deterministic=True)["params"]

  def load_pretrained(self, params: dict) -> dict:
    params = dict(params)
    if "word_embeddings" in params:  # GloVe: the table of the training text's words
      table = self.input.words.matrix()
      want = params["word_embeddings"]["embedding"].shape
      if table.shape != want:
        raise ValueError(f"word table {table.shape} from {self.config.word_vectors.source!r} does not fit the "
                         f"model's word_embeddings {want}")
      params["word_embeddings"] = {"embedding": table}
    if "text_encoder" in params:
      enc = self.encoder_params()
      ours = jax.tree.structure(params["text_encoder"])
      if jax.tree.structure(enc) != ours:
        raise ValueError("text encoder parameters from the checkpoint do not match the model's parameter tree")
      params["text_encoder"] = enc
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.trainable)

  def _logits(self, params, batch, rng, train: bool):
    rngs = {"dropout": rng} if train else {}
    return self.model.apply({"params": params}, batch, deterministic=not train, rngs=rngs)

  def loss(self, params, batch, aux, rng, train: bool = True):
    del aux
    logits = self._logits(params, batch, rng, train)
    pos, neg = logits[:, 0], logits[:, 1]
    if "_valid" in batch:  # evaluation batches padded to the static shape
      valid = batch["_valid"] > 0
      per_pair = -jax.nn.log_sigmoid(pos) - jax.nn.log_sigmoid(-neg)
      n = jnp.maximum(jnp.sum(valid), 1)
      loss = jnp.sum(jnp.where(valid, per_pair, 0.0)) / n
      correct = jnp.sum(jnp.where(valid, (pos >= 0).astype(jnp.int32) + (neg < 0).astype(jnp.int32), 0))
      return loss, {"accuracy": correct / (2 * n)}
    loss = baseline.paired_loss(pos, neg)
    correct, total = baseline.violin_accuracy(pos, neg)
    return loss, {"accuracy": correct / total}

  def predict(self, params, batch, aux) -> dict:
    del aux
    probs = jax.nn.sigmoid(self._logits(params, batch, None, train=False).astype(jnp.float32))
    return {"p_pos": probs[:, 0], "p_neg": probs[:, 1], "clip": batch["clip"], "pair": batch["pair"]}

  # -- evaluation (evaluator.py) --------------------------------------------------------------------------------
  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    return evaluator.evaluate(self.input, split, outputs, out_dir)

  def describe(self) -> str:
    mc = self.config.model
    inputs = ["statement"] + (["subtitles"] if mc.use_subtitles else []) + (
        ["video (single middle frame)" if mc.single_frame else "video"] if mc.use_video else [])
    features = ("GloVe words, LSTM" if self.glove else "online features" if self.online else "cached features")
    return (f"VIOLIN {self.config.model_name} ({mc.encoder} text, {features}; inputs: "
            f"{' + '.join(inputs)}; {self.config.data.feature} features)")


def make_task(config) -> base.Task:
  """`config.task = "violin"` (projects.TASKS): the inference task, or the BERT fine-tuning stage that runs before it
  (`config.model_name = "bert_mlm"`, configs/violin_bert_ft.py; bert_ft.py)."""
  if config.model_name == "bert_mlm":
    from evqa_jax.projects.violin import bert_ft  # pylint: disable=g-import-not-at-top
    return bert_ft.Task(config)
  return Task(config)
