"""VIOLIN models, built as `model_class(config)(**config.model, <values from the checkpoint and the data>)`:

  baseline    (`config.model_name`) the authors' baseline (baseline.ViolinBaseline) on token features of a FROZEN
              BERT-family encoder (`BaselineModel` below). The statement and the subtitles go through the encoder
              (last layer, one shared encoder); the features are under stop_gradient and the encoder's parameters live
              under `text_encoder/`, which `config.trainable` (default "^baseline/") leaves frozen.
  crossmodal  crossmodal.ViolinCrossModal (a BERT-family LM over [video tokens; statement; subtitles] with a
              classification head): a single joint encoder, so no cached text features.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax

from evqa_jax import pretrained
from evqa_jax.models import encoders
from evqa_jax.projects.violin import baseline as baseline_lib
from evqa_jax.projects.violin.crossmodal import ViolinCrossModal


class BaselineModel(nn.Module):
  """Frozen text encoder (online mode) + ViolinBaseline, scoring both statements of each pair.

  batch (online): statement_ids / statement_mask `[b, 2, Ls]` (pair order: positive, negative), subtitle_ids /
  subtitle_mask `[b, Lu]`, video `[b, T, D]`, video_mask `[b, T]`.
  batch (cached): statement_feat `[b, 2, Ls, H]` and subtitle_feat `[b, Lu, H]` instead of the ids.
  -> logits `[b, 2]` (positive, negative), pre-sigmoid. The clip (video, subtitles) is encoded once per pair.

  Fields down to `dtype` are `config.model`; `encoder_config` (the checkpoint's architecture) and `feature_dim` (the
  records') come from outside.
  """
  encoder: str = "bert"
  text_features: str = "online"  # online: the encoder runs in the step; cached: features come in the batch
  use_video: bool = True
  use_subtitles: bool = True
  single_frame: bool = False
  middle_frame: str = "lower"
  subtitle_lstm: bool = False
  hsize1: int = baseline_lib.HSIZE1
  hsize2: int = baseline_lib.HSIZE2
  embed_size: int = baseline_lib.EMBED_SIZE
  dropout: float = 0.5
  dtype: str = "float32"
  encoder_config: Any = None
  feature_dim: int = 0

  @property
  def lm_config(self):
    """The frozen text encoder's config: `encoder_config` at this model's dtype."""
    return dataclasses.replace(self.encoder_config, dtype=pretrained.dtype(self.dtype))

  def _encode(self, encoder, ids, mask):
    # Frozen features: no gradient flows into (or through) the encoder.
    return jax.lax.stop_gradient(encoder(ids, mask, deterministic=True)["hidden"])

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    lm_config = self.lm_config
    hidden = lm_config.hidden_size
    dtype = pretrained.dtype(self.dtype)
    if self.text_features == "online":
      encoder = encoders.ENCODERS[self.encoder](lm_config, name="text_encoder")
      b, _, ls = batch["statement_ids"].shape
      # [b, 2, Ls] -> [2b, Ls] interleaved (row 2i positive, 2i+1 negative of pair i): rows stay on their shard.
      statement = self._encode(encoder, batch["statement_ids"].reshape(2 * b, ls),
                               batch["statement_mask"].reshape(2 * b, ls)).reshape(b, 2, ls, hidden)
      subtitles = (self._encode(encoder, batch["subtitle_ids"], batch["subtitle_mask"])
                   if self.use_subtitles else None)
    else:
      statement = batch["statement_feat"]
      subtitles = batch["subtitle_feat"] if self.use_subtitles else None
    model = baseline_lib.ViolinBaseline(
        feature_dim=self.feature_dim, text_dim=hidden, use_video=self.use_video, use_subtitles=self.use_subtitles,
        single_frame=self.single_frame, dropout=self.dropout, dtype=dtype, middle_frame=self.middle_frame,
        subtitle_lstm=self.subtitle_lstm, hsize1=self.hsize1, hsize2=self.hsize2, embed_size=self.embed_size,
        name="baseline")
    return model(statement.astype(dtype), batch["statement_mask"],
                 subtitles, batch.get("subtitle_mask") if self.use_subtitles else None,
                 batch.get("video") if self.use_video else None,
                 batch.get("video_mask") if self.use_video else None,
                 deterministic=deterministic)


# config.model_name -> the model class.
MODELS = {"baseline": BaselineModel, "crossmodal": ViolinCrossModal}


def model_class(config):
  if config.model_name not in MODELS:
    raise ValueError(f"config.model_name = {config.model_name!r}: expected one of {sorted(MODELS)}")
  return MODELS[config.model_name]
