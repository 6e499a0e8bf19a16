"""ST-Evidence as released (6 fps mp4, masks/, MCQ files) through data_prep/evqa_release.py and the E-VQA converter,
on the release-shaped fixture (tests/release_fixtures.py)."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("av")

import release_fixtures as R  # pylint: disable=g-import-not-at-top
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
