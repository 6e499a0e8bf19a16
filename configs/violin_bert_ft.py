"""VIOLIN's BERT fine-tuning stage: BERT's masked LM on the training statements and subtitles, before it is frozen.

  python launch/train.py --config=configs/violin_bert_ft.py --workdir=runs/violin_bert_ft
  python launch/train.py --config=configs/violin.py --workdir=runs/violin \
      --config.pretrained.init_from=runs/violin_bert_ft          # the main model on the fine-tuned, frozen encoder
Variants: c3d (reads the C3D records, as configs/violin.py:c3d; the text is the same), small (tests: tiny world,
tiny random BERT, 4 steps).
Data, tokenizer, text preprocessing (the authors' clean_str + lower case) and 256-token caps are configs/violin.py's:
the stage trains on the very sequences the frozen encoder reads later (evqa_jax/projects/violin/bert_ft.py).
The authors' own fine-tuning settings are unpublished; these are the defaults of Hugging Face's LM fine-tuning script
(run_lm_finetuning.py, which the TVQA code VIOLIN builds on used): AdamW lr 5e-5, eps 1e-8, no weight decay, no
warm-up, linear decay to 0, gradient clip 1.0, 15% of the word pieces masked (80% [MASK] / 10% random / 10% kept);
batch 32 texts, 3 epochs, masked-token accuracy on validate after every epoch (checkpointed every epoch).
Expected: no published figure for this stage; validate masked-token accuracy should rise above the pretrained BERT's
(epoch 0 is not evaluated: compare with `--config.total_steps=1` if needed).
"""

import ml_collections

from configs import common
from configs import violin_common

VARIANTS = {"small", "c3d"}


def get_config(arg=None):
  variants = common.parse_variants(arg)
  common.check_variants(variants, VARIANTS, "configs/violin_bert_ft.py")
  c = violin_common.violin_config(arg, "configs/violin_bert_ft.py")
  c.model_name = "bert_mlm"
  # BertMLM(**config.model) in evqa_jax/projects/violin/model.py: these keys are the model's fields.
  c.model = ml_collections.ConfigDict(dict(encoder="bert", mlm_probability=0.15, dtype="float32"))
  c.trainable = ("^text_encoder/",)  # the whole BERT, MLM head included
  del c.pretrained["init_from"]  # the stage starts from config.pretrained.dir; init_from is the main config's
  c.data.eval_splits = ("validate",)
  c.optim = ml_collections.ConfigDict(dict(
      name="adam", lr=5e-5, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
      warmup_fraction=0.0, decay="linear", grad_clip=1.0))
  if "small" not in variants:
    c.batch_size = 32
    c.eval_batch_size = 64
    c.total_epochs = 3
    c.eval_every_epochs = 1
    c.checkpoint_every_epochs = 1
  return c
