"""OVQA on MSRVTT-QA: FrozenBiLM+ with the GNN soft verbalizer (eps 0.7), the paper's settings.

  python launch/train.py --config=configs/ovqa_msrvtt.py --workdir=runs/ovqa_msrvtt \
      --config.pretrained.init_from=~/models/frozenbilm.pth   # required ('none': plain DeBERTa-v2)
Variants (comma-separated after ':'): demo (built-in synthetic world + MiniLM-L6, a few CPU minutes), cvqa (the
closed-vocabulary row: FrozenBiLM's head over the top-4000 train answers; cvqa_mlp: an MLP
classifier over them instead), baseline (FrozenBiLM+ without verbalizer), bf16, small (tests),
released (alias authors_eps; as mlvlab/OVQA's released code: base answers at eps = 1, the lr set after each
step; docs/ovqa.md), tiny (small with a random 2-layer 32-wide BERT: the AOT example of docs/benchmarks.md and cheap
tests), scale (the MSRVTT-scale synthetic world: 4,000 train + 1,600 test-only answers and their k = 10, 2-hop
graphs; `:demo,scale` for CPU, benchmarks/ovqa_scale_step.py), xxlarge (DeBERTa-v2-xxlarge,
1.5B, instead of -xlarge), shapes_only (the paper LM's shapes with random weights and no downloaded files, for
compiles: `python launch/aot_check.py --config=configs/ovqa_msrvtt.py:scale,shapes_only,bf16 --mesh=4x1
--topology=v5e:2x2`).
nbrworld (the demo in the synthetic world whose frames show a concept's GloVe graph neighbours rather than its own
word vector: data_prep/synthetic_ovqa.py, video_direction), paper (the default, named). Commands per table and the
paper's numbers: docs/ovqa.md.
Expected: the OVQA paper's Table 2 row "FrozenBiLM+ w/ GNN verbalizer" for MSRVTT-QA (per-category B/C/R/U/T/mAcc).
Demo: docs/results.md holds the table that the README's main command printed.
"""

from configs import ovqa_common

VARIANTS = ovqa_common.VARIANTS


def get_config(arg=None):
  return ovqa_common.ovqa_config("msrvtt", arg, cvqa_topk=4000)


def get_sweep(name, arg=None):
  return ovqa_common.ovqa_sweep(name, arg)
