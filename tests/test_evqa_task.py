"""E-VQA task: text inputs, evidence decoding, MCQ scoring, official prediction files (training on 1 device and
the meshes, evaluated: tests/test_mesh_sharding_evqa.py)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from configs import evqa_gen
from data_prep import synthetic_evqa
from evqa_jax.evaluate import st_evidence as st_eval
from evqa_jax.projects.evqa import evaluator as evqa_evaluator
from evqa_jax.projects.evqa import input as evqa_input
from evqa_jax.projects.evqa import task as evqa


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("evqa_world")
  synthetic_evqa.generate(str(root), small=True, verbose=False)
  return str(root / "records")


def _config(records_dir, modes=("gen",), variant="small"):
  c = evqa_gen.get_config(variant)
  c.data.dir = records_dir
  c.eval.modes = modes
  return c


@pytest.fixture(scope="module")
def task(world):
  return evqa.Task(_config(world, ("gen", "mcq")))


# ------------------------------------------------------------------------------------------------ inputs


def test_build_text_layout(task):
  tok = task.input.tokenizer
  out = evqa_input.build_text(tok, "What colour is it?", ["red", "it does not move"], max_tokens=16, max_option_tokens=3,
                        num_options=5)
  q = tok("What colour is it?", add_special_tokens=False)["input_ids"]
  o2 = tok("it does not move", add_special_tokens=False)["input_ids"][:3]
  ids = [tok.cls_token_id] + q + [tok.sep_token_id] + tok("red", add_special_tokens=False)["input_ids"] + [
      tok.sep_token_id] + o2 + [tok.sep_token_id]
  n = len(ids)
  assert list(out["input_ids"][:n]) == ids and np.all(out["input_ids"][n:] == tok.pad_token_id)
  assert out["attention_mask"].sum() == n
  assert list(np.nonzero(out["question_mask"])[0]) == list(range(1, 1 + len(q)))
  start = len(q) + 2
  assert list(np.nonzero(out["option_mask"][0])[0]) == [start]
  assert list(np.nonzero(out["option_mask"][1])[0]) == [start + 2, start + 3, start + 4]
  assert out["option_mask"][2:].sum() == 0 and list(out["option_valid"]) == [1, 1, 0, 0, 0]
  assert list(out["token_type_ids"][:n]) == [0] * (len(q) + 2) + [1] * (n - len(q) - 2)
  with pytest.raises(ValueError, match="max_tokens"):
    evqa_input.build_text(tok, "What colour is it?", ["red"] * 5, max_tokens=10, max_option_tokens=3, num_options=5)


def test_preprocess_shapes_and_labels(task):
  src = task.source("test")
  ex = src[0]
  out = task.preprocess(ex, train=False)
  assert out["frames"].shape == (30, 64, 64, 3) and out["masks"].shape == (30, 64, 64)
  assert out["index"] == 0 and out["mcq_segments"].shape == (4, 8, 2) and out["has_mcq"] == 1
  (s, e), = np.asarray(ex["segments"])
  centres = np.asarray(ex["frame_times"]) + 1 / 12
  expect = (centres >= s) & (centres <= e) & np.asarray(ex["frame_mask"])
  np.testing.assert_array_equal(out["frame_labels"], expect.astype(np.float32))
  # Evidence frames are exactly the frames holding the object's mask.
  np.testing.assert_array_equal(out["frame_labels"] > 0, out["masks"].reshape(30, -1).any(-1))
  assert set(task.preprocess(ex, train=True)) < set(out)


# ------------------------------------------------------------------------------------------------ decoding


def test_decode_segments_every_frame():
  times = np.arange(12) / 6.0
  mask = np.ones(12)
  logits = np.full(12, -5.0)
  logits[3:6] = 5.0
  logits[8:9] = 5.0
  segs, runs = evqa_evaluator.decode_segments(logits, times, mask, 6.0)
  assert runs == [(3, 5), (8, 8)]
  np.testing.assert_allclose(segs, [(0.5, 1.0), (8 / 6, 1.5)], atol=1e-4)
  # Round trip with frame_labels: the labels of a segment decode back to it.
  labels = evqa_input.frame_labels(times, mask, [[0.5, 1.0]], 6.0)
  np.testing.assert_array_equal(np.nonzero(labels)[0], [3, 4, 5])
  # Nothing above the threshold: the most likely frame; padded frames never count.
  segs, runs = evqa_evaluator.decode_segments(np.r_[np.full(4, -3.0), -1.0, np.full(7, 9.0)], times, np.r_[np.ones(5),
                                                                                                 np.zeros(7)], 6.0)
  assert runs == [(4, 4)]
  np.testing.assert_allclose(segs, [(4 / 6, 5 / 6)], atol=1e-4)
  # ... and its neighbours when they are at least half as likely (sigmoid: .047 .231 .269 .250 .047).
  _, runs = evqa_evaluator.decode_segments(np.array([-3.0, -1.2, -1.0, -1.1, -3.0]), times[:5], np.ones(5), 6.0)
  assert runs == [(1, 3)]
  _, runs = evqa_evaluator.decode_segments(np.array([-3.0, -1.2, -1.0, -1.1, -3.0]), times[:5], np.ones(5), 6.0, relative=1.0)
  assert runs == [(2, 2)]


def test_decode_segments_subsampled_frames():
  # Frames 0, 3, 6, 9 of a 10-frame video at 6 fps: spans reach half-way to the neighbours.
  times = np.array([0, 3, 6, 9]) / 6.0
  segs, _ = evqa_evaluator.decode_segments(np.array([-1.0, 2.0, 2.0, -1.0]), times, np.ones(4), 6.0)
  # start(1) = (0 + 0.5) / 2 + 1/12 = 1/3; end(2) = (1 + 1.5) / 2 + 1/12 = 4/3
  np.testing.assert_allclose(segs, [(1 / 3, 4 / 3)], atol=1e-4)
  segs, _ = evqa_evaluator.decode_segments(np.array([-1.0, -1.0, -1.0, 2.0]), times, np.ones(4), 6.0)
  np.testing.assert_allclose(segs, [(4 / 3, 10 / 6)], atol=1e-4)  # the last frame ends at its time + 1/fps


def test_mcq_scores_hand_computed():
  logits = jnp.asarray([[0.0, 4.0, 4.0, 0.0, -2.0, 9.0]])
  times = jnp.arange(6)[None] / 6.0
  fmask = jnp.asarray([[1, 1, 1, 1, 1, 0]])
  segments = np.zeros((1, 4, 2, 2), np.float32)
  segments[0, 0, 0] = [1 / 6, 3 / 6]  # frames 1, 2 -> mean 4, outside (0, 0, -2) -> -2/3
  segments[0, 1, 0] = [0, 1 / 6]  # frame 0 -> 0 - (4 + 4 + 0 - 2) / 4 = -1.5
  segments[0, 2, :] = [[0, 1 / 6], [4 / 6, 5 / 6]]  # frames 0 and 4 -> -1 - 8/3
  segments[0, 3, 0] = [5 / 6, 1.0]  # only the padded frame: impossible
  lens = jnp.asarray([[1, 1, 2, 1]])
  scores = np.asarray(evqa.mcq_temporal_scores(logits, times, fmask, jnp.asarray([6.0]), jnp.asarray(segments), lens))
  np.testing.assert_allclose(scores[0, :3], [4 + 2 / 3, -1.5, -1 - 8 / 3], atol=1e-5)
  assert scores[0, 3] == -1e9

  mask_logits = np.full((1, 2, 2, 2), -50.0, np.float32)
  mask_logits[0, 1, 0, :] = 50.0  # frame 1: top row
  cands = np.zeros((1, 4, 2, 2), np.uint8)
  cands[0, 0, 0, :] = 1  # identical -> IoU 1
  cands[0, 1, :, 0] = 1  # one shared pixel of three -> 1/3
  cands[0, 2, 1, :] = 1  # disjoint -> 0
  cands[0, 3] = 1  # 2 of 4 -> 1/2
  spatial = np.asarray(evqa.mcq_spatial_scores(jnp.asarray(mask_logits), jnp.asarray([1]), jnp.asarray(cands)))
  np.testing.assert_allclose(spatial[0], [1.0, 1 / 3, 0.0, 0.5], atol=1e-5)


# ------------------------------------------------------------------------------------------------ evaluation


def _oracle_outputs(task, split, wrong_answer=False):
  src = task.source(split)
  rows = [task.preprocess(src[i], train=False) for i in range(len(src))]
  t, (h, w) = task.input.num_frames, task.input.frame_size
  out = {"index": [], "answer_logits": [], "frame_logits": [], "masks": [], "frame_times": [], "frame_mask": [],
         "mcq_temporal_scores": [], "mcq_spatial_scores": []}
  for r, i in zip(rows, range(len(rows))):
    ex = src[i]
    label = (int(r["label"]) + 1) % 5 if wrong_answer else int(r["label"])
    out["index"].append(i)
    out["answer_logits"].append(np.eye(5)[label] * 10)
    out["frame_logits"].append(np.where(r["frame_labels"] > 0, 10.0, -10.0))
    out["masks"].append(np.packbits(r["masks"].reshape(t, h * w) > 0, axis=-1))
    out["frame_times"].append(r["frame_times"])
    out["frame_mask"].append(r["frame_mask"])
    out["mcq_temporal_scores"].append(np.eye(4)[int(ex["mcq_temporal_answer"])])
    out["mcq_spatial_scores"].append(np.eye(4)[int(ex["mcq_spatial_answer"])])
  return {k: np.asarray(v) for k, v in out.items()}


def test_evaluate_oracle_scores_100_and_writes_official_files(task, tmp_path):
  metrics = task.evaluate("test", _oracle_outputs(task, "test"), str(tmp_path))
  for k in ("accuracy", "mIoU", "mIoP", "tIoU@0.5", "t_mean", "J", "F", "JF", "mcq_qa", "mcq_temporal",
            "mcq_spatial", "mcq_pooled"):
    assert metrics[k] == pytest.approx(100.0), k
  assert metrics["num_entries"] == 10 and metrics["num_missing_predictions"] == 0
  preds = json.load(open(tmp_path / "predictions.json"))
  gt_rows = st_eval.read_gt_csv(os.path.join(task.input.data_dir, "test.csv"))
  for row in gt_rows:
    p = preds[row["entry_id"]]
    assert p["parsed_response"]["answer"] in "ABCDE"
    np.testing.assert_allclose(p["parsed_response"]["segments"], row["segments"], atol=1e-4)
    names = sorted(os.listdir(tmp_path / "pred_masks" / row["entry_id"] / "masks"))
    assert names == sorted(os.listdir(os.path.join(task.input.data_dir, "gt_masks", row["entry_id"])))
    with Image.open(tmp_path / "pred_masks" / row["entry_id"] / "masks" / names[0]) as im:
      arr = np.asarray(im)
    assert arr.shape == (64, 64) and set(np.unique(arr)) <= {0, 255}
  # The same files through the command-line evaluator give the same numbers.
  cli = st_eval.main(["--gt-csv", os.path.join(task.input.data_dir, "test.csv"), "--gt-masks",
                      os.path.join(task.input.data_dir, "gt_masks"), "--pred", str(tmp_path / "predictions.json"),
                      "--pred-masks", str(tmp_path / "pred_masks"), "--out", str(tmp_path / "cli.json")])
  assert cli["JF"] == pytest.approx(metrics["JF"]) and cli["t_mean"] == pytest.approx(metrics["t_mean"])

  from evqa_jax.evaluate import visualize_evidence
  ids = [r["entry_id"] for r in gt_rows[:2]]
  strip = visualize_evidence.main(["--records", task.input.data_dir, "--pred", str(tmp_path / "predictions.json"),
                                   "--pred-masks", str(tmp_path / "pred_masks"), "--entries", ",".join(ids),
                                   "--out", str(tmp_path / "strip.png"), "--num-frames", "6"])
  with Image.open(strip) as im:
    rgb = np.asarray(im.convert("RGB")).astype(int)
  # Oracle masks coincide with the ground truth: the overlap tint (red + green) appears.
  assert rgb.shape[0] > 100 and np.any((rgb[..., 0] > 150) & (rgb[..., 1] > 150) & (rgb[..., 2] < 90))


def test_evaluate_wrong_answers_and_native_resolution(task, tmp_path):
  outputs = _oracle_outputs(task, "test", wrong_answer=True)
  metrics = task.evaluate("test", outputs, str(tmp_path))
  assert metrics["accuracy"] == 0.0 and metrics["mcq_qa"] == 0.0 and metrics["JF"] == pytest.approx(100.0)
  # Records stored smaller than the source video: masks are written at the source size (nearest resize).
  table = task.input.entries("test")
  saved = [dict(e) for e in table]
  try:
    for e in table:
      e["orig_size"] = (128, 96)
    entry = evqa_evaluator.generative_entries(task.input, "test", outputs, task.config.eval)[0]
    frame, mask = next(iter(entry["masks"].items()))
    k = int(np.nonzero(table[0]["frame_indices"] == frame)[0][0])
    small = np.unpackbits(outputs["masks"][0], axis=-1, count=64 * 64).reshape(-1, 64, 64)[k].astype(bool)
    assert mask.shape == (128, 96) and small.any()
    assert mask.sum() == pytest.approx(small.sum() * 2 * 1.5, rel=0.1)
    np.testing.assert_array_equal(mask, evqa_evaluator.resize_mask(small, (128, 96)))
  finally:
    task.input._entries["test"] = saved
