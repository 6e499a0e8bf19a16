"""ST-Evidence as released (6 fps mp4, masks/, MCQ files) through data_prep/evqa_release.py and the E-VQA converter,
on the release-shaped fixture (data_prep/fixtures.py); predicted masks named as the release's; the end-to-end run
(convert -> train our reference model's real-data config at tiny sizes -> official prediction files -> both
evaluators)."""

import json
import os

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("av")

from data_prep import fixtures as R  # pylint: disable=g-import-not-at-top
from data_prep import evqa_release, st_evidence  # pylint: disable=g-import-not-at-top
from evqa_jax.data.source import TFRecordDataSource  # pylint: disable=g-import-not-at-top

H, W = 24, 32


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  return R.evqa_release(str(tmp_path_factory.mktemp("st_evidence")), height=H, width=W)


def test_mp4_decodes_to_the_encoded_frames(release):
  videos = os.path.join(release["dir"], "st_evidence_gen", "videos_6fps")
  for video_id, n in (("vid_a", 14), ("vid_b", 12)):
    frames = evqa_release.decode_mp4(os.path.join(videos, f"{video_id}.mp4"))
    assert frames.shape == (n, H, W, 3) and frames.dtype == np.uint8
    diff = np.abs(frames.astype(int) - release["frames"][video_id].astype(int))
    assert diff.max() <= 3, diff.max()  # lossless H.264 (crf 0, 4:4:4): only RGB <-> YUV rounding
  assert set(evqa_release.video_index(videos)) == {"vid_a", "vid_b"}


def test_wrong_fps_and_missing_video_are_named(release, tmp_path):
  path = str(tmp_path / "v" / "clip.mp4")
  R.write_mp4(path, release["frames"]["vid_a"][:4], fps=5)
  with pytest.raises(st_evidence.ConversionError, match=r"clip\.mp4: video stream is 5(\.0)? fps, expected 6"):
    evqa_release.decode_mp4(path)
  videos = evqa_release.Mp4Videos(str(tmp_path / "v"))
  with pytest.raises(st_evidence.ConversionError, match="row 7: field 'video_id': no nope.mp4"):
    videos.get("nope", "row 7")


def test_mcq_files_become_the_converter_mcq(release, tmp_path):
  mcq_dir = os.path.join(release["dir"], "st_evidence_mcq")
  videos = evqa_release.Mp4Videos(os.path.join(release["dir"], "st_evidence_gen", "videos_6fps"))
  path = evqa_release.mcq_from_release(mcq_dir, videos, str(tmp_path))
  with open(path) as f:
    mcq = json.load(f)
  assert sorted(mcq) == ["q0001", "q0002"]
  for k, (entry_id, _, _, _, cands, answer, segs) in enumerate(R.EVQA_ENTRIES):
    e = mcq[entry_id]
    assert e["qa"] == {"options": cands, "answer": cands.index(answer)}
    assert e["temporal"]["answer"] == k % 4 and e["temporal"]["options"][k % 4] == segs
    ref, boxes = release["spatial"][entry_id]
    assert e["spatial"]["frame"] == ref
    assert e["spatial"]["answer"] == release["mask_options"][entry_id]["answer"]
    files = sorted(os.listdir(tmp_path / e["spatial"]["options_dir"]))
    assert files == ["0.png", "1.png", "2.png", "3.png"]
    for j, name in enumerate(files):
      m = st_evidence.read_mask_png(str(tmp_path / e["spatial"]["options_dir"] / name), "test")
      np.testing.assert_array_equal(m.astype(bool), boxes[j])


def test_convert_the_release(release, tmp_path):
  gen, mcq_dir = (os.path.join(release["dir"], d) for d in ("st_evidence_gen", "st_evidence_mcq"))
  out = tmp_path / "out"
  st_evidence.main(["--csv", os.path.join(mcq_dir, "st_evidence_mcq.csv"), "--videos",
                    os.path.join(gen, "videos_6fps"), "--masks", os.path.join(gen, "masks"), "--mcq-release",
                    mcq_dir, "--num-frames", "16", "--frame-size", str(H), str(W), "--out", str(out)])
  src = TFRecordDataSource.from_split(str(out), "test")
  recs = {str(src[i]["entry_id"]): src[i] for i in range(len(src))}
  for entry_id, video_id, n, _, _, _, _ in R.EVQA_ENTRIES:
    r = recs[entry_id]
    assert int(r["num_video_frames"]) == n and bool(r["has_mcq"])
    assert np.asarray(r["frame_mask"]).sum() == n  # every frame kept (n <= 16)
    diff = np.abs(np.asarray(r["frames"])[:n].astype(int) - release["frames"][video_id].astype(int))
    assert diff.max() <= 3
    for f, m in release["masks"][entry_id].items():
      np.testing.assert_array_equal(np.asarray(r["masks"])[f].astype(bool), m)
    ref, boxes = release["spatial"][entry_id]
    assert int(r["mcq_frame"]) == ref
    np.testing.assert_array_equal(np.asarray(r["mcq_masks"]).astype(bool), boxes)
    assert int(r["mcq_spatial_answer"]) == release["mask_options"][entry_id]["answer"]
  with open(out / "test_mcq.json") as f:
    gt = json.load(f)
  assert gt["q0002"]["spatial"]["options_dir"] == "mcq_masks/q0002/"
  assert sorted(os.listdir(out / "mcq_masks" / "q0002")) == ["0.png", "1.png", "2.png", "3.png"]


def test_bad_mcq_entry_is_named_or_skipped(release, tmp_path):
  import shutil
  mcq_dir = str(tmp_path / "st_evidence_mcq")
  shutil.copytree(os.path.join(release["dir"], "st_evidence_mcq"), mcq_dir)
  with open(os.path.join(mcq_dir, "temp_options.json")) as f:
    temp = json.load(f)
  temp["q0002"]["correct_answer"] = "Z"
  with open(os.path.join(mcq_dir, "temp_options.json"), "w") as f:
    json.dump(temp, f)
  videos = evqa_release.Mp4Videos(os.path.join(release["dir"], "st_evidence_gen", "videos_6fps"))
  with pytest.raises(st_evidence.ConversionError, match=r"entry 'q0002' \(temp_options.json\): field "
                                                        r"'correct_answer' must be a letter A-D"):
    evqa_release.mcq_from_release(mcq_dir, videos, str(tmp_path / "a"))
  with open(evqa_release.mcq_from_release(mcq_dir, videos, str(tmp_path / "b"), skip_bad=True)) as f:
    assert sorted(json.load(f)) == ["q0001"]


# --------------------------------------------------------------------------------- predicted mask names


def test_mask_name_digits_hand_cases():
  from evqa_jax.evaluate import st_evidence as st_eval
  assert st_eval.mask_name_digits(["00003.png", "00012.png", "10000.png"], "d") == 5
  assert st_eval.mask_name_digits(["3.png", "12.png", "0.png"], "d") == 0
  assert st_eval.mask_name_digits(["012.png", "100.png"], "d") == 3
  assert st_eval.mask_name_digits([], "d") == 5  # no PNG: the release's naming
  assert [st_eval.mask_file_name(7, d) for d in (5, 3, 0)] == ["00007.png", "007.png", "7.png"]
  assert st_eval.mask_file_name(123456, 5) == "123456.png"
  for names, bad in ((["5.png", "00005.png"], "5.png"), (["012.png", "0013.png"], "0013.png"),
                     (["00001.png", "frame_2.png"], "frame_2.png"), (["00001.PNG"], "00001.PNG")):
    with pytest.raises(ValueError, match=f"gt/e1: .*{bad}"):
      st_eval.mask_name_digits(names, "gt/e1")


def _oracle_gen_outputs(src, h, w):
  """Predictions equal to the records' ground truth: answer, evidence frames (those holding a mask) and masks."""
  out = {k: [] for k in ("index", "answer_logits", "frame_logits", "frame_times", "frame_mask", "masks")}
  for i in range(len(src)):
    r = src[i]
    masks = np.asarray(r["masks"]) > 0
    out["index"].append(i)
    out["answer_logits"].append(np.eye(5)[int(r["answer_index"])] * 10)
    out["frame_logits"].append(np.where(masks.reshape(len(masks), -1).any(-1), 10.0, -10.0))
    out["frame_times"].append(np.asarray(r["frame_times"]))
    out["frame_mask"].append(np.asarray(r["frame_mask"]).astype(np.int32))
    out["masks"].append(np.packbits(masks.reshape(len(masks), h * w), axis=-1))
  return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("digits", [5, 0])
def test_predicted_masks_take_the_ground_truth_names(digits, tmp_path):
  """The writer names each predicted PNG as the entry's ground truth names its frames (the release: "00004.png"),
  so the official exact-name pairing finds them: oracle masks score J = F = 100 on every written frame."""
  from configs import evqa_gen
  from evqa_jax.evaluate import st_evidence as st_eval
  from evqa_jax.projects.evqa import evaluator
  from evqa_jax.projects.evqa import input as evqa_input
  rel = R.evqa_release(str(tmp_path / "st"), height=H, width=W, mask_digits=digits)
  gen = os.path.join(rel["dir"], "st_evidence_gen")
  out = str(tmp_path / "records")
  st_evidence.main(["--csv", os.path.join(gen, "st_evidence_gen.csv"), "--videos", os.path.join(gen, "videos_6fps"),
                    "--masks", os.path.join(gen, "masks"), "--num-frames", "8", "--frame-size", str(H), str(W),
                    "--out", out])
  c = evqa_gen.get_config("small")
  c.data.dir = out
  inp = evqa_input.Input(c)
  assert [e["mask_name_digits"] for e in inp.entries("test")] == [digits, digits]
  entries = evaluator.generative_entries(inp, "test", _oracle_gen_outputs(inp.source("test"), H, W), c.eval)
  pred_json, mask_root = evaluator.write_gen_predictions(entries, str(tmp_path / "pred"))
  # 14 frames sampled to 8: [0, 2, 4, 6, 7, 9, 11, 13], masks on 3..9; 12 frames: [0, 2, 3, 5, 6, 8, 9, 11], masks
  # on 0..3 and 6..9.
  name = lambda f: f"{f:05d}.png" if digits else f"{f}.png"  # pylint: disable=unnecessary-lambda-assignment
  for entry_id, frames in (("q0001", [4, 6, 7, 9]), ("q0002", [0, 2, 3, 6, 8, 9])):
    assert sorted(os.listdir(os.path.join(mask_root, entry_id, "masks"))) == sorted(name(f) for f in frames)
  metrics, per_entry = st_eval.evaluate(os.path.join(gen, "st_evidence_gen.csv"), pred_json,
                                        os.path.join(gen, "masks"), mask_root)
  assert metrics["J"] == pytest.approx(100.0) and metrics["F"] == pytest.approx(100.0)
  assert metrics["num_mask_frames"] == 10 and metrics["accuracy"] == pytest.approx(100.0)
  assert per_entry["q0002"]["num_mask_frames"] == 6


# ----------------------------------------------------------------------------------------------- end to end

TINY_CLIP = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                 patch_size=8, hidden_act="quick_gelu", layer_norm_eps=1e-5)


def _train_split(gen: str, out_dir: str, copies: int = 4) -> tuple[str, str]:
  """A train CSV and mask folder: `copies` of each release row under new entry ids. (ST-Evidence is a test benchmark;
  a real train split comes from other data in the same layout.)"""
  import csv
  import shutil
  with open(os.path.join(gen, "st_evidence_gen.csv"), newline="") as f:
    rows = list(csv.DictReader(f))
  masks = os.path.join(out_dir, "masks")
  train = []
  for row in rows:
    for k in range(copies):
      entry_id = f"{row['entry_id']}_{k}"
      shutil.copytree(os.path.join(gen, "masks", row["entry_id"]), os.path.join(masks, entry_id))
      train.append(dict(row, entry_id=entry_id))
  path = os.path.join(out_dir, "train.csv")
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(train)
  return path, masks


def test_release_end_to_end(release, tmp_path):
  """The release converted (train and test splits) -> our reference model's real-data config (its model features on; CLIP, the text
  encoder and the heads shrunk) trained 2 steps -> the trainer's evaluation writes the official files (predictions.json, pred_masks/ PNGs
  named as the release's masks, mcq_predictions.json) -> both evaluators, reading the release files as published,
  give the trainer's own numbers."""
  from configs import evqa_gen
  from evqa_jax.evaluate import st_evidence as st_eval
  from evqa_jax.evaluate import st_evidence_mcq as mcq_eval
  from evqa_jax.train import train_and_evaluate
  gen, mcq_dir = (os.path.join(release["dir"], d) for d in ("st_evidence_gen", "st_evidence_mcq"))
  gen_csv, gen_masks = os.path.join(gen, "st_evidence_gen.csv"), os.path.join(gen, "masks")
  records = str(tmp_path / "records")
  train_csv, train_masks = _train_split(gen, str(tmp_path))
  common = ["--videos", os.path.join(gen, "videos_6fps"), "--num-frames", "8", "--frame-size", "32", "32",
            "--out", records]
  st_evidence.main(["--csv", train_csv, "--masks", train_masks, "--split", "train"] + common)
  st_evidence.main(["--csv", gen_csv, "--masks", gen_masks, "--mcq-release", mcq_dir, "--split", "test"] + common)

  c = evqa_gen.get_config()
  m = c.model
  assert (m.frame_encoder, m.evidence_readout, m.frame_descriptors, m.factorized_masks) == ("clip", True, True, True)
  assert m.shape_window > 0 and m.shape_radius > 0
  c.data.dir = records
  c.data.max_tokens = 32  # the fixture's longest question + 5 options is 17 tokens
  c.pretrained.clip_dir = ""  # random weights at the tiny shapes below
  c.pretrained.clip_shape = TINY_CLIP
  c.pretrained.dir, c.pretrained.tokenizer = "", "pkg:minilm"  # MiniLM's tokenizer, a 1-layer 16-wide BERT
  c.pretrained.shape = dict(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=64)
  m.num_layers = 1
  m.temporal_dim, m.seg_dim, m.seg_mlp_dim, m.answer_dim = 16, 8, 16, 16
  c.batch_size = c.eval_batch_size = 8
  c.total_epochs = c.eval_every_epochs = c.checkpoint_every_epochs = None
  c.total_steps = c.eval_every_steps = c.checkpoint_every_steps = 2
  c.eval.modes = ("gen", "mcq")
  run = tmp_path / "run"
  train_and_evaluate(c, str(run))

  final = json.load(open(run / "final_metrics.json"))
  test = final["eval"]["test"]
  assert final["step"] == 2 and np.isfinite(final["train"]["loss"])
  pred_dir = run / "eval" / "test_step2"
  preds = json.load(open(pred_dir / "predictions.json"))
  assert sorted(preds) == ["q0001", "q0002"]
  for entry_id, n in (("q0001", 14), ("q0002", 12)):
    assert preds[entry_id]["parsed_response"]["answer"] in "ABCDE" and preds[entry_id]["parsed_response"]["segments"]
    names = sorted(os.listdir(pred_dir / "pred_masks" / entry_id / "masks"))
    assert names and set(names) <= {f"{f:05d}.png" for f in range(n)}
    with Image.open(pred_dir / "pred_masks" / entry_id / "masks" / names[0]) as im:
      assert im.size == (W, H) and set(np.unique(np.asarray(im))) <= {0, 255}  # the video's size, not the records'
  scored = st_eval.main(["--gt-csv", gen_csv, "--gt-masks", gen_masks, "--pred", str(pred_dir / "predictions.json"),
                         "--pred-masks", str(pred_dir / "pred_masks"), "--out", str(tmp_path / "gen.json")])
  for k in ("accuracy", "mIoU", "mIoP", "t_mean", "J", "F", "JF", "num_mask_frames"):
    assert scored[k] == pytest.approx(test[k]), k
  assert scored["num_missing_predictions"] == 0 and scored["format_errors_total"] == 0
  assert scored["num_mask_frames"] == sum(len(os.listdir(pred_dir / "pred_masks" / e / "masks")) for e in preds)
  mcq = mcq_eval.main(["--mcq-csv", os.path.join(mcq_dir, "st_evidence_mcq.csv"), "--temp-options",
                       os.path.join(mcq_dir, "temp_options.json"), "--mask-options",
                       os.path.join(mcq_dir, "mask_options.json"), "--pred", str(pred_dir / "mcq_predictions.json"),
                       "--out", str(tmp_path / "mcq.json")])
  assert mcq["num_entries"] == 2
  for k in ("qa", "temporal", "spatial", "pooled"):
    assert mcq[k] == pytest.approx(test[f"mcq_{k}"]), k
