"""The OVQA backbones, one entry each in `BACKBONES`, picked by `config.model.backbone`.

The OVQA task (task.py) is one task for every backbone: records, answer vocabularies and graphs (input.py), the
cross-entropy over the active vocabulary, predictions and the official scorer (evaluator.py) are its own. A backbone
gives it the rest (`Backbone`):
- input pieces: the question's token arrays of one record (`text_inputs`) and the answer encoder's tokens
  (`answer_tokens`, for the answers and the answer-graph nodes);
- its model, `Model(**config.model, ...)` (`build_model`, `dummy_batch`; `model_class` is the Flax class, whose fields
  are exactly config.model's keys);
- its weight loaders (`load_pretrained`: config.pretrained.dir, then config.pretrained.init_from);
- what it changes in training: the parameters it trains (`trainable_patterns`), a frozen answer encoder computed once
  per split (`precomputes_aux`, `precompute_aux`), an auxiliary loss (`train_loss`).
Its config (the `:<name>` variant of configs/ovqa_*.py) is the entry of configs/ovqa_common.py's BACKBONES. A new
backbone is one entry in each table plus its own files (docs/architecture.md, "Adding an OVQA backbone").
"""

import abc
import importlib

# config.model.backbone -> "module:class" of its Backbone (imported on use: one backbone's modules never load another's).
BACKBONES = {
    "frozenbilm": "evqa_jax.projects.ovqa.backbones.frozenbilm:FrozenBiLM",  # FrozenBiLM+ and its CVQA rows
    "justask": "evqa_jax.projects.ovqa.backbones.justask:JustAsk",  # JustAsk and JustAsk+ (docs/justask.md)
    "allinone": "evqa_jax.projects.ovqa.backbones.allinone:AllInOne",  # All-in-one(+), from pixels
    "violet": "evqa_jax.projects.ovqa.backbones.violet:Violet",  # VIOLET(+), from pixels (Video Swin + BERT)
}


def backbone_class(name: str) -> type:
  """The Backbone class of `config.model.backbone`; ValueError naming the known ones otherwise."""
  if name not in BACKBONES:
    raise ValueError(f"config.model.backbone = {name!r}: expected one of {tuple(BACKBONES)}")
  module, attr = BACKBONES[name].split(":")
  return getattr(importlib.import_module(module), attr)


def build(config) -> "Backbone":
  return backbone_class(config.model.backbone)(config)


class Backbone(abc.ABC):
  """One OVQA backbone for `config`. Built before the input (its start point and head are checked before any data is
  read); `build_model(input)` then builds `self.model` from what the input holds (feature size, vocabularies, graphs)."""

  #: Its name in prose ("FrozenBiLM").
  title: str = ""
  #: The variant of configs/ovqa_*.py that picks it ("" for the default backbone).
  variant: str = ""
  #: The config.model.head values its model has.
  heads: tuple = ()
  #: What `init_from_missing` tells to pass: the authors' pretrained checkpoint file the paper configs start from,
  #: and the plain encoder that `init_from=none` trains instead.
  paper_checkpoint: str = ""
  plain_encoder: str = ""
  #: The Flax module `Model(**config.model, ...)` builds.
  model_class: type = None
  #: What its model reads of a video: "features" (pre-extracted, records of data_prep/ovqa.py: `video`, `video_mask`)
  #: or "frames" (pixels, records of data_prep/ovqa_frames.py: `frames` uint8 [T, H, W, 3]); the Input refuses
  #: records of the other kind.
  video_input: str = "features"

  def __init__(self, config):
    self.config = config
    self.init_from = self.init_from_path(config)
    if config.model.head not in self.heads:
      raise ValueError(f"config.model.head = {config.model.head!r}: {self.title}'s heads are {self.heads}")
    self.model = None  # build_model
    #: Whether load_pretrained filled a learned verbalizer (launch/evaluate.py --zero_shot refuses an untrained one).
    self.verbalizer_from_checkpoint = False

  @classmethod
  def init_from_path(cls, config) -> str:
    """`config.pretrained.init_from` -> the checkpoint (or run) to start from, or "" for none ("none" opts out).

    The paper configs (`pretrained.init_from_required`) fine-tune from the authors' pretrained checkpoint: with
    init_from empty they stop here, before any data is read, rather than quietly training another model."""
    value = str(config.pretrained.init_from or "").strip()
    if value.lower() == "none":
      return ""
    if not value and config.pretrained.init_from_required:
      raise ValueError(cls.init_from_missing(config))
    return value

  @classmethod
  def init_from_missing(cls, config) -> str:
    """The error when a paper config's init_from is empty: what to pass (and `none` for no checkpoint)."""
    variant = f":{cls.variant}" if cls.variant else ""
    return (f"config.pretrained.init_from is empty, but configs/ovqa_{config.dataset}.py{variant} (the paper's "
            f"settings) starts from {cls.title}'s pretrained checkpoint: pass --config.pretrained.init_from=PATH/"
            f"{cls.paper_checkpoint}, or --config.pretrained.init_from=none to start from plain {cls.plain_encoder} "
            "instead")

  # -- input pieces (input.py calls them) -----------------------------------------------------------------------
  @abc.abstractmethod
  def text_inputs(self, inp, example: dict) -> dict:
    """One record -> the question's fixed-shape arrays (token ids, masks) the model reads; `inp`: the Input."""

  @abc.abstractmethod
  def answer_tokens(self, inp, answers, pad_to: int):
    """Answer (or graph-node) words -> the answer encoder's `[pad_to, L]` ids and bool mask."""

  # -- model ----------------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def build_model(self, inp):
    """Sets and returns `self.model`, built from config.model, config.pretrained and the input `inp`."""

  @abc.abstractmethod
  def dummy_batch(self) -> dict:
    """A batch of one with the shapes `text_inputs` and the records give, for init."""

  # -- weights --------------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def load_pretrained(self, params: dict) -> dict:
    """Host params -> params with config.pretrained's weights filled in (sets `verbalizer_from_checkpoint`)."""

  # -- training -------------------------------------------------------------------------------------------------
  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.trainable)

  @property
  def precomputes_aux(self) -> bool:
    return False

  def precompute_aux(self, frozen_params, aux):
    del frozen_params
    return aux

  def train_loss(self, params, batch, rng, loss, metrics):
    """The VideoQA loss and metrics of a train step -> the ones the step optimises (an auxiliary loss added)."""
    del params, batch, rng
    return loss, metrics

  @abc.abstractmethod
  def describe(self, inp) -> str:
    """The run's one-line description (the row of the paper it trains)."""
