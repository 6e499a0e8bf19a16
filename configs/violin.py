"""VIOLIN (video-and-language inference): the authors' baseline on frozen BERT features, ResNet frames, paper settings.

  python launch/train.py --config=configs/violin_bert_ft.py --workdir=runs/violin_bert_ft   # the BERT fine-tuning stage
  python launch/train.py --config=configs/violin.py --workdir=runs/violin \
      --config.pretrained.init_from=runs/violin_bert_ft     # the main model on the fine-tuned, frozen encoder
  python launch/train.py --config=configs/violin.py:demo --workdir=runs/violin_demo          # synthetic, CPU minutes
  python launch/sweep.py --config=configs/violin.py:demo --sweep=inputs --workdir=runs/violin_inputs   # Table 3
Variants (comma-separated after ':'): demo (built-in synthetic world, generated on first use, + MiniLM-L6 text
features cached once), c3d (C3D features, 4096-d), det (Table 3's Det rows: the per-frame pooled Faster R-CNN
features, 2048-d, records converted with --feature det), lxmert (Table 3's LXMERT row: LXMERT's encoder over the
statement + subtitles and one object per frame of the det features, fine-tuned whole; --config.pretrained.dir = a
local Hugging Face LXMERT folder), glove (Table 3's GloVe rows: GloVe word vectors + the LSTM text
encoder instead of BERT; --config.word_vectors.source = a GloVe 300d text file), crossmodal (BERT-family LM over video
tokens + text with a classification head; not in the paper), cached (precompute the frozen text features once), bf16,
small (tests: tiny world, tiny encoder), shapes_only (bert-base-uncased's architecture with random weights and no
checkpoint files: compile checks).
Inputs of the Table 3 ablation: --config.model.use_video / use_subtitles / single_frame (or the `inputs` sweep).
Expected: the paper's Table 3 (test accuracy) for the BERT rows: statement only 54.20, statement + subtitles 66.05,
statement + subtitles + video (ResNet) a little above that; single frame below the full video; GloVe 3-6 points below
BERT. docs/violin.md: every row's command and what reproduces; docs/results.md: the demo's recorded table.
"""

from configs import violin_common

VARIANTS = violin_common.VARIANTS


def get_config(arg=None):
  return violin_common.violin_config(arg)


def get_sweep(name, arg=None):
  return violin_common.violin_sweep(name, arg)
