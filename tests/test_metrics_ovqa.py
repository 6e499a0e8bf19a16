"""OVQA metrics on hand-computed cases: categories, per-category accuracy, mAcc vs total, BNG, Table 1."""


import pytest

from evqa_jax.metrics import ovqa


@pytest.mark.parametrize("count,cat", [(0, "unseen"), (1, "rare"), (10, "rare"), (11, "common"), (100, "common"),
                                       (101, "base"), (5000, "base")])
def test_category_boundaries(count, cat):
  assert ovqa.category_of_count(count) == cat


def test_answer_categories_from_train_answers():
  train = ["yes"] * 101 + ["no"] * 100 + ["man"] * 11 + ["dog"] * 10 + ["cat"]
  cats = ovqa.answer_categories(train)
  assert cats == {"yes": "base", "no": "common", "man": "common", "dog": "rare", "cat": "rare"}
  cats = ovqa.answer_categories(train, answers=["yes", "zebra"])
  assert cats == {"yes": "base", "zebra": "unseen"}
  assert ovqa.answer_categories({"a": 150, "b": 0}) == {"a": "base", "b": "unseen"}


TRAIN_COUNTS = {"yes": 200, "man": 50, "dog": 5, "cat": 3}
GT = ["yes"] * 8 + ["man", "dog", "zebra", "zebra"]


def test_majority_model_total_vs_macc_and_bng():
  # Always "yes": 8/12 right overall, but only one of four test answers is ever right.
  out = ovqa.ovqa_metrics(GT, ["yes"] * 12, TRAIN_COUNTS)
  assert out["total"] == pytest.approx(100 * 8 / 12)
  assert out["mAcc"] == pytest.approx(25.0)
  assert (out["base"], out["common"], out["rare"], out["unseen"]) == (100.0, 0.0, 0.0, 0.0)
  assert out["non_base"] == 0.0 and out["BNG"] == 100.0
  assert [out[f"num_samples_{c}"] for c in ovqa.CATEGORIES] == [8, 1, 1, 2]
  assert [out[f"num_answers_{c}"] for c in ovqa.CATEGORIES] == [1, 1, 1, 1]
  assert out["num_samples_total"] == 12 and out["num_answers_total"] == 4 and out["num_correct_total"] == 8


def test_mixed_model_and_missing_predictions():
  preds = ["yes"] * 6 + ["no", None] + ["man", "cat", "zebra", None]
  out = ovqa.ovqa_metrics(GT, preds, TRAIN_COUNTS)
  assert out["base"] == 75.0 and out["common"] == 100.0 and out["rare"] == 0.0 and out["unseen"] == 50.0
  assert out["non_base"] == 50.0           # 2 of the 4 common + rare + unseen samples, pooled
  assert out["BNG"] == 25.0
  assert out["total"] == pytest.approx(100 * 8 / 12)
  assert out["mAcc"] == pytest.approx(100 * (0.75 + 1 + 0 + 0.5) / 4)


def test_exact_string_match_and_empty_category():
  out = ovqa.ovqa_metrics(["man", "man"], ["man ", "Man"], {"man": 20})
  assert out["total"] == 0.0
  # No base sample: the authors' MetricLogger reports 0 for a meter that never got a sample (not NaN / null).
  assert out["base"] == 0.0 and out["unseen"] == 0.0 and out["num_samples_base"] == 0
  assert out["BNG"] == 0.0 - out["non_base"]
  with pytest.raises(ValueError, match="predictions"):
    ovqa.ovqa_metrics(["a"], [], {})


def test_categories_and_vocab_from_the_authors_files():
  # ans2cat overrides the train counts: "man" is rare here although 50 train samples would make it common.
  cats = {"yes": "base", "man": "rare", "dog": "rare", "zebra": "unseen"}
  preds = ["yes"] * 6 + ["no", None] + ["man", "cat", "zebra", None]
  out = ovqa.ovqa_metrics(GT, preds, categories=cats, vocab=["yes", "man", "dog", "zebra"])
  assert out["base"] == 75.0 and out["common"] == 0.0 and out["rare"] == 50.0 and out["unseen"] == 50.0
  assert out["num_samples_common"] == 0 and out["num_vocab_answers_without_samples"] == 0
  assert out["mAcc"] == pytest.approx(100 * (0.75 + 1 + 0 + 0.5) / 4)
  # A vocabulary answer without test sample: counted (the official macc is then NaN), our mAcc unchanged.
  more = ovqa.ovqa_metrics(GT, preds, categories=cats, vocab=["yes", "man", "dog", "zebra", "cat"])
  assert more["num_vocab_answers_without_samples"] == 1 and more["mAcc"] == out["mAcc"]
  with pytest.raises(ValueError, match="no category"):
    ovqa.ovqa_metrics(GT, preds, categories={"yes": "base"})
  with pytest.raises(ValueError, match="not in the test vocabulary"):
    ovqa.ovqa_metrics(GT, preds, categories=cats, vocab=["yes"])


def test_table1():
  train = ["yes"] * 200 + ["man"] * 50 + ["dog"] * 5 + ["cat"] * 3
  t = ovqa.table1(train, GT)
  # V_train u V_test: base yes; common man; rare dog, cat (cat is not in test); unseen zebra.
  assert t["num_answers"] == {"base": 1, "common": 1, "rare": 2, "unseen": 1, "total": 5}
  assert t["num_test_answers"] == {"base": 1, "common": 1, "rare": 1, "unseen": 1, "total": 4}
  assert t["num_train_samples"] == {"base": 200, "common": 50, "rare": 8, "unseen": 0, "total": 258}
  assert t["num_test_samples"] == {"base": 8, "common": 1, "rare": 1, "unseen": 2, "total": 12}


def test_per_answer_accuracy():
  acc = ovqa.per_answer_accuracy(GT, ["yes"] * 7 + ["no"] + ["man", None, "zebra", "zebra"])
  assert acc == {"yes": (7, 8), "man": (1, 1), "dog": (0, 1), "zebra": (2, 2)}


def test_evaluate_files_matches_in_memory(tmp_path):
  import pandas as pd  # pylint: disable=g-import-not-at-top
  from evqa_jax.evaluate import ovqa as ovqa_eval  # pylint: disable=g-import-not-at-top
  train = ["yes"] * 200 + ["man"] * 50 + ["dog"] * 5 + ["cat"] * 3
  pd.DataFrame({"answer": train}).to_csv(tmp_path / "train.csv", index=False)
  pd.DataFrame({"answer": GT}).to_csv(tmp_path / "test.csv", index=False)
  preds = ["yes"] * 6 + ["no", None] + ["man", "cat", "zebra", None]
  rows = [(i, p) for i, p in enumerate(preds) if p is not None]
  pd.DataFrame(rows, columns=["index", "prediction"]).to_csv(tmp_path / "pred.csv", index=False)
  got = ovqa_eval.evaluate_files(str(tmp_path / "train.csv"), str(tmp_path / "test.csv"), str(tmp_path / "pred.csv"))
  assert got == ovqa.ovqa_metrics(GT, preds, TRAIN_COUNTS)
  assert got["BNG"] == 25.0


def test_metrics_package_imports_no_evaluator_pandas_or_matplotlib():
  # metrics/ is the plain-numpy layer under evaluate/ (issue 12): importing it back makes a cycle.
  import ast  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(ovqa.__file__)
  for name in sorted(os.listdir(root)):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(root, name)) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
              [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      for mod in mods:
        assert not mod.startswith(("evqa_jax.evaluate", "pandas", "matplotlib")), (name, mod)
