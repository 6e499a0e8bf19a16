"""VIOLIN evaluator: statement accuracy of one split, as the authors' `validate()` (jimmy646/violin main.py).

Usage:
  python -m evqa_jax.evaluate.violin --gt violin_annotation.json --pred preds.json --split test --out metrics.json

Inputs:
  --gt: the official annotation {clip_id: {"file", "split": train|validate|test, "sub": [...],
    "statement": [[positive, negative] x 3]}}.
  --pred: {clip_id: [[p_pos, p_neg] x 3]}: for each statement pair of the clip (annotation order) the model's
    probability that the positive and that the negative statement is entailed by the clip.
    A positive statement is correct when p_pos >= 0.5, a negative one when p_neg < 0.5, compared in float32.
    Clips of the scored split missing from the file count as wrong (all six statements). A malformed clip entry (not
    in the annotation, wrong number of pairs, a value that is not a number) is counted by kind and scored wrong;
    numbers outside [0, 1] are compared as they are and counted (out_of_range).
  --split: the split to score, default test (the authors' test run); repeat it to score several, each on its own.
    Splits are never pooled into one accuracy.

Output: "official": {"acc", "real acc", "fake acc"} as the authors print them (fractions, 4 decimals) for each scored
split ({split: {...}}); then our unrounded values per split under "splits" and, for the first --split, at the top
level: accuracy, real_accuracy (positive statements), fake_accuracy (negative statements) in percent, num_statements,
num_correct, num_real_correct, num_fake_correct, num_clips, num_missing_clips; and "format_errors" by kind.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Optional, Sequence

from evqa_jax import cli
from evqa_jax import io
from evqa_jax import log
from evqa_jax.evaluate import json_safe, load_json_object
from evqa_jax.metrics import violin as violin_lib


def _load_json(path: str, what: str, finite: bool = True) -> dict:
  return load_json_object(path, what, "{clip_id: ...}", finite)


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


PRED_ERROR_KINDS = ("not_in_annotation", "wrong_pairs", "not_a_number", "out_of_range")


def read_predictions(path: str, clips: dict[str, dict[str, Any]],
                     errors: Optional[dict[str, int]] = None) -> dict[str, list[list[float]]]:
  """{clip_id: [[p_pos, p_neg] x pairs]} of the well-formed clip entries; never raises on an entry.

  A malformed entry is left out (its clip then scores wrong) and counted in `errors` by kind (PRED_ERROR_KINDS);
  numbers outside [0, 1] are kept and counted as out_of_range.
  """
  raw = _load_json(path, "prediction JSON", finite=False)
  errors = {} if errors is None else errors
  for kind in PRED_ERROR_KINDS:
    errors.setdefault(kind, 0)
  preds = {}
  for clip_id, probs in raw.items():
    if clip_id not in clips:
      errors["not_in_annotation"] += 1
      continue
    n_pairs = len(clips[clip_id]["statement"])
    if not isinstance(probs, list) or len(probs) != n_pairs or not all(
        isinstance(p, list) and len(p) == 2 for p in probs):
      errors["wrong_pairs"] += 1
      continue
    values = [p for pair in probs for p in pair]
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) for p in values):
      errors["not_a_number"] += 1
      continue
    if not all(0.0 <= p <= 1.0 for p in values):
      errors["out_of_range"] += 1
    preds[clip_id] = [[float(a), float(b)] for a, b in probs]
  if errors["not_in_annotation"]:
    log.warning(f"{errors['not_in_annotation']} prediction clips are not in the annotation and are ignored")
  return preds


def official_block(row: dict[str, Any]) -> dict[str, Any]:
  """The authors' printed numbers: acc, real acc, fake acc = correct / float(count), "%.4f" (from the counts, so the
  rounding is theirs to the last bit); None for an empty split (theirs divides by zero)."""
  n = row["num_statements"]
  fracs = {"acc": (row["num_correct"], n), "real acc": (row["num_real_correct"], n // 2),
           "fake acc": (row["num_fake_correct"], n // 2)}
  return {k: round(c / float(d), 4) if d else None for k, (c, d) in fracs.items()}


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.violin", description=__doc__.split("\n")[0])
  parser.add_argument("--gt", required=True, help="violin_annotation.json")
  parser.add_argument("--pred", required=True, help="prediction JSON {clip_id: [[p_pos, p_neg] x 3]}")
  parser.add_argument("--out", required=True, help="metrics JSON to write")
  parser.add_argument("--split", action="append", default=None,
                      help="split to score (default test); repeatable, each split scored on its own")
  args = parser.parse_args(argv)
  io.check_args(args, ["out"])

  splits = list(dict.fromkeys(args.split or ["test"]))
  clips = read_annotation(args.gt)
  known = {c["split"] for c in clips.values()}
  unknown = [s for s in splits if s not in known]
  if unknown:
    raise ValueError(f"--split {unknown} not in annotation {args.gt} (its splits: {sorted(known)}); "
                     f"choose one with --split")
  errors: dict[str, int] = {}
  preds = read_predictions(args.pred, clips, errors)
  per = violin_lib.violin_metrics(clips, preds, splits)["splits"]
  metrics = dict(per[splits[0]], split=splits[0], splits=per, format_errors=errors,
                 official={s: official_block(row) for s, row in per.items()})
  metrics = json_safe(metrics)
  io.write_json(args.out, metrics)
  for split, row in metrics["splits"].items():
    acc = "-" if row["accuracy"] is None else f"{row['accuracy']:.2f}"
    o = metrics["official"][split]
    print(f"{split:>10}: accuracy {acc:>6}  (acc {o['acc']} real acc {o['real acc']} fake acc {o['fake acc']}; "
          f"{row['num_clips']} clips, {row['num_missing_clips']} without prediction)")
  bad = {k: v for k, v in errors.items() if v}
  if bad:
    print(f"format errors: {bad}")
  return metrics


if __name__ == "__main__":
  sys.exit(cli.run(main))
