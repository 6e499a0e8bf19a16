"""VIOLIN models, built as `model_class(config)(**config.model, <values from the checkpoint and the data>)`:

  baseline    (`config.model_name`) the authors' baseline (baseline.ViolinBaseline) on token features of a FROZEN
              BERT-family encoder (`BaselineModel` below). The statement and the subtitles go through the encoder
              (last layer, one shared encoder); the features are under stop_gradient and the encoder's parameters live
              under `text_encoder/`, which `config.trainable` (default "^baseline/") leaves frozen.
              With `encoder="glove"` (configs/violin.py:glove, Table 3's GloVe rows) the text is word ids instead:
              a GloVe-initialised embedding table `word_embeddings/embedding [vocab, word_dim]` (trainable as in
              TVQA unless config.trainable leaves it out) feeds the baseline's LSTM text encoder.
  crossmodal  crossmodal.ViolinCrossModal (a BERT-family LM over [video tokens; statement; subtitles] with a
              classification head): a single joint encoder, so no cached text features.
  lxmert      lxmert_model.ViolinLxmert (Table 3's LXMERT row: LXMERT's encoder over [statement; subtitles] and one
              object per frame, LXMERT's head on its pooled output; everything trains).
  bert_mlm    `BertMLM` below: the BERT fine-tuning stage on VIOLIN text (masked LM) that runs before the encoder is
              frozen (configs/violin_bert_ft.py; task in bert_ft.py). Its encoder lives under `text_encoder/` too, so
              the baseline takes it as it is (`config.pretrained.init_from`).
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from evqa_jax.models import encoders
from evqa_jax.projects.violin import baseline as baseline_lib
from evqa_jax.projects.violin.crossmodal import ViolinCrossModal
from evqa_jax.projects.violin.lxmert_model import ViolinLxmert


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
  vocab_size: int = 0  # glove: rows of the word table (the data's vocabulary)
  word_dim: int = 0  # glove: word-vector size (300 for GloVe 840B / 6B 300d)

  @property
  def lm_config(self):
    """The frozen text encoder's config: `encoder_config` at this model's dtype (None for GloVe)."""
    if self.encoder == "glove":
      return None
    return dataclasses.replace(self.encoder_config, dtype=encoders.dtype(self.dtype))

  def _encode(self, encoder, ids, mask):
    # Frozen features: no gradient flows into (or through) the encoder.
    return jax.lax.stop_gradient(encoder(ids, mask, deterministic=True)["hidden"])

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    dtype = encoders.dtype(self.dtype)
    glove = self.encoder == "glove"
    if glove:
      # Word ids -> word vectors; the table is loaded from GloVe by the task (load_pretrained).
      embed = nn.Embed(self.vocab_size, self.word_dim, param_dtype=jnp.float32, name="word_embeddings",
                       embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.4), ("vocab", "embed")))
      hidden = self.word_dim
      statement = embed(batch["statement_ids"])
      subtitles = embed(batch["subtitle_ids"]) if self.use_subtitles else None
    elif self.text_features == "online":
      lm_config = self.lm_config
      hidden = lm_config.hidden_size
      encoder = encoders.ENCODERS[self.encoder](lm_config, name="text_encoder")
      b, _, ls = batch["statement_ids"].shape
      # [b, 2, Ls] -> [2b, Ls] interleaved (row 2i positive, 2i+1 negative of pair i): rows stay on their shard.
      statement = self._encode(encoder, batch["statement_ids"].reshape(2 * b, ls),
                               batch["statement_mask"].reshape(2 * b, ls)).reshape(b, 2, ls, hidden)
      subtitles = (self._encode(encoder, batch["subtitle_ids"], batch["subtitle_mask"])
                   if self.use_subtitles else None)
    else:
      hidden = self.lm_config.hidden_size
      statement = batch["statement_feat"]
      subtitles = batch["subtitle_feat"] if self.use_subtitles else None
    model = baseline_lib.ViolinBaseline(
        feature_dim=self.feature_dim, text_dim=hidden, use_video=self.use_video, use_subtitles=self.use_subtitles,
        single_frame=self.single_frame, dropout=self.dropout, dtype=dtype, middle_frame=self.middle_frame,
        subtitle_lstm=self.subtitle_lstm, hsize1=self.hsize1, hsize2=self.hsize2, embed_size=self.embed_size,
        text_encoder="lstm" if glove else "projection", name="baseline")
    return model(statement.astype(dtype), batch["statement_mask"],
                 subtitles, batch.get("subtitle_mask") if self.use_subtitles else None,
                 batch.get("video") if self.use_video else None,
                 batch.get("video_mask") if self.use_video else None,
                 deterministic=deterministic)


def mask_tokens(key, ids, mask, *, special_ids, mask_id: int, vocab: int, probability: float, num_predictions: int):
  """BERT's masked-LM corruption of ONE sequence (Devlin et al.; Google's create_pretraining_data.py).

  ids, mask `[L]` -> (corrupted ids `[L]`, positions `[P]`, labels `[P]`, weights `[P]` float32), P =
  num_predictions. Of the n valid non-special tokens, max(1, round(n * probability)) (halves up; at most P; none
  when n = 0) are drawn uniformly without replacement; each becomes [MASK] with probability 0.8, a uniformly drawn
  token id (< vocab) with 0.1, and stays itself with 0.1. Unused prediction slots have weight 0.
  """
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  k_pick, k_kind, k_token = jax.random.split(key, 3)
  candidate = (mask > 0) & ~jnp.isin(ids, jnp.asarray(special_ids, ids.dtype))
  n = jnp.sum(candidate)
  count = jnp.where(n > 0, jnp.clip(jnp.floor(n * probability + 0.5), 1, num_predictions), 0)  # half rounds up
  scores = jnp.where(candidate, jax.random.uniform(k_pick, ids.shape), -1.0)
  _, positions = jax.lax.top_k(scores, num_predictions)  # distinct; the `count` best are candidates
  weights = (jnp.arange(num_predictions) < count).astype(jnp.float32)
  labels = ids[positions]
  draw = jax.random.uniform(k_kind, (num_predictions,))
  random_ids = jax.random.randint(k_token, (num_predictions,), 0, vocab, ids.dtype)
  new = jnp.where(draw < 0.8, mask_id, jnp.where(draw < 0.9, random_ids, labels)).astype(ids.dtype)
  corrupted = ids.at[positions].set(jnp.where(weights > 0, new, labels))
  return corrupted, positions, labels, weights


class BertMLM(nn.Module):
  """The BERT fine-tuning stage: BERT's masked-LM objective on VIOLIN statements and subtitles.

  batch: ids / mask `[b, L]` (one text per row, [CLS] ... [SEP] padded), index `[b]` (the text's position in its
  split: each row's corruption is drawn from fold_in(the "masking" rng, index), so an evaluation pass corrupts every
  text the same way whatever the batching). -> {"logits": [b, P, vocab] at the corrupted positions, "labels":
  [b, P], "weights": [b, P]}, P = max(1, round(L * mlm_probability)).

  `mlm_probability`, `dtype` are config.model; encoder_config and the token ids come from the checkpoint and its
  tokenizer.
  """
  encoder: str = "bert"
  mlm_probability: float = 0.15
  dtype: str = "float32"
  encoder_config: Any = None
  mask_token_id: int = 0
  special_token_ids: tuple = ()
  tokenizer_vocab_size: int = 0

  @property
  def lm_config(self):
    return dataclasses.replace(self.encoder_config, dtype=encoders.dtype(self.dtype))

  def num_predictions(self, length: int) -> int:
    return max(1, int(round(length * self.mlm_probability)))

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    ids, mask = batch["ids"], batch["mask"]
    base = self.make_rng("masking")
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(batch["index"])
    corrupt = jax.vmap(lambda k, i, m: mask_tokens(
        k, i, m, special_ids=self.special_token_ids, mask_id=self.mask_token_id, vocab=self.tokenizer_vocab_size,
        probability=self.mlm_probability, num_predictions=self.num_predictions(ids.shape[1])))
    corrupted, positions, labels, weights = corrupt(keys, ids, mask)
    encoder = encoders.ENCODERS[self.encoder](self.lm_config, name="text_encoder")
    logits = encoder(corrupted, mask, decode_positions=positions, deterministic=deterministic)["logits"]
    return {"logits": logits, "labels": labels, "weights": weights}


# config.model_name -> the model class.
MODELS = {"baseline": BaselineModel, "crossmodal": ViolinCrossModal, "lxmert": ViolinLxmert, "bert_mlm": BertMLM}


def model_class(config):
  if config.model_name not in MODELS:
    raise ValueError(f"config.model_name = {config.model_name!r}: expected one of {sorted(MODELS)}")
  return MODELS[config.model_name]
