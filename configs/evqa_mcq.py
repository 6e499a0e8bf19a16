"""E-VQA on ST-Evidence-MCQ: the same trained model picks the answer, the temporal and the spatial option.

Our reference model (not the paper's UniPixel, which is not implemented here; configs/evqa_common.py, docs/evqa.md).

  python launch/train.py --config=configs/evqa_mcq.py:demo --workdir=runs/evqa_mcq_demo

Temporal option = the candidate segment set with the largest mean evidence logit inside minus outside; spatial
option = the candidate mask with the largest soft IoU with the predicted mask on the reference frame. Predictions
(<workdir>/eval/test_step<N>/mcq_predictions.json) are scored by evqa_jax.evaluate.st_evidence_mcq (qa, temporal,
spatial, pooled; chance 20 / 25 / 25 / 1.25 %). Variants as in configs/evqa_gen.py.
"""

from configs import evqa_common

VARIANTS = evqa_common.VARIANTS


def get_config(arg=None):
  return evqa_common.evqa_config("mcq", arg, "configs/evqa_mcq.py")
