"""The VIOLET backbone (`config.model.backbone = "violet"`, the `:violet` variant): VIOLET (head "cvqa", the authors'
open-ended QA classifier over the top-k train answers) and VIOLET+ (head "open": similarity against a frozen answer
encoder's embeddings, optionally through the GNN soft verbalizer), from pixels. The network: evqa_jax/models/violet.py
(its Video Swin Transformer: models/video_swin.py).

Inputs (the authors' dataset.py `str2txt`, main_qaoe.py): the question alone, BERT's uncased tokenizer
(config.pretrained.tokenizer) `[CLS] question [SEP]` truncated and padded to config.data.max_tokens (their size_txt,
25), the mask `ids != 0`; frames uint8 `[T, S, S, 3]` (config.data.num_frames = 5, frame_size = 224: OVQA appendix B;
their str2img pads each frame to a square and resizes it, data_prep.ovqa_frames' "violet" recipe), normalised inside;
no train-time augmentation (config.data.augment = "none", as their QA fine-tuning).

Heads on the text [CLS] row of the cross-modal transformer, their `fc` (Dropout(0.1) -> Linear(768, 1536) -> ReLU ->
Linear(1536, out)):
- "cvqa": out = k, the top-k train answers (the OVQA appendix's k: MSVD 1000, MSRVTT 1500, TGIF 1540, ActivityNet
  1654), their CrossEntropyLoss;
- "open" (VIOLET+): out = the answer encoder's width; logits = feature . answer embedding (answer_encoders.py's
  FrozenAnswerHead, as All-in-one+), V_train in training, V_test in evaluation.

Weights: config.pretrained.init_from, the authors' checkpoint (ckpt_violet_pretrain.pt, or a fine-tuned
ckpt_violet_<task>_<epoch>.pt: a PyTorch state dict, read with torch's weights_only unpickler unless
config.trust_pickles; or a safetensors export) by parameter name (models/violet.checkpoint_rules); a classifier of
another width stays at init, as their load_ckpt. The answer encoder from config.pretrained.answer_dir.
"""

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax.models import bert, encoders, video_swin
from evqa_jax.models import violet as violet_lib
from evqa_jax.projects.ovqa.backbones import Backbone
from evqa_jax.projects.ovqa.backbones import answer_encoders

HEADS = ("open", "cvqa")


class Model(nn.Module, answer_encoders.FrozenAnswerHead):
  """VIOLET / VIOLET+; built as `Model(**config.model, swin=..., text=..., num_classes=..., answer_spec=...,
  verbalizer=..., verbalizer_call=...)`: the fields down to `remat` are config.model's.

  Attributes:
    backbone: "violet". head: "cvqa" or "open". answer_encoder: "deberta" or "clip" (answer_encoders.py).
    head_dropout: fc's input dropout (their 0.1). dtype, remat: compute dtype and the cross-modal layers' remat.
    swin: models.video_swin.VideoSwinConfig. text: models.bert.BertConfig (the cross-modal transformer and the text
    embeddings). num_classes: k (head "cvqa"). answer_spec: answer_encoders.AnswerEncoderSpec (head "open").
    verbalizer, verbalizer_call: as model.Model.
  """
  backbone: str = "violet"
  head: str = "open"
  answer_encoder: str = "deberta"
  head_dropout: float = 0.1
  dtype: str = "float32"
  remat: str = "none"
  swin: Any = None
  text: Any = None
  num_classes: int = 0
  answer_spec: Any = None
  verbalizer: Optional[dict] = None
  verbalizer_call: Optional[dict] = None

  @property
  def network(self) -> violet_lib.Violet:
    """The VIOLET network (unbound): what models/violet.load_checkpoint fills under `violet/`."""
    dt = encoders.dtype(self.dtype)
    out = self.num_classes if self.head == "cvqa" else self.answer_spec.dim
    return violet_lib.Violet(dataclasses.replace(self.swin, dtype=dt),
                             dataclasses.replace(self.text, dtype=dt, remat=self.remat), out,
                             head_dropout=self.head_dropout)

  def setup(self):
    if self.backbone != "violet":
      raise ValueError(f"config.model.backbone = {self.backbone!r}: this is the VIOLET model")
    if self.head not in HEADS:
      raise ValueError(f"config.model.head = {self.head!r}: VIOLET's heads are {HEADS}")
    if self.head != "open" and self.verbalizer is not None:
      raise ValueError(f"config.model.head = {self.head!r} scores a fixed answer set: the GNN verbalizer is for "
                       "head 'open' only (set config.verbalizer.variant = 'A')")
    if self.head == "cvqa" and self.num_classes < 1:
      raise ValueError("VIOLET head 'cvqa': num_classes (the top-k answers) must be >= 1")
    self.violet = self.network.clone(name="violet")
    if self.head == "open":
      self.answer_encoder_module = self.answer_spec.module("answer_encoder")
      if self.verbalizer is not None:
        from evqa_jax.models.verbalizer import Verbalizer  # pylint: disable=g-import-not-at-top
        self.verbalizer_module = Verbalizer(**self.verbalizer, dtype=encoders.dtype(self.dtype), name="verbalizer")

  def __call__(self, batch, vocab, deterministic: bool = True):
    """-> logits `[b, A]` over the padded answer vocabulary (padding at the float32 minimum)."""
    out = self.violet(batch, deterministic).astype(jnp.float32)
    return self.score(out, vocab, self.num_classes, self.head == "cvqa", "VIOLET")


class Violet(answer_encoders.FrozenAnswerBackbone, Backbone):
  """VIOLET (head "cvqa") and VIOLET+ (head "open", optionally with the GNN verbalizer)."""
  title = "VIOLET"
  variant = "violet"
  heads = HEADS
  model_class = Model
  video_input = "frames"

  @staticmethod
  def init_from_missing(config) -> str:
    return (f"config.pretrained.init_from is empty, but configs/ovqa_{config.dataset}.py:violet (the paper's "
            "settings) fine-tunes the authors' pretrained VIOLET: pass --config.pretrained.init_from=PATH/"
            "ckpt_violet_pretrain.pt (or its safetensors export), or --config.pretrained.init_from=none to start "
            "from random weights")

  def text_inputs(self, inp, example: dict) -> dict:
    """`[CLS] question [SEP]` ids padded with 0 (their str2txt; the mask is ids != 0)."""
    question = str(example["question"])
    if not question.strip():
      raise ValueError(f"record {int(example['index'])} of {inp.data_dir}: empty question")
    enc = inp.tokenizer(question, max_length=self.config.data.max_tokens, truncation=True, padding="max_length")
    return {"question_ids": np.asarray(enc["input_ids"], np.int32)}

  def configs(self, inp=None):
    """(VideoSwinConfig, BertConfig) of config.pretrained.swin_shape and config.pretrained.shape."""
    pc, dc = self.config.pretrained, self.config.data
    if not pc.shape or not pc.swin_shape:
      raise ValueError("config.pretrained.shape / swin_shape is empty: give VIOLET's architecture (configs/"
                       "ovqa_violet_common.py VIOLET_BERT, VIOLET_SWIN)")
    swin = video_swin.VideoSwinConfig.from_dict(dict(pc.swin_shape))
    text = bert.BertConfig.from_dict(dict(pc.shape))
    if inp is not None and len(inp.tokenizer) > text.vocab_size:
      raise ValueError(f"the tokenizer has {len(inp.tokenizer)} ids but VIOLET's vocabulary is {text.vocab_size} "
                       "(config.pretrained.tokenizer / shape)")
    if dc.max_tokens > text.max_position_embeddings:
      raise ValueError(f"config.data.max_tokens = {dc.max_tokens} > VIOLET's max_position_embeddings "
                       f"{text.max_position_embeddings}")
    if dc.num_frames > 6:
      raise ValueError(f"config.data.num_frames = {dc.num_frames}: VIOLET's frame embeddings (emb_len) hold 6")
    side = -(-dc.frame_size // swin.stride)
    if side * side > 14 ** 2:
      raise ValueError(f"config.data.frame_size = {dc.frame_size}: {side}x{side} patches per frame, VIOLET's "
                       "position embeddings (emb_pos) hold 14x14 (frame_size <= 448)")
    return swin, text

  def build_model(self, inp):
    config = self.config
    swin, text = self.configs(inp)
    self.model = Model(**config.model, swin=swin, text=text, num_classes=len(inp.answers_train),
                       answer_spec=self.answer_spec if config.model.head == "open" else None,
                       verbalizer=dict(config.verbalizer) if inp.use_graph else None,
                       verbalizer_call=inp.verbalizer_call())
    return self.model

  def dummy_batch(self) -> dict:
    dc = self.config.data
    return {"frames": jnp.zeros((1, dc.num_frames, dc.frame_size, dc.frame_size, 3), jnp.uint8),
            "question_ids": jnp.ones((1, dc.max_tokens), jnp.int32)}

  def load_pretrained(self, params: dict) -> dict:
    params = self.load_answer_encoder(params)
    self.verbalizer_from_checkpoint = False
    if not self.init_from:
      return params
    path = io_lib.local_copy(self.init_from, "init_from")
    params["violet"], report = violet_lib.load_checkpoint(self.model.network, path, params["violet"],
                                                          trust_pickles=self.config.trust_pickles)
    log.info(f"Initialised from VIOLET checkpoint {self.init_from}: {str(report).splitlines()[0]}")
    return params

  def describe(self, inp) -> str:
    vc, k = self.config.verbalizer, len(inp.answers_train)
    swin, dc = self.model.swin, self.config.data
    kind = (f"VIOLET (CVQA, top-{k} answers)" if self.model.head == "cvqa" else
            f"VIOLET+ with verbalizer {vc.variant} eps={vc.eps}" if inp.use_graph else "VIOLET+")
    enc = "" if self.model.head == "cvqa" else f"; frozen {self.config.model.answer_encoder} answer encoder"
    return (f"OVQA {kind} (Video Swin {swin.embed_dim}x{swin.depths}, BERT {self.model.text.num_hidden_layers}x"
            f"{self.model.text.hidden_size}, {dc.num_frames} frames at {dc.frame_size}{enc})")
