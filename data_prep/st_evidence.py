"""ST-Evidence (E-VQA) converter: official CSV + frames + masks (+ MCQ) -> TFRecord dataset.

    python -m data_prep.st_evidence --csv C (--frames DIR | --videos DIR) (--masks DIR | --instruct-json DIR | both) \
        [--split test] [--mcq MCQ.json | --mcq-release DIR] [--num-frames 32] [--frame-size H W] [--allow-missing-masks] \
        [--num-shards N] [--skip-bad] --out OUT
    python -m data_prep.st_evidence (--instruct ST-Evidence-Instruct/gen_mask | --vicas ST-Evidence-Instruct/gen_qa/vicas) \
        --split train [--num-frames 32] [--frame-size H W] [--skip-bad] --out OUT

Raw format (REFERENCE.md section 3):
  CSV            columns entry_id, video_id, video_path, question, candidates (python-list string, e.g.
                 "['red', 'blue', ...]"), answer (text, one of the candidates), segment ("[[s, e], ...]" seconds)
  frames         frames/<video_id>/<frame:05d>.png|.jpg, every frame of the video at 6 fps, numbered from 0
  --videos       or the release's videos_6fps/<video_id>.mp4, decoded with PyAV (data_prep/evqa_release.py)
  --masks        gt_masks/<entry_id>/<frame>.png: any non-zero pixel = evidence object (all objects merged);
                 <frame> is the frame index at 6 fps, one zero-padding per folder (the release: 5 digits,
                 "00012.png"); a frame without a PNG has an empty mask
  --instruct-json  <dir>/<entry_id>.json (ST-Evidence-Instruct): {fps, width, height, evidence_objects:
                 [{ref_expression, masks: [{frame, mask}]}]}, mask = {exterior: [[x, y], ...], holes: [[[x, y],
                 ...], ...]} polygon (pixel coordinates, rasterised with PIL, holes cut out) or COCO RLE
                 {size: [h, w], counts: list | string}; frame indices at the JSON's fps, mapped to 6 fps by time.
                 When both mask sources are given an entry uses its JSON if present, else its PNG folder.
  --mcq          {entry_id: {"qa": {"options": [5 strings], "answer": int},
                             "temporal": {"options": [[[s, e], ...] x 4], "answer": int},
                             "spatial": {"frame": int, "options_dir": "mcq_masks/<entry_id>/", "answer": int}}}
                 options_dir (relative to the MCQ file) holds 4 candidate mask PNGs, option k = k-th by numeric name.
  --instruct     ST-Evidence-Instruct's gen_mask folder as released (SalesforceAIResearch/EVQA README, its loader
                 STEvidenceGenMaskDataset): st_evidence.csv (the columns above with the segments in
                 `temporal_evidence`), masks/<entry_id>.json (the --instruct-json format) and
                 video_frames_6fps/<video>/frame_%04d.jpg, <video> = the CSV's video_path without its extension
  --vicas        ST-Evidence-Instruct's gen_qa/vicas folder (its loader STEvidenceGenQADataset):
                 st_evidence_vicas.csv (+ `mask_evidence`, "[1, 2]": ViCaS track ids, and `temporal_evidence`),
                 annotations/v1.0/<video_id:06d>.json ({segmentations: [{filename, track_ids, mask_rles}]}, one entry
                 per frame, COCO RLE per track) and video_frames/<video_id:06d>/<filename>; the evidence mask of a
                 frame merges the RLEs of the mask_evidence tracks present in it. The frames are taken to be at 6 fps
                 (an annotation with another numeric "fps" is refused).
  A CSV without `segment` reads its segments from `temporal_evidence` (ST-Evidence-Instruct's name); the ground-truth
  copy OUT/<split>.csv then gets a `segment` column with the same text, for the official evaluator.
  --mcq-release  or the release's st_evidence_mcq folder (st_evidence_mcq.csv, temp_options.json,
                 mask_options.json, options.tar.gz), turned into that JSON by data_prep/evqa_release.py

Record schema (one record per CSV row; T = --num-frames, H x W = --frame-size):
  entry_id             string ()
  video_id             string ()
  question             string ()
  candidates           string [C]         answer options in CSV order (C = 5 in ST-Evidence)
  answer_index         int32 ()           index of the answer text in candidates (exact match after strip)
  frames               uint8 [T, H, W, 3] RGB; all frames when the video has <= T, else T uniformly sampled
                                          (first and last kept); zero padding after the real frames
  frame_mask           bool [T]           True for real frames
  frame_times          float32 [T]        seconds of each frame (index / 6); 0 for padding
  frame_indices        int32 [T]          index of each frame in the 6 fps video; -1 for padding
  fps                  float32 ()         6.0
  num_video_frames     int32 ()           frames in the whole video at 6 fps
  orig_size            int32 [2]          (height, width) of the source frames (masks are predicted at this size)
  masks                uint8 [T, H, W]    0/1 evidence mask of each sampled frame, all objects merged
  mask_name_digits     int32 ()           zero-padding of the entry's GT mask names (5: "00012.png", 0: "12.png";
                                          5, the release's, without a PNG folder): predicted masks are written
                                          under the same names (evqa_jax.evaluate.st_evidence.mask_file_name)
  has_masks            bool ()            False only for entries converted with --allow-missing-masks
  segments             float32 [S, 2]     temporal evidence [start, end] seconds (S >= 1, variable)
  has_mcq              bool ()            True when the MCQ file has this entry; the mcq_* fields are
                                          zeros / -1 otherwise
  mcq_segments         float32 [4, S_max, 2]  the 4 temporal options, zero-padded to the longest (S_max)
  mcq_segments_len     int32 [4]          segments in each temporal option
  mcq_temporal_answer  int32 ()           0..3 (-1 without MCQ)
  mcq_masks            uint8 [4, H, W]    the 4 spatial options (0/1) on the reference frame
  mcq_frame            int32 ()           reference frame index at 6 fps (-1 without MCQ)
  mcq_spatial_answer   int32 ()           0..3 (-1 without MCQ)
The MCQ's QA options must equal the CSV candidates and its answer the CSV answer (checked).

Besides the shards, OUT gets the ground truth in the layout of the official evaluators:
  OUT/<split>.csv                 the converted rows of the CSV, verbatim
                                  (`python -m evqa_jax.evaluate.st_evidence --gt-csv OUT/test.csv`)
  OUT/gt_masks/<entry_id>/*.png   copies of the PNG masks (entries whose masks came from PNGs)
  OUT/<split>_mcq.json            the MCQ ground truth of the converted entries, options_dir pointing to
  OUT/mcq_masks/<entry_id>/*.png  copies of the candidate masks
and metadata.json (task "evqa", fps, num_frames, frame_size, per-split conversion counts, these file names).

Bad input (missing column or field, bad candidates list string, answer not among the candidates, malformed
segment string, missing or unreadable frame/mask image, polygon outside the frame, malformed MCQ entry)
raises ConversionError naming file, entry and field; with --skip-bad the entry is skipped and counted under
its reason instead. Every output file is written atomically.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import io
import math
import os
import shutil
import sys
from typing import Any, Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import settings
from evqa_jax.data import records
from data_prep import common
from data_prep.st_evidence_common import ConversionError, FrameFolders, decode_rle, numbered_images
from evqa_jax.data.example import Feature
from evqa_jax.evaluate import st_evidence as st_eval

FPS = 6.0
NUM_FRAMES = 32
FRAME_SIZE = (224, 224)
CSV_COLUMNS = ("entry_id", "video_id", "video_path", "question", "candidates", "answer", "segment")
NUM_MCQ_OPTIONS = 4
GT_MASKS_DIR = "gt_masks"
MCQ_MASKS_DIR = "mcq_masks"


def record_spec(num_frames: int, height: int, width: int) -> dict[str, Feature]:
  t, h, w = num_frames, height, width
  return {
      "entry_id": Feature("string", ()),
      "video_id": Feature("string", ()),
      "question": Feature("string", ()),
      "candidates": Feature("string", (None,)),
      "answer_index": Feature("int32", ()),
      "frames": Feature("uint8", (t, h, w, 3)),
      "frame_mask": Feature("bool", (t,)),
      "frame_times": Feature("float32", (t,)),
      "frame_indices": Feature("int32", (t,)),
      "fps": Feature("float32", ()),
      "num_video_frames": Feature("int32", ()),
      "orig_size": Feature("int32", (2,)),
      "masks": Feature("uint8", (t, h, w)),
      "mask_name_digits": Feature("int32", ()),
      "has_masks": Feature("bool", ()),
      "segments": Feature("float32", (None, 2)),
      "has_mcq": Feature("bool", ()),
      "mcq_segments": Feature("float32", (NUM_MCQ_OPTIONS, None, 2)),
      "mcq_segments_len": Feature("int32", (NUM_MCQ_OPTIONS,)),
      "mcq_temporal_answer": Feature("int32", ()),
      "mcq_masks": Feature("uint8", (NUM_MCQ_OPTIONS, h, w)),
      "mcq_frame": Feature("int32", ()),
      "mcq_spatial_answer": Feature("int32", ()),
  }


# ----------------------------------------------------------------------------------------------- parsing

def parse_candidates(text: str, where: str) -> list[str]:
  """"['a', 'b', ...]" -> list of stripped strings (at least two, no duplicates)."""
  try:
    value = ast.literal_eval(text) if isinstance(text, str) else None
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    value = None
  if (not isinstance(value, (list, tuple)) or len(value) < 2
      or not all(isinstance(c, str) and c.strip() for c in value)):
    raise ConversionError("bad_candidates",
                          f"{where}: field 'candidates' must be a python-list string of >= 2 non-empty strings, got {text!r}")
  out = [c.strip() for c in value]
  if len(set(out)) != len(out):
    raise ConversionError("bad_candidates", f"{where}: field 'candidates' has duplicate options: {out}")
  return out


def _as_segments(value: Any) -> np.ndarray | None:
  if not isinstance(value, (list, tuple)) or not value:
    return None
  segs = []
  for seg in value:
    if (not isinstance(seg, (list, tuple)) or len(seg) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seg)):
      return None
    try:
      s, e = float(seg[0]), float(seg[1])
    except OverflowError:  # an integer beyond float range
      return None
    if not (math.isfinite(s) and math.isfinite(e)) or s < 0 or e < s:
      return None
    segs.append([s, e])
  return np.asarray(segs, np.float32).reshape(-1, 2)


def parse_segments(text: str, where: str, field: str = "segment") -> np.ndarray:
  """"[[s, e], ...]" (seconds, 0 <= s <= e, at least one) -> float32 [S, 2]."""
  try:
    value = ast.literal_eval(text.strip()) if isinstance(text, str) else None
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    value = None
  segs = _as_segments(value)
  if segs is None:
    raise ConversionError("bad_segment",
                          f"{where}: field {field!r} must look like \"[[start, end], ...]\" with 0 <= start <= end, got {text!r}")
  return segs


def read_csv(path: str) -> tuple[list[str], list[dict]]:
  """Returns (header, rows as dicts with the raw text); error naming the file for missing columns."""
  try:
    reader = csv.DictReader(io.StringIO(evqa_io.read_text(path, "CSV file"), newline=""))
    header = list(reader.fieldnames or [])
    rows = list(reader)
  except (OSError, ValueError, csv.Error) as e:
    raise ConversionError("unreadable_csv", f"{path}: cannot read CSV ({e})") from e
  if "segment" not in header and "temporal_evidence" in header:  # ST-Evidence-Instruct's CSVs
    header.append("segment")
    for row in rows:
      row["segment"] = row.get("temporal_evidence")
  missing = [c for c in CSV_COLUMNS if c not in header]
  if missing:
    raise ConversionError("missing_column", f"{path}: missing column(s) {missing} (header: {header})")
  return header, rows


# ------------------------------------------------------------------------------------------------ images

def read_mask_png(path: str, where: str) -> np.ndarray:
  """uint8 0/1 [H, W] by the evaluator's and the official rule (`evqa_io.read_mask`: convert('L') > 0)."""
  try:
    return evqa_io.read_mask(path).astype(np.uint8)
  except (OSError, ValueError) as e:
    raise ConversionError("unreadable_image", f"{where}: {e}") from e


def resize_rgb(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  if img.shape[:2] == tuple(size):
    return img
  return np.asarray(Image.fromarray(img).resize((size[1], size[0]), Image.BILINEAR))


def resize_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  if mask.shape == tuple(size):
    return mask
  return np.asarray(Image.fromarray(mask * 255).resize((size[1], size[0]), Image.NEAREST)) > 127


def _check_points(points: Any, height: int, width: int, where: str, what: str) -> list[tuple[float, float]]:
  if not isinstance(points, (list, tuple)) or len(points) < 3:
    raise ConversionError("bad_mask", f"{where}: {what} must be a list of >= 3 [x, y] points")
  out = []
  for p in points:
    if (not isinstance(p, (list, tuple)) or len(p) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p)):
      raise ConversionError("bad_mask", f"{where}: {what} has a malformed point {p!r}")
    x, y = float(p[0]), float(p[1])
    if not (0 <= x <= width and 0 <= y <= height):
      raise ConversionError("polygon_outside_frame",
                            f"{where}: {what} point ({x}, {y}) lies outside the {width}x{height} frame")
    out.append((x, y))
  return out


def rasterize_polygon(exterior: Sequence, holes: Sequence, height: int, width: int, where: str = "polygon") -> np.ndarray:
  """PIL rasterisation: fill the exterior with 1, then each hole with 0 (boundary pixels included). [H, W] uint8."""
  img = Image.new("L", (width, height), 0)
  draw = ImageDraw.Draw(img)
  draw.polygon(_check_points(exterior, height, width, where, "exterior"), fill=1)
  if not isinstance(holes, (list, tuple)):
    raise ConversionError("bad_mask", f"{where}: holes must be a list of polygons")
  for k, hole in enumerate(holes):
    draw.polygon(_check_points(hole, height, width, where, f"holes[{k}]"), fill=0)
  return np.asarray(img, np.uint8)


def masks_from_instruct(path: str, entry_id: str, num_video_frames: int, height: int, width: int) -> dict[int, np.ndarray]:
  """{frame index at 6 fps: merged 0/1 mask [H, W]} from an ST-Evidence-Instruct JSON."""
  where = f"{path}: entry {entry_id!r}"
  try:
    obj = evqa_io.load_json(path, "instruct JSON")
  except (OSError, ValueError) as e:
    raise ConversionError("unreadable_json", f"{where}: {e}") from e
  if not isinstance(obj, dict):
    raise ConversionError("missing_field", f"{where}: expected a JSON object")
  for key in ("fps", "width", "height", "evidence_objects"):
    if key not in obj:
      raise ConversionError("missing_field", f"{where}: missing field {key!r}")
  fps = obj["fps"]
  if not isinstance(fps, (int, float)) or fps <= 0:
    raise ConversionError("bad_mask", f"{where}: field 'fps' must be a positive number, got {fps!r}")
  if [obj["height"], obj["width"]] != [height, width]:
    raise ConversionError("bad_mask", f"{where}: fields height/width {obj['height']}x{obj['width']} differ from "
                          f"the frames' {height}x{width}")
  if not isinstance(obj["evidence_objects"], list):
    raise ConversionError("bad_mask", f"{where}: field 'evidence_objects' must be a list")
  merged: dict[int, np.ndarray] = {}
  for i, ev in enumerate(obj["evidence_objects"]):
    if not isinstance(ev, dict) or not isinstance(ev.get("masks"), list):
      raise ConversionError("missing_field", f"{where}: evidence_objects[{i}] lacks a 'masks' list")
    for j, m in enumerate(ev["masks"]):
      here = f"{where}: field evidence_objects[{i}].masks[{j}]"
      if not isinstance(m, dict) or "frame" not in m or "mask" not in m:
        raise ConversionError("missing_field", f"{here}: needs keys 'frame' and 'mask'")
      if not isinstance(m["frame"], int) or isinstance(m["frame"], bool) or m["frame"] < 0:
        raise ConversionError("bad_mask", f"{here}: 'frame' must be a non-negative int, got {m['frame']!r}")
      frame = int(round(m["frame"] / fps * FPS))
      if frame >= num_video_frames:
        raise ConversionError("bad_mask", f"{here}: frame {m['frame']} is beyond the video's {num_video_frames} frames")
      mask = m["mask"]
      if isinstance(mask, dict) and "exterior" in mask:
        arr = rasterize_polygon(mask["exterior"], mask.get("holes", []), height, width, here)
      elif isinstance(mask, dict) and "counts" in mask:
        arr = decode_rle(mask, height, width, here)
      else:
        raise ConversionError("bad_mask", f"{here}: 'mask' must be a polygon {{exterior, holes}} or an RLE {{size, counts}}")
      merged[frame] = np.maximum(merged.get(frame, 0), arr).astype(np.uint8)
  return merged


def masks_from_pngs(directory: str, entry_id: str, num_video_frames: int, height: int,
                    width: int) -> tuple[dict[int, np.ndarray], int]:
  """({frame index at 6 fps: 0/1 mask [H, W]}, zero-padding of the PNG names) of one entry's mask folder.

  Every PNG must be named <frame>.png with one padding (st_eval.mask_name_digits): the official evaluator pairs a
  predicted PNG with the ground-truth PNG of the same name, so the predictions are written under the same names.
  """
  where = f"{directory}: entry {entry_id!r}"
  names = sorted(n for n in os.listdir(directory) if n.lower().endswith(".png"))
  try:
    digits = st_eval.mask_name_digits(names, where)
  except ValueError as e:
    raise ConversionError("bad_mask", str(e)) from None
  out = {}
  for name in names:
    frame, path = int(name[:-len(".png")]), os.path.join(directory, name)
    if frame >= num_video_frames:
      raise ConversionError("bad_mask", f"{where}: mask {path} is for frame {frame}, the video has {num_video_frames}")
    m = read_mask_png(path, where)
    if m.shape != (height, width):
      raise ConversionError("bad_mask", f"{where}: mask {path} is {m.shape[1]}x{m.shape[0]}, frames are {width}x{height}")
    out[frame] = m
  return out, digits


def sample_indices(num_video_frames: int, num_frames: int) -> np.ndarray:
  if num_video_frames <= num_frames:
    return np.arange(num_video_frames)
  return np.round(np.linspace(0, num_video_frames - 1, num_frames)).astype(np.int64)


# ----------------------------------------------------------------------------------------------------- MCQ

def load_mcq(path: str) -> dict:
  try:
    obj = evqa_io.load_json(path, "MCQ file")
  except (OSError, ValueError) as e:
    raise ConversionError("unreadable_mcq", str(e)) from e
  if not isinstance(obj, dict):
    raise ConversionError("bad_mcq", f"{path}: expected a JSON object {{entry_id: {{qa, temporal, spatial}}}}")
  return obj


def _answer_index(value: Any, n: int, where: str, field: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
    raise ConversionError("bad_mcq", f"{where}: field {field!r} must be an int in [0, {n}), got {value!r}")
  return value


def parse_mcq_entry(entry: Any, mcq_path: str, entry_id: str, candidates: list[str], answer_index: int,
                    num_video_frames: int, height: int, width: int) -> dict:
  """Validates one MCQ entry; returns segments list, masks [4, H, W] (source size), answers, frame, mask files."""
  where = f"{mcq_path}: entry {entry_id!r}"
  if not isinstance(entry, dict) or not all(isinstance(entry.get(k), dict) for k in ("qa", "temporal", "spatial")):
    raise ConversionError("bad_mcq", f"{where}: needs objects 'qa', 'temporal' and 'spatial'")
  qa, tmp, sp = entry["qa"], entry["temporal"], entry["spatial"]
  options = qa.get("options")
  if not isinstance(options, list) or [str(o).strip() for o in options] != candidates:
    raise ConversionError("bad_mcq", f"{where}: field 'qa.options' {options!r} differs from the CSV candidates {candidates}")
  if _answer_index(qa.get("answer"), len(candidates), where, "qa.answer") != answer_index:
    raise ConversionError("bad_mcq", f"{where}: field 'qa.answer' is {qa.get('answer')}, the CSV answer is option {answer_index}")
  t_opts = tmp.get("options")
  if not isinstance(t_opts, list) or len(t_opts) != NUM_MCQ_OPTIONS:
    raise ConversionError("bad_mcq", f"{where}: field 'temporal.options' must be a list of {NUM_MCQ_OPTIONS} segment lists")
  segments = []
  for k, opt in enumerate(t_opts):
    segs = _as_segments(opt)
    if segs is None:
      raise ConversionError("bad_mcq", f"{where}: field 'temporal.options[{k}]' must be [[start, end], ...], got {opt!r}")
    segments.append(segs)
  t_ans = _answer_index(tmp.get("answer"), NUM_MCQ_OPTIONS, where, "temporal.answer")
  frame = sp.get("frame")
  if not isinstance(frame, int) or isinstance(frame, bool) or not 0 <= frame < num_video_frames:
    raise ConversionError("bad_mcq", f"{where}: field 'spatial.frame' must be a frame index < {num_video_frames}, got {frame!r}")
  s_ans = _answer_index(sp.get("answer"), NUM_MCQ_OPTIONS, where, "spatial.answer")
  rel = sp.get("options_dir")
  try:
    evqa_io.check_relpath(rel, f"{where}: field 'spatial.options_dir'", "options_dir")
  except ValueError as e:
    raise ConversionError("bad_mcq", str(e)) from None
  d = os.path.join(os.path.dirname(os.path.abspath(mcq_path)), rel)
  if not os.path.isdir(d):
    raise ConversionError("bad_mcq", f"{where}: field 'spatial.options_dir': no folder {d}")
  files = [p for _, p in sorted(numbered_images(d, (".png",)).items())]
  if len(files) != NUM_MCQ_OPTIONS:
    raise ConversionError("bad_mcq", f"{where}: {d} holds {len(files)} numbered mask PNGs, expected {NUM_MCQ_OPTIONS}")
  masks = []
  for p in files:
    m = read_mask_png(p, where)
    if m.shape != (height, width):
      raise ConversionError("bad_mcq", f"{where}: candidate mask {p} is {m.shape[1]}x{m.shape[0]}, frames are {width}x{height}")
    masks.append(m)
  return {"segments": segments, "temporal_answer": t_ans, "frame": frame, "spatial_answer": s_ans,
          "masks": np.stack(masks), "mask_files": files}


# ---------------------------------------------------------------------------------------------- converter

def convert(csv_path: str, frames_dir: str, out: str, split: str = "test", masks_dir: str | None = None,
            instruct_dir: str | None = None, mcq_path: str | None = None, num_frames: int = NUM_FRAMES,
            frame_size: tuple[int, int] = FRAME_SIZE, allow_missing_masks: bool = False, num_shards: int = 1,
            skip_bad: bool = False, verbose: bool = True, videos_dir: str | None = None,
            mcq_release: str | None = None, instruct_release: str | None = None,
            vicas_release: str | None = None) -> dict:
  """Converts one split into OUT; returns its counts (also in metadata.json["conversion"][split]).

  `videos_dir` (the release's 6 fps mp4 files) replaces `frames_dir`; `mcq_release` (the st_evidence_mcq folder)
  replaces `mcq_path` (data_prep/evqa_release.py). `instruct_release` (ST-Evidence-Instruct's gen_mask folder) and
  `vicas_release` (its gen_qa/vicas folder) give the CSV, frames and masks of those layouts (module docstring).
  """
  if instruct_release is not None or vicas_release is not None:
    if instruct_release is not None and vicas_release is not None:
      raise ValueError("give --instruct or --vicas, not both (convert them one after the other into OUT)")
    if any(x is not None for x in (csv_path, frames_dir, videos_dir, masks_dir, instruct_dir)):
      raise ValueError("--instruct / --vicas name the CSV, frames and masks themselves: drop --csv, --frames, "
                       "--videos, --masks and --instruct-json")
  if instruct_release is not None:
    from data_prep import evqa_release
    frames = os.path.join(instruct_release, "video_frames_6fps")
    return _convert(os.path.join(instruct_release, "st_evidence.csv"), frames, out, split, None,
                    os.path.join(instruct_release, "masks"), mcq_path, num_frames, frame_size, allow_missing_masks,
                    num_shards, skip_bad, verbose, None, mcq_release, evqa_release.InstructFrames(frames))
  if vicas_release is not None:
    from data_prep import evqa_release
    return _convert(os.path.join(vicas_release, "st_evidence_vicas.csv"), vicas_release, out, split, None, None,
                    mcq_path, num_frames, frame_size, allow_missing_masks, num_shards, skip_bad, verbose, None,
                    mcq_release, evqa_release.VicasVideos(vicas_release))
  return _convert(csv_path, frames_dir, out, split, masks_dir, instruct_dir, mcq_path, num_frames, frame_size,
                  allow_missing_masks, num_shards, skip_bad, verbose, videos_dir, mcq_release)


def _convert(csv_path, frames_dir, out, split, masks_dir, instruct_dir, mcq_path, num_frames, frame_size,
             allow_missing_masks, num_shards, skip_bad, verbose, videos_dir, mcq_release, _cache=None) -> dict:
  # A release layout's frame source (data_prep/evqa_release.py) may name each row's frame folder
  # (`video_key(row, video_id, where)`) and carry the masks itself (`evidence_masks(row, n, h, w, where)`).
  if masks_dir is None and instruct_dir is None and not hasattr(_cache, "evidence_masks"):
    raise ValueError("give --masks (PNG masks) and/or --instruct-json (ST-Evidence-Instruct JSON folder)")
  if (frames_dir is None) == (videos_dir is None):
    raise ValueError("give exactly one of --frames (frame folders) and --videos (the release's mp4 files)")
  height, width = int(frame_size[0]), int(frame_size[1])
  common.check_out(out, [csv_path, frames_dir, videos_dir, masks_dir, instruct_dir, mcq_path, mcq_release])
  header, rows = read_csv(csv_path)
  if _cache is not None:
    cache = _cache
  elif videos_dir is not None:
    from data_prep import evqa_release
    cache = evqa_release.Mp4Videos(videos_dir)
  else:
    cache = FrameFolders(frames_dir)
  if mcq_release is not None:
    if mcq_path is not None:
      raise ValueError("give --mcq or --mcq-release, not both")
    import tempfile
    from data_prep import evqa_release
    with tempfile.TemporaryDirectory() as tmp:
      mcq_path = evqa_release.mcq_from_release(mcq_release, cache, tmp, skip_bad=skip_bad)
      return _convert(csv_path, frames_dir, out, split, masks_dir, instruct_dir, mcq_path, num_frames, frame_size,
                      allow_missing_masks, num_shards, skip_bad, verbose, videos_dir, None, _cache)
  mcq = load_mcq(mcq_path) if mcq_path else {}
  spec = record_spec(num_frames, height, width)
  skipped: collections.Counter = collections.Counter()
  kept_rows: list[dict] = []
  png_entries: list[str] = []
  mcq_kept: dict[str, tuple[dict, list[str]]] = {}
  seen: set[str] = set()

  def convert_row(i: int, row: dict) -> dict:
    where = f"{csv_path}: row {i + 2}"
    for col in CSV_COLUMNS:
      if row.get(col) is None or (col != "video_path" and not row[col].strip()):
        raise ConversionError("missing_field", f"{where}: field {col!r} is empty")
    entry_id, video_id = row["entry_id"], row["video_id"]  # verbatim, as the evaluator: check_id refuses spaces
    try:  # both name folders (masks, frames, ground-truth copies)
      evqa_io.check_id(entry_id, f"{where}, field 'entry_id'", "entry id")
      evqa_io.check_id(video_id, f"{where}, field 'video_id'", "video id")
    except ValueError as e:
      raise ConversionError("bad_id", str(e)) from None
    where = f"{csv_path}: row {i + 2} (entry {entry_id!r})"
    if entry_id in seen:
      raise ConversionError("duplicate_entry", f"{where}: field 'entry_id' repeats an earlier row")
    candidates = parse_candidates(row["candidates"], where)
    answer = row["answer"].strip()
    if answer not in candidates:
      raise ConversionError("answer_not_in_candidates", f"{where}: field 'answer' {answer!r} is not among {candidates}")
    answer_index = candidates.index(answer)
    segments = parse_segments(row["segment"], where)
    video_key = cache.video_key(row, video_id, where) if hasattr(cache, "video_key") else video_id
    files, (h0, w0) = cache.get(video_key, where)
    n = len(files)
    idx = sample_indices(n, num_frames)

    json_path = os.path.join(instruct_dir, entry_id + ".json") if instruct_dir else None
    png_dir = os.path.join(masks_dir, entry_id) if masks_dir else None
    has_masks, from_png, digits = True, False, st_eval.AUTHORS_MASK_DIGITS
    if hasattr(cache, "evidence_masks"):
      mask_by_frame = cache.evidence_masks(row, n, h0, w0, where)
    elif json_path and os.path.exists(json_path):
      mask_by_frame = masks_from_instruct(json_path, entry_id, n, h0, w0)
    elif png_dir and os.path.isdir(png_dir):
      (mask_by_frame, digits), from_png = masks_from_pngs(png_dir, entry_id, n, h0, w0), True
    elif allow_missing_masks:
      mask_by_frame, has_masks = {}, False
    else:
      looked = " or ".join(p for p in (json_path, png_dir) if p)
      raise ConversionError("missing_masks", f"{where}: no evidence masks ({looked} not found)")

    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    masks = np.zeros((num_frames, height, width), np.uint8)
    for k, f in enumerate(idx):
      frames[k] = resize_rgb(cache.frame(int(f), where), (height, width))
      if int(f) in mask_by_frame:
        masks[k] = resize_mask(mask_by_frame[int(f)], (height, width))
    valid = np.zeros(num_frames, bool)
    valid[:len(idx)] = True
    times = np.zeros(num_frames, np.float32)
    times[:len(idx)] = idx / FPS
    indices = np.full(num_frames, -1, np.int32)
    indices[:len(idx)] = idx

    m = None
    if entry_id in mcq:
      m = parse_mcq_entry(mcq[entry_id], mcq_path, entry_id, candidates, answer_index, n, h0, w0)
    s_max = max([len(s) for s in m["segments"]]) if m else 1
    mcq_segments = np.zeros((NUM_MCQ_OPTIONS, s_max, 2), np.float32)
    mcq_len = np.zeros(NUM_MCQ_OPTIONS, np.int32)
    mcq_masks = np.zeros((NUM_MCQ_OPTIONS, height, width), np.uint8)
    if m:
      for k, segs in enumerate(m["segments"]):
        mcq_segments[k, :len(segs)] = segs
        mcq_len[k] = len(segs)
        mcq_masks[k] = resize_mask(m["masks"][k], (height, width))

    ex = {
        "entry_id": entry_id, "video_id": video_id, "question": row["question"].strip(),
        "candidates": np.asarray(candidates, object), "answer_index": np.int32(answer_index),
        "frames": frames, "frame_mask": valid, "frame_times": times, "frame_indices": indices,
        "fps": np.float32(FPS), "num_video_frames": np.int32(n), "orig_size": np.asarray([h0, w0], np.int32),
        "masks": masks, "mask_name_digits": np.int32(digits), "has_masks": np.bool_(has_masks), "segments": segments,
        "has_mcq": np.bool_(m is not None), "mcq_segments": mcq_segments, "mcq_segments_len": mcq_len,
        "mcq_temporal_answer": np.int32(m["temporal_answer"] if m else -1), "mcq_masks": mcq_masks,
        "mcq_frame": np.int32(m["frame"] if m else -1),
        "mcq_spatial_answer": np.int32(m["spatial_answer"] if m else -1),
    }
    try:
      common.check_record(ex, spec, where)
    except ValueError as e:
      raise ConversionError("bad_values", str(e)) from None
    seen.add(entry_id)
    kept_rows.append(row)
    if from_png:
      png_entries.append(entry_id)
    if m:
      mcq_kept[entry_id] = (mcq[entry_id], m["mask_files"])
    return ex

  def examples() -> Iterator[dict]:
    for i, row in enumerate(rows):
      try:
        yield convert_row(i, row)
      except ConversionError as e:
        if not skip_bad:
          raise
        skipped[e.reason] += 1

  # One split per run: OUT's other splits are kept (hard links), this split's files are replaced.
  inputs = [csv_path, frames_dir, videos_dir, masks_dir, instruct_dir, mcq_path, mcq_release]
  with common.build_output(out, inputs, "data_prep.st_evidence", keep_existing=True) as tmp:
    written = records.write_split(tmp, split, examples(), spec, num_shards=num_shards)
    common.check_converted(written, skipped, csv_path, split)
    _write_ground_truth(tmp, split, csv_path, header, kept_rows, masks_dir, png_entries, mcq_path, mcq_kept)

    counts = {"converted": written, "skipped": dict(sorted(skipped.items())),
              "entries_without_mcq": (written - len(mcq_kept)) if mcq_path else written,
              "mcq_entries_not_in_csv": len(set(mcq) - {r["entry_id"] for r in rows})}
    meta = records.load_metadata(tmp)
    conversion = dict(meta.get("conversion", {}))
    conversion[split] = counts
    gt = dict(meta.get("ground_truth", {}))
    gt[split] = {"csv": f"{split}.csv", "gt_masks": GT_MASKS_DIR if png_entries else None,
                 "mcq": f"{split}_mcq.json" if mcq_kept else None}
    records.update_metadata(
        tmp, task="evqa", fps=FPS, num_frames=num_frames, frame_size=[height, width], conversion=conversion,
        ground_truth=gt, record_schema=__doc__[__doc__.index("Record schema"):__doc__.index("Besides")].strip())
  if verbose:
    reasons = ", ".join(f"{k}={v}" for k, v in counts["skipped"].items()) or "none"
    print(f"{split}: converted {written} entries, skipped {sum(skipped.values())} ({reasons}); "
          f"{counts['entries_without_mcq']} without MCQ")
  return counts


def _copy(src: str, dst: str) -> None:
  with evqa_io.atomic_path(dst) as tmp:
    shutil.copyfile(src, tmp)


def _write_ground_truth(out, split, csv_path, header, kept_rows, masks_dir, png_entries, mcq_path, mcq_kept):
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
  writer.writeheader()
  writer.writerows(kept_rows)
  evqa_io.write_text(os.path.join(out, f"{split}.csv"), buf.getvalue())
  for entry_id in png_entries:
    src = os.path.join(masks_dir, entry_id)
    for name in sorted(os.listdir(src)):
      if name.lower().endswith(".png"):
        _copy(os.path.join(src, name), os.path.join(out, GT_MASKS_DIR, entry_id, name))
  if mcq_kept:
    gt = {}
    for entry_id, (entry, files) in mcq_kept.items():
      rel = f"{MCQ_MASKS_DIR}/{entry_id}/"
      for p in files:
        _copy(p, os.path.join(out, rel, os.path.basename(p)))
      gt[entry_id] = {**entry, "spatial": {**entry["spatial"], "options_dir": rel}}
    evqa_io.write_json(os.path.join(out, f"{split}_mcq.json"), gt)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--csv", default=None,
                 help="QA CSV (entry_id, video_id, video_path, question, candidates, answer, segment)")
  p.add_argument("--instruct", default=None,
                 help="ST-Evidence-Instruct's gen_mask folder (st_evidence.csv, masks/, video_frames_6fps/)")
  p.add_argument("--vicas", default=None,
                 help="ST-Evidence-Instruct's gen_qa/vicas folder (st_evidence_vicas.csv, annotations/, video_frames/)")
  p.add_argument("--frames", default=None, help="folder of frames/<video_id>/<frame:05d>.png at 6 fps")
  p.add_argument("--videos", default=None, help="the release's videos_6fps folder (<video_id>.mp4), instead of --frames")
  p.add_argument("--mcq-release", default=None,
                 help="the release's st_evidence_mcq folder (temp_options.json, mask_options.json, options.tar.gz)")
  p.add_argument("--masks", default=None, help="gt_masks folder: <entry_id>/<frame>.png")
  p.add_argument("--instruct-json", default=None, help="folder of ST-Evidence-Instruct <entry_id>.json")
  p.add_argument("--mcq", default=None, help="ST-Evidence-MCQ JSON")
  p.add_argument("--split", default="test")
  p.add_argument("--num-frames", type=settings.arg(settings.POSITIVE_INT, "--num-frames"), default=NUM_FRAMES)
  p.add_argument("--frame-size", type=settings.arg(settings.POSITIVE_INT, "--frame-size"), nargs=2, default=list(FRAME_SIZE), metavar=("H", "W"))
  p.add_argument("--allow-missing-masks", action="store_true",
                 help="convert entries without masks (empty masks, has_masks=False) instead of failing")
  p.add_argument("--num-shards", type=settings.arg(settings.POSITIVE_INT, "--num-shards"), default=1)
  p.add_argument("--skip-bad", action="store_true", help="skip and count bad entries instead of failing")
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  evqa_io.check_args(a, ["out"])
  if a.instruct is not None or a.vicas is not None:
    if a.instruct is not None and a.vicas is not None:
      p.error("give --instruct or --vicas, not both (convert them one after the other into OUT)")
    taken = [f for f, v in (("--csv", a.csv), ("--frames", a.frames), ("--videos", a.videos), ("--masks", a.masks),
                            ("--instruct-json", a.instruct_json)) if v is not None]
    if taken:
      p.error(f"--instruct / --vicas name the CSV, frames and masks themselves: drop {', '.join(taken)}")
  else:
    if a.csv is None:
      p.error("give --csv (or --instruct / --vicas for ST-Evidence-Instruct's folders)")
    if a.masks is None and a.instruct_json is None:
      p.error("give --masks and/or --instruct-json")
    if (a.frames is None) == (a.videos is None):
      p.error("give exactly one of --frames and --videos")
  convert(a.csv, a.frames, a.out, a.split, a.masks, a.instruct_json, a.mcq, a.num_frames, tuple(a.frame_size),
          a.allow_missing_masks, a.num_shards, a.skip_bad, videos_dir=a.videos, mcq_release=a.mcq_release,
          instruct_release=a.instruct, vicas_release=a.vicas)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
