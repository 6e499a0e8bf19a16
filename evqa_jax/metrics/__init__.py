"""Benchmark metrics with the exact semantics of REFERENCE.md; plain numpy, no JAX needed.

Shared by training-time evaluation (`evqa_jax.projects`) and the command-line evaluators (`evqa_jax.evaluate`, which reads the files);
this package imports nothing from `evqa_jax.evaluate`, pandas or matplotlib:
  ovqa         answer categories, per-category accuracy, mAcc, BNG, Table 1 statistics
  st_evidence  ST-Evidence-Gen answer / temporal / mask (J, F) metrics, ST-Evidence-MCQ, DAVIS-2017 aggregation
  violin       VIOLIN statement accuracy
"""

from evqa_jax.metrics.ovqa import answer_categories, answer_counts, category_of_count, ovqa_metrics, table1
from evqa_jax.metrics.st_evidence import (answer_is_correct, davis_aggregate, davis_sequence_scores, entry_mask_scores,
                                          f_measure, frame_scores, mcq_metrics, mcq_results_metrics,
                                          parse_pred_segments, seg2bmap, st_evidence_summary, temporal_iou_iop,
                                          temporal_summary)
from evqa_jax.metrics.violin import violin_accuracy, violin_metrics

__all__ = [
    "answer_categories", "answer_counts", "category_of_count", "ovqa_metrics", "table1",
    "answer_is_correct", "davis_aggregate", "davis_sequence_scores", "entry_mask_scores", "f_measure",
    "frame_scores", "mcq_metrics", "mcq_results_metrics", "parse_pred_segments", "seg2bmap", "st_evidence_summary",
    "temporal_iou_iop", "temporal_summary",
    "violin_accuracy", "violin_metrics",
]
