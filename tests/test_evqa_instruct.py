"""ST-Evidence-Instruct as released (data_prep.fixtures.evqa_instruct) through the E-VQA converter: the gen_mask part
(temporal_evidence column, frame_%04d.jpg frames under the video_path's folder, polygon-with-hole and RLE JSON masks)
and the gen_qa/vicas part (ViCaS annotations, masks through mask_evidence track ids), read back and checked against
hand-computed masks and segments; the errors name the file, row and field."""

import csv
import os

import numpy as np
import pytest

from data_prep import fixtures, st_evidence
from evqa_jax import cli
from evqa_jax.data.source import TFRecordDataSource


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  return fixtures.evqa_instruct(str(tmp_path_factory.mktemp("instruct")))


def _records(out, split):
  src = TFRecordDataSource.from_split(out, split)
  return [src[i] for i in range(len(src))]


def test_rle_encoder_round_trips_through_the_converters_decoder():
  m = np.zeros((7, 9), np.uint8)
  m[1:5, 2:8] = 1
  m[6, 0] = 1
  rle = fixtures.rle_encode(m)
  assert isinstance(rle["counts"], str) and rle["size"] == [7, 9]
  np.testing.assert_array_equal(st_evidence.decode_rle(rle, 7, 9, "t"), m)


def test_gen_mask_part_converts_as_released(release, tmp_path):
  out = str(tmp_path / "out")
  assert cli.run(st_evidence.main, ["--instruct", release["gen_mask"], "--split", "train", "--frame-size", "24",
                                    "32", "--num-frames", "16", "--out", out]) == 0
  (r,) = _records(out, "train")
  assert r["entry_id"] == "YNIWQ_868759" and r["video_id"] == "YNIWQ"
  assert r["answer_index"] == 0 and list(r["candidates"])[0] == "a backpack"
  np.testing.assert_allclose(r["segments"], [[0.3, 0.7]])  # the temporal_evidence column
  assert r["num_video_frames"] == 9 and list(r["frame_mask"]).count(True) == 9  # frame_0000 .. frame_0008
  np.testing.assert_array_equal(r["frame_indices"][:9], np.arange(9))
  masks = r["masks"]
  # Frame 2: the 17 x 13 polygon minus its 5 x 5 hole (the hole is background) = 196 pixels.
  assert masks[2].sum() == 17 * 13 - 25 and masks[2][10, 10] == 0 and masks[2][5, 5] == 1
  # Frame 3 adds object 1's RLE box (4 x 6); frames without a mask entry are empty.
  assert masks[3].sum() == 196 + 24 and masks[3][19, 25] == 1
  for f, want in release["masks"]["YNIWQ_868759"].items():
    np.testing.assert_array_equal(masks[f], want, err_msg=f"frame {f}")
  assert masks[[0, 1, 5, 6, 7, 8]].sum() == 0
  # The ground-truth copy keeps the release's columns and adds `segment` for the official evaluator.
  with open(os.path.join(out, "train.csv")) as f:
    row = next(csv.DictReader(f))
  assert row["segment"] == row["temporal_evidence"] == "[[0.3, 0.7]]"


def test_vicas_part_takes_the_mask_evidence_tracks(release, tmp_path):
  out = str(tmp_path / "out")
  st_evidence.convert(None, None, out, "train", frame_size=(24, 32), num_frames=16, verbose=False,
                      vicas_release=release["vicas"])
  (r,) = _records(out, "train")
  assert r["entry_id"] == "10375_0" and r["answer_index"] == 3 and len(r["candidates"]) == 4
  np.testing.assert_allclose(r["segments"], [[0.0, 0.5]])
  assert r["num_video_frames"] == 6
  masks = r["masks"]
  # Tracks 1 (8 x 4 on frames 0-2) and 2 (4 x 10 on frames 1-3) are the evidence; track 3 (the whole frame) is not.
  assert [int(masks[i].sum()) for i in range(6)] == [32, 72, 72, 40, 0, 0]
  for f, want in release["masks"]["10375_0"].items():
    np.testing.assert_array_equal(masks[f], want, err_msg=f"frame {f}")


def test_release_layout_errors_name_row_and_field(release, tmp_path):
  import shutil
  vicas = str(tmp_path / "vicas")
  shutil.copytree(release["vicas"], vicas)
  path = os.path.join(vicas, "st_evidence_vicas.csv")
  text = open(path).read()
  with open(path, "w") as f:
    f.write(text.replace('"[1, 2]"', "one"))
  with pytest.raises(st_evidence.ConversionError, match=r"st_evidence_vicas.csv: row 2 \(entry '10375_0'\): field "
                     r"'mask_evidence' must be a non-empty list of ViCaS track ids"):
    st_evidence.convert(None, None, str(tmp_path / "o1"), "train", frame_size=(24, 32), verbose=False,
                        vicas_release=vicas)
  gen = str(tmp_path / "gen")
  shutil.copytree(release["gen_mask"], gen)
  path = os.path.join(gen, "st_evidence.csv")
  text = open(path).read()
  with open(path, "w") as f:
    f.write(text.replace("videos/star/YNIWQ.mp4", "../../YNIWQ.mp4"))
  with pytest.raises(st_evidence.ConversionError, match=r"row 2 \(entry 'YNIWQ_868759'\), field 'video_path'"):
    st_evidence.convert(None, None, str(tmp_path / "o2"), "train", frame_size=(24, 32), verbose=False,
                        instruct_release=gen)
  with pytest.raises(ValueError, match="drop --csv"):
    st_evidence.convert("x.csv", None, str(tmp_path / "o3"), instruct_release=gen)
