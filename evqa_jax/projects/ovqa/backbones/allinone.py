"""The All-in-one backbone (`config.model.backbone = "allinone"`, the `:allinone` variant): All-in-one (head "cvqa",
the authors' classifier over the top-k train answers) and All-in-one+ (head "open": similarity against a frozen answer
encoder's embeddings, optionally through the GNN soft verbalizer), from pixels. The ViT: evqa_jax/models/allinone.py.

Inputs (the authors' msrvttqa.py `get_text`): the question alone, `[CLS] question [SEP]` with BERT's uncased
tokenizer (config.pretrained.tokenizer), truncated and padded to config.data.max_tokens (their max_text_len, 40);
frames uint8 `[T, S, S, 3]` (config.data.num_frames = 3, frame_size = 224: OVQA appendix B), normalised inside.

Heads on the pooled [CLS] feature (`cls_feats`, their Pooler):
- "cvqa": their `openend_vqa` classifier, Dropout(0.5) -> Linear(D, D/2) -> LayerNorm(D/2, eps 1e-5) -> GELU ->
  Linear(D/2, k) over the top-k train answers (the OVQA appendix's k: MSVD 1000, MSRVTT 1500, ActivityNet 1000, TGIF
  1540; their code adds one background class for out-of-vocabulary rows, which the OVQA task instead leaves out of
  training and scores as wrong).
- "open" (All-in-one+): the same MLP with its last layer sized to the answer embeddings (OVQA section 3.2: the
  classifier replaced by the similarity with answer embeddings), logits = feature . answer embedding (no bias, no
  temperature) over V_train in training and V_test in evaluation; the answer embeddings are the frozen answer
  encoder's (answer_encoders.py; DeBERTa's word embeddings by default) computed once per split, refined by the GNN
  verbalizer when config.verbalizer.variant reads the graph.

Weights: config.pretrained.init_from, the authors' released checkpoint (all-in-one-base.ckpt, a PyTorch Lightning
.ckpt: its state_dict, read with torch's weights_only unpickler unless config.trust_pickles; or a safetensors export
of it) by parameter name (models/allinone.checkpoint_rules); a classifier of the same size is taken too. The answer
encoder from config.pretrained.answer_dir.
"""

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax.models import allinone as allinone_lib
from evqa_jax.models import encoders, hf_utils, layers
from evqa_jax.models.layers import ACTIVATIONS
from evqa_jax.projects.ovqa.backbones import Backbone
from evqa_jax.projects.ovqa.backbones import answer_encoders
from evqa_jax.projects.ovqa.backbones.text import padded_tokens

HEADS = ("open", "cvqa")


class VQAClassifier(nn.Module):
  """Their `vqa_classifier` for openend_vqa: Dropout(p) -> fc1 (D -> D/2) -> norm (eps 1e-5) -> GELU -> fc2."""
  hidden_size: int
  out_size: int
  dropout: float = 0.5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = layers.dense(self.hidden_size // 2, ("embed", "mlp"), "fc1", self.dtype, stddev=0.02)(x)
    x = layers.layer_norm("norm", self.dtype, epsilon=1e-5, axis="mlp")(x)
    x = ACTIVATIONS["gelu"](x)
    return layers.dense(self.out_size, ("mlp", None), "fc2", self.dtype, stddev=0.02)(x)


class Model(nn.Module, answer_encoders.FrozenAnswerHead):
  """All-in-one / All-in-one+; built as `Model(**config.model, vit=..., num_classes=..., answer_spec=...,
  verbalizer=..., verbalizer_call=...)`: the fields down to `remat` are config.model's.

  Attributes:
    backbone: "allinone". head: "cvqa" or "open". answer_encoder: "deberta" or "clip" (answer_encoders.py).
    head_dropout: the classifier's input dropout (their 0.5). dtype, remat: compute dtype and per-block remat.
    vit: the models.allinone.AllInOneConfig (config.pretrained.shape). num_classes: k (head "cvqa").
    answer_spec: answer_encoders.AnswerEncoderSpec (head "open"). verbalizer, verbalizer_call: as model.Model.
  """
  backbone: str = "allinone"
  head: str = "open"
  answer_encoder: str = "deberta"
  head_dropout: float = 0.5
  dtype: str = "float32"
  remat: str = "none"
  vit: Any = None
  num_classes: int = 0
  answer_spec: Any = None
  verbalizer: Optional[dict] = None
  verbalizer_call: Optional[dict] = None

  @property
  def vit_config(self) -> allinone_lib.AllInOneConfig:
    return dataclasses.replace(self.vit, dtype=encoders.dtype(self.dtype), remat=self.remat)

  def setup(self):
    if self.backbone != "allinone":
      raise ValueError(f"config.model.backbone = {self.backbone!r}: this is the All-in-one model")
    if self.head not in HEADS:
      raise ValueError(f"config.model.head = {self.head!r}: All-in-one's heads are {HEADS}")
    if self.head != "open" and self.verbalizer is not None:
      raise ValueError(f"config.model.head = {self.head!r} scores a fixed answer set: the GNN verbalizer is for "
                       "head 'open' only (set config.verbalizer.variant = 'A')")
    cfg = self.vit_config
    self.allinone = allinone_lib.AllInOne(cfg)
    if self.head == "cvqa":
      if self.num_classes < 1:
        raise ValueError("All-in-one head 'cvqa': num_classes (the top-k answers) must be >= 1")
      self.vqa_classifier = VQAClassifier(cfg.hidden_size, self.num_classes, self.head_dropout, cfg.dtype)
    else:
      self.vqa_classifier = VQAClassifier(cfg.hidden_size, self.answer_spec.dim, self.head_dropout, cfg.dtype)
      self.answer_encoder_module = self.answer_spec.module("answer_encoder")
      if self.verbalizer is not None:
        from evqa_jax.models.verbalizer import Verbalizer
        self.verbalizer_module = Verbalizer(**self.verbalizer, dtype=cfg.dtype, name="verbalizer")

  def features(self, batch, deterministic: bool = True):
    """-> the pooled [CLS] feature `[b, D]` (their `cls_feats`)."""
    return self.allinone(batch["frames"], batch["text_ids"], batch["text_mask"], deterministic)["cls_feats"]

  def __call__(self, batch, vocab, deterministic: bool = True):
    """-> logits `[b, A]` over the padded answer vocabulary (padding at the float32 minimum)."""
    out = self.vqa_classifier(self.features(batch, deterministic), deterministic).astype(jnp.float32)
    return self.score(out, vocab, self.num_classes, self.head == "cvqa", "All-in-one")


# ------------------------------------------------------------------------------------------ weight import


def checkpoint_rules(model: Model) -> dict:
  """Our flat param path -> rule over the authors' state dict: the All-in-one ViT under `allinone/` and, when its
  output size matches, their `vqa_classifier` (Sequential: 0 Dropout, 1 Linear, 2 LayerNorm, 3 GELU, 4 Linear)."""
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  rules = allinone_lib.checkpoint_rules(model.vit_config, ours="allinone/")
  for ours, theirs in (("fc1", "1"), ("fc2", "4")):
    rules[f"vqa_classifier/{ours}/kernel"] = rule((f"vqa_classifier.{theirs}.weight",), lin)
    rules[f"vqa_classifier/{ours}/bias"] = rule((f"vqa_classifier.{theirs}.bias",))
  rules["vqa_classifier/norm/scale"] = rule(("vqa_classifier.2.weight",))
  rules["vqa_classifier/norm/bias"] = rule(("vqa_classifier.2.bias",))
  return rules


def load_checkpoint(model: Model, path: str, params: dict, trust_pickles: bool = False):
  """The authors' checkpoint (`allinone_lib.read_checkpoint`) into `params` by name. Every ViT parameter must be in
  it; a `vqa_classifier` of another output size (their k + 1 classes, or a pretraining checkpoint without one) is
  left at init. Returns (params, report)."""
  ckpt = allinone_lib.inflate_temporal_embed(allinone_lib.read_checkpoint(path, trust_pickles),
                                             model.vit_config.num_frames)
  flat_init = hf_utils.flatten_params(hf_utils.params_of(params))
  rules = checkpoint_rules(model)
  head_keys = [k for k in rules if k.startswith("vqa_classifier/")]
  if any(k in flat_init and all(t in ckpt for t in rules[k].keys) and
         np.shape(rules[k].apply([ckpt[t] for t in rules[k].keys])) != np.shape(flat_init[k]) for k in head_keys):
    rules = {k: v for k, v in rules.items() if not k.startswith("vqa_classifier/")}
  flat, report = hf_utils.assemble(flat_init, ckpt, rules, source=path, init=flat_init,
                                   ignore=allinone_lib.CHECKPOINT_IGNORE + (r"^vqa_classifier\.",),
                                   required=(r"^allinone/",))
  return hf_utils.unflatten_params(flat), report


class AllInOne(answer_encoders.FrozenAnswerBackbone, Backbone):
  """All-in-one (head "cvqa") and All-in-one+ (head "open", optionally with the GNN verbalizer)."""
  title = "All-in-one"
  variant = "allinone"
  heads = HEADS
  model_class = Model
  video_input = "frames"

  paper_checkpoint = "all-in-one-base.ckpt (or its safetensors export)"
  plain_encoder = "ViT and BERT embeddings (random weights)"

  def text_inputs(self, inp, example: dict) -> dict:
    """`[CLS] question [SEP]` ids and mask (their get_text: the bare question)."""
    question = str(example["question"])
    if not question.strip():
      raise ValueError(f"record {int(example['index'])} of {inp.data_dir}: empty question")
    ids, mask = padded_tokens(inp.tokenizer, question, self.config.data.max_tokens)
    return {"text_ids": ids, "text_mask": mask}

  def vit_config(self, inp=None) -> allinone_lib.AllInOneConfig:
    config = self.config
    shape = dict(config.pretrained.shape or {})
    if not shape:
      raise ValueError("config.pretrained.shape is empty: give All-in-one's architecture (configs/"
                       "ovqa_allinone_common.py ALLINONE_BASE)")
    vit = allinone_lib.AllInOneConfig.from_dict(shape, num_frames=config.data.num_frames,
                                                image_size=config.data.frame_size)
    if inp is not None and len(inp.tokenizer) > vit.vocab_size:
      raise ValueError(f"the tokenizer has {len(inp.tokenizer)} ids but All-in-one's vocabulary is {vit.vocab_size} "
                       "(config.pretrained.tokenizer / shape)")
    if config.data.max_tokens > vit.max_text_len:
      raise ValueError(f"config.data.max_tokens = {config.data.max_tokens} > All-in-one's max_text_len "
                       f"{vit.max_text_len} (its text position embeddings)")
    return vit

  def build_model(self, inp):
    config = self.config
    open_head = config.model.head == "open"
    self.model = Model(**config.model, vit=self.vit_config(inp), num_classes=len(inp.answers_train),
                       answer_spec=self.answer_spec if open_head else None,
                       verbalizer=dict(config.verbalizer) if inp.use_graph else None,
                       verbalizer_call=inp.verbalizer_call())
    return self.model

  def dummy_batch(self) -> dict:
    dc = self.config.data
    return {"frames": jnp.zeros((1, dc.num_frames, dc.frame_size, dc.frame_size, 3), jnp.uint8),
            "text_ids": jnp.zeros((1, dc.max_tokens), jnp.int32),
            "text_mask": jnp.ones((1, dc.max_tokens), jnp.int32)}

  def load_pretrained(self, params: dict) -> dict:
    params = self.load_answer_encoder(params)
    self.verbalizer_from_checkpoint = False
    if not self.init_from:
      return params
    path = io_lib.local_copy(self.init_from, "init_from")
    params, report = load_checkpoint(self.model, path, params, trust_pickles=self.config.trust_pickles)
    log.info(f"Initialised from All-in-one checkpoint {self.init_from}: {str(report).splitlines()[0]}")
    return params

  def describe(self, inp) -> str:
    vc, k, vit = self.config.verbalizer, len(inp.answers_train), self.model.vit_config
    kind = (f"All-in-one (CVQA, top-{k} answers)" if self.model.head == "cvqa" else
            f"All-in-one+ with verbalizer {vc.variant} eps={vc.eps}" if inp.use_graph else "All-in-one+")
    enc = "" if self.model.head == "cvqa" else f"; frozen {self.config.model.answer_encoder} answer encoder"
    return (f"OVQA {kind} (ViT {vit.num_hidden_layers}x{vit.hidden_size}, {vit.num_frames} frames at "
            f"{vit.image_size}, patch {vit.patch_size}{enc})")
