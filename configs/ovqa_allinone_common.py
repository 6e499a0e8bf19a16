"""The `:allinone` variant of the OVQA configs: All-in-one (CVQA) and All-in-one+ (the "+" head, optionally with the
GNN soft verbalizer) from pixels, instead of FrozenBiLM(+); same task, vocabularies, graphs and metrics
(evqa_jax/projects/ovqa/backbones/allinone.py, evqa_jax/models/allinone.py; docs/ovqa.md has the commands and the
paper's numbers).

Paper settings (OVQA appendix B, "All-in-one"): batch 512, 20 epochs, lr 1e-4 with a 10% warm-up, AdamW; 3 frames
sampled per video, resized to 224 x 224, 14 x 14 patches of 16 pixels (All-in-one-Base); CVQA answer sets MSVD 1000,
MSRVTT 1500, ActivityNet 1000, TGIF 1540. From the authors' code (showlab/all-in-one config.py
task_finetune_msrvttqa / msvdqa / tgifqa, allinone_utils.set_schedule), where the appendix is silent: AdamW betas
(0.9, 0.98), eps 1e-8, weight decay 0.01, linear decay to 0 after the warm-up, no gradient clipping, question <= 40
tokens (bert-base-uncased), dropout 0.1 in the ViT, 0.5 before the classifier. Two parts of their optimiser are
not reproduced (docs/ovqa.md): they exempt biases and LayerNorms from the weight decay and train the classifier at
10x the lr (lr_mult 10); here every trained parameter decays and follows one schedule.
Fine-tuning starts from their pretrained checkpoint (all-in-one-base.ckpt, config.pretrained.init_from). The "+"
head's answer encoder is frozen DeBERTa-v2-xlarge (its word embeddings, as FrozenBiLM+; config.model.answer_encoder
= "clip": CLIP's text tower, the paper's Table 7).

Variants (with `allinone`): cvqa = the All-in-one row (their classifier over the top-k answers); baseline =
All-in-one+ without the verbalizer; demo / small / tiny / bf16 / shapes_only / authors_eps as for FrozenBiLM (demo,
small, tiny: a 2-layer 32-wide All-in-one at 32 x 32 pixels over the frames world, MiniLM-L6's word embeddings as the
answer encoder).

Its entry of configs/ovqa_common.py's BACKBONES (evqa_jax/projects/ovqa/backbones/allinone.py in the library).
"""

import ml_collections

TITLE = "All-in-one"
OWN_VARIANTS = set()
RECORDS = "records_frames"  # config.data.dir: data_prep.ovqa_frames ... --num-frames 3 --frame-size 224

# The released All-in-one-Base (vit_base_patch16_224, config.py defaults): the models.allinone.AllInOneConfig fields.
ALLINONE_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4,
                     patch_size=16, max_text_len=40, drop_rate=0.1, drop_path_rate=0.1)
# demo, small, tiny: a random 2-layer 32-wide All-in-one over 32 x 32 frames (16 patches of 8 pixels).
ALLINONE_TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                     patch_size=8, max_text_len=40, drop_rate=0.1, drop_path_rate=0.1)
TINY_SHAPE = ALLINONE_TINY  # ovqa_common's `tiny`
# The OVQA appendix's CVQA answer sets (config.data.cvqa_topk).
CVQA_TOPK = {"msvd": 1000, "msrvtt": 1500, "activitynet": 1000, "tgif": 1540}
# DeBERTa-v2-xlarge's word embeddings (the answer encoder's shapes without the folder, for shapes_only).
DEBERTA_V2_XLARGE_EMBEDDINGS = dict(vocab_size=128100, hidden_size=1536)


def paper_shape(variants: set) -> dict:
  """All-in-one-Base's architecture for `shapes_only` (random weights)."""
  del variants
  return ALLINONE_BASE


def apply(c: ml_collections.ConfigDict, variants: set, worlds: dict) -> None:
  """Sets the All-in-one parts of the OVQA config `c` of `variants` (ovqa_common.ovqa_config), in place."""
  demo, small = "demo" in variants, "small" in variants
  toy = demo or small or "tiny" in variants
  head = "cvqa" if "cvqa" in variants else "open"
  # Model(**config.model) in evqa_jax/projects/ovqa/backbones/allinone.py: these keys are its fields.
  c.model = ml_collections.ConfigDict(dict(
      backbone="allinone", head=head,
      answer_encoder="deberta",  # the frozen answer encoder of the "+" head: deberta | clip (answer_encoders.py)
      head_dropout=0.5,  # their openend_vqa classifier's input dropout
      dtype="bfloat16" if "bf16" in variants else "float32", remat="none"))
  c.trainable = (".",)  # everything but the frozen answer encoder (the backbone's trainable_patterns)

  c.data.num_frames = 3
  c.data.frame_size = 32 if toy else 224
  c.data.augment = "allinone"  # their train-time VideoTransform: resize to 1.2 x, random crop (centre at eval)
  c.data.max_tokens = 40  # their max_text_len: [CLS] question [SEP]
  c.data.answer_max_subwords = 5  # the deberta answer encoder: mean over at most this many sub-words
  c.data.use_subtitles = False
  c.data.cvqa_topk = CVQA_TOPK[c.dataset]
  if demo or small:  # the synthetic world as pixels: 3 frames at 32 x 32 (data_prep/synthetic_ovqa.py)
    world = "frames_small" if small else "frames"
    if world in worlds:
      c.data.synthetic, c.data.dir = (world, worlds[world]) if demo else ("", worlds[world])

  c.pretrained = ml_collections.ConfigDict(dict(
      dir="",  # All-in-one has no Hugging Face folder: its weights come from init_from
      tokenizer="pkg:minilm" if toy else "~/models/bert-base-uncased",  # the question's (bert-base-uncased vocab)
      init_from="",  # the authors' all-in-one-base.ckpt (or its safetensors export); "none": random weights
      init_from_required=not (toy or "shapes_only" in variants),
      shape=ml_collections.ConfigDict(ALLINONE_TINY if toy else ALLINONE_BASE),  # models.allinone.AllInOneConfig
      # The frozen answer encoder's local folder (answer_encoders.py): DeBERTa-v2-xlarge as the paper.
      answer_dir="pkg:minilm" if toy else "~/models/deberta-v2-xlarge",
      answer_tokenizer="",  # default: answer_dir
      answer_shape=None))  # a config dict: random weights of that shape instead of the folder's

  if "shapes_only" in variants:  # no folders: DeBERTa-v2-xlarge's embedding shapes, MiniLM's tokenizer
    c.pretrained.answer_dir, c.pretrained.answer_tokenizer = "", "pkg:minilm"
    c.pretrained.answer_shape = ml_collections.ConfigDict(DEBERTA_V2_XLARGE_EMBEDDINGS)

  if not small:  # small: ovqa_common's 8 / 16
    c.batch_size, c.eval_batch_size = (32, 64) if demo else (512, 512)
  c.optim.name, c.optim.lr, c.optim.b1, c.optim.b2, c.optim.eps = "adam", 1e-4, 0.9, 0.98, 1e-8
  c.optim.weight_decay = 0.01  # decoupled (AdamW)
  c.optim.warmup_fraction, c.optim.decay, c.optim.grad_clip = 0.1, "linear", 0.0
  if toy:
    c.optim.lr = 1e-3  # a from-scratch toy model


def heads_sweep(columns) -> dict:
  """The demo's All-in-one rows: All-in-one (CVQA), All-in-one+ and All-in-one+ with the GNN verbalizer."""
  points = [
      {"name": "allinone_cvqa", "overrides": {"model.head": "cvqa", "verbalizer.variant": "A"}, "x": None},
      {"name": "allinone_plus", "overrides": {"model.head": "open", "verbalizer.variant": "A"}, "x": None},
      {"name": "allinone_plus_gnn", "overrides": {"model.head": "open", "verbalizer.variant": "E"}, "x": None},
  ]
  return {"points": points, "columns": columns, "split": "test", "x_label": None, "per_seed": "M",
          "order": [p["name"] for p in points]}


SWEEPS = {"heads_allinone": heads_sweep}  # configs/ovqa_common.py's ovqa_sweep
