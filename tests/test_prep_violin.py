"""VIOLIN converter on hand-made fixtures, its bad-input errors, and the synthetic VIOLIN world."""

import hashlib
import json
import os
import re

import h5py
import numpy as np
import pytest

from evqa_jax import cli
from data_prep import synthetic_violin, violin
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource


def _clip(split, statements=None, sub=None):
  return {"split": split,
          "sub": sub if sub is not None else [["Hello there.", 0.0, 1.0], ["  General Kenobi!  ", 1.0, 2.5]],
          "statement": statements or [["pos a", "neg a"], ["pos b", "neg b"], ["pos c", "neg c"]]}


def _write(tmp_path, ann, feats, key="resnet_features"):
  for cid, entry in ann.items():  # "file" = the clip id unless a test says otherwise (the release's HDF5 key)
    if isinstance(entry, dict):
      entry.setdefault("file", cid)
  a = tmp_path / "violin_annotation.json"
  a.write_text(json.dumps(ann))
  h = tmp_path / "f.h5"
  with h5py.File(h, "w") as f:
    for cid, x in feats.items():
      f.create_dataset(f"{cid}/{key}", data=x)
  return str(a), str(h)


def _read(out, split):
  return [TFRecordDataSource.from_split(out, split)[i] for i in range(len(TFRecordDataSource.from_split(out, split)))]


def test_convert_values_and_metadata(tmp_path):
  x1 = np.array([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
  x2 = np.arange(12 * 4, dtype=np.float32).reshape(12, 4) + 1.0
  ann = {"c1": _clip("train"), "c2": _clip("test", [["p", "n"]])}
  a, h = _write(tmp_path, ann, {"c1": x1, "c2": x2, "only_in_h5": x1})
  out = str(tmp_path / "out")
  counts = violin.convert(a, h, out, feature="resnet", feature_dim=4, max_frames=5, verbose=False)
  assert counts["train"] == {"converted_clips": 1, "converted_records": 3, "skipped_clips": {}}
  assert counts["test"]["converted_records"] == 1

  train = _read(out, "train")
  assert [r["pair_index"] for r in train] == [0, 1, 2]
  assert [(r["statement_pos"], r["statement_neg"]) for r in train] == [("pos a", "neg a"), ("pos b", "neg b"),
                                                                       ("pos c", "neg c")]
  r = train[0]
  assert r["clip_id"] == "c1" and r["split"] == "train"
  assert r["subtitles"] == "Hello there. General Kenobi!"
  expected = np.array([[0.6, 0.8, 0, 0], [0, 0, 0, 1], [0.5, 0.5, 0.5, 0.5]], np.float32)
  np.testing.assert_allclose(r["video"], expected, atol=1e-6)
  assert r["video"].dtype == np.float32 and r["video_len"] == 3

  # 12 frames, at most 5: linspace(0, 11, 5) = [0, 2.75, 5.5, 8.25, 11] -> rows [0, 3, 6, 8, 11].
  t = _read(out, "test")[0]
  rows = x2[[0, 3, 6, 8, 11]]
  np.testing.assert_allclose(t["video"], rows / np.linalg.norm(rows, axis=1, keepdims=True), rtol=1e-6)
  assert t["video_len"] == 5

  meta = records.load_metadata(out)
  assert meta["task"] == "violin" and meta["feature"] == "resnet" and meta["feature_dim"] == 4
  assert meta["splits"]["train"]["num_examples"] == 3 and meta["features_without_annotation"] == 1
  assert meta["features"]["video"] == {"dtype": "float32", "shape": [None, 4]}
  assert "statement_pos" in meta["record_schema"]
  with open(os.path.join(out, "violin_annotation.json")) as f:
    assert json.load(f) == ann


def test_default_cap_of_256_frames_and_c3d(tmp_path):
  x = np.random.default_rng(0).normal(size=(300, 4096)).astype(np.float32)
  a, h = _write(tmp_path, {"c": _clip("validate")}, {"c": x}, key="c3d_features")
  out = str(tmp_path / "o")
  violin.convert(a, h, out, feature="c3d", verbose=False)
  r = _read(out, "validate")[0]
  assert r["video_len"] == 256 and r["video"].shape == (256, 4096)
  np.testing.assert_allclose(np.linalg.norm(r["video"], axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(r["video"][0], x[0] / np.linalg.norm(x[0]), rtol=1e-5)
  np.testing.assert_allclose(r["video"][-1], x[-1] / np.linalg.norm(x[-1]), rtol=1e-5)
  assert records.load_metadata(out)["feature_dim"] == 4096


def test_detection_features_release_layout(tmp_path):
  """`--feature det`: the release-shaped fixture's all_det_features.h5 (`<file>/det_features` [T, 2048], per-frame
  pooled regions) converts through the CLI with the same checks; region-level [T, R, 2048] arrays are named and
  counted, and a resnet-keyed file read as det names the missing det dataset."""
  from data_prep import fixtures
  rel = fixtures.violin_release(str(tmp_path / "feat"), feature="det")
  assert os.path.basename(rel["h5"]) == "all_det_features.h5" == violin.RELEASE_FILES["det"]
  ann = os.path.join(rel["dir"], "violin_annotation.json")
  out = str(tmp_path / "out")
  assert cli.run(violin.main, ["--annotation", ann, "--features", rel["h5"], "--feature", "det", "--out", out]) == 0
  meta = records.load_metadata(out)
  assert meta["feature"] == "det" and meta["feature_dim"] == 2048
  clip = "desperate_housewives_s02e03_clip_07"
  r = _read(out, "test")[0]
  x = rel["features"][clip].astype(np.float64)
  assert r["clip_id"] == clip and r["video_len"] == len(x)
  np.testing.assert_allclose(r["video"], x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)

  regions = np.ones((3, 10, 2048), np.float32)  # un-pooled: 10 regions a frame
  a, h = _write(tmp_path, {"good": _clip("train"), "bad": _clip("train")},
                {"good": np.ones((3, 2048), np.float32), "bad": regions}, key="det_features")
  with pytest.raises(violin.ConversionError, match=r"'bad/det_features' has shape \(3, 10, 2048\).*pooled to one "
                     "row per frame"):
    violin.convert(a, h, str(tmp_path / "o2"), feature="det", verbose=False)
  counts = violin.convert(a, h, str(tmp_path / "o2"), feature="det", skip_bad=True, verbose=False)
  assert counts["train"]["skipped_clips"] == {"wrong_feature_dim": 1} and counts["train"]["converted_clips"] == 1
  with pytest.raises(violin.ConversionError, match="dataset 'friends_s01e01_seg01_clip_00/det_features' is missing"):
    violin.convert(ann, fixtures.violin_release(str(tmp_path / "res"))["h5"], str(tmp_path / "o3"), feature="det",
                   verbose=False)


BAD_CASES = [
    # (name, annotation for clip "bad", features for "bad" (None: absent), reason, message fragments)
    ("missing_key", {"file": "x", "split": "train", "sub": []}, np.ones((2, 4)), "missing_field", ["'statement'"]),
    ("unknown_clip", _clip("train"), None, "unknown_clip_id", ["clip id 'bad'", "file 'bad'", "'bad/resnet_features'"]),
    ("bad_file", {**_clip("train"), "file": "../x"}, np.ones((2, 4)), "bad_clip_id", ["'file'"]),
    ("wrong_dim", _clip("train"), np.ones((2, 5)), "wrong_feature_dim", ["resnet_features", "(2, 5)"]),
    ("bad_pair", _clip("train", [["only one"]]), np.ones((2, 4)), "bad_statement", ["'statement'[0]"]),
    ("bad_split", _clip("dev"), np.ones((2, 4)), "unknown_split", ["'split'", "'dev'"]),
    ("bad_sub", _clip("train", sub=[["text", 0.0]]), np.ones((2, 4)), "bad_subtitles", ["'sub'[0]"]),
    ("empty", _clip("train"), np.ones((0, 4)), "empty_features", ["no frames"]),
    ("nan", _clip("train"), np.full((2, 4), np.nan), "bad_features", ["non-finite"]),
]


@pytest.mark.parametrize("name,entry,feats,reason,fragments", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input(tmp_path, name, entry, feats, reason, fragments):
  ann = {"good": _clip("train"), "bad": entry}
  fs = {"good": np.ones((3, 4), np.float32)}
  if feats is not None:
    fs["bad"] = feats
  a, h = _write(tmp_path, ann, fs)
  out = str(tmp_path / "out")
  with pytest.raises(violin.ConversionError) as e:
    violin.convert(a, h, out, feature_dim=4, verbose=False)
  msg = str(e.value)
  assert e.value.reason == reason
  assert "'bad'" in msg and (a in msg or h in msg), msg
  for frag in fragments:
    assert frag in msg, msg
  assert not os.path.exists(os.path.join(out, "violin_annotation.json"))  # nothing half-written

  counts = violin.convert(a, h, out, feature_dim=4, skip_bad=True, verbose=False)
  split = "invalid" if reason == "unknown_split" else "train"
  assert counts[split]["skipped_clips"] == {reason: 1}
  assert counts["train"]["converted_clips"] == 1 and counts["train"]["converted_records"] == 3
  assert len(_read(out, "train")) == 3
  assert records.load_metadata(out)["conversion"][split]["skipped_clips"] == {reason: 1}


def test_features_are_looked_up_by_the_clips_file(tmp_path):
  """As the authors' loader: `fin[clip['file'] + '/resnet_features']`, whatever the clip id."""
  x = np.array([[3.0, 4.0, 0.0, 0.0]], np.float32)
  ann = {"c1": {**_clip("train"), "file": "show_s01_clip_07"}}
  a, h = _write(tmp_path, ann, {"show_s01_clip_07": x, "c1": np.ones((2, 4), np.float32)})
  out = str(tmp_path / "out")
  violin.convert(a, h, out, feature_dim=4, verbose=False)
  r = _read(out, "train")[0]
  assert r["clip_id"] == "c1" and r["video_len"] == 1
  np.testing.assert_allclose(r["video"], [[0.6, 0.8, 0.0, 0.0]], atol=1e-6)
  # The file is missing while the clip id is there: one line naming the clip, its file and the HDF5 path.
  ann = {"c1": {**_clip("train"), "file": "other_name"}}
  a, h = _write(tmp_path, ann, {"c1": x})
  with pytest.raises(violin.ConversionError) as e:
    violin.convert(a, h, str(tmp_path / "o2"), feature_dim=4, verbose=False)
  assert str(e.value) == (f"{h}: clip id 'c1' (file 'other_name' in the annotation): HDF5 path "
                          "'other_name/resnet_features' is not in the features file; the clip id is a group there, "
                          "but the authors' loader reads the file's")
  # Two clips naming one file (the authors assert one file per clip).
  ann = {"c1": {**_clip("train"), "file": "f"}, "c2": {**_clip("test"), "file": "f"},
         "c3": {**_clip("test"), "file": "g"}}  # (a split that --skip-bad empties is an error of its own)
  a, h = _write(tmp_path, ann, {"f": x, "g": x})
  with pytest.raises(violin.ConversionError, match=r"clip 'c2': field 'file' 'f' is also the file of clip 'c1' \(one file per clip\)"):
    violin.convert(a, h, str(tmp_path / "o3"), feature_dim=4, verbose=False)
  counts = violin.convert(a, h, str(tmp_path / "o3"), feature_dim=4, skip_bad=True, verbose=False)
  assert counts["test"]["skipped_clips"] == {"duplicate_file": 1}


def test_cli_prints_counts_and_errors(tmp_path, capsys):
  a, h = _write(tmp_path, {"c": _clip("train"), "d": _clip("train")}, {"c": np.ones((2, 4))})
  assert cli.run(violin.main, ["--annotation", a, "--features", h, "--feature-dim", "4",
                               "--out", str(tmp_path / "o")]) == 2
  assert "clip id 'd'" in capsys.readouterr().err
  assert violin.main(["--annotation", a, "--features", h, "--feature-dim", "4", "--skip-bad",
                      "--out", str(tmp_path / "o")]) == 0
  assert "train: converted 3 records (1 clips), skipped 1 clips (unknown_clip_id=1)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ synthetic world

def _tree_digest(d):
  out = {}
  for root, _, files in os.walk(d):
    for f in files:
      if f.endswith(".lock"):
        continue
      p = os.path.join(root, f)
      out[os.path.relpath(p, d)] = hashlib.md5(open(p, "rb").read()).hexdigest()
  return out


def test_world_is_deterministic_and_converts(tmp_path):
  c1 = synthetic_violin.generate(str(tmp_path / "a"), seed=3, small=True, verbose=False)
  synthetic_violin.generate(str(tmp_path / "b"), seed=3, small=True, verbose=False)
  synthetic_violin.generate(str(tmp_path / "c"), seed=4, small=True, verbose=False)
  da, db, dc = (_tree_digest(str(tmp_path / x / "raw")) for x in "abc")
  assert da == db and da != dc
  assert {k: v["converted_clips"] for k, v in c1.items()} == synthetic_violin.SIZES["small"]
  for split in ("train", "validate", "test"):
    ra, rb = _read(str(tmp_path / "a" / "records"), split), _read(str(tmp_path / "b" / "records"), split)
    assert len(ra) == 3 * synthetic_violin.SIZES["small"][split]
    for x, y in zip(ra, rb):
      assert x.keys() == y.keys()
      for k in x:
        np.testing.assert_array_equal(x[k], y[k])
  meta = records.load_metadata(str(tmp_path / "a" / "records"))
  assert meta["feature_dim"] == 512 and meta["synthetic"]["seed"] == 3
  r = ra[0]
  assert 8 <= r["video_len"] <= 32 and r["video"].shape == (r["video_len"], 512)
  np.testing.assert_allclose(np.linalg.norm(r["video"], axis=1), 1.0, rtol=1e-5)


def _words(s):
  return re.findall(r"[a-z]+", s.lower())


def test_world_statements_need_the_right_modality():
  sizes = {"train": 400, "validate": 0, "test": 200}
  ann, feats, types = synthetic_violin.build_world(seed=0, sizes=sizes)
  cat_of = {w: c for c, ws in synthetic_violin.CATEGORIES.items() for w in ws}
  visual = {w for ws in synthetic_violin.VISUAL.values() for w in ws}
  dialogue = {w for ws in synthetic_violin.DIALOGUE.values() for w in ws}
  kinds = {"edit": 0, "adversarial": 0}
  for cid, a in ann.items():
    sub_words = set(_words(" ".join(s[0] for s in a["sub"])))
    assert not sub_words & visual  # visual facts are never spoken
    assert len(sub_words & dialogue) == 3
    for (pos, neg), (typ, kind) in zip(a["statement"], types[cid]):
      kinds[kind] += 1
      wp, wn = _words(pos), _words(neg)
      assert pos != neg
      if kind == "edit":
        assert len(wp) == len(wn)
        diff = [(x, y) for x, y in zip(wp, wn) if x != y]
        assert len(diff) == 1 and cat_of[diff[0][0]] == cat_of[diff[0][1]]
      # Dialogue words of a positive are in the subtitles; a negative has a false fact word.
      assert {w for w in wp if w in dialogue} <= sub_words
      if typ == "dialogue":
        assert not {w for w in wn if w in dialogue} <= sub_words
      if typ == "visual":
        assert not {w for w in wp + wn if w in dialogue}
  assert kinds["adversarial"] > 0.1 * kinds["edit"]

  # Statement-only: a bag-of-words logistic regression trained on train positives vs negatives is at chance.
  vocab = sorted({w for a in ann.values() for p in a["statement"] for s in p for w in _words(s)})
  index = {w: i for i, w in enumerate(vocab)}

  def bow(split):
    xs, ys = [], []
    for a in ann.values():
      if a["split"] == split:
        for p in a["statement"]:
          for s, y in zip(p, (1.0, 0.0)):
            v = np.zeros(len(vocab))
            for w in _words(s):
              v[index[w]] += 1
            xs.append(v)
            ys.append(y)
    return np.array(xs), np.array(ys)

  xtr, ytr = bow("train")
  xte, yte = bow("test")
  w, b = np.zeros(len(vocab)), 0.0
  for _ in range(300):
    p = 1 / (1 + np.exp(-(xtr @ w + b)))
    w -= 0.5 * (xtr.T @ (p - ytr) / len(ytr) + 1e-3 * w)
    b -= 0.5 * np.mean(p - ytr)
  acc = np.mean(((xte @ w + b) > 0) == (yte > 0.5))
  assert 0.42 < acc < 0.58, acc

  # The video holds the visual facts: decoding each category by cosine with the projected concepts is accurate,
  # and the decoded facts decide the visual statements.
  concept = synthetic_violin._concept_embeddings()
  correct = total = 0
  for cid, a in ann.items():
    v = feats[cid] / np.linalg.norm(feats[cid], axis=1, keepdims=True)
    decoded = {}
    for c, ws in synthetic_violin.VISUAL.items():
      m = np.stack([concept[x] / np.linalg.norm(concept[x]) for x in ws])
      decoded[c] = ws[int(np.argmax((v @ m.T).max(axis=0)))]
    for (pos, neg), (typ, _) in zip(a["statement"], types[cid]):
      if typ != "visual":
        continue
      score = lambda s: sum(decoded[cat_of[w]] == w for w in _words(s) if w in visual)
      correct += score(pos) > score(neg)
      total += 1
  assert correct / total > 0.9, correct / total


def test_violin_stats_hand_computed(tmp_path, capsys):
  """data_prep.violin_stats: the section 3.2 / 5 totals, the length histograms (Figs. 6-7) and the common words
  (Table 7) of a two-clip annotation, counted by hand, with the paper's figures beside them."""
  from data_prep import violin_stats
  ann = {"c0": {"file": "f0", "split": "train", "sub": [["hi", 0, 1]],
                "statement": [["A man sits.", "A man runs fast"], ["The man talks", "Nobody talks"]]},
         "c1": {"file": "f1", "split": "test", "sub": [], "statement": [["A woman talks", "A dog barks loudly now"]]}}
  path = tmp_path / "violin_annotation.json"
  path.write_text(json.dumps(ann))
  s = violin_stats.statistics(str(path), top=3)
  assert (s["clips"], s["statements"], s["statements_per_clip"]) == (2, 6, 3)
  assert s["split_statements"] == {"train": 4, "validate": 0, "test": 2}
  # positive 3, 3, 3 words; negative 4, 2, 5 words
  assert s["length_histogram"] == {"positive": {3: 3}, "negative": {2: 1, 4: 1, 5: 1}}
  assert (s["mean_words_positive"], s["mean_words_negative"], s["mean_words"]) == (3.0, 3.67, 3.33)
  assert s["top_positive_words"] == [("a", 2), ("man", 2), ("talks", 2)]
  assert violin_stats.main([str(path), "--top", "1"]) == 0
  out = capsys.readouterr().out
  assert "| clips | 2 | 15,887 |" in out and "| test statements | 2 | 9,600 |" in out
  assert "| statements ((V, S, H) triplets) | 6 | 95,322 |" in out and "| 18 (\"almost the same\") |" in out


def test_violin_stats_table1_per_source_and_fig8_clip_lengths(tmp_path, capsys):
  """Table 1 grouped by the entries' "source" and Fig. 8 from the features' frame counts at 3 fps, by hand: Friends
  clips of 45 and 60 frames (15 s, 20 s), a MovieClips clip of 120 frames (40 s, left out of Fig. 8's TV shows)."""
  import h5py
  from data_prep import violin_stats
  pair = lambda p, n: [p, n]  # noqa: E731
  ann = {"f0": {"file": "F0", "source": "Friends", "split": "train", "sub": [["a b c", 0, 1], ["d", 1, 2]],
                "statement": [pair("one two three", "one two")]},
         "f1": {"file": "F1", "source": "Friends", "split": "test", "sub": [],
                "statement": [pair("one", "one two three four five")]},
         "m0": {"file": "M0", "source": "MovieClips", "split": "validate", "sub": [["x y", 0, 1]],
                "statement": [pair("w w w w", "w w")]}}
  path = tmp_path / "violin_annotation.json"
  path.write_text(json.dumps(ann))
  h5 = tmp_path / "all_res101_pool5_feat.h5"
  with h5py.File(h5, "w") as f:
    for file, frames in (("F0", 45), ("F1", 60), ("M0", 120)):
      f.create_group(file).create_dataset("resnet_features", data=np.zeros((frames, 2048), np.float32))
  s = violin_stats.statistics(str(path), features=str(h5))
  assert s["table1"]["Friends"] == {"clips": 2, "mean_words_positive": 2.0, "mean_words_negative": 3.5,
                                    "mean_subtitle_words": 2.0, "mean_clip_seconds": 17.5}
  assert s["table1"]["MovieClips"] == {"clips": 1, "mean_words_positive": 4.0, "mean_words_negative": 2.0,
                                       "mean_subtitle_words": 2.0, "mean_clip_seconds": 40.0}
  assert s["table1"]["All"]["clips"] == 3 and s["table1"]["All"]["mean_clip_seconds"] == 25.0
  assert s["clip_lengths"] == {"tv_only": True, "histogram": {15: 1, 20: 1}}
  assert violin_stats.main([str(path), "--features", str(h5)]) == 0
  out = capsys.readouterr().out
  assert "| Friends | 2 | 17.5 | 2 | 3.5 | 2 |" in out and "| All | 6,716 | 15,887 | 35.20 | 18.10 | 18.04 | 76.40 |" in out
  assert "| 15-16 | 1 |" in out and "| 40-41 |" not in out
  assert violin_stats.statistics(str(path), features=str(h5), fps=1.5)["table1"]["All"]["mean_clip_seconds"] == 50.0
  with pytest.raises(violin_stats.violin.ConversionError, match="'M0/resnet_features'"):
    with h5py.File(h5, "a") as f:
      del f["M0/resnet_features"]
    violin_stats.statistics(str(path), features=str(h5))
