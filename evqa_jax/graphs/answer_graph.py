"""Answer graphs for the GNN-based soft verbalizer (OVQA paper section 3.3, Eq. 2-4).

n(a) = the k nearest words of a in the word-vector table (cosine, the word itself excluded, optionally only words with
similarity >= min_sim and only among the top_n most frequent words). The node set grows K hops (Eq. 2); the edges are
j -> i for every j in n(i) and every node i reached before the last hop (Eq. 3); edges between two original answers are
dropped; every node gets a self-loop. Original answers are nodes 0 .. |V|-1 in vocabulary order, then the words found
at hop 1 (in order of discovery), then hop 2, and so on. Edges are sorted by (receiver, sender).

Words are matched by `word_vectors.normalize_word` (lower case, collapsed whitespace): a neighbour word that equals an
answer is that answer's node. A multi-word answer's query vector is the mean of its in-vocabulary words; an answer with
no in-vocabulary word has no neighbours, keeps only its self-loop, and is listed in `info["oov_answers"]`.

Node features are not word vectors: callers embed `node_words` with the frozen LM answer encoder (`embed_nodes`).
An imported graph (the OVQA authors' answer_graph/*.pth, data_prep/ovqa_authors.py) instead carries its own
`node_features` `[nodes, D]` and knows only its answers' words (the other nodes' words are "").
"""

import dataclasses
import json
from typing import Callable, Optional, Sequence

import numpy as np

from evqa_jax import io
from evqa_jax.graphs import word_vectors as wv_lib

_NPZ_KEYS = ("node_words", "senders", "receivers", "num_answers", "info")  # plus node_features when given
SOURCES = ("glove", "authors")  # config.graph.source: built here from word vectors, or imported from the authors


@dataclasses.dataclass
class AnswerGraph:
  """A directed answer graph; edge e goes senders[e] -> receivers[e]. Answers are nodes [0, num_answers)."""
  node_words: list
  senders: np.ndarray  # [edges] int32
  receivers: np.ndarray  # [edges] int32
  num_answers: int
  info: dict = dataclasses.field(default_factory=dict)
  node_features: Optional[np.ndarray] = None  # [nodes, D] float32 given with the graph, or None (embed node_words)

  def __post_init__(self):
    self.senders = np.asarray(self.senders, np.int32)
    self.receivers = np.asarray(self.receivers, np.int32)
    if self.node_features is not None:
      self.node_features = np.asarray(self.node_features, np.float32)
    self.validate()

  @property
  def num_nodes(self) -> int:
    return len(self.node_words)

  @property
  def num_edges(self) -> int:
    return int(self.senders.shape[0])

  def validate(self, where: str = "answer graph") -> None:
    n = self.num_nodes
    if self.senders.ndim != 1 or self.senders.shape != self.receivers.shape:
      raise ValueError(f"{where}: senders {self.senders.shape} and receivers {self.receivers.shape} must be equal 1-D")
    if not 0 <= self.num_answers <= n:
      raise ValueError(f"{where}: num_answers={self.num_answers} outside [0, {n}] nodes")
    for name, arr in (("senders", self.senders), ("receivers", self.receivers)):
      if arr.size and (arr.min() < 0 or arr.max() >= n):
        raise ValueError(f"{where}: {name} index out of range [0, {n})")
    feats = self.node_features
    if feats is not None and (feats.ndim != 2 or feats.shape[0] != n):
      raise ValueError(f"{where}: node_features has shape {feats.shape}, expected [{n} nodes, D]")

  def stats(self) -> dict:
    return {
        "num_answers": self.num_answers,
        "num_nodes": self.num_nodes,
        "num_edges": self.num_edges,
        "num_oov_answers": len(self.info.get("oov_answers", [])),
    }

  def save(self, path: str) -> None:
    """Writes an .npz (no pickles) atomically."""
    extra = {} if self.node_features is None else {"node_features": self.node_features}
    with io.atomic_path(path) as tmp:
      with open(tmp, "wb") as f:
        np.savez(f,
                 node_words=np.asarray(self.node_words, dtype=str),
                 senders=self.senders,
                 receivers=self.receivers,
                 num_answers=np.int64(self.num_answers),
                 info=np.asarray(json.dumps(self.info, sort_keys=True)),
                 **extra)


def load_answer_graph(path: str) -> AnswerGraph:
  """Reads a graph written by `AnswerGraph.save`."""
  z = io.load_npz(path, "answer graph")  # pickled members refused, errors name the file
  missing = [k for k in _NPZ_KEYS if k not in z]
  if missing:
    raise ValueError(f"{path}: not an answer graph, missing arrays {missing} (has {sorted(z)})")
  graph = AnswerGraph.__new__(AnswerGraph)
  graph.node_words = [str(w) for w in z["node_words"].tolist()]
  graph.senders = z["senders"].astype(np.int32)
  graph.receivers = z["receivers"].astype(np.int32)
  graph.num_answers = int(z["num_answers"])
  graph.info = io.loads_json(str(z["info"]), path, "answer graph info")
  graph.node_features = z["node_features"].astype(np.float32) if "node_features" in z else None
  graph.validate(where=path)
  return graph


def check_build_params(graph: AnswerGraph, path: str, data_dir: str, k: int, hops: int, min_sim: float,
                       source: str = "glove") -> None:
  """Refuses a graph built with other k / hops / min_sim than config.graph asks for, or from another source.

  The graph is fixed at data prep, so these config keys cannot change it; a graph that disagrees with them would
  make a sweep over them silently do nothing. A min_sim of None at build time (no cut-off) equals -1.0 (every
  cosine is >= -1). An imported authors' graph has no k / hops / min_sim of ours: it needs config.graph.source =
  "authors" (so no config silently trains on it), and then those three keys are not read.
  """
  info = graph.info
  built_source = info.get("source", "glove")
  if source not in SOURCES:
    raise ValueError(f"config.graph.source = {source!r}: expected 'glove' (a graph built by "
                     "data_prep/answer_graphs.py) or 'authors' (imported with its --authors-graph)")
  if built_source != source:
    if built_source == "authors":
      raise ValueError(f"{path} is the OVQA authors' answer graph (imported from {info.get('edge_index')}), not one "
                       "built with config.graph.k / hops / min_sim: set config.graph.source = 'authors' to use it, or "
                       f"build ours with `python data_prep/answer_graphs.py --data {data_dir}`")
    raise ValueError(f"config.graph.source = {source!r} but {path} was built by data_prep/answer_graphs.py from word "
                     f"vectors: import the authors' graph with `python data_prep/answer_graphs.py --data {data_dir} "
                     "--authors-graph <meta_data/dataset>`, or set config.graph.source = 'glove'")
  if source == "authors":
    return
  built = {"k": info.get("k"), "hops": info.get("hops"),
           "min_sim": -1.0 if info.get("min_sim") is None else float(info["min_sim"])}
  if "k" not in info or "hops" not in info:
    raise ValueError(f"{path} does not record the k / hops it was built with: rebuild it with "
                     f"`python data_prep/answer_graphs.py --data {data_dir} --k {k} --hops {hops} --min-sim {min_sim}`")
  wanted = {"k": int(k), "hops": int(hops), "min_sim": float(min_sim)}
  for key, value in wanted.items():
    if built[key] != value:
      raise ValueError(
          f"config.graph.{key} = {value} but {path} was built with {key} = {built[key]}; the answer graph is "
          f"fixed at data prep, so rebuild it: `python data_prep/answer_graphs.py --data {data_dir} --k {k} "
          f"--hops {hops} --min-sim {min_sim}` (or set config.graph.{key} = {built[key]})")


def build_answer_graph(answers: Sequence[str],
                       word_vectors: wv_lib.WordVectors,
                       k: int = 10,
                       hops: int = 2,
                       min_sim: Optional[float] = None,
                       top_n: Optional[int] = None,
                       batch_size: int = 256) -> AnswerGraph:
  """Builds the K-hop answer graph of `answers` (see module docstring).

  Args:
    answers: the answer vocabulary, unique after `normalize_word`; its order is the node order.
    word_vectors: the knowledge base (GloVe).
    k: neighbours per word, n(a).
    hops: K in Eq. 2 (the paper uses 2).
    min_sim: optional cosine cut-off for neighbours.
    top_n: optional restriction of neighbour candidates to the top_n most frequent words.
    batch_size: kNN queries per matmul block.
  """
  if hops < 1:
    raise ValueError(f"hops must be >= 1, got {hops}")
  node_words = []
  node_of = {}
  for pos, ans in enumerate(answers):
    if not isinstance(ans, str) or not ans.strip():
      raise ValueError(f"answer vocabulary entry {pos} is empty or not a string: {ans!r}")
    key = wv_lib.normalize_word(ans)
    if key in node_of:
      raise ValueError(f"answer vocabulary entry {pos} {ans!r} duplicates entry {node_of[key]} "
                       f"{answers[node_of[key]]!r}")
    node_of[key] = pos
    node_words.append(ans)
  num_answers = len(node_words)

  oov = []
  query_vecs = {}
  for i, ans in enumerate(node_words):
    vec = word_vectors.phrase_vector(ans)
    if vec is None:
      oov.append(ans)
    else:
      query_vecs[i] = vec

  senders, receivers = [], []
  dropped = 0
  hop_sizes = [num_answers]
  frontier = list(range(num_answers))
  for _ in range(hops):
    queried = [i for i in frontier if i in query_vecs]
    new_nodes = []
    if queried:
      exclude = []
      for i in queried:
        row = word_vectors.lookup(node_words[i])
        exclude.append([row] if row is not None else [])
      idx, _ = wv_lib.cosine_knn(word_vectors, np.stack([query_vecs[i] for i in queried]), k, exclude=exclude,
                                 min_sim=min_sim, top_n=top_n, batch_size=batch_size)
      for i, rows in zip(queried, idx):
        for row in rows:
          if row < 0:
            break
          word = word_vectors.words[row]
          key = wv_lib.normalize_word(word)
          j = node_of.get(key)
          if j is None:
            j = len(node_words)
            node_of[key] = j
            node_words.append(word)
            query_vecs[j] = word_vectors.vectors[row]
            new_nodes.append(j)
          if j == i:
            continue
          if i < num_answers and j < num_answers:
            dropped += 1
            continue
          senders.append(j)
          receivers.append(i)
    hop_sizes.append(len(new_nodes))
    frontier = new_nodes

  n = len(node_words)
  senders = np.concatenate([np.asarray(senders, np.int64), np.arange(n)])
  receivers = np.concatenate([np.asarray(receivers, np.int64), np.arange(n)])
  order = np.lexsort((senders, receivers))
  info = {
      "source": "glove", "k": k, "hops": hops, "min_sim": min_sim, "top_n": top_n,
      "nodes_per_hop": hop_sizes,
      "dropped_answer_answer_edges": dropped,
      "oov_answers": oov,
  }
  return AnswerGraph(node_words, senders[order], receivers[order], num_answers, info)


def embed_nodes(graph: AnswerGraph, embed_words: Callable[[list], np.ndarray]) -> np.ndarray:
  """Node features `[nodes, D]` = embed_words(graph.node_words), e.g. the frozen LM answer encoder."""
  feats = np.asarray(embed_words(list(graph.node_words)))
  if feats.ndim != 2 or feats.shape[0] != graph.num_nodes:
    raise ValueError(f"embed_words returned shape {feats.shape} for {graph.num_nodes} node words; expected [nodes, D]")
  return feats
