"""OVQA from raw videos (data_prep/ovqa_frames.py) and the pixel side of the OVQA input (frames, augmentation)."""

import os
import types

import numpy as np
import pandas as pd
import pytest

from configs import ovqa_msrvtt
from data_prep import fixtures
from data_prep import ovqa
from data_prep import ovqa_frames
from evqa_jax.data import pipeline
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource
from evqa_jax.projects.ovqa import input as input_lib

av = pytest.importorskip("av")

T, S = 3, 16  # frames per record, model frame size (All-in-one stores R = int(1.2 * 16) = 19)


def _decode_all(path):
  with av.open(path) as c:
    return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def _read(out, split):
  return TFRecordDataSource(records.split_paths(out, split), records.load_spec(out, split))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  return fixtures.ovqa_raw_videos(str(tmp_path_factory.mktemp("raw_videos")))


def _convert(rel, dataset, out, **kw):
  info = rel[dataset]
  kw.setdefault("num_frames", T)
  kw.setdefault("frame_size", S)
  return ovqa_frames.convert(info["csv_dir"], info["videos"], str(out), dataset=dataset, video_map=info["video_map"],
                             cvqa_topk=0, verbose=False, **kw)


def test_sample_indices_hand_computed():
  # All-in-one: segments linspace(0, n, T+1).astype(int) = [0, 3, 6, 10] -> [0, 2], [3, 5], [6, 9] -> middles.
  assert ovqa_frames.sample_indices(10, 3, "allinone") == [1, 4, 7]
  assert ovqa_frames.sample_indices(12, 3, "allinone") == [1, 5, 9]
  assert ovqa_frames.sample_indices(3, 3, "allinone") == [0, 1, 2]
  # VIOLET: int(n / (T + 1) * (i + 1)): 2.5, 5.0, 7.5 -> 2, 5, 7.
  assert ovqa_frames.sample_indices(10, 3, "violet") == [2, 5, 7]
  assert ovqa_frames.sample_indices(12, 3, "violet") == [3, 6, 9]


def test_resize_hand_computed():
  y, x = np.mgrid[0:10, 0:20]
  frame = np.stack([y, x, np.zeros_like(y)], -1).astype(np.uint8)  # a GIF frame, 20 wide, 10 high
  out = ovqa_frames.resize_frame(frame, "allinone", 5, squash=False)  # R = int(6.0) = 6
  # shorter side 10 -> 6, longer 20 -> int(6 * 20 / 10) = 12, nearest: rows floor(i * 10 / 6), cols floor(j * 20 / 12);
  # centre crop x0 = round((12 - 6) / 2) = 3
  assert out[:, 0, 0].tolist() == [0, 1, 3, 5, 6, 8]
  assert out[0, :, 1].tolist() == [5, 6, 8, 10, 11, 13]
  # VIOLET: a 2 x 4 frame is zero-padded by (4 - 2) // 2 = 1 row above and below, then 4 x 4 stays 4 x 4.
  small = np.full((2, 4, 3), 200, np.uint8)
  out = ovqa_frames.resize_frame(small, "violet", 4, squash=True)
  assert out[:, 0, 0].tolist() == [0, 200, 200, 0]


def test_records_equal_pyav_decode(release, tmp_path):
  """raw videos -> records -> frames == PyAV's decode of the same files at the hand-computed indices, resized."""
  out = tmp_path / "msrvtt"
  _convert(release, "msrvtt", out)
  meta = records.load_metadata(str(out))
  assert (meta["video_input"], meta["num_frames"], meta["frame_size"], meta["stored_size"]) == ("frames", T, S, 19)
  src = _read(str(out), "train")
  files = {os.path.basename(p): p for p in release["msrvtt"]["files"]}
  hand = {"7010": ("video7010.mp4", [1, 5, 9]),  # 12 frames
          "7011": ("video7011.mp4", [2, 9, 16])}  # 20 frames: [0, 6, 13, 20] -> (0 + 5) // 2, (6 + 12) // 2, ...
  for i in range(len(src)):
    ex = src[i]
    name, idx = hand[str(ex["video_id"])]
    decoded = _decode_all(files[name])
    want = np.stack([ovqa_frames.resize_frame(decoded[j], "allinone", S, squash=True) for j in idx])
    assert ex["frames"].shape == (T, 19, 19, 3) and ex["frames"].dtype == np.uint8
    np.testing.assert_array_equal(ex["frames"], want)
  # VIOLET at the video's own size on a square video: no resampling at all, the decoded frames themselves.
  square = tmp_path / "sq"
  square.mkdir()
  pd.DataFrame({"question": ["q"], "answer": ["a"], "video_id": ["video1"]}).to_csv(square / "train.csv", index=False)
  pd.DataFrame({"question": ["q"], "answer": ["a"], "video_id": ["1"]}).to_csv(square / "test.csv", index=False)
  ovqa_frames.write_video(str(square / "video1.mp4"), fixtures.smooth_frames(12, 16, 16))
  ovqa_frames.convert(str(square), str(square), str(tmp_path / "sq_out"), dataset="msrvtt", num_frames=T,
                      frame_size=16, recipe="violet", cvqa_topk=0, verbose=False)
  decoded = _decode_all(str(square / "video1.mp4"))
  for split in ("train", "test"):
    np.testing.assert_array_equal(_read(str(tmp_path / "sq_out"), split)[0]["frames"],
                                  np.stack([decoded[j] for j in (3, 6, 9)]))


@pytest.mark.parametrize("dataset", ["msvd", "tgif", "activitynet"])
def test_dataset_naming(release, tmp_path, dataset):
  """MSVD's vid<N> through youtube_mapping.txt, TGIF's gifs, ActivityNet's v_<id> .mp4 and .mkv: every row found."""
  summary = _convert(release, dataset, tmp_path / dataset)
  rows = fixtures.OVQA_VIDEO_ROWS[dataset]
  assert {s: summary[s]["converted"] for s in summary} == {s: len(r) for s, r in rows.items()}
  first = _read(str(tmp_path / dataset), "train")[0]
  path = [p for p in release[dataset]["files"] if dataset != "msvd" and str(first["video_id"]) in p
          or dataset == "msvd" and fixtures.MSVD_MAPPING.get(os.path.basename(p)[:-4]) == first["video_id"]][0]
  decoded = _decode_all(path)
  idx = ovqa_frames.sample_indices(len(decoded), T, "allinone")
  want = np.stack([ovqa_frames.resize_frame(decoded[j], "allinone", S, squash=dataset != "tgif") for j in idx])
  np.testing.assert_array_equal(first["frames"], want)


def _bad_release(tmp_path):
  d = tmp_path / "bad"
  d.mkdir()
  rows = [("q0", "a", "video1"), ("q1", "b", "video2"), ("q2", "a", "video3"), ("q3", "a", "video4"),
          ("q4", "b", "../video1"), ("q5", "a", "video1")]
  pd.DataFrame(rows, columns=["question", "answer", "video_id"]).to_csv(d / "train.csv", index=False)
  pd.DataFrame([("q", "a", "video1")], columns=["question", "answer", "video_id"]).to_csv(d / "test.csv", index=False)
  ovqa_frames.write_video(str(d / "video1.mp4"), fixtures.smooth_frames(6, 16, 16))
  ovqa_frames.write_video(str(d / "video2.mp4"), fixtures.smooth_frames(2, 16, 16))  # shorter than T = 3
  (d / "video3.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")  # unreadable
  return d  # video4: no file


def test_bad_videos_named_counted_nothing_written(tmp_path):
  d = _bad_release(tmp_path)
  out = tmp_path / "out"
  with pytest.raises(ovqa.ConversionError, match=r"train.csv, row 1 \(line 3\), field 'video_id'.*video2.mp4: 2 "
                     r"frame\(s\), fewer than --num-frames 3"):
    ovqa_frames.convert(str(d), str(d), str(out), dataset="msrvtt", num_frames=T, frame_size=S, verbose=False)
  assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]
  summary = ovqa_frames.convert(str(d), str(d), str(out), dataset="msrvtt", num_frames=T, frame_size=S,
                                skip_bad=True, verbose=False, workers=1)
  assert summary["train"]["converted"] == 2
  assert summary["train"]["skipped"] == {"bad_video_id": 1, "missing_video": 1, "bad_video": 1, "short_video": 1}
  messages = {r["reason"]: r["message"] for r in summary["train"]["skipped_rows"]}
  assert "video3.mp4: cannot decode" in messages["bad_video"]
  assert "no msrvtt video 'video4'" in messages["missing_video"]
  meta = records.load_metadata(str(out))
  assert meta["conversion"]["train"]["skipped"] == summary["train"]["skipped"]
  # the worker-decoded records equal the in-process decode of the same video
  decoded = _decode_all(str(d / "video1.mp4"))
  want = np.stack([ovqa_frames.resize_frame(decoded[j], "allinone", S, squash=True) for j in (0, 2, 4)])
  np.testing.assert_array_equal(_read(str(out), "train")[0]["frames"], want)
  # a split of nothing but bad rows is an error, not an empty split (common.check_converted)
  pd.DataFrame([("q", "a", "video2")], columns=["question", "answer", "video_id"]).to_csv(d / "test.csv", index=False)
  with pytest.raises(ValueError, match="split 'test': converted 0 records"):
    ovqa_frames.convert(str(d), str(d), str(tmp_path / "out2"), dataset="msrvtt", num_frames=T, frame_size=S,
                        skip_bad=True, verbose=False)


# ------------------------------------------------------------------------------------------------ the OVQA input

class _Frames:
  """A stand-in backbone: the Input reads `video_input` and the text inputs (none here)."""
  video_input = "frames"

  def text_inputs(self, inp, example):
    return {}


@pytest.fixture(scope="module")
def frame_records(release, tmp_path_factory):
  out = tmp_path_factory.mktemp("frames") / "records"
  _convert(release, "msrvtt", out)
  return str(out)


def _config(data_dir, **data):
  c = ovqa_msrvtt.get_config("tiny")
  c.data.dir, c.data.synthetic, c.verbalizer.variant = data_dir, "", "A"
  c.data.num_frames, c.data.frame_size, c.data.use_subtitles = T, S, False
  c.data.update(data)
  return c


def test_input_mismatch_errors(frame_records, release, tmp_path):
  violet_records = str(tmp_path / "violet")
  _convert(release, "msrvtt", violet_records, recipe="violet")
  with pytest.raises(ValueError, match=r"config.model.backbone = 'frozenbilm' reads video features but .*metadata.json "
                     "has video_input 'frames'"):
    input_lib.Input(_config(frame_records), "open", types.SimpleNamespace(video_input="features"))
  with pytest.raises(ValueError, match=r"config.data.frame_size = 32 but .*metadata.json has frame_size 16"):
    input_lib.Input(_config(frame_records, frame_size=32), "open", _Frames())
  with pytest.raises(ValueError, match=r"config.data.num_frames = 4 but the records in .* hold 3 frames"):
    input_lib.Input(_config(frame_records, num_frames=4), "open", _Frames())
  with pytest.raises(ValueError, match=r"config.data.augment = 'flip': expected one of \('none', 'allinone'\)"):
    input_lib.Input(_config(frame_records, augment="flip"), "open", _Frames())
  with pytest.raises(ValueError, match=r"config.data.augment = 'allinone' crops frame_size 16 from larger frames, but "
                     r".*metadata.json stores them at that size \(frame_recipe 'violet'\)"):
    input_lib.Input(_config(violet_records, augment="allinone"), "open", _Frames())


def test_augmentation_deterministic_and_resumed(frame_records):
  inp = input_lib.Input(_config(frame_records, augment="allinone"), "open", _Frames())
  src = inp.source("train")
  stored = [np.asarray(src[i]["frames"]) for i in range(len(src))]
  # evaluation: All-in-one's centre crop, round((19 - 16) / 2) = 2
  ev = inp.preprocess(src[0], train=False)
  np.testing.assert_array_equal(ev["frames"], stored[0][:, 2:18, 2:18])
  assert ev["frames"].dtype == np.uint8 and "video" not in ev

  def loader():
    return pipeline.make_train_loader(src, global_batch_size=1, seed=7, num_epochs=12, process_index=0,
                                      process_count=1, transform=pipeline.KeyedTransform(
                                          lambda ex, key: inp.preprocess(ex, True, key)))
  with iter(loader()) as it:
    batches = [next(it) for _ in range(12)]
  offsets = set()
  for step, b in enumerate(batches):
    i = int(b["index"][0])
    crop = b["frames"][0]
    found = [(y, x) for y in range(4) for x in range(4)
             if np.array_equal(crop, stored[i][:, y:y + S, x:x + S])]
    assert found, step  # a 16 x 16 window of the stored 19 x 19 frames, the same for every frame of the clip
    offsets.add(found[0])
  assert len(offsets) > 3  # the window moves between steps (12 draws of 16 offsets)
  with iter(loader()) as it:  # a resume at step 5 sees exactly the batches the first run saw from there
    it.set_step(5)
    for step in range(5, 12):
      np.testing.assert_array_equal(next(it)["frames"], batches[step]["frames"])
  # no augmentation without a key (shape probes) nor with augment "none": the centre crop
  plain = input_lib.Input(_config(frame_records), "open", _Frames())
  np.testing.assert_array_equal(plain.preprocess(src[0], True, (7, 3, 0))["frames"], ev["frames"])


def test_jpeg_frames(release, frame_records, tmp_path):
  """--frame-format jpeg: the input decodes to exactly PIL's JPEG round trip of the raw records' frames; damaged
  fields are one error naming the record."""
  from evqa_jax.data import frames as frames_lib
  out = tmp_path / "jpeg"
  _convert(release, "msrvtt", out, frame_format="jpeg", jpeg_quality=90)
  meta = records.load_metadata(str(out))
  assert (meta["frame_format"], meta["jpeg_quality"]) == ("jpeg", 90)
  raw = input_lib.Input(_config(frame_records), "open", _Frames())
  jpeg = input_lib.Input(_config(str(out)), "open", _Frames())
  raw_src, jpeg_src = raw.source("test"), jpeg.source("test")
  for i in range(len(raw_src)):
    stored = np.asarray(raw_src[i]["frames"])
    want = frames_lib.decode_jpeg(frames_lib.encode_jpeg(stored, 90), "x")
    assert np.abs(want.astype(int) - stored).mean() < 3  # a lossy copy of the same frames
    np.testing.assert_array_equal(jpeg.preprocess(jpeg_src[i], train=False)["frames"], want[:, 2:18, 2:18])
  bad = dict(jpeg_src[0], frames_jpeg_ends=np.asarray([5, 3, 1]), index=0)
  with pytest.raises(ValueError, match=r"record 0 of .*jpeg: frames_jpeg_ends \[5, 3, 1\] do not cut"):
    jpeg.preprocess(bad, train=False)
  ex = jpeg_src[0]
  junk = dict(ex, frames_jpeg=np.zeros_like(ex["frames_jpeg"]))
  with pytest.raises(ValueError, match="field 'frames_jpeg' does not decode as 3 JPEG frames"):
    jpeg.preprocess(junk, train=False)
