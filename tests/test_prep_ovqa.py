"""OVQA converter (data_prep/ovqa.py), feature readers (data_prep/features.py) and answer statistics."""

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest

from evqa_jax import cli
from data_prep import answer_stats
from data_prep import features as features_lib
from data_prep import ovqa
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource

DIM = 768
T = 10

# Official layout: question, answer, video_id, type, id. "none" must stay a string answer.
TRAIN = [
    ("what is the man holding", "dog", "v_long", 0, 100),
    ("what animal is shown", "dog", "v_exact", 0, 101),
    ("what is in the video", "cat", "v_short", 0, 102),
    ("what color is the car", "red", "v_long", 2, 103),
    ("what is shown", "dog", "v_25", 0, 104),
    ("what is on the table", "none", "v_short", 0, 105),
]
VAL = [
    ("who is talking", "man", "v_exact", 4, 200),
    ("when is it", "night", "v_25", 5, 201),
]
TEST = [
    ("what animal is there", "dog", "v_25", 0, 300),
    ("what color is the shirt", "blue", "v_long", 2, 301),
    ("what color is the ball", "red", "v_exact", 2, 302),
    ("what is the woman eating", "apple", "v_short", 0, 303),
]
LENGTHS = {"v_long": 23, "v_exact": 10, "v_short": 3, "v_25": 25}
SUBTITLES = {"v_long": "hello there", "v_25": [{"text": "first line"}, {"text": "second"}]}


def _write_csv(path, rows, columns=("question", "answer", "video_id", "type", "id")):
  pd.DataFrame([dict(zip(("question", "answer", "video_id", "type", "id"), r)) for r in rows],
               columns=list(columns)).to_csv(path, index=False)


def _features(seed=0):
  rng = np.random.default_rng(seed)
  return {v: (rng.standard_normal((n, DIM)) * 3).astype(np.float16) for v, n in LENGTHS.items()}


@pytest.fixture
def release(tmp_path):
  """A tiny release in the official format: CSVs, subtitles JSON and the features (as .npz)."""
  raw = tmp_path / "raw"
  raw.mkdir()
  _write_csv(raw / "train.csv", TRAIN)
  _write_csv(raw / "val.csv", VAL)
  _write_csv(raw / "test.csv", TEST)
  (raw / "subtitles.json").write_text(json.dumps(SUBTITLES))
  feats = _features()
  features_lib.save_feature_dict(str(raw / "features.npz"), feats)
  return raw, feats


def _read_split(out, split):
  src = TFRecordDataSource.from_split(str(out), split)
  return [src[i] for i in range(len(src))]


def test_frame_indices_hand_computed():
  # floor(j * 23 / 10), j = 0..9
  np.testing.assert_array_equal(features_lib.frame_indices(23, 10), [0, 2, 4, 6, 9, 11, 13, 16, 18, 20])
  np.testing.assert_array_equal(features_lib.frame_indices(25, 10), [0, 2, 5, 7, 10, 12, 15, 17, 20, 22])
  np.testing.assert_array_equal(features_lib.frame_indices(10, 10), np.arange(10))
  np.testing.assert_array_equal(features_lib.frame_indices(3, 10), [0, 1, 2])
  x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
  frames, mask = features_lib.sample_frames(x, 5)
  np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0])
  np.testing.assert_array_equal(frames[:3], x)
  assert frames.dtype == np.float32 and not frames[3:].any()
  frames, _ = features_lib.sample_frames(x, 5, np.float16)
  np.testing.assert_array_equal(frames[:3], x.astype(np.float16))
  assert frames.dtype == np.float16


def _dtype_release(root, feats):
  root.mkdir(parents=True)
  _write_csv(root / "train.csv", [("what is it", "dog", v, 0, i) for i, v in enumerate(feats)])
  _write_csv(root / "test.csv", [("what is it", "cat", v, 0, i) for i, v in enumerate(feats)])
  features_lib.save_feature_dict(str(root / "features.npz"), feats)
  return root


def test_features_keep_the_source_dtype(tmp_path):
  """Video features are stored at the source's precision by default (float32 S3D stays float32, float16 CLIP stays
  float16, float64 becomes float32, the compute dtype); `--feature-dtype float16` stores float16 on request. The
  records read back bit-exact and the OVQA reader gives the float32 model input either way."""
  from evqa_jax.projects.ovqa import input as input_lib
  rng = np.random.default_rng(0)
  x32 = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal((2, 4)).astype(np.float32)}
  # Below float16's smallest subnormal (6e-8, so 0 there) and values needing float32's 24-bit mantissa.
  x32["a"][0, :] = [1e-8, -3e-10, 1.0000001, 3.1415927]
  assert not np.float16(1e-8) and np.float16(1.0000001) == 1.0
  raw = _dtype_release(tmp_path / "raw32", x32)

  def convert(name, **kw):
    out = tmp_path / name
    ovqa.convert(str(raw), str(raw / "features.npz"), str(out), num_frames=3, feature_dim=4, cvqa_topk=0,
                 verbose=False, **kw)
    meta = records.load_metadata(str(out))
    assert meta["features"]["video"]["dtype"] == meta["feature_dtype"]
    return meta["feature_dtype"], [ex["video"] for ex in _read_split(out, "train")]

  dtype, videos = convert("source")  # the default
  assert dtype == "float32"
  np.testing.assert_array_equal(videos[0], x32["a"])  # exact: the tiny values survive
  np.testing.assert_array_equal(videos[1], np.concatenate([x32["b"], np.zeros((1, 4), np.float32)]))
  assert videos[0][0, 0] == np.float32(1e-8) and videos[0][0, 2] == np.float32(1.0000001)
  reader = input_lib.Input.__new__(input_lib.Input)  # only the record -> model input step
  reader.answer_index_eval, reader.data_dir = {"dog": 0}, str(tmp_path / "source")
  got = reader.video_and_label({"answer": "dog", "index": 0, "video": videos[0], "video_mask": [1, 1, 1]}, False)
  assert got["video"].dtype == np.float32
  np.testing.assert_array_equal(got["video"], x32["a"])

  dtype, videos = convert("f16", feature_dtype="float16")  # the explicit choice: half the size, float16's precision
  assert dtype == "float16" and videos[0].dtype == np.float16
  np.testing.assert_array_equal(videos[0], x32["a"].astype(np.float16))
  assert videos[0][0, 0] == 0 and videos[0][0, 2] == 1.0
  got = reader.video_and_label({"answer": "dog", "index": 0, "video": videos[0], "video_mask": [1, 1, 1]}, False)
  np.testing.assert_array_equal(got["video"], x32["a"].astype(np.float16).astype(np.float32))

  x16 = {k: v.astype(np.float16) for k, v in x32.items()}
  raw = _dtype_release(tmp_path / "raw16", x16)
  dtype, videos = convert("source16")
  assert dtype == "float16"
  np.testing.assert_array_equal(videos[0], x16["a"])
  x64 = {k: v.astype(np.float64) for k, v in x32.items()}
  raw = _dtype_release(tmp_path / "raw64", x64)
  dtype, videos = convert("source64")
  assert dtype == "float32"
  np.testing.assert_array_equal(videos[0], x32["a"])

  # A float16 file whose later video is float32: "source" storage (float16, from the first video) would round it.
  raw = _dtype_release(tmp_path / "mixed", {"a": x16["a"], "b": x32["b"]})
  with pytest.raises(ovqa.ConversionError, match=r"train.csv, row 1 \(line 3\), field 'video_id': video 'b' in .* "
                     r"has float32 features but the file's first video float16, the dtype the records keep: pass "
                     r"--feature-dtype float32"):
    convert("mixed_out")
  dtype, videos = convert("mixed_out32", feature_dtype="float32")
  assert dtype == "float32"
  np.testing.assert_array_equal(videos[1][:2], x32["b"])


@pytest.mark.parametrize("fmt", ["npz", "h5", "npy", "pth"])
def test_convert_and_read_back(release, tmp_path, fmt):
  raw, feats = release
  if fmt == "pth":
    pytest.importorskip("torch")
  feature_file = str(raw / f"features.{fmt}")
  if fmt != "npz":
    features_lib.save_feature_dict(feature_file, feats)
  out = tmp_path / "out"
  summary = ovqa.convert(str(raw), feature_file, str(out), subtitles=str(raw / "subtitles.json"), num_frames=T,
                         cvqa_topk=2, trust_pickles=fmt == "npy", verbose=False)
  assert {s: summary[s]["converted"] for s in summary} == {"train": 6, "val": 2, "test": 4}
  subs = {"v_long": "hello there", "v_25": "first line second"}
  for split, rows in (("train", TRAIN), ("val", VAL), ("test", TEST)):
    got = _read_split(out, split)
    assert len(got) == len(rows)
    for i, (ex, (q, a, vid, qtype, rid)) in enumerate(zip(got, rows)):
      assert (ex["index"], ex["id"], ex["video_id"], ex["question"], ex["answer"]) == (i, str(rid), vid, q, a)
      assert ex["question_type"] == qtype and ex["question_type"].dtype == np.int64
      assert ex["subtitles"] == subs.get(vid, "")
      n = LENGTHS[vid]
      idx = [j * n // T for j in range(T)] if n > T else list(range(n))  # REFERENCE.md frame rule
      want = np.zeros((T, DIM), np.float16)
      want[:len(idx)] = feats[vid][idx]
      assert ex["video"].dtype == np.float16 and ex["video"].shape == (T, DIM)
      np.testing.assert_array_equal(ex["video"], want)
      np.testing.assert_array_equal(ex["video_mask"], [1] * len(idx) + [0] * (T - len(idx)))
    copy = pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)
    assert copy["answer"].tolist() == [r[1] for r in rows]
    assert copy["video_id"].tolist() == [r[2] for r in rows]

  vocab = json.loads((out / "vocab.json").read_text())
  assert vocab["train_counts"] == {"dog": 3, "cat": 1, "none": 1, "red": 1}
  assert vocab["vocab_train"] == ["dog", "cat", "none", "red"]  # count desc, ties alphabetical
  assert vocab["vocab_test"] == ["dog", "red", "apple", "blue"]  # train order, then unseen alphabetically
  assert vocab["vocab_cvqa"] == ["dog", "cat"]
  assert vocab["categories"] == {"dog": "rare", "cat": "rare", "none": "rare", "red": "rare",
                                 "apple": "unseen", "blue": "unseen"}
  meta = records.load_metadata(str(out))
  assert (meta["task"], meta["num_frames"], meta["feature_dim"]) == ("ovqa", T, DIM)
  assert meta["features"]["video"] == {"dtype": "float16", "shape": [T, DIM]}
  assert meta["features"]["video_mask"] == {"dtype": "int64", "shape": [T]}
  assert meta["conversion"]["train"]["skipped"] == {}
  assert meta["splits"]["test"]["num_examples"] == 4


def test_int_keys_and_missing_optional_columns(tmp_path):
  """A pickled .npy dict with int keys; CSVs without type/id/val.csv; no subtitles."""
  raw = tmp_path / "raw"
  raw.mkdir()
  rows = [("what is it", "ball", "7010", 0, 0), ("what is that", "cup", "7011", 0, 0)]
  _write_csv(raw / "train.csv", rows, columns=("question", "answer", "video_id"))
  _write_csv(raw / "test.csv", rows[::-1], columns=("question", "answer", "video_id"))
  feats = {7010: np.ones((4, 8), np.float16), 7011: np.full((12, 8), 2, np.float16)}
  np.save(raw / "f.npy", feats, allow_pickle=True)
  out = tmp_path / "out"
  ovqa.convert(str(raw), str(raw / "f.npy"), str(out), num_frames=5, feature_dim=8, trust_pickles=True,
               verbose=False)
  test = _read_split(out, "test")
  assert [ex["question_type"] for ex in test] == [-1, -1]
  assert [ex["id"] for ex in test] == ["0", "1"]  # row index when the CSV has no id column
  assert [ex["subtitles"] for ex in test] == ["", ""]
  np.testing.assert_array_equal(test[0]["video_mask"], [1] * 5)
  np.testing.assert_array_equal(test[1]["video_mask"], [1, 1, 1, 1, 0])
  assert records.load_metadata(str(out))["splits"].keys() == {"train", "test"}


def test_build_vocab_thresholds():
  train = ["a"] * 101 + ["b"] * 100 + ["c"] * 11 + ["d"] * 10 + ["e"]
  v = ovqa.build_vocab(train, ["e", "z", "a", "y"], cvqa_topk=0)
  assert v["vocab_train"] == ["a", "b", "c", "d", "e"]
  assert v["vocab_cvqa"] == v["vocab_train"]
  assert v["vocab_test"] == ["a", "e", "y", "z"]
  assert v["categories"] == {"a": "base", "b": "common", "c": "common", "d": "rare", "e": "rare",
                             "y": "unseen", "z": "unseen"}


def _set_cell(path, row, column, value):
  df = pd.read_csv(path, dtype=str, keep_default_na=False)
  df.loc[row, column] = value
  df.to_csv(path, index=False)


# (case, how to break the release, reason counted by --skip-bad, split, row, field named in the error)
BAD_ROWS = [
    ("unknown_video", lambda raw: _set_cell(raw / "train.csv", 2, "video_id", "v_missing"), "unknown_video",
     "train", 2, "video_id"),
    ("empty_question", lambda raw: _set_cell(raw / "test.csv", 1, "question", "  "), "empty_question", "test", 1,
     "question"),
    ("empty_answer", lambda raw: _set_cell(raw / "val.csv", 0, "answer", ""), "empty_answer", "val", 0, "answer"),
    ("bad_type", lambda raw: _set_cell(raw / "train.csv", 4, "type", "what"), "bad_type", "train", 4, "type"),
]


def _break_features(raw, feats, vid, value):
  feats = dict(feats)
  feats[vid] = value
  features_lib.save_feature_dict(str(raw / "features.npz"), feats)


BAD_FEATURES = [
    ("wrong_dim", np.zeros((5, 512), np.float16)),
    ("one_dim", np.zeros((DIM,), np.float16)),
    ("no_frames", np.zeros((0, DIM), np.float16)),
    ("nan", np.full((4, DIM), np.nan, np.float16)),
    ("not_float", np.zeros((4, DIM), np.int32)),
]


@pytest.mark.parametrize("case,breaker,reason,split,row,field", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_rows(release, tmp_path, case, breaker, reason, split, row, field):
  raw, _ = release
  breaker(raw)
  out = tmp_path / "out"
  with pytest.raises(ovqa.ConversionError) as err:
    ovqa.convert(str(raw), str(raw / "features.npz"), str(out), verbose=False)
  msg = str(err.value)
  assert f"{split}.csv" in msg and f"row {row}" in msg and repr(field) in msg, msg
  assert not out.exists()
  assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []  # temporary output removed

  summary = ovqa.convert(str(raw), str(raw / "features.npz"), str(out), skip_bad=True, verbose=False)
  total = {"train": len(TRAIN), "val": len(VAL), "test": len(TEST)}
  assert summary[split]["skipped"] == {reason: 1}
  assert summary[split]["converted"] == total[split] - 1
  assert summary[split]["skipped_rows"][0]["row"] == row
  got = _read_split(out, split)
  assert len(got) == total[split] - 1
  assert [ex["index"] for ex in got] == list(range(total[split] - 1))
  copy = pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)
  assert len(copy) == total[split] - 1 and copy["id"].tolist() == [ex["id"] for ex in got]
  assert records.load_metadata(str(out))["conversion"][split]["skipped"] == {reason: 1}


@pytest.mark.parametrize("case,value", BAD_FEATURES, ids=[c[0] for c in BAD_FEATURES])
def test_bad_features(release, tmp_path, case, value):
  raw, feats = release
  _break_features(raw, feats, "v_short", value)  # used by train rows 2 and 5 and test row 3
  out = tmp_path / "out"
  with pytest.raises(ovqa.ConversionError) as err:
    ovqa.convert(str(raw), str(raw / "features.npz"), str(out), verbose=False)
  msg = str(err.value)
  assert "train.csv" in msg and "row 2" in msg and "'video_id'" in msg and "v_short" in msg, msg
  summary = ovqa.convert(str(raw), str(raw / "features.npz"), str(out), skip_bad=True, verbose=False)
  assert summary["train"]["skipped"] == {"bad_features": 2}
  assert summary["test"]["skipped"] == {"bad_features": 1}
  assert [ex["answer"] for ex in _read_split(out, "train")] == ["dog", "dog", "red", "dog"]
  vocab = json.loads((out / "vocab.json").read_text())
  assert vocab["vocab_train"] == ["dog", "red"]  # computed from the converted rows only
  assert vocab["vocab_test"] == ["dog", "red", "blue"]


def test_missing_column_and_split_are_errors_even_with_skip_bad(release, tmp_path):
  raw, _ = release
  df = pd.read_csv(raw / "train.csv", dtype=str, keep_default_na=False)
  df.drop(columns=["answer"]).to_csv(raw / "train.csv", index=False)
  with pytest.raises(ovqa.ConversionError, match=r"train\.csv: missing column\(s\) \['answer'\]"):
    ovqa.convert(str(raw), str(raw / "features.npz"), str(tmp_path / "out"), skip_bad=True, verbose=False)
  df.to_csv(raw / "train.csv", index=False)
  os.remove(raw / "test.csv")
  with pytest.raises(ovqa.ConversionError, match=r"split file .*test\.csv does not exist"):
    ovqa.convert(str(raw), str(raw / "features.npz"), str(tmp_path / "out"), skip_bad=True, verbose=False)
  with pytest.raises(features_lib.FeatureError, match="does not exist"):
    features_lib.FeatureStore(str(raw / "absent.h5"))


def test_failed_conversion_leaves_existing_output_untouched(release, tmp_path):
  raw, _ = release
  out = tmp_path / "out"
  ovqa.convert(str(raw), str(raw / "features.npz"), str(out), verbose=False)
  before = {p: (out / p).read_bytes() for p in os.listdir(out)}
  _set_cell(raw / "test.csv", 3, "video_id", "v_missing")
  with pytest.raises(ovqa.ConversionError, match="v_missing"):
    ovqa.convert(str(raw), str(raw / "features.npz"), str(out), verbose=False)
  assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before
  assert sorted(os.listdir(tmp_path)) == ["out", "raw"]


def test_cli_prints_counts_and_table(release, tmp_path, capsys):
  raw, _ = release
  _set_cell(raw / "train.csv", 0, "video_id", "v_missing")
  out = tmp_path / "out"
  args = ["--csv-dir", str(raw), "--features", str(raw / "features.npz"), "--out", str(out)]
  assert cli.run(ovqa.main, args) == 2
  assert "unknown video id 'v_missing'" in capsys.readouterr().err
  assert cli.run(ovqa.main, args + ["--skip-bad", "--subtitles", str(raw / "subtitles.json")]) == 0
  printed = capsys.readouterr().out
  assert "train: converted 5 of 6 rows, skipped 1 (unknown_video: 1)" in printed
  assert "test: converted 4 of 4 rows, skipped 0 (none)" in printed
  assert "| unseen | 2 | 2 | 2 | 50.00 | 0 |" in printed


def test_answer_stats_table1(release, tmp_path, capsys):
  raw, _ = release
  t = answer_stats.table1_from_dir(str(raw))
  # train: dog 3, cat 1, none 1, red 1 (all rare); test: dog, blue, red, apple
  assert t["rare"] == {"answers": 4, "test_answers": 2, "test_samples": 2, "test_samples_pct": 50.0,
                       "train_samples": 6}
  assert t["unseen"] == {"answers": 2, "test_answers": 2, "test_samples": 2, "test_samples_pct": 50.0,
                         "train_samples": 0}
  assert t["base"]["answers"] == t["common"]["answers"] == 0
  assert t["total"]["answers"] == 6 and t["total"]["test_samples"] == 4
  big = answer_stats.table1(["a"] * 120 + ["b"] * 20 + ["c"] * 3, ["a", "a", "b", "c", "d", "d"])
  assert [big[c]["test_samples"] for c in ("base", "common", "rare", "unseen")] == [2, 1, 1, 2]
  assert [big[c]["answers"] for c in ("base", "common", "rare", "unseen")] == [1, 1, 1, 1]
  assert answer_stats.main([str(raw), "--json", str(tmp_path / "t.json")]) == 0
  assert "| rare | 4 | 2 | 2 | 50.00 | 6 |" in capsys.readouterr().out
  assert json.loads((tmp_path / "t.json").read_text())["unseen"]["answers"] == 2
  # --dataset: the paper's Table 1 and section 4.1 beside ours (raw CSVs: V_train / V_test are their unique answers).
  assert answer_stats.main([str(raw), "--dataset", "msrvtt", "--json", str(tmp_path / "p.json")]) == 0
  out = capsys.readouterr().out
  assert "| rare | 4 | 2 | 2 | 50.00 | 6 | 2,858 |" in out and "| total | 6 | 4 | 4 | 100.00 | 6 | 5,632 |" in out
  assert "| train questions | 6 | 159K |" in out and "| test questions | 4 | 73K |" in out
  assert "| train vocabulary (V_train) | 4 | 4,000 |" in out and "| test vocabulary (V_test) | 4 | 4,173 |" in out
  assert json.loads((tmp_path / "p.json").read_text())["splits"] == {
      "train_questions": 6, "test_questions": 4, "vocab_train": 4, "vocab_test": 4}
  out_dir = tmp_path / "converted"  # a converted folder: its vocab.json's vocabularies
  ovqa.convert(str(raw), str(raw / "features.npz"), str(out_dir), cvqa_topk=0, verbose=False)
  vocab = json.loads((out_dir / "vocab.json").read_text())
  assert answer_stats.splits_from_dir(str(out_dir)) == {
      "train_questions": 6, "test_questions": 4, "vocab_train": len(vocab["vocab_train"]),
      "vocab_test": len(vocab["vocab_test"])} == {"train_questions": 6, "test_questions": 4, "vocab_train": 4,
                                                  "vocab_test": 4}


def test_answer_stats_fig1_groups(tmp_path, capsys):
  """The paper's Fig. 1 groups, counted by hand: the top-k train answers (ties alphabetical), the other train answers
  and the unseen test answers; their shares of the answers (1a) and samples (1b); (c)'s sorted counts; the PNG."""
  train = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"]
  test = ["a", "c", "d", "d", "e", "e", "f"]
  f = answer_stats.fig1_groups(train, test, top=2)  # a (5), then b / c tie at 3: b
  assert f["groups"] == {"~ Top-2": {"answers": 2, "train_samples": 8, "test_samples": 1, "samples": 9},
                         "Top-2 ~": {"answers": 2, "train_samples": 4, "test_samples": 3, "samples": 7},
                         "Unseen": {"answers": 2, "train_samples": 0, "test_samples": 3, "samples": 3}}
  assert f["shares"]["Unseen"] == {"answers": 33.33, "train_samples": 0.0, "test_samples": 42.86, "samples": 15.79}
  assert f["sorted_counts"] == [6, 3, 4, 3, 2, 1]  # a b | c d | e f
  raw = tmp_path / "raw"
  raw.mkdir()
  _write_csv(raw / "train.csv", [("q", a, "v", 0, i) for i, a in enumerate(train)])
  _write_csv(raw / "test.csv", [("q", a, "v", 0, i) for i, a in enumerate(test)])
  assert answer_stats.main([str(raw), "--fig1", str(tmp_path / "fig1.png"), "--top", "2"]) == 0
  assert "| Unseen | 2 | 33.33 | 0.00 | 42.86 | 15.79 |" in capsys.readouterr().out
  assert (tmp_path / "fig1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_torch_missing_gives_clear_error(release, monkeypatch):
  raw, _ = release
  (raw / "f.pth").write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
  with pytest.raises(features_lib.FeatureError, match="needs torch, which is not installed: pip install"):
    features_lib.FeatureStore(str(raw / "f.pth"))


def test_hdf5_group_layout_and_subtitle_formats(tmp_path):
  import h5py
  path = tmp_path / "f.h5"
  with h5py.File(path, "w") as f:
    f.create_dataset("a", data=np.ones((2, 3), np.float16))
    f.create_group("b").create_dataset("clip", data=np.full((4, 3), 2, np.float16))
    g = f.create_group("c")
    g.create_dataset("x", data=np.zeros((1, 3)))
    g.create_dataset("y", data=np.zeros((1, 3)))
  with features_lib.FeatureStore(str(path)) as store:
    assert sorted(store) == ["a", "b", "c"]
    np.testing.assert_array_equal(store["b"], np.full((4, 3), 2, np.float16))
    with pytest.raises(features_lib.FeatureError, match="exactly one dataset"):
      store["c"]
  sub = tmp_path / "s.json"
  sub.write_text(json.dumps({"a": " hi ", "b": ["x", " ", "y"], "c": {"text": ["p", "q"]}, "7": []}))
  assert features_lib.load_subtitles(str(sub)) == {"a": "hi", "b": "x y", "c": "p q", "7": ""}
  sub.write_text(json.dumps({"a": 3}))
  with pytest.raises(features_lib.FeatureError, match="subtitles of video 'a'"):
    features_lib.load_subtitles(str(sub))
