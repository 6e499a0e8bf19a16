"""Command-line evaluators on small files written in tmp_path; the JSON numbers are checked by hand."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from evqa_jax.evaluate import ovqa as ovqa_cli
from evqa_jax.evaluate import st_evidence as st_cli
from evqa_jax.evaluate import st_evidence_mcq as mcq_cli
from evqa_jax.evaluate import violin as violin_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
  with open(path) as f:
    return json.load(f)


# ---------------------------------------------------------------------------------------------------------------------
# OVQA.


@pytest.fixture
def ovqa_files(tmp_path):
  # "none" and "null" are real answers: they must not turn into NaN when read.
  train = ["yes"] * 150 + ["none"] * 20 + ["dog"] * 3
  test = ["yes", "yes", "yes", "none", "dog", "null"]
  pd.DataFrame({"question": ["q"] * len(train), "answer": train, "video_id": range(len(train))}).to_csv(
      tmp_path / "train.csv", index=False)
  pd.DataFrame({"question": ["q"] * len(test), "answer": test, "video_id": range(len(test)),
                "type": [0] * len(test)}).to_csv(tmp_path / "test.csv", index=False)
  return tmp_path


def test_ovqa_cli_single_prediction(ovqa_files, capsys):
  t = ovqa_files
  # Index 4 ("dog") has no prediction -> wrong. Rows in any order.
  pd.DataFrame({"index": [5, 0, 1, 2, 3], "prediction": ["null", "yes", "yes", "no", "none"]}).to_csv(
      t / "pred.csv", index=False)
  out = ovqa_cli.main(["--train-csv", str(t / "train.csv"), "--test-csv", str(t / "test.csv"),
                       "--pred", str(t / "pred.csv"), "--out", str(t / "m.json")])
  m = _read(t / "m.json")
  assert m == out
  assert m["base"] == pytest.approx(200 / 3)
  assert m["common"] == 100.0 and m["rare"] == 0.0 and m["unseen"] == 100.0
  assert m["total"] == pytest.approx(400 / 6)
  assert m["mAcc"] == pytest.approx(100 * (2 / 3 + 1 + 0 + 1) / 4)
  assert m["non_base"] == pytest.approx(200 / 3)
  assert m["BNG"] == pytest.approx(0.0)
  assert [m[f"num_samples_{c}"] for c in ("base", "common", "rare", "unseen")] == [3, 1, 1, 1]
  assert m["table1"]["num_answers"] == {"base": 1, "common": 1, "rare": 1, "unseen": 1, "total": 4}
  assert m["official"] == {"base": 0.6667, "common": 1.0, "rare": 0.0, "unseen": 1.0, "total": 0.6667,
                           "macc": 0.6667}
  printed = capsys.readouterr().out
  assert "mAcc" in printed and "66.67" in printed


def test_ovqa_cli_several_models_and_plot(ovqa_files):
  t = ovqa_files
  pd.DataFrame({"index": range(6), "prediction": ["yes"] * 6}).to_csv(t / "a.csv", index=False)
  pd.DataFrame({"index": range(6), "prediction": ["yes", "yes", "yes", "none", "dog", "null"]}).to_csv(
      t / "b.csv", index=False)
  ovqa_cli.main(["--train-csv", str(t / "train.csv"), "--test-csv", str(t / "test.csv"),
                 "--pred", str(t / "a.csv"), "--label", "majority", "--pred", str(t / "b.csv"), "--label", "oracle",
                 "--out", str(t / "m.json"), "--plot", str(t / "tail.png")])
  m = _read(t / "m.json")
  assert m["models"]["majority"]["total"] == 50.0 and m["models"]["majority"]["mAcc"] == 25.0
  assert m["models"]["majority"]["BNG"] == 100.0
  assert m["models"]["oracle"]["total"] == 100.0 and m["models"]["oracle"]["BNG"] == 0.0
  with Image.open(t / "tail.png") as im:
    assert im.format == "PNG" and im.size[0] > 300
  assert not [n for n in os.listdir(t) if n.endswith(".tmp")]


def test_ovqa_binned_accuracy():
  x, y, n = ovqa_cli.binned_accuracy(np.array([0, 0, 1, 3, 2, 150]), np.array([0, 50, 100, 0, 50, 80]))
  # Bins {0}, [1, 2), [2, 4), [128, 256).
  np.testing.assert_allclose(y, [25, 100, 25, 80])
  np.testing.assert_array_equal(n, [2, 1, 2, 1])
  np.testing.assert_allclose(x, [0, 1, np.sqrt(6), 150])


def test_ovqa_cli_authors_vocab_and_categories(ovqa_files):
  t = ovqa_files
  pd.DataFrame({"index": [5, 0, 1, 2, 3], "prediction": ["null", "yes", "yes", "no", "none"]}).to_csv(
      t / "pred.csv", index=False)
  # The authors' meta_data files: ans2cat makes "none" rare (20 train samples would make it common) and leaves
  # "common" without any test sample; test_vocab is {answer: id}.
  (t / "ans2cat.json").write_text(json.dumps({"yes": "base", "none": "rare", "dog": "rare", "null": "unseen",
                                              "cat": "common"}))
  (t / "test_vocab.json").write_text(json.dumps({"yes": 0, "none": 1, "dog": 2, "null": 3}))
  args = ["--test-csv", str(t / "test.csv"), "--ans2cat", str(t / "ans2cat.json"), "--pred", str(t / "pred.csv")]
  m = ovqa_cli.main(args + ["--test-vocab", str(t / "test_vocab.json"), "--out", str(t / "m.json")])
  # yes: 2 of 3; none right, dog missing -> rare 1 of 2; null right.
  assert m["base"] == pytest.approx(200 / 3) and m["rare"] == 50.0 and m["unseen"] == 100.0
  assert m["common"] == 0.0 and m["num_samples_common"] == 0  # the official logger's 0, not null
  assert m["official"] == {"base": 0.6667, "common": 0.0, "rare": 0.5, "unseen": 1.0, "total": 0.6667,
                           "macc": 0.6667}
  assert "table1" not in m  # no train CSV
  # train_vocab.json + ans2cat.json give the Table 1 answer counts over V_train u V_test.
  (t / "train_vocab.json").write_text(json.dumps({"yes": 0, "none": 1, "cat": 2}))
  v = ovqa_cli.main(args + ["--train-vocab", str(t / "train_vocab.json"), "--out", str(t / "v.json")])
  assert v["table1"]["num_answers"] == {"base": 1, "common": 1, "rare": 2, "unseen": 1, "total": 5}
  assert v["table1"]["num_train_vocab"] == {"base": 1, "common": 1, "rare": 1, "unseen": 0, "total": 3}
  assert v["table1"]["num_test_answers"] == {"base": 1, "common": 0, "rare": 2, "unseen": 1, "total": 4}
  # A vocabulary answer without test sample: the official macc is NaN (0/0 in its mean) -> null; ours unchanged.
  (t / "test_vocab.json").write_text(json.dumps({"yes": 0, "none": 1, "dog": 2, "null": 3, "cat": 4}))
  m2 = ovqa_cli.main(args + ["--test-vocab", str(t / "test_vocab.json"), "--out", str(t / "m2.json")])
  assert m2["official"]["macc"] is None and m2["mAcc"] == m["mAcc"]
  (t / "ans2cat.json").write_text(json.dumps({"yes": "base", "none": "rare", "dog": "often", "null": "unseen"}))
  with pytest.raises(ValueError, match=r"ans2cat.json entry 'dog': category must be one of"):
    ovqa_cli.main(args + ["--out", str(t / "m3.json")])
  (t / "ans2cat.json").write_text(json.dumps({"yes": "base"}))
  with pytest.raises(ValueError, match=r"ans2cat.json: 3 answers of test CSV .* are missing from it"):
    ovqa_cli.main(args + ["--out", str(t / "m3.json")])


def test_ovqa_cli_errors(ovqa_files):
  t = ovqa_files
  args = ["--train-csv", str(t / "train.csv"), "--test-csv", str(t / "test.csv"), "--out", str(t / "m.json")]
  pd.DataFrame({"index": [0, 6], "prediction": ["yes", "yes"]}).to_csv(t / "bad.csv", index=False)
  with pytest.raises(ValueError, match=r"bad.csv line 3: index 6 is not a row"):
    ovqa_cli.main(args + ["--pred", str(t / "bad.csv")])
  pd.DataFrame({"idx": [0], "prediction": ["yes"]}).to_csv(t / "nocol.csv", index=False)
  with pytest.raises(ValueError, match=r"nocol.csv: missing column\(s\) \['index'\]"):
    ovqa_cli.main(args + ["--pred", str(t / "nocol.csv")])
  pd.DataFrame({"index": [1, 1], "prediction": ["yes", "no"]}).to_csv(t / "dup.csv", index=False)
  with pytest.raises(ValueError, match="predicted twice"):
    ovqa_cli.main(args + ["--pred", str(t / "dup.csv")])
  assert not (t / "m.json").exists()


# ---------------------------------------------------------------------------------------------------------------------
# ST-Evidence-Gen.


def _square(y0, y1, x0, x1, shape=(10, 10)):
  m = np.zeros(shape, dtype=bool)
  m[y0:y1, x0:x1] = True
  return m


def _png(path, mask, value=255, mode="L"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  arr = mask.astype(np.uint8) * value
  if mode == "P":
    im = Image.fromarray(arr, mode="L").convert("P")
  else:
    im = Image.fromarray(arr)
  im.save(path)


@pytest.fixture
def st_files(tmp_path):
  rows = [
      # e1: right answer; duplicated predicted segment -> IoU 2, IoP 1.
      ("e1", "['cat', 'dog', 'bird']", "dog", "[[0, 10]]"),
      # e2: answer after strip matches; IoU 1/3, IoP 1/2.
      ("e2", "[' red ', 'blue']", "red", "[[0.0, 10.0]]"),
      # e3: letter past the candidates, compared as the text "E" -> wrong; empty segments -> 0, 0 (empty_segments).
      ("e3", "['x', 'y', 'z']", "x", "[[0, 10]]"),
      # e4: missing from the predictions.
      ("e4", "['x', 'y']", "y", "[[1, 2]]"),
      # e5: wrong answer; IoU exactly 0.3, IoP 1.
      ("e5", "['cat', 'dog', 'bird']", "dog", "[[0, 10]]"),
      # e6: the answer given as its text is right; flat segments [0, 2, 3, 5]: inter 3, union 5 -> IoU 0.6, IoP 0.75.
      ("e6", "['up', 'down']", "down", "[[0, 4]]"),
      # e7: dict / string / extra-element / reversed segments plus two unreadable ones (malformed_segments):
      #     [2, 4] + [6, 8] + [9, 12] + reversed [5, 3]: inter 2 + 2 + 1 = 5, pred length 7, union 12.
      ("e7", "['a', 'b']", "a", "[[0, 10]]"),
      # e8: parsed_response null (none_responses). e9: segments a string (parse_errors), answer right.
      ("e8", "['a', 'b']", "b", "[[0, 10]]"),
      ("e9", "['a', 'b']", "b", "[[0, 10]]"),
  ]
  pd.DataFrame([{"entry_id": e, "video_id": f"v{e}", "video_path": f"videos/{e}.mp4", "question": "what?",
                 "candidates": c, "answer": a, "segment": s} for e, c, a, s in rows]).to_csv(tmp_path / "gt.csv",
                                                                                           index=False)
  gt, pm = tmp_path / "gt_masks", tmp_path / "pred_masks"
  preds = {
      "e1": {"video_id": "ve1", "parsed_response": {"answer": "B", "segments": [[0, 10], [0, 10]]}},
      "e2": {"video_id": "ve2", "parsed_response": {"answer": " A", "segments": [[5, 15]]}},
      "e3": {"video_id": "ve3", "parsed_response": {"answer": "E", "segments": []}},
      "e5": {"video_id": "ve5", "parsed_response": {"answer": "C", "segments": [[0, 3]]}},
      "e6": {"video_id": "ve6", "parsed_response": {"answer": "down", "segments": [0, 2, 3, 5]},
             "mask_folder": str(tmp_path / "elsewhere" / "e6")},
      "e7": {"video_id": "ve7", "parsed_response": {"answer": "A", "segments": [
          {"start": "2", "end": 4}, {"start_time": 6, "end_time": "8"}, [9, 12, "extra"], [5, 3], {"begin": 1},
          "oops"]}},
      "e8": {"video_id": "ve8", "parsed_response": None},
      "e9": {"video_id": "ve9", "parsed_response": {"answer": "B", "segments": "[[0, 10]]"}},
      "zz": {"video_id": "vzz", "parsed_response": None},  # not in the GT: ignored, its format error still counted
  }
  (tmp_path / "pred.json").write_text(json.dumps(preds))

  sq, two, empty = _square(2, 6, 2, 6), _square(2, 6, 4, 8), np.zeros((10, 10), dtype=bool)
  # e1: frame 000 identical (1, 1); 001 shifted by two (1/3, 0.625); 002 has no GT PNG and an empty prediction (1, 1);
  # 003 has a GT PNG but no prediction (not scored). GT stored as palette indices 1, not 255.
  _png(str(gt / "e1" / "000.png"), sq, value=1, mode="P")
  _png(str(gt / "e1" / "001.png"), sq, value=1, mode="P")
  _png(str(gt / "e1" / "003.png"), sq, value=1, mode="P")
  _png(str(pm / "e1" / "masks" / "000.png"), sq)
  _png(str(pm / "e1" / "masks" / "001.png"), two)
  _png(str(pm / "e1" / "masks" / "002.png"), empty)
  # e2: GT empty vs predicted object (0, 0); GT object vs predicted empty (0, 0).
  _png(str(gt / "e2" / "000.png"), empty)
  _png(str(gt / "e2" / "001.png"), sq)
  _png(str(pm / "e2" / "masks" / "000.png"), sq)
  _png(str(pm / "e2" / "masks" / "001.png"), empty)
  # e3: GT masks but no predicted masks -> 0. e4: no GT mask folder -> skipped.
  _png(str(gt / "e3" / "000.png"), sq)
  os.makedirs(pm / "e4" / "masks")
  # e5: "0.png" is not "000.png": exact names only, so the GT of that frame is empty -> (0, 0).
  _png(str(gt / "e5" / "000.png"), sq)
  _png(str(pm / "e5" / "masks" / "0.png"), sq)
  # e6: its mask_folder holds the right mask (1, 1); the base folder's empty one must not be read.
  _png(str(gt / "e6" / "000.png"), sq)
  _png(str(tmp_path / "elsewhere" / "e6" / "000.png"), sq)
  _png(str(pm / "e6" / "masks" / "000.png"), empty)
  # e7: colour predictions binarised by convert('L') > 0: pure red (1, 0, 0) has luminance 0 -> empty -> (0, 0);
  #     green (0, 255, 0) -> object -> (1, 1).
  _png(str(gt / "e7" / "000.png"), sq)
  _png(str(gt / "e7" / "001.png"), sq)
  for name, colour in (("000.png", (1, 0, 0)), ("001.png", (0, 255, 0))):
    rgb = np.zeros((10, 10, 3), np.uint8)
    rgb[sq] = colour
    os.makedirs(pm / "e7" / "masks", exist_ok=True)
    Image.fromarray(rgb).save(pm / "e7" / "masks" / name)
  return tmp_path


def _st_args(t, out="m.json"):
  return ["--gt-csv", str(t / "gt.csv"), "--gt-masks", str(t / "gt_masks"), "--pred", str(t / "pred.json"),
          "--pred-masks", str(t / "pred_masks"), "--out", str(t / out)]


ST_IOUS = [2.0, 1 / 3, 0.0, 0.0, 0.3, 0.6, 5 / 12, 0.0, 0.0]
ST_IOPS = [1.0, 0.5, 0.0, 0.0, 1.0, 0.75, 5 / 7, 0.0, 0.0]
E1_J, E1_F = (1 + 1 / 3 + 1) / 3, (1 + 0.625 + 1) / 3


def test_st_evidence_cli_numbers(st_files):
  t = st_files
  out = st_cli.main(_st_args(t) + ["--per-entry", str(t / "per_entry.json")])
  m = _read(t / "m.json")
  assert m == out
  assert m["accuracy"] == pytest.approx(100 * 5 / 9)  # e1, e2, e6 (text answer), e7, e9
  assert m["mIoU"] == pytest.approx(100 * sum(ST_IOUS) / 9)
  assert m["mIoP"] == pytest.approx(100 * sum(ST_IOPS) / 9)
  assert m["tIoU@0.3"] == pytest.approx(100 * 5 / 9) and m["tIoU@0.5"] == pytest.approx(100 * 2 / 9)
  assert m["tIoP@0.3"] == pytest.approx(100 * 5 / 9) and m["tIoP@0.5"] == pytest.approx(100 * 5 / 9)
  assert m["t_mean"] == pytest.approx(100 * sum((a + b) / 2 for a, b in zip(ST_IOUS, ST_IOPS)) / 9)
  # Mask entries e1, e2, e3, e5, e6, e7 (e4, e8, e9 have no GT folder).
  assert m["J"] == pytest.approx(100 * (E1_J + 0 + 0 + 0 + 1 + 0.5) / 6)
  assert m["F"] == pytest.approx(100 * (E1_F + 0 + 0 + 0 + 1 + 0.5) / 6)
  assert m["JF"] == pytest.approx((m["J"] + m["F"]) / 2)
  assert m["num_entries"] == 9 and m["num_mask_entries"] == 6 and m["num_missing_predictions"] == 1
  assert m["num_mask_frames"] == 3 + 2 + 0 + 1 + 1 + 2 and m["num_unmatched_predictions"] == 1
  # The official block, with its rounding and its format_errors (over every prediction entry, zz included).
  o = m["official"]
  assert o["qa_metrics"] == {"accuracy": 55.56, "correct": 5, "total": 9} and o["num_samples"] == 9
  assert o["temporal_metrics"]["TIoU@0.5"] == 22.22 and o["temporal_metrics"]["mIoU"] == round(m["mIoU"], 2)
  assert o["format_errors"] == {"total": 5, "none_responses": 2, "empty_segments": 1, "malformed_segments": 1,
                                "parse_errors": 1}
  assert o["mask_metrics"] == {"J": round(m["J"], 2), "F": round(m["F"], 2), "J&F": round(m["JF"], 2),
                               "num_entries": 6, "total_masks": 9}
  per = m["per_sample_scores"]
  assert per["e6"]["correct"] and per["e7"]["IoU"] == pytest.approx(5 / 12)
  assert per["e7"]["format_error"] == "malformed_segments" and per["e4"]["missing"]
  assert per["e1"]["num_mask_frames"] == 3 and "J" not in per["e4"] and per["e5"]["J"] == 0.0
  assert _read(t / "per_entry.json") == per


def test_st_evidence_cli_frame_number_leniency_and_default_mask_dir(st_files):
  t = st_files
  lenient = st_cli.main(_st_args(t, "l.json") + ["--match-frame-numbers"])
  assert lenient["J"] == pytest.approx(100 * (E1_J + 0 + 0 + 1 + 1 + 0.5) / 6)  # e5: 0.png == 000.png
  # Without --pred-masks the official default is <pred without .json>/concat.
  os.makedirs(t / "pred")
  os.rename(t / "pred_masks", t / "pred" / "concat")
  args = _st_args(t, "d.json")
  del args[6:8]
  assert st_cli.main(args)["J"] == pytest.approx(100 * (E1_J + 0 + 0 + 0 + 1 + 0.5) / 6)
  # No --out: <pred dir>/<pred stem>_eval.json, as the official script.
  st_cli.main(args[:-2])
  assert (t / "pred_eval.json").exists()


def test_st_evidence_cli_bad_masks_never_abort(st_files):
  t = st_files
  # An unreadable predicted PNG is skipped; e5's only one -> the entry leaves the mask means (as the official).
  (t / "pred_masks" / "e5" / "masks" / "0.png").write_bytes(b"not a png")
  m = st_cli.main(_st_args(t))
  assert m["num_mask_entries"] == 5 and m["format_errors_unreadable_masks"] == 1
  assert m["J"] == pytest.approx(100 * (E1_J + 0 + 0 + 1 + 0.5) / 5)
  # Two non-empty masks of different sizes: that frame scores 0 and is counted (the official loses all mask metrics).
  _png(str(t / "pred_masks" / "e6" / "masks" / "000.png"), _square(2, 6, 2, 6, shape=(12, 10)))
  preds = _read(t / "pred.json")
  del preds["e6"]["mask_folder"]
  (t / "pred.json").write_text(json.dumps(preds))
  m = st_cli.main(_st_args(t))
  assert m["format_errors_mask_size_mismatch"] == 1 and m["per_sample_scores"]["e6"]["J"] == 0.0


def test_st_evidence_cli_malformed_gt_is_an_error(st_files):
  t = st_files
  for col, value, msg in (("segment", "[[0, 10]", "segment string"), ("segment", "[[0, 'x']]", "pair of numbers"),
                          ("candidates", "['a',", "candidates")):
    df = pd.read_csv(t / "gt.csv", dtype=str, keep_default_na=False)
    df.loc[1, col] = value
    df.to_csv(t / "bad_gt.csv", index=False)
    args = _st_args(t)
    args[1] = str(t / "bad_gt.csv")
    with pytest.raises(ValueError, match=r"bad_gt.csv line 3 \(entry e2\): .*" + msg):
      st_cli.main(args)
  assert not (t / "m.json").exists()


def test_st_evidence_cli_subprocess_without_jax(st_files):
  t = st_files
  code = ("import sys; from evqa_jax.evaluate import st_evidence as m; m.main(sys.argv[1:]); "
          "assert 'jax' not in sys.modules, 'the evaluator must not import JAX'")
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  res = subprocess.run([sys.executable, "-c", code] + _st_args(t, "sub.json"), capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
  assert res.returncode == 0, res.stderr
  assert _read(t / "sub.json")["accuracy"] == pytest.approx(100 * 5 / 9)
  res = subprocess.run([sys.executable, "-m", "evqa_jax.evaluate.st_evidence"] + _st_args(t, "sub2.json"),
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
  assert res.returncode == 0, res.stderr
  assert "accuracy" in res.stdout and _read(t / "sub2.json") == _read(t / "sub.json")


# ---------------------------------------------------------------------------------------------------------------------
# ST-Evidence-MCQ.


def _mcq_gt_entry(qa, temporal, spatial):
  return {"qa": {"options": ["a", "b", "c", "d", "e"], "answer": qa},
          "temporal": {"options": [[[0, 1]], [[2, 3], [4, 5]], [[6, 7]], [[8, 9]]], "answer": temporal},
          "spatial": {"frame": 12, "answer": spatial}}


def test_mcq_cli_our_gt_official_denominators(tmp_path):
  gt = {"a": _mcq_gt_entry(1, 0, 3), "b": _mcq_gt_entry(0, 2, 1), "c": _mcq_gt_entry(4, 1, 0),
        "d": _mcq_gt_entry(2, 3, 2)}
  pred = {"a": {"qa": 1, "temporal": 0, "spatial": 3}, "b": {"qa": 0, "temporal": 2, "spatial": 0},
          "c": {"qa": 4, "temporal": None}, "zz": {"qa": 0}}
  (tmp_path / "gt.json").write_text(json.dumps(gt))
  (tmp_path / "pred.json").write_text(json.dumps(pred))
  base = ["--gt", str(tmp_path / "gt.json"), "--pred", str(tmp_path / "pred.json")]
  out = mcq_cli.main(base + ["--out", str(tmp_path / "m.json")])
  m = _read(tmp_path / "m.json")
  assert m == out
  # d is absent from the predictions: not counted (the official denominator is the entries present).
  assert m["qa"] == 100.0 and m["temporal"] == pytest.approx(200 / 3) and m["spatial"] == pytest.approx(100 / 3)
  assert m["overall_accuracy"] == pytest.approx(100 * 6 / 9) and m["pooled"] == pytest.approx(100 / 3)
  assert m["num_entries"] == 3 and m["num_missing_entries"] == 1 and m["num_unmatched_predictions"] == 1
  assert m["official"]["spatial"] == {"accuracy": pytest.approx(100 / 3), "correct": 1, "total": 3, "valid": 2,
                                      "coverage": pytest.approx(200 / 3)}
  assert m["official"]["overall_accuracy"] == m["overall_accuracy"] and m["official"]["total_entries"] == 3
  strict = mcq_cli.main(base + ["--out", str(tmp_path / "s.json"), "--count-missing"])
  assert (strict["qa"], strict["temporal"], strict["spatial"], strict["overall_accuracy"]) == (75.0, 50.0, 25.0, 50.0)
  # An out-of-range choice is a wrong answer, not an error.
  pred["a"]["qa"] = 5
  (tmp_path / "pred.json").write_text(json.dumps(pred))
  assert mcq_cli.main(base + ["--out", str(tmp_path / "m2.json")])["qa"] == pytest.approx(200 / 3)
  # A malformed ground truth is still an error naming the file and entry.
  gt["b"]["spatial"]["answer"] = 4  # only 4 candidate masks
  (tmp_path / "bad_gt.json").write_text(json.dumps(gt))
  with pytest.raises(ValueError, match=r"bad_gt.json entry b: spatial.answer must be an integer in 0..3"):
    mcq_cli.main(["--gt", str(tmp_path / "bad_gt.json"), "--pred", str(tmp_path / "pred.json"),
                  "--out", str(tmp_path / "m3.json")])


def test_mcq_cli_authors_results_file(tmp_path):
  results = {
      "a": {"answer": "A", "gt_answer": "A", "evidence_t": "B", "gt_evidence_t": "B", "evidence_s": "F",
            "gt_evidence_s": "C"},
      "b": {"answer": None, "gt_answer": "B", "evidence_t": "a", "gt_evidence_t": "A", "evidence_s": "D",
            "gt_evidence_s": "D"},
      "c": {"answer": "C", "gt_answer": "C"},
      "d": {"answer": "None", "gt_answer": "", "evidence_t": "", "gt_evidence_t": "C", "evidence_s": "B",
            "gt_evidence_s": "B"},
  }
  (tmp_path / "model_all_1fps.json").write_text(json.dumps(results))
  out = mcq_cli.main([str(tmp_path / "model_all_1fps.json")])
  # Written next to the results as the official script does.
  assert _read(tmp_path / "model_all_1fps_metrics.json") == out
  o = out["official"]
  assert o["qa"] == {"accuracy": pytest.approx(200 / 3), "correct": 2, "total": 3, "valid": 2,
                     "coverage": pytest.approx(200 / 3)}
  assert (o["temporal"]["correct"], o["temporal"]["valid"]) == (1, 2)  # "a" is not "A"
  assert (o["spatial"]["correct"], o["spatial"]["valid"]) == (2, 3)    # "F" is a wrong answer
  assert o["overall_accuracy"] == pytest.approx(100 * 5 / 9) and o["total_entries"] == 4


def test_mcq_cli_release_layout(tmp_path):
  pd.DataFrame({"entry_id": ["e1", "e2"], "video": ["v1", "v2"], "question": ["q", "q"],
                "options": ["['Up', 'down ', 'left']", "['a', 'b']"], "answer": ["DOWN", "a"]}).to_csv(
                    tmp_path / "st_evidence_mcq.csv", index=False)
  sets = [[[0, 1]], [[1, 2]], [[2, 3]], [[3, 4]]]
  (tmp_path / "temp_options.json").write_text(json.dumps(
      {"e1": {"question": "q", "time_evidence_options": sets, "correct_answer": "C"}}))  # e2: no temporal question
  (tmp_path / "mask_options.json").write_text(json.dumps({
      "k1": {"entry_id": "e1", "options": ["d1", "gt", "d2", "d3"], "gt": "g.png", "d1": "1.png", "d2": "2.png",
             "d3": "3.png", "answer": 1},
      "e2": {"mcq_options": ["p0", "p1", "p2", "p3"], "correct_answer": 3}}))
  pred = {"e1": {"answer": "B", "gt_answer": "Z", "evidence_t": "C", "evidence_s": "A"},
          "e2": {"answer": "B", "evidence_t": "A", "evidence_s": "D"}}
  (tmp_path / "pred.json").write_text(json.dumps(pred))
  release = ["--mcq-csv", str(tmp_path / "st_evidence_mcq.csv"), "--temp-options",
             str(tmp_path / "temp_options.json"), "--mask-options", str(tmp_path / "mask_options.json")]
  out = mcq_cli.main(release + ["--pred", str(tmp_path / "pred.json"), "--out", str(tmp_path / "m.json")])
  # qa: e1 right ("down " == "DOWN"), e2 wrong; temporal: e1 right, e2 not asked; spatial: e1 wrong (B), e2 right.
  assert (out["qa"], out["temporal"], out["spatial"]) == (50.0, 100.0, 50.0)
  assert out["temporal_total"] == 1 and out["overall_accuracy"] == 60.0
  # An answer that pandas reads as NaN ("None"): the authors' pipeline has no QA question for that entry.
  pd.DataFrame({"entry_id": ["e1", "e2"], "options": ["['Up', 'down ', 'left']", "['None', 'b']"],
                "answer": ["DOWN", "None"]}).to_csv(tmp_path / "na.csv", index=False)
  na = mcq_cli.main(["--mcq-csv", str(tmp_path / "na.csv"), "--pred", str(tmp_path / "pred.json"),
                     "--out", str(tmp_path / "na.json")])
  assert (na["qa"], na["qa_total"], na["temporal_total"]) == (100.0, 1, 0)
  pd.DataFrame({"entry_id": ["e1"], "options": ["['up', 'left']"], "answer": ["down"]}).to_csv(
      tmp_path / "bad.csv", index=False)
  with pytest.raises(ValueError, match=r"bad.csv line 2 \(entry e1\): answer 'down' is not one of the options"):
    mcq_cli.main(["--mcq-csv", str(tmp_path / "bad.csv"), "--pred", str(tmp_path / "pred.json"),
                  "--out", str(tmp_path / "x.json")])


# ---------------------------------------------------------------------------------------------------------------------
# VIOLIN.


def test_violin_cli(tmp_path):
  def clip(split):
    return {"file": "f", "split": split, "sub": [["hi", 0.0, 1.0]],
            "statement": [["p1", "n1"], ["p2", "n2"], ["p3", "n3"]]}

  ann = {"a": clip("test"), "b": clip("test"), "c": clip("validate"), "d": clip("train")}
  pred = {"a": [[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]], "c": [[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]]}
  (tmp_path / "ann.json").write_text(json.dumps(ann))
  (tmp_path / "pred.json").write_text(json.dumps(pred))
  base = ["--gt", str(tmp_path / "ann.json"), "--pred", str(tmp_path / "pred.json")]
  # No --split: the test split alone, as the authors score (never every split pooled).
  out = violin_cli.main(base + ["--out", str(tmp_path / "m.json")])
  m = _read(tmp_path / "m.json")
  assert m == out and m["split"] == "test" and list(m["splits"]) == ["test"]
  assert m["accuracy"] == pytest.approx(25.0)  # a: 3 of 6, b missing: 0 of 6
  assert m["real_accuracy"] == pytest.approx(100 * 2 / 6) and m["fake_accuracy"] == pytest.approx(100 / 6)
  assert m["official"] == {"test": {"acc": 0.25, "real acc": 0.3333, "fake acc": 0.1667}}
  two = violin_cli.main(base + ["--out", str(tmp_path / "t.json"), "--split", "validate", "--split", "test"])
  assert two["split"] == "validate" and two["accuracy"] == 100.0 and two["splits"]["test"]["accuracy"] == 25.0

  # Malformed entries are counted by kind and scored wrong; out-of-range numbers are compared as they are.
  bad = {"zz": [[0.5, 0.5]] * 3, "a": [[0.9, 0.1]] * 2, "b": [[1.5, 0.5]] * 3}
  (tmp_path / "bad.json").write_text(json.dumps(bad))
  m = violin_cli.main(["--gt", str(tmp_path / "ann.json"), "--pred", str(tmp_path / "bad.json"),
                       "--out", str(tmp_path / "bad_m.json")])
  assert m["format_errors"] == {"not_in_annotation": 1, "wrong_pairs": 1, "not_a_number": 0, "out_of_range": 1}
  assert m["accuracy"] == pytest.approx(100 * 3 / 12)  # b: three positives right (1.5), negatives 0.5 wrong
  (tmp_path / "nan.json").write_text('{"a": [[NaN, 0.1], [0.9, 0.1], [0.9, 0.1]]}')
  m = violin_cli.main(["--gt", str(tmp_path / "ann.json"), "--pred", str(tmp_path / "nan.json"),
                       "--out", str(tmp_path / "nan_m.json")])
  assert m["format_errors"]["not_a_number"] == 1 and m["num_correct"] == 0
  with pytest.raises(ValueError, match="--split"):
    violin_cli.main(base + ["--out", str(tmp_path / "x.json"), "--split", "val"])


def test_violin_cli_float32_threshold(tmp_path):
  ann = {"a": {"split": "test", "statement": [["p", "n"]] * 3}}
  (tmp_path / "ann.json").write_text(json.dumps(ann))
  # 0.49999999 is 0.5 in float32: the positive counts as entailed (float64 would call it wrong).
  (tmp_path / "pred.json").write_text(json.dumps({"a": [[0.49999999, 0.2], [0.9, 0.1], [0.9, 0.1]]}))
  m = violin_cli.main(["--gt", str(tmp_path / "ann.json"), "--pred", str(tmp_path / "pred.json"),
                       "--out", str(tmp_path / "m.json")])
  assert m["accuracy"] == 100.0
