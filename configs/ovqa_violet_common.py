"""The `:violet` variant of the OVQA configs: VIOLET (CVQA) and VIOLET+ (the "+" head, optionally with the GNN soft
verbalizer) from pixels, instead of FrozenBiLM(+); same task, vocabularies, graphs and metrics
(evqa_jax/projects/ovqa/backbones/violet.py, evqa_jax/models/violet.py, evqa_jax/models/video_swin.py; docs/ovqa.md has
the commands and the paper's numbers).

Paper settings (OVQA appendix B, "VIOLET"): AdamW with betas (0.9, 0.98), lr 1.2e-5, weight decay 1e-3; 5 frames
sampled per video at 224 x 224, 32 x 32 patches (the Video Swin's output stride: 7 x 7 visual tokens per frame); batch
per GPU 10 / 12 / 10 / 8 for MSVD / MSRVTT / TGIF / ActivityNet; CVQA answer sets MSVD 1000, MSRVTT 1500, TGIF 1540,
ActivityNet 1654. From the authors' code (tsujuifu/pytorch_violet _data/args_msvd-qa.json, agent.py, model.py,
video_swin.py), where the appendix is silent: 20 epochs, a constant lr (no warm-up, no decay, no clipping), the
question <= 25 tokens (bert-base-uncased), dropout 0.1 (BERT and the classifier), the Video Swin of
SwinTransformer3D() (96 wide, depths 2-2-18-2, window 8x7x7, drop path 0.2). Their fp16 autocast is not reproduced
(float32 here; `bf16` for bfloat16). Fine-tuning starts from their pretrained checkpoint (ckpt_violet_pretrain.pt,
config.pretrained.init_from). The "+" head's answer encoder is frozen DeBERTa-v2-xlarge (config.model.answer_encoder
= "clip": CLIP's text tower, the paper's Table 7).

Variants (with `violet`): cvqa = the VIOLET row (their classifier over the top-k answers); baseline = VIOLET+ without
the verbalizer; demo / small / tiny / bf16 / shapes_only / authors_eps as for FrozenBiLM (demo, small, tiny: a 2-stage
16-wide Video Swin and a 2-layer 32-wide BERT at 32 x 32 pixels over the 5-frame world, MiniLM-L6's word embeddings as
the answer encoder).

Its entry of configs/ovqa_common.py's BACKBONES (evqa_jax/projects/ovqa/backbones/violet.py in the library).
"""

import ml_collections

TITLE = "VIOLET"
OWN_VARIANTS = set()
RECORDS = "records_frames_violet"  # config.data.dir: data_prep.ovqa_frames --recipe violet --num-frames 5 ...

# bert-base-uncased (the cross-modal transformer and the text embeddings): models.bert.BertConfig fields.
VIOLET_BERT = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                   intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.1,
                   attention_probs_dropout_prob=0.1)
# SwinTransformer3D() as VIOLET builds it: models.video_swin.VideoSwinConfig fields.
VIOLET_SWIN = dict(patch_size=(2, 4, 4), embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24),
                   window_size=(8, 7, 7), mlp_ratio=4, drop_path_rate=0.2)
# demo, small, tiny: 32 x 32 frames -> 4 x 4 visual tokens per frame through two stages (stride 8).
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64)
TINY_SWIN = dict(patch_size=(2, 4, 4), embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=(2, 4, 4),
                 mlp_ratio=4, drop_path_rate=0.1)
TINY_SHAPE = TINY_BERT  # ovqa_common's `tiny`
# The OVQA appendix's CVQA answer sets (config.data.cvqa_topk) and per-GPU batches.
CVQA_TOPK = {"msvd": 1000, "msrvtt": 1500, "tgif": 1540, "activitynet": 1654}
BATCH = {"msvd": 10, "msrvtt": 12, "tgif": 10, "activitynet": 8}
# DeBERTa-v2-xlarge's word embeddings (the answer encoder's shapes without the folder, for shapes_only).
DEBERTA_V2_XLARGE_EMBEDDINGS = dict(vocab_size=128100, hidden_size=1536)


def paper_shape(variants: set) -> dict:
  """The cross-modal transformer's architecture for `shapes_only` (random weights; the Video Swin's: VIOLET_SWIN)."""
  del variants
  return VIOLET_BERT


def apply(c: ml_collections.ConfigDict, variants: set, worlds: dict) -> None:
  """Sets the VIOLET parts of the OVQA config `c` of `variants` (ovqa_common.ovqa_config), in place."""
  demo, small = "demo" in variants, "small" in variants
  toy = demo or small or "tiny" in variants
  head = "cvqa" if "cvqa" in variants else "open"
  # Model(**config.model) in evqa_jax/projects/ovqa/backbones/violet.py: these keys are its fields.
  c.model = ml_collections.ConfigDict(dict(
      backbone="violet", head=head,
      answer_encoder="deberta",  # the frozen answer encoder of the "+" head: deberta | clip (answer_encoders.py)
      head_dropout=0.1,  # their fc's input dropout
      dtype="bfloat16" if "bf16" in variants else "float32", remat="none"))
  c.trainable = (".",)  # everything but the frozen answer encoder (answer_encoders.FrozenAnswerBackbone)

  c.data.num_frames = 5
  c.data.frame_size = 32 if toy else 224
  c.data.augment = "none"  # their QA fine-tuning reads the frames as stored
  c.data.max_tokens = 25  # their size_txt: [CLS] question [SEP]
  c.data.answer_max_subwords = 5  # the deberta answer encoder: mean over at most this many sub-words
  c.data.use_subtitles = False
  c.data.cvqa_topk = CVQA_TOPK[c.dataset]
  if demo or small:  # the synthetic world as pixels: 5 frames at 32 x 32 (data_prep/synthetic_ovqa.py)
    world = "frames_violet_small" if small else "frames_violet"
    if world in worlds:
      c.data.synthetic, c.data.dir = (world, worlds[world]) if demo else ("", worlds[world])

  c.pretrained = ml_collections.ConfigDict(dict(
      dir="",  # VIOLET has no Hugging Face folder: its weights come from init_from
      tokenizer="pkg:minilm" if toy else "~/models/bert-base-uncased",  # the question's (bert-base-uncased vocab)
      init_from="",  # the authors' ckpt_violet_pretrain.pt (or its safetensors export); "none": random weights
      init_from_required=not (toy or "shapes_only" in variants),
      shape=ml_collections.ConfigDict(TINY_BERT if toy else VIOLET_BERT),  # models.bert.BertConfig
      swin_shape=ml_collections.ConfigDict(TINY_SWIN if toy else VIOLET_SWIN),  # models.video_swin.VideoSwinConfig
      # The frozen answer encoder's local folder (answer_encoders.py): DeBERTa-v2-xlarge as the paper.
      answer_dir="pkg:minilm" if toy else "~/models/deberta-v2-xlarge",
      answer_tokenizer="",  # default: answer_dir
      answer_shape=None))  # a config dict: random weights of that shape instead of the folder's

  if "shapes_only" in variants:  # no folders: DeBERTa-v2-xlarge's embedding shapes, MiniLM's tokenizer
    c.pretrained.answer_dir, c.pretrained.answer_tokenizer = "", "pkg:minilm"
    c.pretrained.answer_shape = ml_collections.ConfigDict(DEBERTA_V2_XLARGE_EMBEDDINGS)

  if not small:  # small: ovqa_common's 8 / 16
    c.batch_size, c.eval_batch_size = (32, 64) if demo else (BATCH[c.dataset], BATCH[c.dataset])
  c.optim.name, c.optim.lr, c.optim.b1, c.optim.b2, c.optim.eps = "adam", 1.2e-5, 0.9, 0.98, 1e-8
  c.optim.weight_decay = 1e-3  # decoupled (torch AdamW's decay, times the lr)
  c.optim.warmup_fraction, c.optim.decay, c.optim.grad_clip = 0.0, "constant", 0.0
  if toy:
    c.optim.lr = 1e-3  # a from-scratch toy model


def heads_sweep(columns) -> dict:
  """The demo's VIOLET rows: VIOLET (CVQA), VIOLET+ and VIOLET+ with the GNN verbalizer."""
  points = [
      {"name": "violet_cvqa", "overrides": {"model.head": "cvqa", "verbalizer.variant": "A"}, "x": None},
      {"name": "violet_plus", "overrides": {"model.head": "open", "verbalizer.variant": "A"}, "x": None},
      {"name": "violet_plus_gnn", "overrides": {"model.head": "open", "verbalizer.variant": "E"}, "x": None},
  ]
  return {"points": points, "columns": columns, "split": "test", "x_label": None, "per_seed": "M",
          "order": [p["name"] for p in points]}


SWEEPS = {"heads_violet": heads_sweep}  # configs/ovqa_common.py's ovqa_sweep
