"""The OVQA authors' vocabulary and category files, for the converter's --authors-vocab DIR (data_prep/ovqa.py).

mlvlab/OVQA releases, per dataset (README "meta_data/<dataset>/"; read by dataset.py and train.py):
  train_vocab.json, test_vocab.json  {answer: id}, ids 0..n-1; every answer of the split's CSV is a key
                                     (dataset.py: `answer_id = self.ans2id[original_answer]`). MSRVTT-QA's V_train
                                     holds the 4000 most frequent train answers (capped), so it is not derivable
                                     from the CSVs alone.
  ans2cat.json                       {answer: "base" | "common" | "rare" | "unseen"} over both vocabularies
                                     (dataset.py builds the per-answer eps from `ans2cat[k] for k in ans2id`;
                                     train.py's evaluate reads `ans2cat[ans]` for every test answer).
With them, vocab.json's vocab_train / vocab_test are theirs in id order, vocab_cvqa is the first k of their V_train,
and categories are theirs; train_counts stay the converted train CSV's counts.
(Their answer_graph/{split}_x.pth holds node features, not node words, so graphs are still built from the
vocabularies by data_prep/answer_graphs.py.)
"""

from __future__ import annotations

import json
import os

from evqa_jax.metrics import ovqa as ovqa_metrics

FILES = {"train": "train_vocab.json", "test": "test_vocab.json"}
CATEGORIES_FILE = "ans2cat.json"


class AuthorsVocabError(ValueError):
  """A malformed authors' file; the message names the file and the answer."""


def _load(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise AuthorsVocabError(f"{path} does not exist (--authors-vocab needs {', '.join(FILES.values())} and "
                            f"{CATEGORIES_FILE})") from None
  except (OSError, json.JSONDecodeError) as e:
    raise AuthorsVocabError(f"{path}: cannot read as JSON ({e})") from e


def read_vocab_file(path: str) -> list[str]:
  """Answers of one {answer: id} file, in id order; ids must be exactly 0..n-1."""
  obj = _load(path)
  if not isinstance(obj, dict) or not obj:
    raise AuthorsVocabError(f"{path}: expected a non-empty JSON object {{answer: id}}")
  by_id = {}
  for answer, i in obj.items():
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(obj):
      raise AuthorsVocabError(f"{path}: answer {answer!r} has id {i!r}; ids must be integers 0..{len(obj) - 1}")
    if i in by_id:
      raise AuthorsVocabError(f"{path}: answers {by_id[i]!r} and {answer!r} share id {i}")
    by_id[i] = answer
  return [by_id[i] for i in range(len(obj))]


def read_authors_vocab(directory: str) -> dict:
  """{"vocab_train", "vocab_test": [answers in id order], "categories": {answer: category} over both}."""
  out = {f"vocab_{split}": read_vocab_file(os.path.join(directory, name)) for split, name in FILES.items()}
  path = os.path.join(directory, CATEGORIES_FILE)
  cats = _load(path)
  if not isinstance(cats, dict):
    raise AuthorsVocabError(f"{path}: expected a JSON object {{answer: category}}")
  categories = {}
  for answer in out["vocab_train"] + out["vocab_test"]:
    cat = cats.get(answer)
    if cat not in ovqa_metrics.CATEGORIES:
      raise AuthorsVocabError(f"{path}: answer {answer!r} has category {cat!r}; expected one of "
                              f"{list(ovqa_metrics.CATEGORIES)}")
    categories[answer] = cat
  out["categories"] = categories
  return out


def apply(vocab: dict, authors: dict, cvqa_topk: int) -> dict:
  """vocab.json content (data_prep.ovqa.build_vocab) with the authors' vocabularies and categories."""
  train = authors["vocab_train"]
  return dict(vocab, vocab_train=list(train), vocab_test=list(authors["vocab_test"]),
              vocab_cvqa=list(train[:cvqa_topk] if cvqa_topk > 0 else train), categories=dict(authors["categories"]))
