"""OVQA on MSVD-QA: FrozenBiLM+ with the GNN soft verbalizer (eps 0.7), the paper's settings.

  python launch/train.py --config=configs/ovqa_msvd.py --workdir=runs/ovqa_msvd \
      --config.pretrained.init_from=~/models/frozenbilm.pth   # required ('none': plain DeBERTa-v2)
Variants (comma-separated after ':'): demo (built-in synthetic world + MiniLM-L6, a few CPU minutes), cvqa (the
closed-vocabulary row: FrozenBiLM's head over the top-1852 train answers; cvqa_mlp: an MLP
classifier over them instead), baseline (FrozenBiLM+ without verbalizer), bf16, small (tests).
released (alias authors_eps; as mlvlab/OVQA's released code: base answers at eps = 1, the lr set after
each step; docs/ovqa.md).
paper (the default, named). Commands per table and the paper's numbers: docs/ovqa.md.
Expected: the OVQA paper's Table 2 row "FrozenBiLM+ w/ GNN verbalizer" for MSVD-QA (per-category B/C/R/U/T/mAcc).
Demo: docs/results.md holds the table that the README's main command printed.
"""

from configs import ovqa_common

VARIANTS = ovqa_common.VARIANTS


def get_config(arg=None):
  return ovqa_common.ovqa_config("msvd", arg, cvqa_topk=1852)


def get_sweep(name, arg=None):
  return ovqa_common.ovqa_sweep(name, arg)
