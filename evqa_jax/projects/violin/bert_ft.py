"""VIOLIN's BERT fine-tuning stage (`config.model_name = "bert_mlm"`, configs/violin_bert_ft.py).

The authors encode statements and subtitles with "pre-trained BERT-base model, finetuned on VIOLIN training statements
and subtitles" (paper, section 4) and freeze it; their README: "Finetune BERT-base on Violin's training statements,
or download our finetuned BERT model". Their fine-tuning code and settings are not released. This stage trains BERT
with its own masked-LM objective (model.BertMLM: 15% of the word pieces, 80% [MASK] / 10% random / 10% kept), as the
code base VIOLIN builds on (jayleicn/TVQA, TVQA+) fine-tuned BERT with Hugging Face's LM fine-tuning script, on
exactly the sequences the frozen encoder reads later: every distinct statement (positive and negative) and every
clip's subtitles of the training split, preprocessed and cut as `config.data` says (input.Input.tokenize), each row
padded to the longer of the two caps. Evaluation: masked-token accuracy, loss and perplexity over the evaluation
split's texts, each text corrupted the same way in every evaluation (metrics.json in the eval folder).

The encoder lives under `text_encoder/`, the name the baseline model gives its frozen encoder:
`--config.pretrained.init_from=<this stage's workdir>` hands the newest checkpoint's encoder to configs/violin.py
(input.fine_tuned_encoder_params).
"""

from __future__ import annotations

import hashlib
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import pretrained
from evqa_jax.models import encoders
from evqa_jax.projects import base
from evqa_jax.projects.violin import input as input_lib
from evqa_jax.projects.violin import model as model_lib

KINDS = ("statement", "subtitle")


class TextSource:
  """Grain random-access source over the texts of one split: {"kind": 0 statement | 1 subtitles, "text", "index"}."""

  def __init__(self, texts: list[tuple[str, str]], split: str):
    self.texts = texts
    digest = hashlib.sha1("\n".join(f"{k}\t{t}" for k, t in texts).encode()).hexdigest()[:12]
    # Grain compares this string when it restores an iterator: the same texts, wherever the data lives.
    self._repr = f"VIOLINTextSource(split={split!r}, texts={len(texts)}, sha1={digest})"

  def __len__(self) -> int:
    return len(self.texts)

  def __getitem__(self, index: int) -> dict:
    kind, text = self.texts[index]
    return {"kind": np.int32(KINDS.index(kind)), "text": text, "index": np.int64(index)}

  def __repr__(self) -> str:
    return self._repr


def token_stats(out: dict):
  """BertMLM outputs -> (negative log-likelihood, correct, weight), each `[b, P]` float32."""
  logits = out["logits"].astype(jnp.float32)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, out["labels"][..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(logits, -1) == out["labels"]).astype(jnp.float32)
  return nll, correct, out["weights"]


class Task(base.Task):
  main_metric = "mlm_accuracy"

  def __init__(self, config):
    super().__init__(config)
    mc, dc = config.model, config.data
    self.input = input_lib.Input(config, online=True)
    tok = self.input.tokenizer
    if tok.mask_token_id is None:
      raise ValueError("the tokenizer of config.pretrained.tokenizer / config.pretrained.dir has no mask token, which "
                       "the masked-LM fine-tuning stage needs")
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    encoder_config = encoders.encoder_config(mc.encoder, config.pretrained)
    if len(tok) > encoder_config.vocab_size:
      raise ValueError(f"the tokenizer has {len(tok)} tokens but the encoder's vocab_size is "
                       f"{encoder_config.vocab_size} (config.pretrained.tokenizer / dir / shape)")
    self.model = model_lib.model_class(config)(
        **mc, encoder_config=encoder_config, mask_token_id=int(tok.mask_token_id),
        special_token_ids=tuple(sorted({int(i) for i in tok.all_special_ids})), tokenizer_vocab_size=len(tok))
    self.length = max(dc.max_statement_tokens, dc.max_subtitle_tokens)
    self._sources = {}

  # -- data -----------------------------------------------------------------------------------------------------
  def source(self, split: str):
    if split not in self._sources:
      self._sources[split] = TextSource(
          [(kind, t) for kind in KINDS for t in self.input.texts(kind, [split]) if t], split)  # no empty subtitles
    return self._sources[split]

  def preprocess(self, example: dict, train: bool) -> dict:
    del train
    ids, mask = self.input.tokenize(str(example["text"]), KINDS[int(example["kind"])])
    pad = self.length - len(ids)
    return {"ids": np.pad(ids, (0, pad), constant_values=self.input.tokenizer.pad_token_id or 0),
            "mask": np.pad(mask, (0, pad)), "index": np.int32(example["index"])}

  # -- model ----------------------------------------------------------------------------------------------------
  def init_params(self, rng):
    batch = {"ids": jnp.ones((1, self.length), jnp.int32), "mask": jnp.ones((1, self.length), jnp.int32),
             "index": jnp.zeros((1,), jnp.int32)}
    return self.model.init({"params": rng, "masking": rng, "dropout": rng}, batch, deterministic=True)["params"]

  def load_pretrained(self, params: dict) -> dict:
    """The encoder (with its MLM head) from config.pretrained.dir; a random init without one (tests)."""
    params = dict(params)
    params["text_encoder"] = jax.tree.map(np.asarray, encoders.load_encoder_weights(
        self.config.model.encoder, self.model.lm_config, self.pretrained_dir, params["text_encoder"]))
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.trainable)

  def loss(self, params, batch, aux, rng, train: bool = True):
    del aux
    k_mask, k_drop = jax.random.split(rng)
    out = self.model.apply({"params": params}, batch, deterministic=not train,
                           rngs={"masking": k_mask, "dropout": k_drop})
    nll, correct, weight = token_stats(out)
    if "_valid" in batch:  # evaluation batches padded to the static shape
      weight = weight * batch["_valid"][:, None]
    n = jnp.maximum(jnp.sum(weight), 1.0)
    return jnp.sum(nll * weight) / n, {"mlm_accuracy": jnp.sum(correct * weight) / n}

  def predict(self, params, batch, aux) -> dict:
    del aux
    out = self.model.apply({"params": params}, batch, deterministic=True,
                           rngs={"masking": jax.random.key(self.config.seed)})
    nll, correct, weight = token_stats(out)
    return {"nll": jnp.sum(nll * weight, -1), "correct": jnp.sum(correct * weight, -1),
            "count": jnp.sum(weight, -1)}

  # -- evaluation -----------------------------------------------------------------------------------------------
  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    """Masked-token accuracy (%), loss and perplexity over the split's texts -> out_dir/metrics.json."""
    count = float(np.sum(outputs["count"]))
    loss = float(np.sum(outputs["nll"])) / max(count, 1.0)
    metrics = {"mlm_accuracy": 100.0 * float(np.sum(outputs["correct"])) / max(count, 1.0), "mlm_loss": loss,
               "perplexity": math.exp(min(loss, 700.0)), "num_masked_tokens": int(count),
               "num_texts": int(len(outputs["index"]))}
    os.makedirs(out_dir, exist_ok=True)
    io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return metrics

  def describe(self) -> str:
    dc = self.config.data
    return (f"VIOLIN BERT fine-tuning stage ({self.config.model.encoder}, masked LM on the {dc.train_split} "
            f"statements and subtitles, text preprocessing {dc.text_preprocessing!r}, {self.length} tokens)")
