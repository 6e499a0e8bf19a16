"""ST-Evidence converter on hand-made fixtures in the official formats, its errors, and the synthetic E-VQA world."""

import csv
import hashlib
import json
import os

import numpy as np
import pytest
from PIL import Image

from evqa_jax import cli
from data_prep import st_evidence, synthetic_evqa
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource

H, W = 8, 10
N = 5  # frames of video v1


def _png(path, arr):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(arr).save(path)


def _frame(f):
  img = np.zeros((H, W, 3), np.uint8)
  img[..., 0] = 10 * f
  img[..., 1] = np.arange(W)[None, :] * 7
  img[..., 2] = np.arange(H)[:, None] * 11
  return img


def _rows():
  return [
      {"entry_id": "e1", "video_id": "v1", "video_path": "v1.mp4", "question": " What is red? ",
       "candidates": "['a ball', 'a cup', 'a hat', 'a dog', 'a cat']", "answer": "a hat",
       "segment": "[[0.0, 0.3], [0.5, 0.7]]"},
      {"entry_id": "e2", "video_id": "v1", "video_path": "v1.mp4", "question": "Which one?",
       "candidates": "['x', 'y', 'z', 'w', 'v']", "answer": "v", "segment": "[[0.25, 0.5]]"},
  ]


def _write_csv(path, rows, columns=st_evidence.CSV_COLUMNS):
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)


def _fixture(tmp_path, rows=None):
  """v1: 5 frames; e1: PNG masks on frames 1 and 3 + MCQ; e2: Instruct JSON with two objects (one with a hole)."""
  raw = tmp_path / "raw"
  for f in range(N):
    _png(str(raw / "frames" / "v1" / f"{f:05d}.png"), _frame(f))
  m1 = np.zeros((H, W), np.uint8)
  m1[1:3, 2:5] = 255
  _png(str(raw / "gt_masks" / "e1" / "00001.png"), m1)
  m3 = np.zeros((H, W, 3), np.uint8)
  m3[5, 7, 2] = 9  # any non-zero channel counts
  _png(str(raw / "gt_masks" / "e1" / "00003.png"), m3)
  inst = {"fps": 6.0, "width": W, "height": H, "evidence_objects": [
      {"ref_expression": "square", "masks": [
          {"frame": 3, "mask": {"exterior": [[1, 1], [5, 1], [5, 5], [1, 5]], "holes": [[[2, 2], [4, 2], [4, 4], [2, 4]]]}},
          {"frame": 4, "mask": {"exterior": [[0, 0], [1, 0], [1, 1], [0, 1]], "holes": []}}]},
      {"ref_expression": "bar", "masks": [
          {"frame": 3, "mask": {"exterior": [[3, 3], [8, 3], [8, 3], [3, 3]], "holes": []}},
          {"frame": 0, "mask": {"size": [H, W], "counts": [1, 2, H * W - 3]}}]}]}
  os.makedirs(raw / "instruct")
  (raw / "instruct" / "e2.json").write_text(json.dumps(inst))
  mcq = {"e1": {"qa": {"options": ["a ball", "a cup", "a hat", "a dog", "a cat"], "answer": 2},
                "temporal": {"options": [[[0.0, 0.3]], [[0.0, 0.3], [0.5, 0.7]], [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]],
                                         [[0.6, 0.8]]], "answer": 1},
                "spatial": {"frame": 1, "options_dir": "mcq_masks/e1/", "answer": 3}},
         "ghost": {}}
  for k in range(4):
    m = np.zeros((H, W), np.uint8)
    m[k, :k + 1] = 255
    _png(str(raw / "mcq_masks" / "e1" / f"{k}.png"), m)
  (raw / "mcq.json").write_text(json.dumps(mcq))
  _write_csv(raw / "test.csv", rows or _rows())
  return raw


def _convert(raw, out, **kw):
  args = dict(split="test", masks_dir=str(raw / "gt_masks"), instruct_dir=str(raw / "instruct"),
              mcq_path=str(raw / "mcq.json"), num_frames=4, frame_size=(H, W), verbose=False)
  args.update(kw)
  return st_evidence.convert(str(raw / "test.csv"), str(raw / "frames"), str(out), **args)


def _read(out, split):
  src = TFRecordDataSource.from_split(str(out), split)
  return [src[i] for i in range(len(src))]


def test_rasterize_square_and_hole():
  sq = st_evidence.rasterize_polygon([[2, 2], [6, 2], [6, 6], [2, 6]], [], 10, 10)
  expected = np.zeros((10, 10), np.uint8)
  expected[2:7, 2:7] = 1  # PIL fills the boundary: pixels 2..6 inclusive
  np.testing.assert_array_equal(sq, expected)
  ring = st_evidence.rasterize_polygon([[2, 2], [6, 2], [6, 6], [2, 6]], [[[3, 3], [5, 3], [5, 5], [3, 5]]], 10, 10)
  expected[3:6, 3:6] = 0
  np.testing.assert_array_equal(ring, expected)
  assert ring.sum() == 16
  with pytest.raises(st_evidence.ConversionError, match="outside the 10x10 frame"):
    st_evidence.rasterize_polygon([[2, 2], [11, 2], [6, 6]], [], 10, 10)


def test_rle_decoding():
  # Column-major runs 3 zeros, 5 ones, 2 zeros, 2 ones on 3x4; "352M" is the COCO string of the same counts
  # (the last count stored as the delta 2 - 5 = -3 -> 29 + 48 = 'M').
  expected = np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 1]], np.uint8)
  np.testing.assert_array_equal(st_evidence.decode_rle({"size": [3, 4], "counts": [3, 5, 2, 2]}, 3, 4, "x"), expected)
  np.testing.assert_array_equal(st_evidence.decode_rle({"size": [3, 4], "counts": "352M"}, 3, 4, "x"), expected)
  with pytest.raises(st_evidence.ConversionError, match="sum to 11"):
    st_evidence.decode_rle({"size": [3, 4], "counts": [3, 5, 2, 1]}, 3, 4, "x")


def test_segment_and_candidate_parsing():
  np.testing.assert_array_equal(st_evidence.parse_segments("[[0.5, 1.25], [2, 3]]", "w"),
                                np.array([[0.5, 1.25], [2.0, 3.0]], np.float32))
  np.testing.assert_array_equal(st_evidence.parse_segments(" [[0, 0]] ", "w"), np.zeros((1, 2), np.float32))
  for bad in ("[[1, 0.5]]", "[0.5, 1]", "[[a, b]]", "", "[[1, 2, 3]]", "[]", "[[-1, 2]]", "[[0, nan]]", "[[True, 2]]"):
    with pytest.raises(st_evidence.ConversionError, match="field 'segment'") as e:
      st_evidence.parse_segments(bad, "file.csv: row 3")
    assert e.value.reason == "bad_segment" and "file.csv: row 3" in str(e.value)
  assert st_evidence.parse_candidates("['a ', \"b\"]", "w") == ["a", "b"]
  for bad in ("['a', 'b'", "[1, 2]", "not a list", "['a']", "['a', 'a']", "['a', '']"):
    with pytest.raises(st_evidence.ConversionError, match="field 'candidates'"):
      st_evidence.parse_candidates(bad, "w")


def test_convert_values(tmp_path):
  raw = _fixture(tmp_path)
  out = tmp_path / "out"
  counts = _convert(raw, out)
  assert counts == {"converted": 2, "skipped": {}, "entries_without_mcq": 1, "mcq_entries_not_in_csv": 1}
  e1, e2 = _read(out, "test")

  assert e1["entry_id"] == "e1" and e1["video_id"] == "v1" and e1["question"] == "What is red?"
  assert list(e1["candidates"]) == ["a ball", "a cup", "a hat", "a dog", "a cat"] and e1["answer_index"] == 2
  np.testing.assert_array_equal(e1["segments"], np.array([[0.0, 0.3], [0.5, 0.7]], np.float32))
  # 5 frames sampled to 4: round(linspace(0, 4, 4)) = [0, 1, 3, 4].
  np.testing.assert_array_equal(e1["frame_indices"], [0, 1, 3, 4])
  np.testing.assert_allclose(e1["frame_times"], np.array([0, 1, 3, 4]) / 6, rtol=1e-6)
  assert e1["frame_mask"].all() and e1["fps"] == 6.0 and e1["num_video_frames"] == 5
  np.testing.assert_array_equal(e1["orig_size"], [H, W])
  for k, f in enumerate([0, 1, 3, 4]):
    np.testing.assert_array_equal(e1["frames"][k], _frame(f))
  assert e1["masks"].dtype == np.uint8 and e1["has_masks"]
  m = np.zeros((4, H, W), np.uint8)
  m[1, 1:3, 2:5] = 1
  m[2, 5, 7] = 1
  np.testing.assert_array_equal(e1["masks"], m)

  assert e1["has_mcq"] and e1["mcq_temporal_answer"] == 1 and e1["mcq_spatial_answer"] == 3 and e1["mcq_frame"] == 1
  np.testing.assert_array_equal(e1["mcq_segments_len"], [1, 2, 3, 1])
  assert e1["mcq_segments"].shape == (4, 3, 2)
  np.testing.assert_allclose(e1["mcq_segments"][2], [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], rtol=1e-6)
  np.testing.assert_array_equal(e1["mcq_segments"][0], np.array([[0.0, 0.3], [0, 0], [0, 0]], np.float32))
  for k in range(4):
    expected = np.zeros((H, W), np.uint8)
    expected[k, :k + 1] = 1
    np.testing.assert_array_equal(e1["mcq_masks"][k], expected)

  # e2: Instruct JSON; objects merged, hole cut out, a degenerate (zero-area) polygon still marks its line,
  # RLE on frame 0; frame 4 (square at the corner) is sampled.
  sq = np.zeros((H, W), np.uint8)
  sq[1:6, 1:6] = 1
  sq[2:5, 2:5] = 0
  sq[3, 3:9] = 1
  np.testing.assert_array_equal(e2["masks"][2], sq)
  f0 = np.zeros((H, W), np.uint8)
  f0[1:3, 0] = 1
  np.testing.assert_array_equal(e2["masks"][0], f0)
  corner = np.zeros((H, W), np.uint8)
  corner[0:2, 0:2] = 1
  np.testing.assert_array_equal(e2["masks"][3], corner)
  assert e2["masks"][1].sum() == 0
  assert not e2["has_mcq"] and e2["mcq_frame"] == -1 and e2["mcq_masks"].sum() == 0
  # Predicted masks are written under the GT names: e1's "00001.png" are 5 digits; e2 (Instruct JSON) the release's 5.
  assert e1["mask_name_digits"] == 5 and e2["mask_name_digits"] == 5

  # Ground truth in the evaluators' layout.
  with open(out / "test.csv") as f:
    got = list(csv.DictReader(f))
  assert got == _rows()
  assert sorted(os.listdir(out / "gt_masks" / "e1")) == ["00001.png", "00003.png"]
  assert (out / "gt_masks" / "e1" / "00001.png").read_bytes() == (raw / "gt_masks" / "e1" / "00001.png").read_bytes()
  assert not (out / "gt_masks" / "e2").exists()
  gt = json.loads((out / "test_mcq.json").read_text())
  assert list(gt) == ["e1"] and gt["e1"]["spatial"]["options_dir"] == "mcq_masks/e1/"
  assert sorted(os.listdir(out / "mcq_masks" / "e1")) == ["0.png", "1.png", "2.png", "3.png"]
  meta = records.load_metadata(str(out))
  assert meta["task"] == "evqa" and meta["num_frames"] == 4 and meta["frame_size"] == [H, W]
  assert meta["conversion"]["test"]["converted"] == 2 and meta["ground_truth"]["test"]["mcq"] == "test_mcq.json"
  assert meta["features"]["mcq_segments"] == {"dtype": "float32", "shape": [4, None, 2]}


def test_padding_and_resizing(tmp_path):
  raw = _fixture(tmp_path)
  out = tmp_path / "out"
  _convert(raw, out, num_frames=8, frame_size=(4, 5), mcq_path=None)
  e1 = _read(out, "test")[0]
  np.testing.assert_array_equal(e1["frame_mask"], [1] * 5 + [0] * 3)
  np.testing.assert_array_equal(e1["frame_indices"], [0, 1, 2, 3, 4, -1, -1, -1])
  assert e1["frames"].shape == (8, 4, 5, 3) and e1["frames"][5:].sum() == 0 and e1["masks"][5:].sum() == 0
  # Nearest-neighbour mask resize of the 2x3 box at rows 1-2, cols 2-4 of an 8x10 mask onto 4x5.
  expected = np.asarray(Image.fromarray(np.pad(np.ones((2, 3), np.uint8) * 255, ((1, 5), (2, 5)))).resize((5, 4), Image.NEAREST)) > 127
  np.testing.assert_array_equal(e1["masks"][1], expected)
  assert not e1["has_mcq"]


def _corrupt(kind, raw):
  """Applies one bad-input case to the fixture; returns (reason, message fragments)."""
  rows = _rows()
  if kind == "missing_column":
    _write_csv(raw / "test.csv", rows, [c for c in st_evidence.CSV_COLUMNS if c != "segment"])
    return "missing_column", ["'segment'"]
  if kind == "empty_field":
    rows[1]["question"] = " "
    _write_csv(raw / "test.csv", rows)
    return "missing_field", ["row 3", "'question'"]
  if kind == "bad_candidates":
    rows[1]["candidates"] = "['x', 'y'"
    _write_csv(raw / "test.csv", rows)
    return "bad_candidates", ["'e2'", "'candidates'"]
  if kind == "answer_not_in_candidates":
    rows[1]["answer"] = "q"
    _write_csv(raw / "test.csv", rows)
    return "answer_not_in_candidates", ["'e2'", "'answer'"]
  if kind == "bad_segment":
    rows[1]["segment"] = "[[0.5, 0.25]]"
    _write_csv(raw / "test.csv", rows)
    return "bad_segment", ["'e2'", "'segment'"]
  if kind == "unknown_video":
    rows[1]["video_id"] = "nope"
    _write_csv(raw / "test.csv", rows)
    return "missing_frames", ["'e2'", "'video_id'", "nope"]
  if kind == "unreadable_frame":
    for f in (0, 2, 3, 4):
      _png(str(raw / "frames" / "v2" / f"{f:05d}.png"), _frame(f))
    (raw / "frames" / "v2" / "00001.png").write_bytes(b"not a png")
    rows[1]["video_id"] = "v2"
    _write_csv(raw / "test.csv", rows)
    return "unreadable_image", ["'e2'", "00001.png"]
  if kind == "unreadable_mask":
    (raw / "gt_masks" / "e1" / "00002.png").write_bytes(b"\x89PNG garbage")
    return "unreadable_image", ["'e1'", "00002.png"]
  if kind == "mask_names":  # two zero-paddings in one folder: predicted masks could not take the GT names
    os.rename(raw / "gt_masks" / "e1" / "00003.png", raw / "gt_masks" / "e1" / "3.png")
    return "bad_mask", ["'e1'", "00001.png and 3.png", "zero-padded differently"]
  if kind == "polygon_outside":
    obj = json.loads((raw / "instruct" / "e2.json").read_text())
    obj["evidence_objects"][0]["masks"][0]["mask"]["exterior"][1] = [12, 1]
    (raw / "instruct" / "e2.json").write_text(json.dumps(obj))
    return "polygon_outside_frame", ["e2.json", "'e2'", "evidence_objects[0].masks[0]", "(12.0, 1.0)"]
  if kind == "instruct_missing_key":
    obj = json.loads((raw / "instruct" / "e2.json").read_text())
    del obj["height"]
    (raw / "instruct" / "e2.json").write_text(json.dumps(obj))
    return "missing_field", ["e2.json", "'height'"]
  if kind == "missing_masks":
    os.remove(raw / "instruct" / "e2.json")
    return "missing_masks", ["'e2'", "no evidence masks"]
  if kind == "mcq_options":
    mcq = json.loads((raw / "mcq.json").read_text())
    mcq["e1"]["qa"]["options"][0] = "a bat"
    (raw / "mcq.json").write_text(json.dumps(mcq))
    return "bad_mcq", ["mcq.json", "'e1'", "'qa.options'"]
  if kind == "mcq_mask_count":
    os.remove(raw / "mcq_masks" / "e1" / "3.png")
    return "bad_mcq", ["'e1'", "3 numbered mask PNGs"]
  raise ValueError(kind)


BAD = ["missing_column", "empty_field", "bad_candidates", "answer_not_in_candidates", "bad_segment", "unknown_video",
       "unreadable_frame", "unreadable_mask", "mask_names", "polygon_outside", "instruct_missing_key", "missing_masks",
       "mcq_options", "mcq_mask_count"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_input(tmp_path, kind):
  raw = _fixture(tmp_path)
  reason, fragments = _corrupt(kind, raw)
  out = tmp_path / "out"
  with pytest.raises(st_evidence.ConversionError) as e:
    _convert(raw, out)
  assert e.value.reason == reason
  for frag in fragments:
    assert frag in str(e.value), str(e.value)
  assert not (out / "test.csv").exists()  # nothing half-written
  if kind == "missing_column":
    return  # a file-level error: nothing to skip
  counts = _convert(raw, out, skip_bad=True)
  assert counts["converted"] == 1 and counts["skipped"] == {reason: 1}
  kept = _read(out, "test")
  assert len(kept) == 1
  with open(out / "test.csv") as f:
    assert [r["entry_id"] for r in csv.DictReader(f)] == [kept[0]["entry_id"]]
  assert records.load_metadata(str(out))["conversion"]["test"]["skipped"] == {reason: 1}


def test_allow_missing_masks_and_cli(tmp_path, capsys):
  raw = _fixture(tmp_path)
  os.remove(raw / "instruct" / "e2.json")
  out = tmp_path / "out"
  argv = ["--csv", str(raw / "test.csv"), "--frames", str(raw / "frames"), "--masks", str(raw / "gt_masks"),
          "--instruct-json", str(raw / "instruct"), "--num-frames", "4", "--frame-size", str(H), str(W),
          "--out", str(out)]
  assert cli.run(st_evidence.main, argv) == 2
  assert "'e2'" in capsys.readouterr().err
  assert st_evidence.main(argv + ["--skip-bad"]) == 0
  assert "test: converted 1 entries, skipped 1 (missing_masks=1)" in capsys.readouterr().out
  assert st_evidence.main(argv + ["--allow-missing-masks"]) == 0
  e2 = _read(out, "test")[1]
  assert not e2["has_masks"] and e2["masks"].sum() == 0


# ------------------------------------------------------------------------------------------ synthetic world

def _digest(d):
  out = {}
  for root, _, files in os.walk(d):
    for f in files:
      p = os.path.join(root, f)
      out[os.path.relpath(p, d)] = hashlib.md5(open(p, "rb").read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  d = tmp_path_factory.mktemp("evqa_world")
  synthetic_evqa.generate(str(d / "a"), seed=1, small=True, verbose=False)
  return d


def test_world_deterministic(world):
  synthetic_evqa.generate(str(world / "b"), seed=1, small=True, verbose=False)
  da, db = _digest(str(world / "a" / "raw")), _digest(str(world / "b" / "raw"))
  assert da == db and len(da) > 100
  for split in ("train", "test"):
    for x, y in zip(_read(world / "a" / "records", split), _read(world / "b" / "records", split)):
      for k in x:
        np.testing.assert_array_equal(x[k], y[k])


def test_world_sanity(world):
  rec = world / "a" / "records"
  kinds = json.loads((rec / synthetic_evqa.TYPES_FILE).read_text())
  for split in ("train", "test"):
    entries = _read(rec, split)
    assert len(entries) == synthetic_evqa.SIZES["small"][split]
    with open(world / "a" / "raw" / f"{split}.csv") as f:
      rows = {r["entry_id"]: r for r in csv.DictReader(f)}
    for e in entries:
      cands = list(e["candidates"])
      assert len(cands) == 5 and len(set(cands)) == 5
      assert cands[e["answer_index"]] == rows[e["entry_id"]]["answer"]
      (s, t), = e["segments"]
      valid = e["frame_mask"]
      inside = (e["frame_times"] >= s - 1e-3) & (e["frame_times"] < t - 1e-3) & valid
      area = e["masks"].reshape(len(valid), -1).sum(1)
      assert inside.any() and (area[inside] > 0).all() and (area[~inside] == 0).all(), e["entry_id"]
      if kinds[e["entry_id"]] in ("colour_of_shape", "colour_by_motion"):
        # The answer is visible: the pixels under the evidence mask have the answer's colour.
        pix = e["frames"][e["masks"].astype(bool)].astype(float).mean(0)
        np.testing.assert_allclose(pix, synthetic_evqa.COLOURS[cands[e["answer_index"]]], atol=6)
      if split == "test":
        assert e["has_mcq"]
        gt_opt = e["mcq_segments"][e["mcq_temporal_answer"], :e["mcq_segments_len"][e["mcq_temporal_answer"]]]
        np.testing.assert_allclose(gt_opt, e["segments"], atol=1e-4)
        for k in range(4):
          if k != e["mcq_temporal_answer"]:
            (a, b), = e["mcq_segments"][k, :1]
            inter = max(0.0, min(b, t) - max(a, s))
            assert inter / (b - a + t - s - inter) < 0.3
        ref = list(e["frame_indices"]).index(e["mcq_frame"])
        np.testing.assert_array_equal(e["mcq_masks"][e["mcq_spatial_answer"]], e["masks"][ref])
        gt = e["masks"][ref].astype(bool)
        for k in range(4):
          if k != e["mcq_spatial_answer"]:
            m = e["mcq_masks"][k].astype(bool)
            assert m.sum() >= 10 and (m & gt).sum() / (m | gt).sum() < 0.3
      else:
        assert not e["has_mcq"]
  meta = records.load_metadata(str(rec))
  assert set(meta["splits"]) == {"train", "test"} and meta["num_frames"] == 30
  assert len(os.listdir(rec / "gt_masks")) == synthetic_evqa.SIZES["small"]["test"]
