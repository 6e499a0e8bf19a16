"""ST-Evidence release inputs for the E-VQA converter (data_prep/st_evidence.py): 6 fps mp4 videos and MCQ files.

The release (SalesforceAIResearch/EVQA benchmark/HUGGINGFACE_README.md):
  st_evidence_gen/  st_evidence_gen.csv, videos_6fps.tar.gz (-> <video_id>.mp4, 6 fps), masks.tar.gz
                    (-> <entry_id>/<frame>.png, read by the converter's --masks as they are). The names are not
                    documented; the authors' prediction scripts (benchmark/st_evidence_gen/*_st_evidence.py) write
                    the mask of 6-fps frame i as str(i).zfill(5) + ".png" and eval_st_evidence.py pairs files by
                    exact name, so the release's are "00012.png"; the converter keeps each folder's padding
                    (records field mask_name_digits) and the prediction writer reuses it.
  st_evidence_mcq/  st_evidence_mcq.csv (entry_id, video_id | video, video_path, question, candidates | options,
                    answer, segment, ...), temp_options.json, mask_options.json, options.tar.gz

Videos: `<videos_dir>/<video_id>.mp4` or one folder below (`<videos_dir>/*/<video_id>.mp4`), as the authors'
scripts look them up; decoded with PyAV, every frame in order, RGB uint8. A video whose stream is not 6 fps is an
error: masks and segments are indexed at 6 fps.

MCQ (benchmark/st_evidence_mcq/*_st_evidence_mcq.py):
  temp_options.json  {entry_id: {"time_evidence_options": [[[s, e], ...] x 4], "correct_answer": "A".."D" (or an
                      index), "ground_truth_segments", "question"}}
  mask_options.json  {entry_id: {"gt", "d1", "d2", "d3": image paths, "options": the 4 keys in option order,
                      "answer": index}} or {entry_id: {"mcq_options": [4 image paths], "answer" | "correct_answer"}};
                      paths are relative to the folder options.tar.gz is extracted in (absolute paths are used as
                      they are); an entry may also be keyed otherwise and carry "entry_id".
  options.tar.gz     the option images: a video frame with a red boundary drawn around each candidate (the
                      authors' spatial prompt: "Each image has a red mask boundary overlaid on it, highlighting a
                      different object or region"; which frame, and how thick the line, is not documented).
The released spatial options are pictures, not masks. `mcq_from_release` recovers what the records need: the
reference frame is the video frame closest to the option images (mean absolute difference), and each candidate
mask is the region enclosed by the pixels where the option image differs from that frame (the drawn boundary,
holes filled). It writes the converter's MCQ JSON (see data_prep/st_evidence.py --mcq) and the candidate PNGs.
"""

from __future__ import annotations

import ast
import csv
import glob
import json
import os
import tarfile
import zlib

import numpy as np

from evqa_jax import io as evqa_io
from evqa_jax import io as io_lib

FPS = 6.0
NUM_OPTIONS = 4
_BOUNDARY_DIFF = 40  # per-channel difference that marks a drawn boundary pixel (codec noise stays far below)


from data_prep import st_evidence_common
from data_prep.st_evidence_common import ConversionError as ReleaseError  # reason = the converter's --skip-bad key


# ---------------------------------------------------------------------------------- ST-Evidence-Instruct frames

class InstructFrames:
  """Frames of ST-Evidence-Instruct's gen_mask part: `video_frames_6fps/<video>/frame_%04d.jpg`, <video> the CSV's
  video_path without its extension (the authors' STEvidenceGenMaskDataset: os.path.splitext(video_path)[0]).

  The converter's frame source (st_evidence_common.FrameFolders' interface) plus `video_key(row, video_id, where)`.
  """

  def __init__(self, frames_root: str):
    self.frames_root = frames_root
    self._cache = st_evidence_common.FrameFolders(frames_root)

  def video_key(self, row: dict, video_id: str, where: str) -> str:
    del video_id
    rel = os.path.splitext(str(row.get("video_path") or "").strip())[0]
    try:  # a path from the CSV: it must stay inside video_frames_6fps/
      evqa_io.check_relpath(rel, f"{where}, field 'video_path'", "video folder")
    except ValueError as e:
      raise ReleaseError("bad_id", str(e)) from None
    return rel

  def get(self, key: str, where: str):
    return self._cache.get(key, where)

  def frame(self, index: int, where: str) -> np.ndarray:
    return self._cache.frame(index, where)


class VicasVideos:
  """Frames and evidence masks of ST-Evidence-Instruct's gen_qa/vicas part (the authors' STEvidenceGenQADataset).

  annotations/v1.0/<video_id:06d>.json: {"segmentations": [{"filename", "track_ids": [int], "mask_rles": [COCO
  RLE]}, ...]} one entry per frame, in order; frames video_frames/<video_id:06d>/<filename>. A row's evidence mask of
  frame i merges the RLEs of its `mask_evidence` track ids ("[1, 2]") present in segmentations[i] (absent: empty).
  The frames are taken to be at 6 fps (an annotation with another numeric "fps" is an error).
  """

  def __init__(self, root: str):
    self.root = root
    self.key, self.files, self.size, self.anno, self.decoded = None, None, None, None, {}

  def _load(self, video_id: str, where: str):
    if self.key == video_id:
      return
    vid = video_id.zfill(6)
    path = os.path.join(self.root, "annotations", "v1.0", f"{vid}.json")
    try:
      anno = evqa_io.load_json(path, "ViCaS annotation")
    except (OSError, ValueError) as e:
      raise ReleaseError("missing_masks", f"{where}: field 'video_id': {e}") from None
    segs = anno.get("segmentations") if isinstance(anno, dict) else None
    if not isinstance(segs, list) or not segs:
      raise ReleaseError("bad_mask", f"{where}: {path}: field 'segmentations' must be a non-empty list")
    fps = anno.get("fps")
    if isinstance(fps, (int, float)) and not isinstance(fps, bool) and abs(float(fps) - FPS) > 1e-3:
      raise ReleaseError("bad_frame", f"{where}: {path}: field 'fps' is {fps}, the records are indexed at {FPS:g} fps")
    files = {}
    for i, seg in enumerate(segs):
      name = seg.get("filename") if isinstance(seg, dict) else None
      try:
        evqa_io.check_id(name, f"{where}: {path}: segmentations[{i}].filename", "frame file")
      except ValueError as e:
        raise ReleaseError("bad_frame", str(e)) from None
      files[i] = os.path.join(self.root, "video_frames", vid, name)
    first = st_evidence_common.read_image(files[0], "RGB", where)
    self.key, self.files, self.size, self.anno, self.decoded = video_id, files, first.shape[:2], (path, segs), {0: first}

  def get(self, video_id: str, where: str):
    self._load(video_id, where)
    return self.files, self.size

  def frame(self, index: int, where: str) -> np.ndarray:
    if index not in self.decoded:
      img = st_evidence_common.read_image(self.files[index], "RGB", where)
      if img.shape[:2] != tuple(self.size):
        raise ReleaseError("bad_frame", f"{where}: frame {self.files[index]} is {img.shape[1]}x{img.shape[0]}, "
                           f"frame 0 is {self.size[1]}x{self.size[0]}")
      self.decoded[index] = img
    return self.decoded[index]

  def evidence_masks(self, row: dict, num_frames: int, height: int, width: int, where: str) -> dict:
    """{frame index: merged 0/1 mask [H, W]} of the row's mask_evidence tracks (frames where one is present)."""
    try:
      tracks = ast.literal_eval(str(row.get("mask_evidence", "")).strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
      tracks = None
    if (not isinstance(tracks, list) or not tracks
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in tracks)):
      raise ReleaseError("bad_mask", f"{where}: field 'mask_evidence' must be a non-empty list of ViCaS track ids "
                         f"such as \"[1, 2]\", got {row.get('mask_evidence')!r}")
    path, segs = self.anno
    out = {}
    for i, seg in enumerate(segs[:num_frames]):
      ids, rles = seg.get("track_ids"), seg.get("mask_rles")
      if not isinstance(ids, list) or not isinstance(rles, list) or len(ids) != len(rles):
        raise ReleaseError("bad_mask", f"{where}: {path}: segmentations[{i}] needs 'track_ids' and 'mask_rles' "
                           "lists of one length")
      for t in tracks:
        if t in ids:
          m = st_evidence_common.decode_rle(rles[ids.index(t)], height, width, f"{where}: {path}: segmentations[{i}] "
                                     f"track {t}")
          out[i] = np.maximum(out.get(i, 0), m).astype(np.uint8)
    if not out:
      raise ReleaseError("missing_masks", f"{where}: none of the mask_evidence tracks {tracks} occurs in {path}")
    return out


# ------------------------------------------------------------------------------------------------------ videos

def video_index(videos_dir: str) -> dict[str, str]:
  """{video_id: path} of the .mp4 files in `videos_dir` and one folder below (a top-level file wins)."""
  if not os.path.isdir(videos_dir):
    raise ReleaseError("missing_frames", f"--videos {videos_dir} is not a folder (extract videos_6fps.tar.gz)")
  out = {}
  for path in sorted(glob.glob(os.path.join(videos_dir, "*", "*.mp4"))) + sorted(
      glob.glob(os.path.join(videos_dir, "*.mp4"))):
    out[os.path.basename(path)[:-len(".mp4")]] = path
  return out


def decode_mp4(path: str, fps: float = FPS) -> np.ndarray:
  """Every frame of the first video stream of `path`: uint8 [N, H, W, 3] RGB. Error when the stream is not `fps`."""
  try:
    import av
  except ImportError as e:
    raise ImportError("decoding the ST-Evidence mp4 videos needs PyAV: `pip install av`") from e
  try:
    with av.open(path) as container:
      if not container.streams.video:
        raise ReleaseError("bad_frame", f"{path}: no video stream")
      stream = container.streams.video[0]
      rate = stream.average_rate or stream.base_rate
      if rate is None or abs(float(rate) - fps) > 1e-3:
        raise ReleaseError("bad_frame", f"{path}: video stream is {float(rate) if rate else 'unknown'} fps, expected "
                           f"{fps:g} (masks and segments are indexed at {fps:g} fps)")
      frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
  except av.error.FFmpegError as e:
    raise ReleaseError("bad_frame", f"{path}: cannot decode ({e})") from e
  if not frames:
    raise ReleaseError("bad_frame", f"{path}: no frames decoded")
  return np.stack(frames)


class Mp4Videos:
  """The converter's frame source (the interface of st_evidence_common.FrameFolders) over a folder of mp4 files.

  get(video_id, where) -> ({frame index: frame index}, (height, width)); frame(index, where) -> uint8 [H, W, 3].
  The most recent video stays decoded (rows of one video are usually adjacent in the CSV).
  """

  def __init__(self, videos_dir: str):
    self.videos_dir = videos_dir
    self.paths = video_index(videos_dir)
    self.key, self.frames = None, None

  def decoded(self, video_id: str, where: str) -> np.ndarray:
    if self.key != video_id:
      path = self.paths.get(video_id)
      if path is None:
        raise ReleaseError("missing_frames", f"{where}: field 'video_id': no {video_id}.mp4 in {self.videos_dir} "
                           "(nor one folder below)")
      try:
        self.frames = decode_mp4(path)
      except ReleaseError as e:
        raise ReleaseError(e.reason, f"{where}: {e}") from None
      self.key = video_id
    return self.frames

  def get(self, video_id: str, where: str) -> tuple[dict[int, int], tuple[int, int]]:
    frames = self.decoded(video_id, where)
    return {i: i for i in range(len(frames))}, frames.shape[1:3]

  def frame(self, index: int, where: str) -> np.ndarray:
    return self.frames[index]


# --------------------------------------------------------------------------------------------------------- MCQ

def _read_json(path: str, what: str) -> dict:
  try:
    obj = io_lib.load_json(path, what)
  except (OSError, ValueError) as e:
    raise ReleaseError("unreadable_mcq", f"{path}: cannot read {what} ({e})") from e
  if not isinstance(obj, dict):
    raise ReleaseError("bad_mcq", f"{path}: expected a JSON object keyed by entry_id")
  return obj


def _letter_or_index(value, where: str, field: str) -> int:
  if isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in "ABCD":
    return "ABCD".index(value.strip().upper())
  if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < NUM_OPTIONS:
    return value
  raise ReleaseError("bad_mcq", f"{where}: field {field!r} must be a letter A-D or an index 0-3, got {value!r}")


def extract_options(mcq_dir: str, work_dir: str) -> str:
  """The folder the option image paths are relative to: `mcq_dir` when it already holds options/, else
  options.tar.gz extracted into `work_dir` (regular files and folders only, nothing outside it)."""
  if os.path.isdir(os.path.join(mcq_dir, "options")):
    return mcq_dir
  tar_path = os.path.join(mcq_dir, "options.tar.gz")
  if not os.path.exists(tar_path):
    raise ReleaseError("bad_mcq", f"{mcq_dir}: neither options/ nor options.tar.gz (the spatial option images)")
  try:
    with tarfile.open(tar_path, "r:gz") as tar:
      # Sizes come from the member headers: more than gzip can expand the archive to is a lie, refused before
      # anything is written (a header claiming terabytes would fill the disk or end in a bare error).
      claimed = sum(m.size for m in tar.getmembers())
      limit = io_lib.MAX_DEFLATE_RATIO * os.path.getsize(tar_path) + 4096
      if claimed > limit:
        raise ReleaseError("bad_mcq", f"{tar_path}: its member headers claim {claimed} bytes, more than the "
                           f"{os.path.getsize(tar_path)}-byte archive can hold; refused")
      if hasattr(tarfile, "data_filter"):
        tar.extractall(work_dir, filter="data")
      else:  # Python without extraction filters: the same rule, checked by hand
        for m in tar.getmembers():
          if not (m.isfile() or m.isdir()) or os.path.isabs(m.name) or ".." in m.name.split("/"):
            raise ReleaseError("bad_mcq", f"{tar_path}: member {m.name!r} is not a plain file inside the archive")
        tar.extractall(work_dir)
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise ReleaseError("bad_mcq", f"{tar_path}: cannot extract ({type(e).__name__}: {e})") from None
  return work_dir


def _spatial_paths(entry: dict, where: str) -> list[str]:
  if isinstance(entry.get("options"), list):
    keys = entry["options"]
    if len(keys) != NUM_OPTIONS or any(not isinstance(entry.get(k), str) for k in keys):
      raise ReleaseError("bad_mcq", f"{where}: field 'options' must name {NUM_OPTIONS} keys holding image paths, "
                         f"got {keys!r}")
    return [entry[k] for k in keys]
  paths = entry.get("mcq_options")
  if not isinstance(paths, list) or len(paths) != NUM_OPTIONS or not all(isinstance(p, str) for p in paths):
    raise ReleaseError("bad_mcq", f"{where}: needs 'options' (keys of gt/d1/d2/d3) or 'mcq_options' "
                       f"({NUM_OPTIONS} image paths)")
  return paths


def recover_spatial(images: list[np.ndarray], frames: np.ndarray, where: str) -> tuple[int, np.ndarray]:
  """(reference frame index, candidate masks bool [4, H, W]) from option images [H, W, 3] drawn on a frame.

  The reference frame minimises the mean absolute difference to the option images; a candidate's mask is the
  region enclosed by its boundary pixels (any channel differing from the frame by more than _BOUNDARY_DIFF).
  """
  from scipy import ndimage
  h, w = frames.shape[1:3]
  for k, img in enumerate(images):
    if img.shape != (h, w, 3):
      raise ReleaseError("bad_mcq", f"{where}: option image {k} is {img.shape[1]}x{img.shape[0]}, the video is "
                         f"{w}x{h}")
  stack = np.stack(images).astype(np.int16)
  cost = [np.abs(stack - f.astype(np.int16)[None]).mean() for f in frames]
  ref = int(np.argmin(cost))
  masks = []
  for k, img in enumerate(stack):
    boundary = (np.abs(img - frames[ref].astype(np.int16)) > _BOUNDARY_DIFF).any(-1)
    if not boundary.any():
      raise ReleaseError("bad_mcq", f"{where}: option image {k} shows no drawn boundary on frame {ref}")
    masks.append(ndimage.binary_fill_holes(boundary))
  return ref, np.stack(masks)


def read_mcq_csv(path: str) -> dict[str, dict]:
  """{entry_id: row} of st_evidence_mcq.csv with `video_id` and `candidates` (the authors' scripts read the
  columns `video` and `options`; either name is accepted)."""
  try:
    with open(path, newline="", encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
  except OSError as e:
    raise ReleaseError("unreadable_mcq", f"{path}: cannot read ({e})") from e
  out = {}
  for i, row in enumerate(rows):
    where = f"{path}: row {i + 2}"
    video = row.get("video_id") or row.get("video")
    options = row.get("candidates") or row.get("options")
    if not row.get("entry_id") or not video or not options or row.get("answer") is None:
      raise ReleaseError("missing_field", f"{where}: needs entry_id, video_id (or video), candidates (or options) "
                         "and answer")
    try:
      cands = ast.literal_eval(options)
    except (ValueError, SyntaxError) as e:
      raise ReleaseError("bad_candidates", f"{where}: field 'candidates' is not a python list string") from e
    try:  # ids verbatim, one rule everywhere (io_lib.check_id refuses surrounding spaces)
      entry_id = io_lib.check_id(row["entry_id"], f"{where}, field 'entry_id'", "entry id")
      video = io_lib.check_id(video, f"{where}, field 'video_id'", "video id")
    except ValueError as e:
      raise ReleaseError("bad_id", str(e)) from None
    out[entry_id] = {"video_id": video, "candidates": [str(c).strip() for c in cands],
                     "answer": row["answer"].strip()}
  return out


def mcq_from_release(mcq_dir: str, videos: Mp4Videos, out_dir: str, skip_bad: bool = False) -> str:
  """Writes the converter's MCQ JSON (`out_dir/mcq.json`, candidate PNGs under `out_dir/mcq_masks/<entry_id>/`)
  from the release's st_evidence_mcq.csv, temp_options.json, mask_options.json and option images; returns its
  path. Entries of the CSV missing from either options file are left out (the converter counts them as entries
  without MCQ), and so are malformed entries with `skip_bad` (else ReleaseError naming file, entry and field)."""
  rows = read_mcq_csv(os.path.join(mcq_dir, "st_evidence_mcq.csv"))
  temp = _read_json(os.path.join(mcq_dir, "temp_options.json"), "temporal options")
  spatial = _read_json(os.path.join(mcq_dir, "mask_options.json"), "mask options")
  spatial = {str(v.get("entry_id", k)) if isinstance(v, dict) else k: v for k, v in spatial.items()}
  root = extract_options(mcq_dir, os.path.join(out_dir, "_options"))
  out = {}
  for entry_id, row in rows.items():
    if entry_id not in temp or entry_id not in spatial:
      continue
    try:
      out[entry_id] = _mcq_entry(mcq_dir, entry_id, row, temp[entry_id], spatial[entry_id], root, videos, out_dir)
    except ReleaseError:
      if not skip_bad:
        raise
  path = os.path.join(out_dir, "mcq.json")
  with open(path, "w") as f:
    json.dump(out, f)
  return path


def _mcq_entry(mcq_dir, entry_id, row, t, s, root, videos, out_dir) -> dict:
  """One entry of the converter's MCQ JSON (see mcq_from_release); writes its candidate PNGs."""
  from PIL import Image
  where = f"{mcq_dir}: entry {entry_id!r}"
  if row["answer"].lower() not in [c.lower() for c in row["candidates"]]:
    raise ReleaseError("answer_not_in_candidates", f"{where}: answer {row['answer']!r} is not among the options "
                       f"{row['candidates']}")
  qa_answer = [c.lower() for c in row["candidates"]].index(row["answer"].lower())
  t_opts = t.get("time_evidence_options") if isinstance(t, dict) else None
  if not isinstance(t_opts, list) or len(t_opts) != NUM_OPTIONS:
    raise ReleaseError("bad_mcq", f"{where}: temp_options.json field 'time_evidence_options' must hold "
                       f"{NUM_OPTIONS} segment lists")
  t_answer = _letter_or_index(t.get("correct_answer"), f"{where} (temp_options.json)", "correct_answer")
  if not isinstance(s, dict):
    raise ReleaseError("bad_mcq", f"{where}: mask_options.json entry must be an object")
  s_answer = _letter_or_index(s.get("answer", s.get("correct_answer")), f"{where} (mask_options.json)", "answer")
  images = []
  for p in _spatial_paths(s, f"{where} (mask_options.json)"):
    full = p if os.path.isabs(p) else os.path.join(root, p)
    try:
      images.append(io_lib.read_image(full, "RGB", "option image"))
    except (OSError, ValueError) as e:
      raise ReleaseError("bad_mcq", f"{where}: option image {full} cannot be read ({e})") from e
  frames = videos.decoded(row["video_id"], where)
  ref, masks = recover_spatial(images, frames, where)
  rel = f"mcq_masks/{entry_id}/"
  os.makedirs(os.path.join(out_dir, rel), exist_ok=True)
  for k, m in enumerate(masks):
    Image.fromarray(m.astype(np.uint8) * 255).save(os.path.join(out_dir, rel, f"{k}.png"))
  return {"qa": {"options": row["candidates"], "answer": qa_answer},
          "temporal": {"options": t_opts, "answer": t_answer},
          "spatial": {"frame": ref, "options_dir": rel, "answer": s_answer}}
