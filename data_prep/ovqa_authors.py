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

Their answer graphs (README "answer_graph/"; dataset.py `load_answer_graph`, model/deberta.py, model/gnn.py), read by
`read_authors_graph` for `python data_prep/answer_graphs.py --data OUT --authors-graph DIR`:
  answer_graph/{split}_edge_index.pth  int64 tensor [2, E], torch_geometric's edge_index: row 0 the source j, row 1
                                       the target i of a message j -> i (MessagePassing's default source_to_target).
                                       Their GATConv first removes every self-loop and adds one to each of the N
                                       nodes (add_self_loops=True); duplicates stay (they count twice in the
                                       softmax). No edge weights; their k / hops are not recorded anywhere.
  answer_graph/{split}_x.pth           float tensor [N, D], the fixed GNN input (`vocab_embeddings`): rows
                                       [0, |V_split|) are the answers in {split}_vocab.json id order (the GNN output
                                       is cut to `[:n_answers]` and mixed with the answer embeddings by eps), the
                                       other rows are neighbour words whose words are not released. D is the LM's
                                       hidden size (1536, DeBERTa-v2-xlarge): the features enter its attention
                                       without a projection.
Imported, our graph holds exactly their edges with their self-loops replaced by one per node (what their GATConv
computes on), their x as `node_features` (the verbalizer's input; Eq. 7's V stays the LM's answer embeddings, as in
their model), and answer words for the answer nodes only; info["source"] = "authors".
"""

from __future__ import annotations

import json
import os

import numpy as np

from evqa_jax import io as evqa_io
from evqa_jax.metrics import ovqa as ovqa_metrics

FILES = {"train": "train_vocab.json", "test": "test_vocab.json"}
CATEGORIES_FILE = "ans2cat.json"
GRAPH_FILES = ("answer_graph/{split}_edge_index.pth", "answer_graph/{split}_x.pth")


class AuthorsVocabError(ValueError):
  """A malformed authors' file; the message names the file and the answer (or field)."""


def _load(path: str):
  try:
    return evqa_io.load_json(path, "authors' file")
  except FileNotFoundError:
    raise AuthorsVocabError(f"{path} does not exist (--authors-vocab needs {', '.join(FILES.values())} and "
                            f"{CATEGORIES_FILE})") from None
  except (OSError, ValueError) as e:
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


def _tensor(path: str, field: str, kinds: str) -> np.ndarray:
  """The one tensor a .pth file holds (weights_only: a pickle there is never run), as numpy; `kinds` "iu" or "f"."""
  torch = evqa_io.import_torch(f"reading {path} (a PyTorch file)")
  if not os.path.exists(path):
    raise AuthorsVocabError(f"{path} does not exist (--authors-graph DIR needs DIR/{GRAPH_FILES[0]} and "
                            f"DIR/{GRAPH_FILES[1]} for split in train, test)")
  obj = evqa_io.torch_load(path)
  if not isinstance(obj, torch.Tensor):
    raise AuthorsVocabError(f"{path}: {field} must be a tensor, found {type(obj).__name__}")
  arr = (obj.float() if obj.is_floating_point() else obj).numpy()
  if arr.dtype.kind not in kinds:
    raise AuthorsVocabError(f"{path}: {field} has dtype {obj.dtype}, expected "
                            f"{'an integer' if kinds == 'iu' else 'a floating'} tensor")
  return arr


def read_authors_graph(directory: str, split: str, answers) -> "answer_graph.AnswerGraph":
  """The authors' answer graph of `split` (module docstring) as our AnswerGraph; `answers` = vocab.json's V_split,
  which must be their {split}_vocab.json in id order (their x rows follow it)."""
  from evqa_jax.graphs import answer_graph  # pylint: disable=g-import-not-at-top
  vocab_path = os.path.join(directory, FILES[split])
  if list(answers) != read_vocab_file(vocab_path):
    raise AuthorsVocabError(f"vocab.json V_{split} is not {vocab_path} in id order, which the rows of their x.pth "
                            "follow: convert with `python -m data_prep.ovqa ... --authors-vocab DIR` first")
  edge_path, x_path = (os.path.join(directory, f.format(split=split)) for f in GRAPH_FILES)
  edges = _tensor(edge_path, "edge_index", "iu")
  x = _tensor(x_path, "x (node features)", "f")
  if x.ndim != 2:
    raise AuthorsVocabError(f"{x_path}: x (node features) has shape {x.shape}, expected [nodes, D]")
  n = x.shape[0]
  if n < len(answers):
    raise AuthorsVocabError(f"{x_path}: x (node features) has {n} rows but {vocab_path} holds {len(answers)} "
                            "answers, which are its first rows: the files are of different datasets or splits")
  if not np.isfinite(x).all():
    raise AuthorsVocabError(f"{x_path}: x (node features) holds NaN or infinite values")
  if edges.ndim != 2 or edges.shape[0] != 2:
    raise AuthorsVocabError(f"{edge_path}: edge_index has shape {edges.shape}, expected [2, edges]")
  bad = np.nonzero((edges < 0) | (edges >= n))[1]
  if bad.size:
    e = int(bad[0])
    raise AuthorsVocabError(f"{edge_path}: edge_index edge {e} ({edges[0, e]} -> {edges[1, e]}) names a node outside "
                            f"the {n} nodes of {x_path}")
  keep = edges[0] != edges[1]  # their GATConv: remove_self_loops, then add_self_loops over all N nodes
  senders = np.concatenate([edges[0, keep], np.arange(n)]).astype(np.int64)
  receivers = np.concatenate([edges[1, keep], np.arange(n)]).astype(np.int64)
  order = np.lexsort((senders, receivers))
  info = {"source": "authors", "edge_index": edge_path, "x": x_path, "num_given_edges": int(edges.shape[1]),
          "num_given_self_loops": int(np.sum(~keep)), "oov_answers": []}
  words = list(answers) + [""] * (n - len(answers))  # their neighbour words are not released
  return answer_graph.AnswerGraph(words, senders[order], receivers[order], len(answers), info, node_features=x)
