"""The OVQA paper's Table 1 (answer statistics) for a converted dataset.

    python -m data_prep.answer_stats DIR [--dataset msrvtt|msvd|tgif|activitynet] [--json OUT.json]

Reads DIR/train.csv and DIR/test.csv (the copies the converter writes; any FrozenBiLM-style CSV directory works;
answers verbatim, as the evaluator reads them) and prints, per category (base >= 101 train occurrences, common
11..100, rare 1..10, unseen 0; the definition of evqa_jax.metrics.ovqa):
  answers        unique answers of the category in V_train u V_test (the paper's Table 1 count)
  test answers   unique answers of the category that occur in the test split
  test samples   test rows whose ground-truth answer is in the category (and their share in %)
  train samples  train rows whose answer is in the category
With --dataset the paper's numbers are printed beside ours: Table 1's answer counts, and section 4.1's split sizes
(train / test questions, rounded to thousands in the paper) and vocabulary sizes (|V_train| / |V_test|: vocab.json's
vocab_train / vocab_test when DIR is a converted folder, else the CSVs' unique answers).
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
# The paper's Table 1 (answers per category) and section 4.1 (train / test questions, |V_train| / |V_test|).
PAPER_TABLE1 = {
    "msvd": {"base": 41, "common": 333, "rare": 1478, "unseen": 391, "total": 2243},
    "msrvtt": {"base": 205, "common": 937, "rare": 2858, "unseen": 1632, "total": 5632},
    "tgif": {"base": 38, "common": 210, "rare": 1292, "unseen": 206, "total": 1746},
    "activitynet": {"base": 26, "common": 275, "rare": 1353, "unseen": 1378, "total": 3032},
}
PAPER_SPLITS = {  # questions as the paper prints them ("159K"), vocabularies exact
    "msvd": {"train_questions": "32K", "test_questions": "13K", "vocab_train": 1852, "vocab_test": 1200},
    "msrvtt": {"train_questions": "159K", "test_questions": "73K", "vocab_train": 4000, "vocab_test": 4173},
    "tgif": {"train_questions": "39K", "test_questions": "13K", "vocab_train": 1540, "vocab_test": 933},
    "activitynet": {"train_questions": "32K", "test_questions": "8K", "vocab_train": 1654, "vocab_test": 2103},
}
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


def format_table1(t: dict, dataset: str | None = None) -> str:
  """Markdown table of a table1() result; with `dataset`, the paper's Table 1 answer counts in a last column."""
  paper = PAPER_TABLE1[dataset] if dataset else None
  lines = ["| category | answers | test answers | test samples | test samples % | train samples |" +
           (" paper: answers |" if paper else ""), "|---|---:|---:|---:|---:|---:|" + ("---:|" if paper else "")]
  for cat in CATEGORIES + ("total",):
    r = t[cat]
    lines.append(f"| {cat} | {r['answers']} | {r['test_answers']} | {r['test_samples']} | "
                 f"{r['test_samples_pct']:.2f} | {r['train_samples']} |" + (f" {paper[cat]:,} |" if paper else ""))
  return "\n".join(lines)


def splits_from_dir(data_dir: str) -> dict:
  """Section 4.1's sizes of DIR: train / test questions (CSV rows) and |V_train| / |V_test|."""
  train, test = _answers(os.path.join(data_dir, "train.csv")), _answers(os.path.join(data_dir, "test.csv"))
  vocab_path = evqa_io.epath_of(data_dir) / "vocab.json"
  if vocab_path.exists():
    vocab = evqa_io.load_json(os.fspath(vocab_path), "answer vocabulary")
    sizes = {"vocab_train": len(vocab["vocab_train"]), "vocab_test": len(vocab["vocab_test"])}
  else:
    sizes = {"vocab_train": len(set(train)), "vocab_test": len(set(test))}
  return {"train_questions": len(train), "test_questions": len(test), **sizes}


def format_splits(s: dict, dataset: str) -> str:
  """Markdown: section 4.1's sizes of a splits_from_dir() result beside the paper's for `dataset`."""
  p = PAPER_SPLITS[dataset]
  names = (("train_questions", "train questions"), ("test_questions", "test questions"),
           ("vocab_train", "train vocabulary (V_train)"), ("vocab_test", "test vocabulary (V_test)"))
  return "\n".join([f"| section 4.1 ({dataset}) | ours | paper |", "|---|---:|---:|"] +
                   [f"| {label} | {s[key]:,} | {p[key] if isinstance(p[key], str) else format(p[key], ',')} |"
                    for key, label in names])


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.answer_stats", description=__doc__.split("\n")[0])
  parser.add_argument("data_dir", help="converted OVQA directory (holds train.csv and test.csv)")
  parser.add_argument("--dataset", choices=sorted(PAPER_TABLE1), default=None,
                      help="print the paper's Table 1 and section 4.1 numbers of this dataset beside ours")
  parser.add_argument("--json", default=None, help="also write the table as JSON here")
  args = parser.parse_args(argv)
  evqa_io.check_args(args, ["json"])
  t = table1_from_dir(args.data_dir)
  print(format_table1(t, args.dataset))
  if args.dataset:
    splits = splits_from_dir(args.data_dir)
    print()
    print(format_splits(splits, args.dataset))
    t = dict(t, splits=splits, paper={"table1": PAPER_TABLE1[args.dataset], "splits": PAPER_SPLITS[args.dataset]})
  if args.json:
    evqa_io.write_json(args.json, t)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
