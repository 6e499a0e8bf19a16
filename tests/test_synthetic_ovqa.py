"""The synthetic OVQA world (data_prep/synthetic_ovqa.py): vocabulary, determinism, statistics, learnability."""

import collections
import json
import os

import numpy as np
import pandas as pd
import pytest

from data_prep import synthetic_ovqa as so
from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource

SMALL = so.WorldConfig(**so.SMALL)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("world")
  so.build(str(out), SMALL, verbose=False)
  return out


def test_words_are_glove_words_and_single_minilm_pieces():
  words = so.concept_words()
  assert 600 <= len(words) <= 800
  assert len({w for w, _ in words}) == len(words)
  vocab = set(open(os.path.join(pretrained.minilm_dir(), "vocab.txt")).read().split("\n"))
  assert [w for w, _ in words if w not in vocab] == []
  so.load_glove([w for w, _ in words])  # raises when a word is missing from GloVe
  types = collections.Counter(so.GROUP_TYPE[g] for _, g in words)
  assert sorted(types) == [0, 1, 2, 3, 4, 5] and min(types.values()) >= 30
  assert set(so.TEMPLATES) == set(so.WORD_GROUPS) == set(so.GROUP_TYPE)


def test_same_seed_same_bytes_and_arrays(world_dir, tmp_path):
  so.generate_raw(str(tmp_path), SMALL)
  raw = world_dir / "raw"
  for name in ("train.csv", "val.csv", "test.csv", "subtitles.json", "world.json"):
    assert (tmp_path / name).read_bytes() == (raw / name).read_bytes(), name
  a, b = np.load(raw / "features.npz"), np.load(tmp_path / "features.npz")
  assert sorted(a.files) == sorted(b.files)
  for k in a.files:
    assert a[k].dtype == np.float16 and a[k].shape[1] == 768
    np.testing.assert_array_equal(a[k], b[k])
  other = tmp_path / "seed1"
  so.generate_raw(str(other), so.WorldConfig(**{**so.SMALL, "seed": 1}))
  assert (other / "train.csv").read_bytes() != (raw / "train.csv").read_bytes()


def test_release_format_and_answer_statistics(world_dir):
  raw = world_dir / "raw"
  train = pd.read_csv(raw / "train.csv", dtype=str, keep_default_na=False)
  test = pd.read_csv(raw / "test.csv", dtype=str, keep_default_na=False)
  assert list(train.columns) == ["question", "answer", "video_id", "type", "id"]
  assert (len(train), len(test)) == (SMALL.num_train, SMALL.num_test)
  info = json.loads((raw / "world.json").read_text())
  heldout = {c["word"] for c in info["concepts"] if c["heldout"]}
  assert len(heldout) == SMALL.num_heldout and not heldout & set(train["answer"])
  assert (test["answer"].isin(heldout).sum() == round(SMALL.unseen_fraction * SMALL.num_test))
  # the rows of one video ask questions of distinct types, so the type tells which segment to look at
  for split in (train, test):
    assert split.groupby("video_id")["type"].apply(lambda t: t.nunique() == len(t)).all()
  t = so.answer_stats.table1_from_dir(str(world_dir / "records"))
  for cat in ("base", "common", "rare", "unseen"):
    assert t[cat]["answers"] > 0 and t[cat]["test_samples"] > 0, (cat, t)
  assert t["unseen"]["test_samples"] >= 0.08 * SMALL.num_test
  meta = records.load_metadata(str(world_dir / "records"))
  assert meta["task"] == "ovqa" and meta["splits"]["train"]["num_examples"] == SMALL.num_train
  vocab = json.loads((world_dir / "records" / "vocab.json").read_text())
  assert len(vocab["vocab_cvqa"]) == SMALL.cvqa_topk


def test_every_question_concept_survives_frame_sampling(world_dir):
  """After sampling to T frames, each row's answer concept dominates some frame, with its type direction."""
  world = so._World(SMALL)
  src = TFRecordDataSource.from_split(str(world_dir / "records"), "test")
  for i in range(len(src)):
    ex = src[i]
    frames = ex["video"].astype(np.float32)[ex["video_mask"] > 0] - world.mean
    along = frames @ world.direction[ex["answer"]]
    best = int(np.argmax(along))
    assert along[best] > 0.8 * SMALL.concept_scale, (i, ex["answer"], along.max())
    type_dir = world.type_dir[ex["question_type"]] / SMALL.type_scale
    assert frames[best] @ type_dir > 0.6 * SMALL.type_scale


def test_unseen_answers_are_predictable_from_word_vectors(world_dir):
  """A ridge map from type-selected frames to GloVe vectors, fit on train, finds unseen test answers by their
  word vectors far above chance: the feature map is shared by all words."""
  world = so._World(SMALL)

  def load(split):
    src = TFRecordDataSource.from_split(str(world_dir / "records"), split)
    xs, answers = [], []
    for i in range(len(src)):
      ex = src[i]
      v = ex["video"].astype(np.float32)[ex["video_mask"] > 0] - world.mean
      score = v @ world.type_dir[ex["question_type"]]
      xs.append(v[score >= score.max() - 1.0].mean(0))
      answers.append(ex["answer"])
    return np.stack(xs), answers

  x_train, a_train = load("train")
  x_test, a_test = load("test")
  vocab = json.loads((world_dir / "records" / "vocab.json").read_text())
  words = sorted(set(a_train) | set(a_test))
  glove = dict(zip(words, so.load_glove(words)[0]))
  y = np.stack([glove[a] for a in a_train])
  mu = x_train.mean(0)
  xc = x_train - mu
  w = np.linalg.solve(xc.T @ xc + 10.0 * np.eye(xc.shape[1]), xc.T @ y)
  cands = vocab["vocab_test"]
  g = np.stack([glove[a] for a in cands])
  g /= np.linalg.norm(g, axis=1, keepdims=True)
  pred = [cands[j] for j in np.argmax(((x_test - mu) @ w) @ g.T, axis=1)]
  unseen = [i for i, a in enumerate(a_test) if vocab["categories"][a] == "unseen"]
  acc_unseen = np.mean([pred[i] == a_test[i] for i in unseen])
  assert acc_unseen > 20 / len(cands), (acc_unseen, len(cands))  # chance is 1 / |V_test|


def test_cli_small_and_bad_knob(tmp_path, capsys):
  out = tmp_path / "w"
  assert so.main(["--out", str(out), "--small", "--num-train", "300", "--num-test", "80", "--num-val", "0",
                  "--no-subtitles"]) == 0
  printed = capsys.readouterr().out
  assert "train: converted 300 of 300 rows" in printed and "| unseen |" in printed
  assert not (out / "raw" / "subtitles.json").exists()
  src = TFRecordDataSource.from_split(str(out / "records"), "train")
  assert len(src) == 300 and src[0]["subtitles"] == ""
  from evqa_jax import cli
  assert cli.run(so.main, ["--out", str(tmp_path / "bad"), "--small", "--num-heldout", "1000"]) == 2  # one line
  err = capsys.readouterr().err
  assert "num_heldout=1000" in err and err.count("\n") == 1, err


def test_ensure_world_builds_once_and_graphs(tmp_path, monkeypatch):
  from data_prep import answer_graphs
  calls = []
  monkeypatch.setattr(answer_graphs, "main", lambda argv: calls.append(list(argv)))
  monkeypatch.setitem(so.PRESETS, "tiny", dict(so.SMALL, num_train=200, num_val=0, num_test=50))
  records_dir = so.ensure_world(str(tmp_path), preset="tiny", verbose=False)
  assert records_dir == str(tmp_path / "records")
  assert calls == [["--data", records_dir]]  # graphs requested and absent
  stamp = os.stat(tmp_path / "records" / "vocab.json").st_mtime_ns
  for name in ("graph_train.npz", "graph_test.npz"):
    (tmp_path / "records" / name).write_bytes(b"")
  assert so.ensure_world(str(tmp_path), preset="tiny", verbose=False) == records_dir
  assert calls == [["--data", records_dir]] and os.stat(tmp_path / "records" / "vocab.json").st_mtime_ns == stamp
  assert records.load_metadata(records_dir)["splits"]["train"]["num_examples"] == 200
  with pytest.raises(ValueError, match="unknown synthetic OVQA preset 'huge'"):
    so.ensure_world(str(tmp_path), preset="huge")


# A smaller MSRVTT-scale world: more concepts than the curated words, so GloVe words join. (At this size the head
# stays under 101 train rows: no base answer; the full preset has 19, README.)
TRAIN_ANSWERS, TEST_ONLY, ROWS = 560, 120, 3


def test_msrvtt_scale_preset_vocabulary_categories_and_graphs(tmp_path, monkeypatch):
  """The MSRVTT-scale preset (msrvtt_scale(); configs/ovqa_msrvtt.py:scale), at a smaller size: V_train and the
  test-only answers have exactly the asked sizes, frequent GloVe words extend the curated ones, the train counts
  give a long tail, the graphs are the k = 10, 2-hop ones, and the world is deterministic."""
  from evqa_jax.graphs import answer_graph
  from evqa_jax.metrics import ovqa as ovqa_metrics
  knobs = so.msrvtt_scale(train_answers=TRAIN_ANSWERS, test_only_answers=TEST_ONLY, rows_per_train_answer=ROWS)
  cfg = so.WorldConfig(**knobs)
  curated = {w for w, _ in so.concept_words()}
  assert cfg.extra_glove_words == TRAIN_ANSWERS + TEST_ONLY - len(curated) > 0
  assert so.PRESETS["msrvtt_scale"] == so.msrvtt_scale(4000, 1600)
  monkeypatch.setitem(so.PRESETS, "scale_test", knobs)
  records_dir = so.ensure_world(str(tmp_path / "w"), preset="scale_test", verbose=False)

  vocab = json.loads(open(os.path.join(records_dir, "vocab.json")).read())
  train_answers, test_answers = vocab["vocab_train"], vocab["vocab_test"]
  test_only = set(test_answers) - set(train_answers)
  assert (len(train_answers), len(test_only)) == (TRAIN_ANSWERS, TEST_ONLY)
  raw = tmp_path / "w" / "raw"
  train = pd.read_csv(raw / "train.csv", dtype=str, keep_default_na=False)
  test = pd.read_csv(raw / "test.csv", dtype=str, keep_default_na=False)
  assert (len(train), len(test)) == (cfg.num_train, cfg.num_test) == (ROWS * TRAIN_ANSWERS, 2 * TEST_ONLY)
  assert not (raw / "val.csv").exists()
  # The extra concepts are the most frequent usable GloVe words, in the group of their nearest curated word.
  info = json.loads((raw / "world.json").read_text())
  extra = [c for c in info["concepts"] if c["word"] not in curated]
  expected_extra = so.frequent_glove_words(cfg.extra_glove_words, curated)
  assert sorted(c["word"] for c in extra) == sorted(expected_extra)
  assert not {c["word"] for c in extra} & so.STOP_WORDS
  groups = dict(so.glove_concepts(so.concept_words(), cfg.extra_glove_words))
  assert all(c["group"] == groups[c["word"]] for c in extra)
  # Categories by train count, as the converter wrote them: a long tail with every category present.
  counts = train["answer"].value_counts()
  cats = collections.Counter(ovqa_metrics.category_of_count(int(counts[a])) for a in train_answers)
  assert cats == collections.Counter(vocab["categories"][a] for a in train_answers)
  assert cats["rare"] > cats["common"] > 0 and sum(cats.values()) == TRAIN_ANSWERS, cats
  assert {vocab["categories"][a] for a in test_only} == {"unseen"}
  # Graphs: built with the recorded k = 10 and 2 hops (config.graph's), answers first, GloVe words around them.
  for split, answers in (("train", train_answers), ("test", test_answers)):
    graph = answer_graph.load_answer_graph(os.path.join(records_dir, f"graph_{split}.npz"))
    assert (graph.info["k"], graph.info["hops"], graph.num_answers) == (10, 2, len(answers))
    assert graph.node_words[:len(answers)] == answers and graph.num_nodes > 3 * len(answers)
    answer_graph.check_build_params(graph, "g", records_dir, 10, 2, -1.0)
  # Deterministic: the same knobs give the same files.
  so.generate_raw(str(tmp_path / "again"), cfg)
  for name in ("train.csv", "test.csv", "world.json"):
    assert (tmp_path / "again" / name).read_bytes() == (raw / name).read_bytes(), name


def test_neighbours_world_shows_the_mean_of_the_graph_words():
  """video_direction='neighbours': a concept's frames show unit(M (n_c - g_mean)), n_c the mean GloVe vector of its
  k nearest GloVe words that are not concepts (a brute-force cosine search here, not the answer-graph code), its own
  vector where all k are concepts. The concepts, splits' random draws and M stay those of the word world."""
  from evqa_jax.graphs import word_vectors
  cfg = so.WorldConfig(**so.SMALL, video_direction="neighbours", neighbour_k=4)
  world, word_world = so._World(cfg), so._World(SMALL)
  assert world.concepts == word_world.concepts and world.heldout == word_world.heldout
  wv = word_vectors.load_word_vectors("pkg:glove-6b-50d")
  table = wv.vectors / np.maximum(np.linalg.norm(wv.vectors, axis=1, keepdims=True), 1e-8)
  concept_words = {word_vectors.normalize_word(w) for w in world.concepts}
  all_vecs = so.load_glove([w for w, _ in so.concept_words()])[0]
  map_ss, _ = np.random.SeedSequence(cfg.seed).spawn(2)
  projection = np.random.default_rng(map_ss).standard_normal((50, cfg.feature_dim)) / np.sqrt(50)
  for c in world.concepts[::7]:
    row = wv.lookup(c)
    sims = table @ table[row]
    sims[row] = -np.inf
    nearest = np.argsort(-sims, kind="stable")[:4]
    found = [j for j in nearest if word_vectors.normalize_word(wv.words[j]) not in concept_words]
    target = wv.vectors[found].mean(0) if found else wv.vectors[row]
    mapped = (target - all_vecs.mean(0)) @ projection
    np.testing.assert_allclose(world.direction[c], mapped / np.linalg.norm(mapped), atol=1e-5, err_msg=c)
    if not found:
      np.testing.assert_allclose(world.direction[c], word_world.direction[c], atol=1e-6)
  assert world.num_without_neighbours < len(world.concepts) // 10
  with pytest.raises(ValueError, match="video_direction='glove'"):
    so._World(so.WorldConfig(**so.SMALL, video_direction="glove"))


def test_frames_world_same_rows_and_pixels_show_the_answers(tmp_path):
  """--frames: the same world's CSVs, subtitles and features byte for byte (the renderer draws from its own seed
  stream), its clips as real mp4 files converted to pixel records, in which a sampled frame of every row shows its
  answer's colour pattern (decoded by the nearest pattern among all concepts at the cell centres)."""
  cfg = so.WorldConfig(**{**so.SMALL, "num_train": 30, "num_val": 0, "num_test": 12})
  fc = so.FramesConfig()
  so.build(str(tmp_path / "frames"), cfg, verbose=False, frames=fc)
  so.generate_raw(str(tmp_path / "features/raw"), cfg)
  for name in ("train.csv", "test.csv", "subtitles.json", "features.npz"):
    assert (tmp_path / "frames/raw" / name).read_bytes() == (tmp_path / "features/raw" / name).read_bytes(), name
  meta = records.load_metadata(str(tmp_path / "frames/records"))
  assert (meta["video_input"], meta["num_frames"], meta["frame_size"], meta["stored_size"]) == ("frames", 3, 32, 38)
  renderer = so.FrameRenderer(so._World(cfg), fc)
  words = list(renderer.pattern)
  patterns = np.stack([renderer.pattern[w].ravel() for w in words])
  centres = ((np.arange(fc.grid) + 0.5) * 38 / fc.grid).astype(int)
  for split in ("train", "test"):
    src = TFRecordDataSource(records.split_paths(str(tmp_path / "frames/records"), split),
                             records.load_spec(str(tmp_path / "frames/records"), split))
    hits = 0
    for i in range(len(src)):
      ex = src[i]
      assert ex["frames"].shape == (3, 38, 38, 3)
      cells = np.median(np.stack([ex["frames"][:, centres + dy][:, :, centres + dx] for dy in (-1, 0, 1)
                                  for dx in (-1, 0, 1)]), axis=0).reshape(3, -1) - 128.0
      hits += str(ex["answer"]) in {words[k] for k in np.argmax(cells @ patterns.T, axis=1)}
    assert hits >= 0.9 * len(src), (split, hits, len(src))
