"""The OVQA paper's Table 1 (answer statistics) for a converted dataset.

    python -m data_prep.answer_stats DIR [--json OUT.json]

Reads DIR/train.csv and DIR/test.csv (the copies the converter writes; any FrozenBiLM-style CSV directory works;
answers verbatim, as the evaluator reads them) and prints, per category (base >= 101 train occurrences, common
11..100, rare 1..10, unseen 0; the definition of evqa_jax.metrics.ovqa):
  answers        unique answers of the category in V_train u V_test (the paper's Table 1 count)
  test answers   unique answers of the category that occur in the test split
  test samples   test rows whose ground-truth answer is in the category (and their share in %)
  train samples  train rows whose answer is in the category
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Sequence

import pandas as pd

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax.metrics import ovqa as ovqa_metrics

CATEGORIES = ovqa_metrics.CATEGORIES
_COLUMNS = (("answers", "num_answers"), ("test_answers", "num_test_answers"),
            ("test_samples", "num_test_samples"), ("train_samples", "num_train_samples"))


def table1(train_answers: Sequence[str], test_answers: Sequence[str]) -> dict:
  """{category: {"answers", "test_answers", "test_samples", "test_samples_pct", "train_samples"}} for
  base / common / rare / unseen / total (counts from evqa_jax.metrics.ovqa.table1)."""
  t = ovqa_metrics.table1(list(train_answers), list(test_answers))
  num_test = len(test_answers)
  out = {}
  for cat in CATEGORIES + ("total",):
    row = {name: int(t[key][cat]) for name, key in _COLUMNS}
    row["test_samples_pct"] = round(100.0 * row["test_samples"] / num_test, 2) if num_test else 0.0
    out[cat] = row
  return out


def _answers(path: str) -> list[str]:
  if not evqa_io.epath_of(path).exists():  # local, or gs://... (a converter's --out on a bucket)
    raise FileNotFoundError(f"{path} does not exist (answer_stats reads a converted directory's train.csv/test.csv)")
  df = pd.read_csv(io.StringIO(evqa_io.read_text(path, "CSV file")), dtype=str, keep_default_na=False)
  if "answer" not in df.columns:
    raise ValueError(f"{path}: no 'answer' column (columns: {list(df.columns)})")
  return df["answer"].tolist()


def table1_from_dir(data_dir: str) -> dict:
  """table1() of DIR/train.csv and DIR/test.csv."""
  return table1(_answers(os.path.join(data_dir, "train.csv")), _answers(os.path.join(data_dir, "test.csv")))


def format_table1(t: dict) -> str:
  """Markdown table of a table1() result."""
  lines = ["| category | answers | test answers | test samples | test samples % | train samples |",
           "|---|---:|---:|---:|---:|---:|"]
  for cat in CATEGORIES + ("total",):
    r = t[cat]
    lines.append(f"| {cat} | {r['answers']} | {r['test_answers']} | {r['test_samples']} | "
                 f"{r['test_samples_pct']:.2f} | {r['train_samples']} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.answer_stats", description=__doc__.split("\n")[0])
  parser.add_argument("data_dir", help="converted OVQA directory (holds train.csv and test.csv)")
  parser.add_argument("--json", default=None, help="also write the table as JSON here")
  args = parser.parse_args(argv)
  evqa_io.check_args(args, ["json"])
  t = table1_from_dir(args.data_dir)
  print(format_table1(t))
  if args.json:
    evqa_io.write_json(args.json, t)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
