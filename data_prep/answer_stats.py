"""The OVQA paper's Table 1 (answer statistics) for a converted dataset.

    python -m data_prep.answer_stats DIR [--json OUT.json]

Reads DIR/train.csv and DIR/test.csv (the copies the converter writes; any FrozenBiLM-style CSV directory works)
and prints, per category (base >= 101 train occurrences, common 11..100, rare 1..10, unseen 0):
  answers        unique answers of the category in V_train + V_test (the paper's Table 1 count)
  test answers   unique answers of the category that occur in the test split
  test samples   test rows whose ground-truth answer is in the category (and their share in %)
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Sequence

import pandas as pd

from evqa_jax import io as evqa_io
from data_prep import ovqa


def table1(train_answers: Sequence[str], test_answers: Sequence[str]) -> dict:
  """{category: {"answers", "test_answers", "test_samples", "test_samples_pct"}} for base/common/rare/unseen/total."""
  counts = collections.Counter(train_answers)
  test_counts = collections.Counter(test_answers)
  out = {c: {"answers": 0, "test_answers": 0, "test_samples": 0} for c in ovqa.CATEGORIES}
  for answer in set(counts) | set(test_counts):
    cat = ovqa.answer_category(counts.get(answer, 0))
    out[cat]["answers"] += 1
    if answer in test_counts:
      out[cat]["test_answers"] += 1
      out[cat]["test_samples"] += test_counts[answer]
  out["total"] = {k: sum(out[c][k] for c in ovqa.CATEGORIES) for k in ("answers", "test_answers", "test_samples")}
  num_test = max(1, len(test_answers))
  for row in out.values():
    row["test_samples_pct"] = round(100.0 * row["test_samples"] / num_test, 2)
  return out


def _answers(path: str) -> list[str]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist (answer_stats reads the converter's train.csv/test.csv)")
  df = pd.read_csv(path, dtype=str, keep_default_na=False)
  if "answer" not in df.columns:
    raise ValueError(f"{path}: no 'answer' column (columns: {list(df.columns)})")
  return df["answer"].tolist()


def table1_from_dir(data_dir: str) -> dict:
  """table1() of DIR/train.csv and DIR/test.csv."""
  return table1(_answers(os.path.join(data_dir, "train.csv")), _answers(os.path.join(data_dir, "test.csv")))


def format_table1(t: dict) -> str:
  """Markdown table of a table1() result."""
  lines = ["| category | answers | test answers | test samples | test samples % |",
           "|---|---:|---:|---:|---:|"]
  for cat in ovqa.CATEGORIES + ("total",):
    r = t[cat]
    lines.append(f"| {cat} | {r['answers']} | {r['test_answers']} | {r['test_samples']} | "
                 f"{r['test_samples_pct']:.2f} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.answer_stats", description=__doc__.split("\n")[0])
  parser.add_argument("data_dir", help="converted OVQA directory (holds train.csv and test.csv)")
  parser.add_argument("--json", default=None, help="also write the table as JSON here")
  args = parser.parse_args(argv)
  try:
    t = table1_from_dir(args.data_dir)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(format_table1(t))
  if args.json:
    evqa_io.write_json(args.json, t)
  return 0


if __name__ == "__main__":
  sys.exit(main())
