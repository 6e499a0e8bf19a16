"""E-VQA on ST-Evidence-Gen: answer letter + temporal segments + masklets, scored by evqa_jax.evaluate.st_evidence.

Our reference model (not the paper's UniPixel, which is not implemented here; configs/evqa_common.py, docs/evqa.md).

  python launch/train.py --config=configs/evqa_gen.py:demo --workdir=runs/evqa_gen_demo

Variants (comma separated): demo (synthetic world, conv frame encoder, MiniLM-L6; 200 steps, about 10 minutes on
2 CPU cores), small (tests), tiny (small with the smallest model), bf16, no_readout (answer head without the
evidence readout), shapes_only (CLIP ViT-B/16's architecture with random weights, no checkpoint files: compile
checks). Predictions land in <workdir>/eval/test_step<N>/{predictions.json, pred_masks/, metrics.json}.
What the demo reaches against the trivial predictions of benchmarks/evqa_trivial_baselines.py: docs/results.md, E-VQA.
"""

from configs import evqa_common

VARIANTS = evqa_common.VARIANTS


def get_config(arg=None):
  return evqa_common.evqa_config("gen", arg, "configs/evqa_gen.py")
