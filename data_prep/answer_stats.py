"""The OVQA paper's Table 1 (answer statistics) for a converted dataset.

    python -m data_prep.answer_stats DIR [--dataset msrvtt|msvd|tgif|activitynet] [--json OUT.json]
        [--fig1 FIG1.png [--top 1000]]

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
With --fig1 also the paper's Fig. 1: the answers in three groups, the `--top` most frequent train answers
("~ Top-1000"; ties alphabetical, as the converter's V_train), the other train answers ("Top-1000 ~") and the test
answers never seen in train ("Unseen"); printed as each group's share of the unique answers (Fig. 1a) and of the
samples (Fig. 1b; train, test and both: the figure's counts are not said to be of one split) and drawn as a PNG
with (c) the samples per answer in sorted order, log scale, the groups' borders in red.
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


def fig1_groups(train_answers: Sequence[str], test_answers: Sequence[str], top: int = 1000) -> dict:
  """Fig. 1's groups: {"groups": {name: {"answers", "train_samples", "test_samples", "samples"}}, "shares": the
  same in % of their totals, "sorted_counts": train + test samples per answer, top group first, then the rest of
  V_train, then unseen, each group in descending order}."""
  import collections  # pylint: disable=g-import-not-at-top
  train, test = collections.Counter(train_answers), collections.Counter(test_answers)
  order = [a for a, _ in sorted(train.items(), key=lambda kv: (-kv[1], kv[0]))]
  unseen = sorted((a for a in test if a not in train), key=lambda a: (-test[a], a))
  members = {f"~ Top-{top}": order[:top], f"Top-{top} ~": order[top:], "Unseen": unseen}
  groups = {name: {"answers": len(ans), "train_samples": sum(train[a] for a in ans),
                   "test_samples": sum(test[a] for a in ans), "samples": sum(train[a] + test[a] for a in ans)}
            for name, ans in members.items()}
  totals = {k: sum(g[k] for g in groups.values()) for k in ("answers", "train_samples", "test_samples", "samples")}
  shares = {name: {k: round(100.0 * g[k] / totals[k], 2) if totals[k] else 0.0 for k in g}
            for name, g in groups.items()}
  sorted_counts = [c for ans in members.values() for c in sorted((train[a] + test[a] for a in ans), reverse=True)]
  return {"groups": groups, "shares": shares, "sorted_counts": sorted_counts}


def format_fig1(f: dict) -> str:
  lines = ["| group (Fig. 1) | answers | % answers (1a) | % train samples | % test samples | % samples (1b) |",
           "|---|---:|---:|---:|---:|---:|"]
  for name, g in f["groups"].items():
    sh = f["shares"][name]
    lines.append(f"| {name} | {g['answers']:,} | {sh['answers']:.2f} | {sh['train_samples']:.2f} | "
                 f"{sh['test_samples']:.2f} | {sh['samples']:.2f} |")
  return "\n".join(lines)


def plot_fig1(f: dict, path: str, title: str = "") -> None:
  """Fig. 1 (a) answers and (b) samples per group as pie charts, (c) samples per sorted answer; PNG, atomically."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = list(f["groups"])
  fig, axes = plt.subplots(1, 3, figsize=(13, 4), gridspec_kw={"width_ratios": [1, 1, 2]})
  for ax, key, name in ((axes[0], "answers", "(a) unique answers"), (axes[1], "samples", "(b) samples")):
    values = [f["groups"][n][key] for n in names]
    ax.pie(values, labels=[f"{n}\n{f['shares'][n][key]:.1f}%" for n in names], colors=["C0", "C1", "C3"],
           startangle=90, textprops={"fontsize": 8})
    ax.set_title(name)
  counts = f["sorted_counts"]
  axes[2].plot(range(len(counts)), [max(c, 1) for c in counts], color="C0", lw=1)
  axes[2].set_yscale("log")
  border = 0
  for n in names[:-1]:
    border += f["groups"][n]["answers"]
    axes[2].axvline(border - 0.5, color="red", lw=0.8)
  axes[2].set_xlabel("answers, sorted (top group, rest of train, unseen)")
  axes[2].set_ylabel("samples per answer (train + test, log)")
  axes[2].set_title("(c) samples per sorted answer")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  with evqa_io.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=110)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.answer_stats", description=__doc__.split("\n")[0])
  parser.add_argument("data_dir", help="converted OVQA directory (holds train.csv and test.csv)")
  parser.add_argument("--dataset", choices=sorted(PAPER_TABLE1), default=None,
                      help="print the paper's Table 1 and section 4.1 numbers of this dataset beside ours")
  parser.add_argument("--json", default=None, help="also write the table as JSON here")
  parser.add_argument("--fig1", default=None, help="also print the paper's Fig. 1 groups and draw it to this PNG")
  parser.add_argument("--top", type=int, default=1000, help="Fig. 1's first group: the top-k train answers")
  args = parser.parse_args(argv)
  evqa_io.check_args(args, ["json", "fig1"])
  t = table1_from_dir(args.data_dir)
  print(format_table1(t, args.dataset))
  if args.dataset:
    splits = splits_from_dir(args.data_dir)
    print()
    print(format_splits(splits, args.dataset))
    t = dict(t, splits=splits, paper={"table1": PAPER_TABLE1[args.dataset], "splits": PAPER_SPLITS[args.dataset]})
  if args.fig1:
    f = fig1_groups(_answers(os.path.join(args.data_dir, "train.csv")),
                    _answers(os.path.join(args.data_dir, "test.csv")), args.top)
    print()
    print(format_fig1(f))
    plot_fig1(f, args.fig1, f"{args.dataset or os.path.basename(os.path.normpath(args.data_dir))}: answer groups")
    print(f"wrote {args.fig1}")
    t = dict(t, fig1={"groups": f["groups"], "shares": f["shares"]})
  if args.json:
    evqa_io.write_json(args.json, t)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
