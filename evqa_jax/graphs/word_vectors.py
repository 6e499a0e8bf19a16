"""Word vectors (GloVe / word2vec) for answer graphs: loading, phrase vectors and exact cosine kNN.

Sources accepted by `load_word_vectors`:
- `pkg:glove-6b-50d`: the PyPI GloVe 6B 50d package (`glove_6B_50d_emb.npy` [400000, 50] float32 +
  `glove_6B_index.parquet`, column `index` = the word), rows in GloVe's frequency order.
- a directory holding a `*_emb.npy` matrix and a `*_index.parquet` word column laid out like that package;
- a GloVe text file (`word v1 ... vd` per line) or a word2vec text file (the same after a `count dim` header line),
  optionally gzipped. Rows keep the file's order (both formats are written most frequent first).

Phrase vectors (multi-word answers such as "wooden boat"): the phrase is lower-cased and split on whitespace; a token
that GloVe lacks is split further on `-`, `_` and `/`; the vector is the mean of the in-vocabulary pieces' vectors.
A phrase that is itself a vocabulary entry (e.g. "e-mail") uses that entry directly. A phrase with no in-vocabulary
piece has no vector (None): its answer gets no GloVe neighbours and the graph builder counts and reports it.
"""

import dataclasses
import gzip
import os
import re
from typing import Optional, Sequence

import numpy as np

from evqa_jax import io
from evqa_jax import pretrained

_SPLIT_RE = re.compile(r"[-_/]+")


def normalize_word(word: str) -> str:
  """The key under which words and answers are matched: lower-case, whitespace collapsed."""
  return " ".join(word.lower().split())


@dataclasses.dataclass
class WordVectors:
  """A word-vector table: `words[i]` has vector `vectors[i]`; rows are in frequency order (most frequent first)."""
  words: list
  vectors: np.ndarray  # [vocab, dim] float32

  def __post_init__(self):
    self.vectors = np.asarray(self.vectors, np.float32)
    if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.words):
      raise ValueError(f"word vectors: {len(self.words)} words but a matrix of shape {self.vectors.shape}")
    self.index = {}
    for i, w in enumerate(self.words):
      self.index.setdefault(w, i)  # keep the first (most frequent) row of a duplicated word
    norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
    # An all-zero row (rare in real tables) gets similarity 0 to everything rather than NaN.
    self.unit = self.vectors / np.maximum(norms, 1e-12)

  @property
  def dim(self) -> int:
    return self.vectors.shape[1]

  def __len__(self) -> int:
    return len(self.words)

  def lookup(self, word: str) -> Optional[int]:
    """Row of an exact vocabulary entry (after `normalize_word`), else None."""
    return self.index.get(normalize_word(word))

  def phrase_pieces(self, phrase: str) -> list:
    """Rows of the in-vocabulary pieces of `phrase` (see module docstring); empty when none is known."""
    key = normalize_word(phrase)
    if key in self.index:
      return [self.index[key]]
    rows = []
    for token in key.split():
      if token in self.index:
        rows.append(self.index[token])
      else:
        rows.extend(self.index[p] for p in _SPLIT_RE.split(token) if p in self.index)
    return rows

  def phrase_vector(self, phrase: str) -> Optional[np.ndarray]:
    """Mean vector of the phrase's in-vocabulary pieces `[dim]`, or None when it has none."""
    rows = self.phrase_pieces(phrase)
    if not rows:
      return None
    return self.vectors[rows].mean(axis=0)


def _parse_row(values: Sequence[str], path: str, line_no: int, word: str) -> np.ndarray:
  """One text row's vector (float32); ValueError naming the file, line and word when it is not numeric or not
  finite (a NaN would spread through every graph edge and verbalizer weight built from it)."""
  try:
    row = np.asarray(values, np.float32)
  except ValueError as e:
    raise ValueError(f"{path}:{line_no}: non-numeric vector for word {word!r} (expected {len(values)} values)") from e
  io.check_finite_weights({f"vector of word {word!r} (line {line_no})": row}, path)
  return row


def _read_text_vectors(path: str, max_words: Optional[int]) -> WordVectors:
  opener = gzip.open if path.endswith(".gz") else open
  words, rows = [], []
  dim = None
  with opener(path, "rt", encoding="utf-8", errors="strict") as f:
    for line_no, line in enumerate(f, start=1):
      parts = line.rstrip("\n").rstrip(" ").split(" ")
      if line_no == 1 and len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        dim = int(parts[1])  # word2vec text header: `count dim`
        continue
      if len(parts) < 2:
        raise ValueError(f"{path}:{line_no}: expected `word v1 ... vd`, got {line[:80]!r}")
      if dim is None:
        dim = len(parts) - 1
      if len(parts) - 1 < dim:
        raise ValueError(f"{path}:{line_no}: {len(parts) - 1} values for word {parts[0]!r}, expected {dim}")
      word = " ".join(parts[:len(parts) - dim])  # a few GloVe releases have tokens containing spaces
      rows.append(_parse_row(parts[len(parts) - dim:], path, line_no, word))
      words.append(word)
      if max_words is not None and len(words) >= max_words:
        break
  if not words:
    raise ValueError(f"{path}: no word vectors found")
  return WordVectors(words, np.stack(rows))


def _read_npy_parquet_dir(directory: str, max_words: Optional[int]) -> WordVectors:
  import pandas as pd  # only this format needs it

  embs = sorted(f for f in os.listdir(directory) if f.endswith("_emb.npy"))
  idxs = sorted(f for f in os.listdir(directory) if f.endswith("_index.parquet"))
  if len(embs) != 1 or len(idxs) != 1:
    raise ValueError(f"{directory}: expected exactly one *_emb.npy and one *_index.parquet, found {embs} and {idxs}")
  matrix = io.load_npy(os.path.join(directory, embs[0]), mmap_mode="r")
  table = pd.read_parquet(os.path.join(directory, idxs[0]))
  if "index" not in table.columns:
    raise ValueError(f"{os.path.join(directory, idxs[0])}: no column `index` (columns: {list(table.columns)})")
  words = table["index"].astype(str).tolist()
  if len(words) != matrix.shape[0]:
    raise ValueError(f"{directory}: {len(words)} words in {idxs[0]} but {matrix.shape[0]} rows in {embs[0]}")
  if max_words is not None:
    words, matrix = words[:max_words], matrix[:max_words]
  matrix = np.array(matrix, np.float32)
  io.check_finite_weights({embs[0]: matrix}, directory)
  return WordVectors(words, matrix)


def load_word_vectors(source: str, max_words: Optional[int] = None) -> WordVectors:
  """Loads a word-vector table from `pkg:glove-6b-50d`, a npy+parquet directory, or a GloVe/word2vec text file.

  `max_words` keeps only the first (most frequent) rows.
  """
  path = pretrained.resolve(source)
  if os.path.isdir(path):
    return _read_npy_parquet_dir(path, max_words)
  if os.path.isfile(path):
    return _read_text_vectors(path, max_words)
  raise FileNotFoundError(f"word vectors {source!r}: {path} is neither a directory nor a file")


def lookup_vectors(source: str, words: Sequence[str], dim: int) -> dict:
  """{word: float32 [dim] vector} for the `words` that the table `source` holds (exact, case-sensitive match).

  A GloVe/word2vec text file is streamed, keeping only the wanted rows (GloVe 840B is 5.6 GB: never held whole);
  `pkg:glove-6b-50d` and npy+parquet folders are memory-mapped. A table whose vectors are not `dim`-dimensional is
  an error naming the source. The first row of a duplicated word wins, as in `WordVectors`.
  """
  wanted = set(words)
  path = pretrained.resolve(source)
  if os.path.isdir(path):
    wv = _read_npy_parquet_dir(path, None)
    if wv.dim != dim:
      raise ValueError(f"word vectors {source!r}: {wv.dim}-dimensional, expected {dim}")
    return {w: wv.vectors[wv.index[w]] for w in wanted if w in wv.index}
  if not os.path.isfile(path):
    raise FileNotFoundError(f"word vectors {source!r}: {path} is neither a directory nor a file")
  out = {}
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8", errors="strict") as f:
    for line_no, line in enumerate(f, start=1):
      parts = line.rstrip("\n").rstrip(" ").split(" ")
      if line_no == 1 and len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        if int(parts[1]) != dim:
          raise ValueError(f"word vectors {source!r}: {parts[1]}-dimensional, expected {dim}")
        continue
      if len(parts) - 1 < dim or (line_no <= 2 and len(parts) - 1 != dim):
        # (the first rows are taken to have one-token words: a 300-d file read as 50-d fails here, not silently)
        raise ValueError(f"{path}:{line_no}: {len(parts) - 1} values for word {parts[0]!r}, expected {dim} "
                         f"(word vectors {source!r})")
      word = " ".join(parts[:len(parts) - dim])
      if word in wanted and word not in out:
        out[word] = _parse_row(parts[len(parts) - dim:], path, line_no, word)
  return out


def cosine_knn(wv: WordVectors,
               queries: np.ndarray,
               k: int,
               exclude: Optional[Sequence[Sequence[int]]] = None,
               min_sim: Optional[float] = None,
               top_n: Optional[int] = None,
               batch_size: int = 256,
               chunk: int = 512):
  """Exact cosine k nearest neighbours of each query among the table's words.

  Args:
    wv: the word table.
    queries: `[q, dim]` query vectors (need not be normalised).
    k: neighbours per query.
    exclude: per query, rows that may not be returned (the query word itself).
    min_sim: drop neighbours whose cosine similarity is below this.
    top_n: only the first `top_n` rows (the most frequent words) are candidates.
    batch_size: queries per matmul block (memory: batch_size x vocab float32).
    chunk: candidate columns per block maximum in the pruning bound (below); any value gives the same result.

  Returns:
    (indices `[q, k]` int64 with -1 where fewer than k neighbours pass, similarities `[q, k]` float32 (-inf there)),
    each row sorted by decreasing similarity, ties by increasing row.
  """
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if chunk < 1:
    raise ValueError(f"chunk must be >= 1, got {chunk}")
  queries = np.asarray(queries, np.float32)
  if queries.ndim != 2 or queries.shape[1] != wv.dim:
    raise ValueError(f"queries must be [q, {wv.dim}], got {queries.shape}")
  cand = wv.unit if top_n is None else wv.unit[:top_n]
  n_cand = cand.shape[0]
  qn = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
  n_q = qn.shape[0]
  out_idx = np.full((n_q, k), -1, np.int64)
  out_sim = np.full((n_q, k), -np.inf, np.float32)
  if n_cand == 0 or n_q == 0:
    return out_idx, out_sim
  max_excl = max((len(e) for e in exclude), default=0) if exclude is not None else 0
  kk = min(k + max_excl, n_cand)
  # Pruning bound: split the candidate columns into chunks and take each chunk's maximum. The kk-th largest of those
  # maxima is the kk-th largest of kk distinct similarities, so it is at or below the row's kk-th best overall: keeping
  # only entries at or above it is exact. Unlike a prefix probe it stays tight for rare query words (whose neighbours
  # are rare words too), so few entries pass and no 400k-wide row is ever partitioned or sorted.
  chunk = min(chunk, n_cand)
  n_chunks = -(-n_cand // chunk)
  width = n_chunks * chunk
  cand_t = np.zeros((wv.dim, width), np.float32)  # padded columns get -inf below
  cand_t[:, :n_cand] = cand.T
  kth_chunk = n_chunks - min(kk, n_chunks)
  buf = np.empty((min(batch_size, n_q), width), np.float32)  # reused: fresh 100s-of-MB blocks cost page faults
  for start in range(0, n_q, batch_size):
    stop = min(start + batch_size, n_q)
    nb = stop - start
    sims = buf[:nb]
    np.matmul(qn[start:stop], cand_t, out=sims)
    sims[:, n_cand:] = -np.inf
    maxima = sims.reshape(nb, n_chunks, chunk).max(axis=2)
    if kk <= n_chunks:
      thresh = np.partition(maxima, kth_chunk, axis=1)[:, kth_chunk]
    else:  # fewer chunks than needed neighbours: every finite candidate may be needed
      thresh = np.full((nb,), -np.inf, np.float32)
    if min_sim is not None:
      thresh = np.maximum(thresh, np.float32(min_sim))
    if kk <= n_chunks:
      # Entries at or above a row's threshold lie in the chunks whose maximum is (a NaN maximum: kept, unknown):
      # scan only those, not the whole [rows, 400k] block (whose nonzero() was half of a knn over the GloVe table).
      chunk_rows, chunk_ids = np.nonzero(~(maxima < thresh[:, None]))
      blocks = sims.reshape(nb, n_chunks, chunk)[chunk_rows, chunk_ids]
      hit, offset = np.nonzero(blocks >= thresh[chunk_rows][:, None])
      rows, cols, vals = chunk_rows[hit], chunk_ids[hit] * chunk + offset, blocks[hit, offset]
      real = cols < n_cand  # padded columns (-inf) never pass a finite threshold; the last chunk may hold some
      rows, cols, vals = rows[real], cols[real], vals[real]
    else:  # every chunk may hold a neighbour: scan the block as it is
      rows, cols = np.nonzero(sims[:, :n_cand] >= thresh[:, None])
      vals = sims[rows, cols]
    order = np.lexsort((cols, -vals, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    bounds = np.searchsorted(rows, np.arange(nb + 1))
    for b in range(nb):
      lo, hi = bounds[b], bounds[b + 1]
      c, v = cols[lo:hi], vals[lo:hi]
      if exclude is not None and len(exclude[start + b]):
        keep = ~np.isin(c, np.asarray(exclude[start + b], np.int64))
        c, v = c[keep], v[keep]
      n = min(k, len(c))
      out_idx[start + b, :n] = c[:n]
      out_sim[start + b, :n] = v[:n]
  return out_idx, out_sim
