"""ST-Evidence-MCQ evaluator: QA, temporal-evidence, spatial-evidence and pooled multiple-choice accuracy.

Usage:
  python -m evqa_jax.evaluate.st_evidence_mcq --gt gt.json --pred preds.json --out metrics.json

Ground-truth JSON (one object per entry; option indices are 0-based):
  {entry_id: {
      "qa":       {"options": [text x 5], "answer": int},
      "temporal": {"options": [[[s, e], ...] x 4], "answer": int},     each option a set of segments in seconds
      "spatial":  {"frame": int, "answer": int [, "options": [... x 4]]}}}
  `spatial.frame` is the reference frame (at 6 fps) the candidate masks are drawn on; without `spatial.options` there
  are 4 candidate masks, so the answer must be in 0..3. Other keys (e.g. `spatial.options_dir`, the candidate mask
  folder written by data_prep/st_evidence.py) are ignored: scoring needs only the indices.

Prediction JSON:
  {entry_id: {"qa": int, "temporal": int, "spatial": int}}   chosen option indices, 0-based.
  A missing entry, a missing task or null is wrong. A non-integer or out-of-range index is an error; prediction
  entries that are not in the ground truth are ignored with a warning.

Output (percent): qa, temporal, spatial, pooled (all three right), plus num_entries and num_missing_entries.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

from evqa_jax import cli
from evqa_jax import io
from evqa_jax.evaluate import json_safe, load_json_object
from evqa_jax.metrics import st_evidence as st

NUM_SPATIAL_OPTIONS = 4


def _load_json(path: str, what: str) -> dict:
  return load_json_object(path, what, "{entry_id: {...}}")


def _is_index(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def read_gt(path: str) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
  """Returns ({entry_id: {task: correct index}}, {entry_id: {task: number of options}})."""
  raw = _load_json(path, "ground-truth JSON")
  answers, num_options = {}, {}
  for entry_id, rec in raw.items():
    where = f"ground-truth JSON {path} entry {entry_id}"
    if not isinstance(rec, dict):
      raise ValueError(f"{where}: expected an object with qa, temporal, spatial")
    answers[entry_id], num_options[entry_id] = {}, {}
    for task in st.MCQ_TASKS:
      sub = rec.get(task)
      if not isinstance(sub, dict):
        raise ValueError(f"{where}: missing or malformed '{task}' object")
      if task == "spatial":
        if not _is_index(sub.get("frame")):
          raise ValueError(f"{where}: spatial.frame must be an integer frame index, got {sub.get('frame')!r}")
        n = len(sub["options"]) if isinstance(sub.get("options"), list) else NUM_SPATIAL_OPTIONS
      else:
        options = sub.get("options")
        if not isinstance(options, list) or not options:
          raise ValueError(f"{where}: {task}.options must be a non-empty list")
        if task == "temporal":
          for k, opt in enumerate(options):
            st.parse_segments(opt, f"{where} temporal.options[{k}]")
        n = len(options)
      ans = sub.get("answer")
      if not _is_index(ans) or not 0 <= ans < n:
        raise ValueError(f"{where}: {task}.answer must be an integer in 0..{n - 1}, got {ans!r}")
      answers[entry_id][task] = ans
      num_options[entry_id][task] = n
  return answers, num_options


def read_predictions(path: str, num_options: dict[str, dict[str, int]]) -> dict[str, dict[str, Optional[int]]]:
  raw = _load_json(path, "prediction JSON")
  preds = {}
  unmatched = []
  for entry_id, rec in raw.items():
    where = f"prediction JSON {path} entry {entry_id}"
    if not isinstance(rec, dict):
      raise ValueError(f"{where}: expected an object {{qa, temporal, spatial}}, got {rec!r}")
    if entry_id not in num_options:
      unmatched.append(entry_id)
      continue
    preds[entry_id] = {}
    for task in st.MCQ_TASKS:
      v = rec.get(task)
      if v is not None:
        n = num_options[entry_id][task]
        if not _is_index(v) or not 0 <= v < n:
          raise ValueError(f"{where}: {task} must be an option index in 0..{n - 1} (or null), got {v!r}")
      preds[entry_id][task] = v
  if unmatched:
    print(f"warning: {len(unmatched)} prediction entries are not in the ground truth and are ignored, "
          f"e.g. {unmatched[:5]}", file=sys.stderr)
  return preds


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.st_evidence_mcq",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--gt", required=True, help="ground-truth JSON")
  parser.add_argument("--pred", required=True, help="prediction JSON")
  parser.add_argument("--out", required=True, help="metrics JSON to write")
  args = parser.parse_args(argv)

  gt, num_options = read_gt(args.gt)
  preds = read_predictions(args.pred, num_options)
  metrics = json_safe(st.mcq_metrics(gt, preds))
  io.write_json(args.out, metrics)
  print("".join(f"{k:>10}" for k in ("qa", "temporal", "spatial", "pooled")))
  print("".join(f"{'-':>10}" if metrics[k] is None else f"{metrics[k]:10.2f}"
                for k in ("qa", "temporal", "spatial", "pooled")))
  print(f"{metrics['num_entries']} entries, {metrics['num_missing_entries']} without prediction")
  return metrics


if __name__ == "__main__":
  sys.exit(cli.run(main))
