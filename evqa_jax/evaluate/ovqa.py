"""OVQA evaluator: per-category accuracy, total, mAcc and BNG of prediction files.

Usage:
  python -m evqa_jax.evaluate.ovqa --train-csv train.csv --test-csv test.csv --pred preds.csv --out metrics.json
  python -m evqa_jax.evaluate.ovqa --train-csv train.csv --test-csv test.csv \
      --pred a.csv --label FrozenBiLM --pred b.csv --label FrozenBiLM+ --out metrics.json --plot acc_vs_freq.png
  python -m evqa_jax.evaluate.ovqa --train-csv train.csv --test-csv test.csv \
      --pred violet.csv --label VIOLET --pred violet_plus.csv --label VIOLET+ --out metrics.json --fig10 fig10.png

  python -m evqa_jax.evaluate.ovqa --test-csv test.csv --test-vocab test_vocab.json --ans2cat ans2cat.json \
      --pred preds.csv --out metrics.json        categories and mAcc vocabulary from the authors' meta_data files

Inputs:
  train/test CSV: the FrozenBiLM / Just Ask layout, with an `answer` column (other columns are ignored). The train
    CSV gives the categories by train count (and the Table 1 statistics); --ans2cat replaces it.
  --ans2cat: the authors' meta_data/<dataset>/ans2cat.json {answer: "base"|"common"|"rare"|"unseen"}: the categories,
    as their evaluate() takes them. Every test answer must be in it.
  --test-vocab: the authors' test_vocab.json {answer: id}: the answer set of mAcc, as their class_tensor. Every test
    answer must be in it; an answer of it without test sample makes the official macc NaN (null), as theirs.
  --train-vocab: the authors' train_vocab.json {answer: id} (V_train; their evaluate() never reads it): with --ans2cat
    and no train CSV, "table1" counts the answers of V_train u V_test per category from these files.
  prediction CSV: columns `index` (row index in the test CSV, 0-based, counting data rows) and `prediction` (the
    answer string). A test row without a prediction is wrong; an index that is not a row of the test CSV, a repeated
    index or a missing column is an error.
All strings are read verbatim (no NaN conversion: answers such as "none" or "null" stay strings).

Output (--out): with one prediction file, "official": the authors' evaluate() results {base, common, rare, unseen,
total, macc} (fractions, 4 decimals as their logger prints them; a category without test sample is 0, as theirs),
then the flat metrics of `evqa_jax.metrics.ovqa.ovqa_metrics` unrounded (base, common, rare, unseen, non_base, total,
mAcc, BNG in percent; num_samples_*, num_answers_*, num_correct_*) plus "table1" (the answer statistics of the OVQA
paper's Table 1, with a train CSV). With several, {"models": {label: metrics with its "official"}, "table1": ...}.
--fig10 draws the OVQA paper's Fig. 10 (evqa_jax.evaluate.ovqa_figures.accurate_categories): per model, the categories
of the test answers it gets right on >= 90% (--fig10-threshold) of their samples, one pie each; "fig10" in --out.
--plot draws each answer's test accuracy against its train frequency (symlog x so that unseen answers, count 0, show),
with one line per model of the mean per-answer accuracy in frequency bins (powers of two) and the category borders.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from evqa_jax import cli
from evqa_jax import io
from evqa_jax.evaluate import json_safe, load_json_object, read_csv
from evqa_jax.metrics import ovqa as ovqa_metrics_lib

CATEGORIES = ovqa_metrics_lib.CATEGORIES


def read_answers(path: str, what: str = "answers CSV") -> list[str]:
  """The `answer` column of a train/test CSV, verbatim."""
  return read_csv(path, what, ["answer"])["answer"].tolist()


def read_vocab(path: str, what: str = "test_vocab JSON") -> dict[str, int]:
  """The authors' {answer: id} vocabulary file."""
  raw = load_json_object(path, what, "{answer: id}")
  for answer, idx in raw.items():
    if isinstance(idx, bool) or not isinstance(idx, int):
      raise ValueError(f"{what} {path} entry {answer!r}: id must be an integer, got {idx!r}")
  return raw


def read_ans2cat(path: str) -> dict[str, str]:
  """The authors' {answer: category} file."""
  raw = load_json_object(path, "ans2cat JSON", "{answer: category}")
  for answer, cat in raw.items():
    if cat not in CATEGORIES:
      raise ValueError(f"ans2cat JSON {path} entry {answer!r}: category must be one of {list(CATEGORIES)}, "
                       f"got {cat!r}")
  return raw


def official_block(m: dict) -> dict:
  """The authors' evaluate() results: per-category and total accuracy and macc as fractions, 4 decimals as their
  logger prints them; macc is NaN when the test vocabulary holds an answer without test sample (0/0 in their mean)."""
  # total / count of their meters, from our counts (0 for an empty meter).
  out = {c: round(m[f"num_correct_{c}"] / m[f"num_samples_{c}"], 4) if m[f"num_samples_{c}"] else 0.0
         for c in CATEGORIES + ("total",)}
  nan_macc = m.get("num_vocab_answers_without_samples", 0) > 0 or m["mAcc"] is None or math.isnan(m["mAcc"])
  out["macc"] = math.nan if nan_macc else round(m["mAcc"] / 100.0, 4)
  return out


def read_predictions(path: str, num_test: int) -> list[Optional[str]]:
  """Predictions aligned with the test rows, [num_test]; None where the file has no row for that index."""
  df = read_csv(path, "prediction CSV", ["index", "prediction"])
  preds: list[Optional[str]] = [None] * num_test
  seen = set()
  for line, (raw_idx, pred) in enumerate(zip(df["index"], df["prediction"]), start=2):
    try:
      idx = int(str(raw_idx).strip())
    except ValueError:
      raise ValueError(f"prediction CSV {path} line {line}: index {raw_idx!r} is not an integer") from None
    if not 0 <= idx < num_test:
      raise ValueError(f"prediction CSV {path} line {line}: index {idx} is not a row of the test CSV "
                       f"(it has {num_test} rows, indices 0..{num_test - 1})")
    if idx in seen:
      raise ValueError(f"prediction CSV {path} line {line}: index {idx} is predicted twice")
    seen.add(idx)
    preds[idx] = pred
  return preds


def format_table(results: dict[str, dict], stats: Optional[dict[str, dict[str, int]]]) -> str:
  """Plain-text table: one row per model, then the per-category sample and answer counts."""
  cols = list(CATEGORIES) + ["total", "mAcc", "BNG"]
  width = max([len("#test answers")] + [len(k) for k in results]) + 2
  lines = ["".join([f"{'model':<{width}}"] + [f"{c:>9}" for c in cols])]
  for label, m in results.items():
    cells = []
    for c in cols:
      v = m[c]
      cells.append(f"{'-':>9}" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:9.2f}")
    lines.append(f"{label:<{width}}" + "".join(cells))
  first = next(iter(results.values()))
  lines.append(f"{'#test samples':<{width}}" + "".join(f"{first[f'num_samples_{c}']:>9}" for c in CATEGORIES)
               + f"{first['num_samples_total']:>9}")
  lines.append(f"{'#test answers':<{width}}" + "".join(f"{first[f'num_answers_{c}']:>9}" for c in CATEGORIES)
               + f"{first['num_answers_total']:>9}")
  if stats is not None:
    lines.append(f"{'#answers (T1)':<{width}}" + "".join(f"{stats['num_answers'][c]:>9}" for c in CATEGORIES)
                 + f"{stats['num_answers']['total']:>9}")
  return "\n".join(lines)


def binned_accuracy(counts: np.ndarray, accuracies: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean per-answer accuracy in train-frequency bins: {0} and [2^k, 2^(k+1)).

  Args:
    counts: train count of each test answer, [answers]; accuracies: its test accuracy in %, [answers].
  Returns:
    (x, mean accuracy, number of answers) per non-empty bin; x is the bin's geometric-mean count (0 for unseen).
  """
  counts = np.asarray(counts, dtype=np.int64)
  accuracies = np.asarray(accuracies, dtype=np.float64)
  bins = np.where(counts > 0, np.floor(np.log2(np.maximum(counts, 1))).astype(np.int64) + 1, 0)
  xs, ys, ns = [], [], []
  for b in np.unique(bins):
    sel = bins == b
    xs.append(0.0 if b == 0 else float(np.exp(np.mean(np.log(counts[sel])))))
    ys.append(float(accuracies[sel].mean()))
    ns.append(int(sel.sum()))
  return np.asarray(xs), np.asarray(ys), np.asarray(ns)


def plot_accuracy_vs_frequency(train_counts: dict[str, int], gt_answers: Sequence[str],
                   predictions: dict[str, Sequence[Optional[str]]], path: str) -> None:
  """Per-answer accuracy vs train frequency, one binned line per model; written atomically to `path` (PNG)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7.5, 4.5))
  for k, (label, preds) in enumerate(predictions.items()):
    per_answer = ovqa_metrics_lib.per_answer_accuracy(gt_answers, preds)
    answers = sorted(per_answer)
    counts = np.array([train_counts.get(a, 0) for a in answers])
    acc = np.array([100.0 * per_answer[a][0] / per_answer[a][1] for a in answers])
    color = f"C{k % 10}"
    ax.scatter(counts, acc, s=6, alpha=0.25, color=color, linewidths=0)
    x, y, _ = binned_accuracy(counts, acc)
    ax.plot(x, y, marker="o", ms=4, color=color, label=label)
  ax.set_xscale("symlog", linthresh=1.0)
  for border in (ovqa_metrics_lib.RARE_MIN_COUNT - 0.5, ovqa_metrics_lib.COMMON_MIN_COUNT - 0.5,
                 ovqa_metrics_lib.BASE_MIN_COUNT - 0.5):
    ax.axvline(border, color="red", lw=0.8, ls="--")
  label_at = ax.get_xaxis_transform()  # x in data units, y in axes units
  for x, name in ((0.0, "unseen"), (3.0, "rare"), (33.0, "common"), (300.0, "base")):
    ax.text(x, 1.01, name, transform=label_at, ha="center", va="bottom", fontsize=8, color="red")
  ax.set_xlabel("answer frequency in train (symlog; 0 = unseen)")
  ax.set_ylabel("per-answer test accuracy (%)")
  ax.set_ylim(-2, 102)
  ax.set_title("OVQA: per-answer accuracy vs answer frequency in train", pad=16)
  ax.legend(loc="lower right")
  fig.tight_layout()
  with io.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=120)
  plt.close(fig)


def evaluate(train_csv: Optional[str], test_csv: str, pred_csvs: Sequence[str],
             labels: Optional[Sequence[str]] = None, test_vocab: Optional[str] = None,
             ans2cat: Optional[str] = None, train_vocab: Optional[str] = None) -> tuple[dict[str, dict], Optional[dict], dict[str, list], list[str], dict]:
  """Scores prediction files. Returns (metrics per label, table1 stats or None without a train CSV, predictions per
  label, gt answers, train counts)."""
  if labels is None or len(labels) == 0:
    labels = [os.path.splitext(os.path.basename(p))[0] for p in pred_csvs]
  if len(labels) != len(pred_csvs):
    raise ValueError(f"{len(pred_csvs)} --pred files but {len(labels)} --label values")
  if len(set(labels)) != len(labels):
    raise ValueError(f"labels must be distinct, got {list(labels)}")
  if train_csv is None and ans2cat is None:
    raise ValueError("give --train-csv (categories by train count) or --ans2cat (the authors' categories)")
  gt_answers = read_answers(test_csv, "test CSV")
  counts, stats = {}, None
  if train_csv is not None:
    counts = dict(ovqa_metrics_lib.answer_counts(read_answers(train_csv, "train CSV")))
    stats = ovqa_metrics_lib.table1(counts, gt_answers)
  categories = read_ans2cat(ans2cat) if ans2cat else None
  if stats is None and train_vocab is not None and categories is not None:
    v_train = read_vocab(train_vocab, "train_vocab JSON")
    try:
      stats = ovqa_metrics_lib.vocab_table(categories, v_train, gt_answers)
    except ValueError as e:
      raise ValueError(f"ans2cat JSON {ans2cat}: {e} (answers of {train_vocab} or {test_csv})") from None
  vocab = read_vocab(test_vocab) if test_vocab else None
  for path, table, what in ((ans2cat, categories, "ans2cat JSON"), (test_vocab, vocab, "test_vocab JSON")):
    if table is not None:
      absent = [a for a in dict.fromkeys(gt_answers) if a not in table]
      if absent:
        raise ValueError(f"{what} {path}: {len(absent)} answers of test CSV {test_csv} are missing from it, "
                         f"e.g. {absent[:5]}")
  results, preds_by_label = {}, {}
  for label, path in zip(labels, pred_csvs):
    preds = read_predictions(path, len(gt_answers))
    preds_by_label[label] = preds
    results[label] = ovqa_metrics_lib.ovqa_metrics(gt_answers, preds, counts, categories, vocab)
  return results, stats, preds_by_label, gt_answers, counts


def evaluate_files(train_csv: str, test_csv: str, pred_csv: str) -> dict[str, float | int | None]:
  """`ovqa_metrics` of one prediction CSV (index,prediction) against the train/test CSVs, for training-time
  evaluation: the same reading rules as the command line. Returns the flat metrics, ready for JSON."""
  results, _, _, _, _ = evaluate(train_csv, test_csv, [pred_csv], ["model"])
  return json_safe(results["model"])


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.ovqa", description=__doc__.split("\n")[0])
  parser.add_argument("--train-csv", default=None, help="train split CSV (answer column): categories by train count")
  parser.add_argument("--test-csv", required=True, help="test split CSV (answer column)")
  parser.add_argument("--ans2cat", default=None, help="the authors' ans2cat.json: categories (replaces train counts)")
  parser.add_argument("--test-vocab", default=None, help="the authors' test_vocab.json: the mAcc answer set")
  parser.add_argument("--train-vocab", default=None,
                      help="the authors' train_vocab.json: Table 1 answer counts with --ans2cat and no --train-csv")
  parser.add_argument("--pred", required=True, action="append", help="prediction CSV (index,prediction); repeatable")
  parser.add_argument("--label", action="append", default=None, help="model name per --pred, in the same order")
  parser.add_argument("--out", required=True, help="metrics JSON to write")
  parser.add_argument("--plot", default=None, help="optional PNG: per-answer accuracy vs train frequency")
  parser.add_argument("--fig10", default=None,
                      help="optional PNG: the OVQA paper's Fig. 10, the categories of the answers each model gets "
                           "right at >= --fig10-threshold %% accuracy (one pie per --pred); the numbers go to --out")
  parser.add_argument("--fig10-threshold", type=float, default=90.0, help="Fig. 10's per-answer accuracy bar (%%)")
  args = parser.parse_args(argv)
  io.check_args(args, ["out", "plot", "fig10"])
  if not 0.0 <= args.fig10_threshold <= 100.0:
    parser.error(f"--fig10-threshold {args.fig10_threshold} is not a percentage in [0, 100]")
  if args.plot and args.train_csv is None:
    parser.error("--plot needs --train-csv (the train frequency of each answer)")

  results, stats, preds, gt_answers, counts = evaluate(args.train_csv, args.test_csv, args.pred, args.label,
                                                       args.test_vocab, args.ans2cat, args.train_vocab)
  with_official = {label: dict(official=official_block(m), **m) for label, m in results.items()}
  if len(results) == 1:
    out = dict(next(iter(with_official.values())))
  else:
    out = {"models": with_official}
  if stats is not None:
    out["table1"] = stats
  fig10 = None
  if args.fig10:
    from evqa_jax.evaluate import ovqa_figures  # pylint: disable=g-import-not-at-top
    category_of = (read_ans2cat(args.ans2cat) if args.ans2cat
                   else ovqa_metrics_lib.answer_categories(counts, gt_answers))
    fig10 = {label: ovqa_figures.accurate_categories(gt_answers, p, category_of, args.fig10_threshold)
             for label, p in preds.items()}
    out["fig10"] = fig10
  out = json_safe(out)
  io.write_json(args.out, out)
  print(format_table(results, stats))
  if args.plot:
    plot_accuracy_vs_frequency(counts, gt_answers, preds, args.plot)
  if fig10 is not None:
    print(format_fig10(fig10))
    ovqa_figures.plot_categories(fig10, args.fig10, "answers at >= "
                                 f"{args.fig10_threshold:g}% accuracy, by category (OVQA paper, Fig. 10)")
  return out


def format_fig10(fig10: dict) -> str:
  """Plain text: per model, the answers at the Fig. 10 threshold by category (count and share)."""
  lines = [f"Fig. 10: test answers with accuracy >= {next(iter(fig10.values()))['threshold']:g}%, by category"]
  for label, r in fig10.items():
    lines.append(f"  {label}: {r['num_answers']} answers; " + ", ".join(
        f"{c} {r['answers'][c]} ({r['shares'][c]:.1f}%)" for c in CATEGORIES))
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(cli.run(main))
