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
      # e3: letter past the candidates -> wrong; empty segments -> 0, 0.
      ("e3", "['x', 'y', 'z']", "x", "[[0, 10]]"),
      # e4: missing from the predictions.
      ("e4", "['x', 'y']", "y", "[[1, 2]]"),
      # e5: wrong answer; IoU exactly 0.3, IoP 1.
      ("e5", "['cat', 'dog', 'bird']", "dog", "[[0, 10]]"),
  ]
  pd.DataFrame([{"entry_id": e, "video_id": f"v{e}", "video_path": f"videos/{e}.mp4", "question": "what?",
                 "candidates": c, "answer": a, "segment": s} for e, c, a, s in rows]).to_csv(tmp_path / "gt.csv",
                                                                                           index=False)
  preds = {
      "e1": {"video_id": "ve1", "parsed_response": {"answer": "B", "segments": [[0, 10], [0, 10]]}},
      "e2": {"video_id": "ve2", "parsed_response": {"answer": " A", "segments": [[5, 15]]}},
      "e3": {"video_id": "ve3", "parsed_response": {"answer": "E", "segments": []}},
      "e5": {"video_id": "ve5", "parsed_response": {"answer": "C", "segments": [[0, 3]]}},
  }
  (tmp_path / "pred.json").write_text(json.dumps(preds))

  gt, pm = tmp_path / "gt_masks", tmp_path / "pred_masks"
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
  # e3: GT masks but no predicted masks -> 0. e4: no GT mask folder -> skipped. e5: one identical frame (1, 1).
  _png(str(gt / "e3" / "000.png"), sq)
  _png(str(gt / "e5" / "000.png"), sq)
  _png(str(pm / "e5" / "masks" / "0.png"), sq)  # numeric names match: frame 0 == GT 000.png
  os.makedirs(pm / "e4" / "masks")  # no GT folder: skipped even though a (empty) prediction folder exists
  return tmp_path


def _st_args(t, out="m.json"):
  return ["--gt-csv", str(t / "gt.csv"), "--gt-masks", str(t / "gt_masks"), "--pred", str(t / "pred.json"),
          "--pred-masks", str(t / "pred_masks"), "--out", str(t / out)]


def test_st_evidence_cli_numbers(st_files):
  t = st_files
  out = st_cli.main(_st_args(t) + ["--per-entry", str(t / "per_entry.json")])
  m = _read(t / "m.json")
  assert m == out
  assert m["accuracy"] == pytest.approx(40.0)
  ious = [2.0, 1 / 3, 0.0, 0.0, 0.3]
  iops = [1.0, 0.5, 0.0, 0.0, 1.0]
  assert m["mIoU"] == pytest.approx(100 * sum(ious) / 5)
  assert m["mIoP"] == pytest.approx(50.0)
  assert m["tIoU@0.3"] == pytest.approx(60.0) and m["tIoU@0.5"] == pytest.approx(20.0)
  assert m["tIoP@0.3"] == pytest.approx(60.0) and m["tIoP@0.5"] == pytest.approx(60.0)
  assert m["t_mean"] == pytest.approx(100 * sum((a + b) / 2 for a, b in zip(ious, iops)) / 5)
  j_e1, f_e1 = (1 + 1 / 3 + 1) / 3, (1 + 0.625 + 1) / 3
  assert m["J"] == pytest.approx(100 * (j_e1 + 0 + 0 + 1) / 4)
  assert m["F"] == pytest.approx(100 * (f_e1 + 0 + 0 + 1) / 4)
  assert m["JF"] == pytest.approx((m["J"] + m["F"]) / 2)
  assert m["num_entries"] == 5 and m["num_mask_entries"] == 4 and m["num_missing_predictions"] == 1
  per = _read(t / "per_entry.json")
  assert per["e1"]["num_mask_frames"] == 3 and "J" not in per["e4"]
  assert per["e3"]["J"] == 0.0 and per["e3"]["num_mask_frames"] == 0


def test_st_evidence_cli_errors(st_files):
  t = st_files
  # Malformed segment string in the GT CSV.
  df = pd.read_csv(t / "gt.csv", dtype=str, keep_default_na=False)
  df.loc[1, "segment"] = "[[0, 10]"
  df.to_csv(t / "bad_gt.csv", index=False)
  args = _st_args(t)
  args[1] = str(t / "bad_gt.csv")
  with pytest.raises(ValueError, match=r"bad_gt.csv line 3 \(entry e2\)"):
    st_cli.main(args)
  # Malformed predicted segments.
  preds = _read(t / "pred.json")
  preds["e2"]["parsed_response"]["segments"] = [[5]]
  (t / "bad_pred.json").write_text(json.dumps(preds))
  args = _st_args(t)
  args[5] = str(t / "bad_pred.json")
  with pytest.raises(ValueError, match=r"bad_pred.json entry e2 parsed_response.segments"):
    st_cli.main(args)
  # Shape mismatch between GT and predicted mask.
  _png(str(t / "pred_masks" / "e5" / "masks" / "0.png"), np.zeros((12, 10), dtype=bool))
  with pytest.raises(ValueError, match=r"mask size mismatch: ground truth .*e5/000.png.*e5/masks/0.png"):
    st_cli.main(_st_args(t))
  # Unreadable PNG.
  (t / "pred_masks" / "e5" / "masks" / "0.png").write_bytes(b"not a png")
  with pytest.raises(ValueError, match=r"cannot read mask PNG .*e5/masks/0.png"):
    st_cli.main(_st_args(t))
  # Two files naming the same frame.
  _png(str(t / "pred_masks" / "e5" / "masks" / "0.png"), np.zeros((10, 10), dtype=bool))
  _png(str(t / "pred_masks" / "e5" / "masks" / "00.png"), np.zeros((10, 10), dtype=bool))
  with pytest.raises(ValueError, match=r"e5/masks: 0.png and 00.png name the same frame"):
    st_cli.main(_st_args(t))
  assert not (t / "m.json").exists()


def test_st_evidence_cli_subprocess_without_jax(st_files):
  t = st_files
  code = ("import sys; from evqa_jax.evaluate import st_evidence as m; m.main(sys.argv[1:]); "
          "assert 'jax' not in sys.modules, 'the evaluator must not import JAX'")
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  res = subprocess.run([sys.executable, "-c", code] + _st_args(t, "sub.json"), capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
  assert res.returncode == 0, res.stderr
  assert _read(t / "sub.json")["accuracy"] == pytest.approx(40.0)
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


def test_mcq_cli(tmp_path):
  gt = {"a": _mcq_gt_entry(1, 0, 3), "b": _mcq_gt_entry(0, 2, 1), "c": _mcq_gt_entry(4, 1, 0),
        "d": _mcq_gt_entry(2, 3, 2)}
  pred = {"a": {"qa": 1, "temporal": 0, "spatial": 3}, "b": {"qa": 0, "temporal": 2, "spatial": 0},
          "c": {"qa": 4, "temporal": None}, "zz": {"qa": 0}}
  (tmp_path / "gt.json").write_text(json.dumps(gt))
  (tmp_path / "pred.json").write_text(json.dumps(pred))
  out = mcq_cli.main(["--gt", str(tmp_path / "gt.json"), "--pred", str(tmp_path / "pred.json"),
                      "--out", str(tmp_path / "m.json")])
  m = _read(tmp_path / "m.json")
  assert m == out
  assert (m["qa"], m["temporal"], m["spatial"], m["pooled"]) == (75.0, 50.0, 25.0, 25.0)
  assert m["num_entries"] == 4 and m["num_missing_entries"] == 1

  pred["a"]["qa"] = 5  # past the 5 options
  (tmp_path / "bad.json").write_text(json.dumps(pred))
  with pytest.raises(ValueError, match=r"bad.json entry a: qa must be an option index in 0..4"):
    mcq_cli.main(["--gt", str(tmp_path / "gt.json"), "--pred", str(tmp_path / "bad.json"),
                  "--out", str(tmp_path / "m2.json")])
  gt["b"]["spatial"]["answer"] = 4  # only 4 candidate masks
  (tmp_path / "bad_gt.json").write_text(json.dumps(gt))
  with pytest.raises(ValueError, match=r"bad_gt.json entry b: spatial.answer must be an integer in 0..3"):
    mcq_cli.main(["--gt", str(tmp_path / "bad_gt.json"), "--pred", str(tmp_path / "pred.json"),
                  "--out", str(tmp_path / "m3.json")])


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
  out = violin_cli.main(base + ["--out", str(tmp_path / "m.json")])
  m = _read(tmp_path / "m.json")
  assert m == out
  assert m["splits"]["test"]["accuracy"] == pytest.approx(25.0)  # a: 3 of 6, b missing: 0 of 6
  assert m["splits"]["validate"]["accuracy"] == 100.0 and m["splits"]["train"]["accuracy"] == 0.0
  assert m["accuracy"] == pytest.approx(100 * 9 / 24)
  only = violin_cli.main(base + ["--out", str(tmp_path / "t.json"), "--split", "test"])
  assert only["accuracy"] == pytest.approx(25.0) and list(only["splits"]) == ["test"]

  for bad, msg in [({"zz": [[0.5, 0.5]] * 3}, "clip zz: clip is not in the annotation"),
                   ({"a": [[0.5, 0.5]] * 2}, "clip a: expected 3"),
                   ({"a": [[1.5, 0.5]] * 3}, "clip a: 1.5 is not a probability")]:
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=msg):
      violin_cli.main(["--gt", str(tmp_path / "ann.json"), "--pred", str(tmp_path / "bad.json"),
                       "--out", str(tmp_path / "bad_m.json")])
  with pytest.raises(ValueError, match="--split"):
    violin_cli.main(base + ["--out", str(tmp_path / "x.json"), "--split", "val"])
