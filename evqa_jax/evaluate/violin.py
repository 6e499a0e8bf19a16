"""VIOLIN evaluator: statement accuracy per split.

Usage:
  python -m evqa_jax.evaluate.violin --gt violin_annotation.json --pred preds.json --out metrics.json [--split test]

Inputs:
  --gt: the official annotation {clip_id: {"file", "split": train|validate|test, "sub": [...],
    "statement": [[positive, negative] x 3]}}.
  --pred: {clip_id: [[p_pos, p_neg] x 3]}: for each statement pair of the clip (annotation order) the model's
    probability in [0, 1] that the positive and that the negative statement is entailed by the clip.
    A positive statement is correct when p_pos >= 0.5, a negative one when p_neg < 0.5. Clips of a scored split that
    are missing from the file count as wrong (all six statements). A clip id that is not in the annotation, a
    probability outside [0, 1] or a wrong number of pairs is an error.
  --split: score only these splits (repeatable); default every split of the annotation.

Output: {"accuracy": percent pooled over the scored splits, "num_statements", "num_correct", "num_clips",
"num_missing_clips", "splits": {split: {"accuracy", "num_statements", "num_correct", "num_clips",
"num_missing_clips"}}}.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Optional, Sequence

from evqa_jax import cli
from evqa_jax import io
from evqa_jax.evaluate import json_safe, load_json_object
from evqa_jax.metrics import violin as violin_lib


def _load_json(path: str, what: str) -> dict:
  return load_json_object(path, what, "{clip_id: ...}")


def read_annotation(path: str) -> dict[str, dict[str, Any]]:
  """{clip_id: {"split": str, "statement": [[pos, neg], ...]}} with every clip checked."""
  raw = _load_json(path, "annotation JSON")
  clips = {}
  for clip_id, rec in raw.items():
    where = f"annotation JSON {path} clip {clip_id}"
    if not isinstance(rec, dict) or not isinstance(rec.get("split"), str):
      raise ValueError(f"{where}: expected an object with a string 'split'")
    statements = rec.get("statement")
    if not isinstance(statements, list) or not statements or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in statements):
      raise ValueError(f"{where}: 'statement' must be a non-empty list of [positive, negative] pairs")
    clips[clip_id] = {"split": rec["split"], "statement": statements}
  return clips


def read_predictions(path: str, clips: dict[str, dict[str, Any]]) -> dict[str, list[list[float]]]:
  raw = _load_json(path, "prediction JSON")
  preds = {}
  for clip_id, probs in raw.items():
    where = f"prediction JSON {path} clip {clip_id}"
    if clip_id not in clips:
      raise ValueError(f"{where}: clip is not in the annotation")
    n_pairs = len(clips[clip_id]["statement"])
    if not isinstance(probs, list) or len(probs) != n_pairs or not all(
        isinstance(p, list) and len(p) == 2 for p in probs):
      raise ValueError(f"{where}: expected {n_pairs} [p_pos, p_neg] pairs, got {probs!r}")
    for pair in probs:
      for p in pair:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
          raise ValueError(f"{where}: {p!r} is not a probability in [0, 1]")
    preds[clip_id] = [[float(a), float(b)] for a, b in probs]
  return preds


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.violin", description=__doc__.split("\n")[0])
  parser.add_argument("--gt", required=True, help="violin_annotation.json")
  parser.add_argument("--pred", required=True, help="prediction JSON {clip_id: [[p_pos, p_neg] x 3]}")
  parser.add_argument("--out", required=True, help="metrics JSON to write")
  parser.add_argument("--split", action="append", default=None, help="split to score (repeatable); default all")
  args = parser.parse_args(argv)

  clips = read_annotation(args.gt)
  if args.split:
    known = {c["split"] for c in clips.values()}
    unknown = [s for s in args.split if s not in known]
    if unknown:
      raise ValueError(f"--split {unknown} not in annotation {args.gt} (its splits: {sorted(known)})")
  preds = read_predictions(args.pred, clips)
  metrics = json_safe(violin_lib.violin_metrics(clips, preds, args.split))
  io.write_json(args.out, metrics)
  for split, row in metrics["splits"].items():
    acc = "-" if row["accuracy"] is None else f"{row['accuracy']:.2f}"
    print(f"{split:>10}: accuracy {acc:>6}  ({row['num_clips']} clips, {row['num_missing_clips']} without prediction)")
  acc = "-" if metrics["accuracy"] is None else f"{metrics['accuracy']:.2f}"
  print(f"{'all':>10}: accuracy {acc:>6}")
  return metrics


if __name__ == "__main__":
  sys.exit(cli.run(main))
