"""OVQA metrics (REFERENCE.md section 1): answer categories, per-category accuracy, mAcc and BNG.

Plain numpy/python so that training-time evaluation and `python -m evqa_jax.evaluate.ovqa` share one definition.

Category of an answer by its count c in the train split: base c >= 101, common 11..100, rare 1..10, unseen c = 0.
A prediction is correct when the predicted string equals the ground-truth string (no normalisation: normalising is
the data converter's job, so that every model is scored on identical strings). A missing prediction (None) is wrong.

Accuracies are percentages. A category without any test sample reports 0, as the authors' MetricLogger does
(mlvlab/OVQA util/metrics.py: a meter with count 0 has global_avg 0). When the authors' ans2cat.json is given, it
defines the categories instead of train counts; when their test_vocab.json is given, it is the answer set of mAcc.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

CATEGORIES = ("base", "common", "rare", "unseen")
BASE_MIN_COUNT = 101
COMMON_MIN_COUNT = 11
RARE_MIN_COUNT = 1


def answer_counts(train_answers: Iterable[str]) -> collections.Counter:
  """Number of train samples per answer string."""
  return collections.Counter(train_answers)


def category_of_count(count: int) -> str:
  """base >= 101, common 11..100, rare 1..10, unseen 0."""
  if count < 0:
    raise ValueError(f"answer count must be >= 0, got {count}")
  if count >= BASE_MIN_COUNT:
    return "base"
  if count >= COMMON_MIN_COUNT:
    return "common"
  if count >= RARE_MIN_COUNT:
    return "rare"
  return "unseen"


def _as_counts(train: Mapping[str, int] | Iterable[str]) -> Mapping[str, int]:
  if isinstance(train, Mapping):
    return train
  if isinstance(train, str):
    raise TypeError("train answers must be a sequence of strings or a mapping answer -> count, not one string")
  return answer_counts(train)


def answer_categories(train_answers: Mapping[str, int] | Iterable[str],
                      answers: Optional[Iterable[str]] = None) -> dict[str, str]:
  """Category of each answer.

  Args:
    train_answers: the train split's answers (one per sample), or a mapping answer -> train count.
    answers: the answers to categorise (e.g. the test vocabulary, which may hold unseen answers);
      default: every answer that occurs in the train split.

  Returns:
    {answer: "base" | "common" | "rare" | "unseen"}.
  """
  counts = _as_counts(train_answers)
  if answers is None:
    answers = counts.keys()
  return {a: category_of_count(int(counts.get(a, 0))) for a in answers}


def _pct(num: float, den: float) -> float:
  """Percent; 0 for an empty denominator, as the official logger's global_avg."""
  return 100.0 * num / den if den > 0 else 0.0


def ovqa_metrics(gt_answers: Sequence[str], pred_answers: Sequence[Optional[str]],
                 train_counts: Optional[Mapping[str, int] | Iterable[str]] = None,
                 categories: Optional[Mapping[str, str]] = None,
                 vocab: Optional[Iterable[str]] = None) -> dict[str, float | int]:
  """OVQA accuracies of predictions against the ground truth.

  Args:
    gt_answers: ground-truth answer per test sample, [num_samples].
    pred_answers: predicted answer per test sample, [num_samples]; None = no prediction (wrong).
    train_counts: mapping answer -> number of train samples with that answer (or the train answers themselves);
      defines the categories unless `categories` is given.
    categories: {answer: "base" | "common" | "rare" | "unseen"} (the authors' ans2cat.json); every ground-truth
      answer must be in it.
    vocab: the test vocabulary (the authors' test_vocab.json keys); every ground-truth answer must be in it. The
      official mAcc averages over the whole vocabulary, so an answer without test sample makes it NaN:
      num_vocab_answers_without_samples counts them (our mAcc averages over the answers with samples).

  Returns:
    Flat dict (percent unless noted):
      base, common, rare, unseen: micro accuracy over the test samples whose ground truth is in the category;
      non_base: micro accuracy over common + rare + unseen samples pooled;
      total: accuracy over all test samples;
      mAcc: mean over the unique test answers of each answer's accuracy;
      BNG: base - non_base (appendix E of the OVQA paper);
      num_samples_<cat>, num_samples_total: test samples per category (int);
      num_answers_<cat>, num_answers_total: unique test answers per category (int);
      num_correct_<cat>, num_correct_total (int);
      num_vocab_answers_without_samples (int, only with `vocab`).
  """
  if len(gt_answers) != len(pred_answers):
    raise ValueError(f"{len(gt_answers)} ground-truth answers but {len(pred_answers)} predictions")
  if categories is not None:
    absent = sorted(set(gt_answers) - set(categories))
    if absent:
      raise ValueError(f"{len(absent)} ground-truth answers have no category, e.g. {absent[:5]}")
    cat_of = {a: categories[a] for a in set(gt_answers)}
  elif train_counts is not None:
    counts = _as_counts(train_counts)
    cat_of = {a: category_of_count(int(counts.get(a, 0))) for a in set(gt_answers)}
  else:
    raise ValueError("ovqa_metrics needs train_counts or categories")

  samples = dict.fromkeys(CATEGORIES, 0)
  correct = dict.fromkeys(CATEGORIES, 0)
  per_answer_total = collections.Counter()
  per_answer_correct = collections.Counter()
  for gt, pred in zip(gt_answers, pred_answers):
    hit = pred is not None and pred == gt
    cat = cat_of[gt]
    samples[cat] += 1
    correct[cat] += hit
    per_answer_total[gt] += 1
    per_answer_correct[gt] += hit

  out: dict[str, float | int] = {}
  for cat in CATEGORIES:
    out[cat] = _pct(correct[cat], samples[cat])
    out[f"num_samples_{cat}"] = samples[cat]
    out[f"num_correct_{cat}"] = correct[cat]
    out[f"num_answers_{cat}"] = sum(1 for a in per_answer_total if cat_of[a] == cat)
  non_base_samples = sum(samples[c] for c in CATEGORIES[1:])
  non_base_correct = sum(correct[c] for c in CATEGORIES[1:])
  out["non_base"] = _pct(non_base_correct, non_base_samples)
  out["total"] = _pct(sum(correct.values()), len(gt_answers))
  out["num_samples_total"] = len(gt_answers)
  out["num_correct_total"] = sum(correct.values())
  out["num_answers_total"] = len(per_answer_total)
  if per_answer_total:
    out["mAcc"] = 100.0 * float(np.mean([per_answer_correct[a] / per_answer_total[a] for a in per_answer_total]))
  else:
    out["mAcc"] = math.nan  # the official mean over an empty set is NaN too
  out["BNG"] = out["base"] - out["non_base"]
  if vocab is not None:
    vocab = set(vocab)
    absent = sorted(set(gt_answers) - vocab)
    if absent:
      raise ValueError(f"{len(absent)} ground-truth answers are not in the test vocabulary, e.g. {absent[:5]}")
    out["num_vocab_answers_without_samples"] = len(vocab - set(per_answer_total))
  return out


def per_answer_accuracy(gt_answers: Sequence[str], pred_answers: Sequence[Optional[str]]) -> dict[str, tuple[int, int]]:
  """{answer: (num_correct, num_samples)} over the test samples, for long-tail plots."""
  if len(gt_answers) != len(pred_answers):
    raise ValueError(f"{len(gt_answers)} ground-truth answers but {len(pred_answers)} predictions")
  total = collections.Counter(gt_answers)
  hits = collections.Counter(g for g, p in zip(gt_answers, pred_answers) if p is not None and p == g)
  return {a: (hits[a], n) for a, n in total.items()}


def table1(train_answers: Mapping[str, int] | Iterable[str], test_answers: Sequence[str]) -> dict[str, dict[str, int]]:
  """Answer statistics per category, as in Table 1 of the OVQA paper.

  Table 1 counts unique answers of V_train (base / common / rare) plus the test answers never seen in training
  (unseen); e.g. MSVD-QA: 41 + 333 + 1478 = 1852 train answers and 391 unseen.

  Args:
    train_answers: the train split's answers (one per sample), or a mapping answer -> train count.
    test_answers: the test split's answers, one per sample.

  Returns:
    {"num_answers": unique answers of V_train u V_test per category (the paper's Table 1),
     "num_test_answers": unique answers of V_test per category,
     "num_train_samples": train samples per category,
     "num_test_samples": test samples per category}; each with a "total" entry.
  """
  counts = _as_counts(train_answers)
  test_counts = collections.Counter(test_answers)
  vocab = set(a for a, c in counts.items() if c > 0) | set(test_counts)
  cats = answer_categories(counts, vocab)
  out = {k: dict.fromkeys(CATEGORIES, 0) for k in ("num_answers", "num_test_answers", "num_train_samples",
                                                     "num_test_samples")}
  for a, cat in cats.items():
    out["num_answers"][cat] += 1
    out["num_train_samples"][cat] += int(counts.get(a, 0))
    if a in test_counts:
      out["num_test_answers"][cat] += 1
      out["num_test_samples"][cat] += test_counts[a]
  for table in out.values():
    table["total"] = sum(table[c] for c in CATEGORIES)
  return out


def vocab_table(categories: Mapping[str, str], train_vocab: Iterable[str],
                test_answers: Iterable[str]) -> dict[str, dict[str, int]]:
  """Table 1 answer counts from the authors' files, when the train CSV is not at hand.

  Args:
    categories: {answer: category} (ans2cat.json); every answer below must be in it.
    train_vocab: V_train (train_vocab.json keys); test_answers: the test split's answers (or V_test).
  Returns:
    {"num_answers": unique answers of V_train u V_test per category (the paper's Table 1),
     "num_train_vocab": V_train per category, "num_test_answers": unique test answers per category}, each with "total".
  """
  train_vocab, test_set = set(train_vocab), set(test_answers)
  absent = sorted((train_vocab | test_set) - set(categories))
  if absent:
    raise ValueError(f"{len(absent)} answers have no category, e.g. {absent[:5]}")
  out = {}
  for key, answers in (("num_answers", train_vocab | test_set), ("num_train_vocab", train_vocab),
                       ("num_test_answers", test_set)):
    row = dict.fromkeys(CATEGORIES, 0)
    for a in answers:
      row[categories[a]] += 1
    row["total"] = sum(row.values())
    out[key] = row
  return out
