"""OVQA converter from the datasets' own videos: the OVQA / FrozenBiLM CSVs + raw videos -> pixel records.

    python -m data_prep.ovqa_frames --csv-dir D --videos V --dataset msvd|msrvtt|tgif|activitynet --out OUT \
        [--num-frames 3] [--frame-size 224] [--recipe allinone|violet] [--video-map youtube_mapping.txt]
        [--subtitles S] [--authors-vocab A] [--cvqa-vocab F] [--cvqa-topk K] [--skip-bad] [--num-shards N]
        [--workers N] [--trust-pickles]
    python -m data_prep.ovqa_frames --ovqa-release meta_data/msvd --videos YouTubeClips --dataset msvd --out OUT

The CSVs, vocabularies, subtitles, bad-row handling and output layout are data_prep/ovqa.py's (its `convert_with`);
only the video changes: instead of a feature dict, each row's video is read from V, sampled and resized here.

Videos (found by the CSV's video_id among the files of V and of the folders one below it; an id is checked as a file
name first, `evqa_jax.io.check_id`, and only ever looked up in that listing, never joined into a path):
  msvd         <name>.avi (YouTubeClips/); with --video-map (MSVD-QA's youtube_mapping.txt, lines "<name> vid<N>")
               the ids vid<N> or <N> name the clip <name>
  msrvtt       video<N>.mp4 (the id video<N>, or <N>)
  tgif         <gif_name>.gif
  activitynet  v_<id>.mp4 / .mkv / .webm (the id with or without its v_)
decoded with PyAV (every frame of the first video stream, RGB).

Frames (--recipe; T = --num-frames, S = --frame-size, n = the video's decoded frame count, n >= T):
  allinone  showlab/all-in-one (AllInOne/datasets/video_base_dataset.py, transforms/videoaug.py, backend a100):
            indices: the T segments np.linspace(0, n, T + 1).astype(int), [x0, x1 - 1] each, and its middle frame
            (x0 + x1 - 1) // 2 (their evaluation sampling, 'uniform'; training draws a random frame per segment,
            which records of T frames cannot: the records keep the middle one);
            spatial: mp4 / avi / mkv frames squashed to 512 x 512 (their decord reader's width=512, height=512;
            bilinear here), GIFs as they are (their imageio reader); the shorter side resized to R = int(1.2 S),
            nearest neighbour (their Resize, cv2.INTER_NEAREST), and the centre R x R kept; the Input then crops S x S:
            at random in training (config.data.augment = "allinone", their RandomCrop), at the centre otherwise
            (their CenterCrop).
  violet    tsujuifu/pytorch_violet (_tools/extract_video-frame.py, dataset.py str2img): indices int(n / (T + 1) *
            (i + 1)), i < T; spatial: zero-padded to a square (the shorter side by (long - short) // 2 on each side),
            resized to S x S (PIL bilinear). R = S: no augmentation (their fine-tuning has none). Their frames pass
            through JPEG once; these do not.

Output: data_prep/ovqa.py's layout; the record holds the frames instead of `video` / `video_mask`:
  frames            uint8 [T, R, R, 3]  RGB, the sampled frames after the recipe's resize (R = metadata
                                        "stored_size"), with --frame-format raw (the default); with jpeg instead
  frames_jpeg       uint8 [N]           the T frames as JPEG files (--jpeg-quality, PIL), back to back
  frames_jpeg_ends  int64 [T]           the end offset of each (the Input decodes them to `frames`)
metadata.json adds "video_input": "frames", "num_frames": T, "frame_size": S (what the model sees), "stored_size": R,
"frame_recipe", "frame_indices" ("segment middles" or "violet"), "frame_format", "jpeg_quality", "dataset".
Raw frames take T * R * R * 3 bytes per CSV row (3 frames at R = 268: 646 kB a row, 102 GB for MSRVTT-QA's 158,581
train rows); --frame-format jpeg stores them compressed (lossy, decoded by the input).

Bad rows (besides data_prep/ovqa.py's): missing_video (no file for the id), bad_video (unreadable, no video stream,
no frame decoded), short_video (fewer than T frames): an error naming the CSV row, the id and the file, or with
--skip-bad skipped and counted in metadata.json's "conversion".
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
from typing import Sequence

import numpy as np

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import settings
from evqa_jax.data import frames as frames_lib
from evqa_jax.data.example import Feature
from data_prep import common
from data_prep import ovqa

DATASET_EXTENSIONS = {"msvd": (".avi",), "msrvtt": (".mp4",), "tgif": (".gif",),
                      "activitynet": (".mp4", ".mkv", ".webm")}
RECIPES = ("allinone", "violet")
FRAME_FORMATS = ("raw", "jpeg")
ALLINONE_SQUASH = 512  # their decord reader's width and height
ALLINONE_RESIZE = 1.2  # their Resize(int(crop_size * 1.2))
_CACHE_VIDEOS = 256


def stored_size(frame_size: int, recipe: str) -> int:
  """R, the side of the stored frames: int(1.2 S) for allinone (the Input crops S from it), S for violet."""
  return int(frame_size * ALLINONE_RESIZE) if recipe == "allinone" else frame_size


def sample_indices(num_video_frames: int, num_frames: int, recipe: str) -> list[int]:
  """The frame indices the recipe keeps of a video of `num_video_frames` >= `num_frames` frames (module docstring)."""
  n, t = num_video_frames, num_frames
  if recipe == "allinone":
    edges = np.linspace(start=0, stop=n, num=t + 1).astype(int)
    return [int((edges[i] + edges[i + 1] - 1) // 2) for i in range(t)]
  if recipe == "violet":
    step = n / (t + 1)
    return [int(step * (i + 1)) for i in range(t)]
  raise ValueError(f"frame recipe {recipe!r}: expected one of {RECIPES}")


def _nearest(img: np.ndarray, height: int, width: int) -> np.ndarray:
  """cv2.resize(img, (width, height), interpolation=cv2.INTER_NEAREST): source pixel floor(i * in / out)."""
  h, w = img.shape[:2]
  rows = np.minimum((np.arange(height) * (h / height)).astype(np.int64), h - 1)
  cols = np.minimum((np.arange(width) * (w / width)).astype(np.int64), w - 1)
  return img[rows][:, cols]


def resize_frame(frame: np.ndarray, recipe: str, frame_size: int, squash: bool) -> np.ndarray:
  """One decoded RGB frame [H, W, 3] -> uint8 [R, R, 3] (module docstring); `squash`: a video file's frame (All-in-one
  reads those at 512 x 512), not a GIF's."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  frame = np.asarray(frame, np.uint8)
  if recipe == "violet":
    h, w = frame.shape[:2]
    pad_h, pad_w = ((w - h) // 2, 0) if w > h else (0, (h - w) // 2)  # their Pad([0, (w-h)//2] if w>h else ...)
    frame = np.pad(frame, ((pad_h, pad_h), (pad_w, pad_w), (0, 0)))
    return np.asarray(Image.fromarray(frame).resize((frame_size, frame_size), Image.BILINEAR))
  size = stored_size(frame_size, recipe)
  if squash:
    frame = np.asarray(Image.fromarray(frame).resize((ALLINONE_SQUASH, ALLINONE_SQUASH), Image.BILINEAR))
  h, w = frame.shape[:2]
  if min(h, w) != size:  # their get_resize_sizes: the shorter side to `size`, the other scaled and floored
    oh, ow = (int(size * h / w), size) if w < h else (size, int(size * w / h))
    frame = _nearest(frame, oh, ow)
  h, w = frame.shape[:2]
  y, x = int(round((h - size) / 2.)), int(round((w - size) / 2.))  # their CenterCrop
  return np.ascontiguousarray(frame[y:y + size, x:x + size])


def decode_frames(path: str, indices_of) -> tuple[list[int], list[np.ndarray]]:
  """(indices, RGB frames [H, W, 3]) of `path`'s first video stream at `indices_of(n)`, n its decoded frame count.
  One pass when the container's frame count is right, two otherwise. Raises ovqa.BadRow (bad_video, short_video)."""
  try:
    import av  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("decoding raw videos needs PyAV: `pip install av`") from e
  want, kept, n = None, {}, 0
  for attempt in range(2):
    try:
      with av.open(path) as container:
        if not container.streams.video:
          raise ovqa.BadRow("bad_video", "video_id", f"{path}: no video stream")
        stream = container.streams.video[0]
        if attempt == 0 and stream.frames:
          try:
            want = set(indices_of(int(stream.frames)))
          except ovqa.BadRow:
            want = None
        n = 0
        for frame in container.decode(stream):
          if want is not None and n in want:
            kept[n] = frame.to_ndarray(format="rgb24")
          n += 1
    except (av.error.FFmpegError, OSError, ValueError) as e:
      raise ovqa.BadRow("bad_video", "video_id", f"{path}: cannot decode ({type(e).__name__}: {e})") from None
    if n == 0:
      raise ovqa.BadRow("bad_video", "video_id", f"{path}: no frame decoded")
    indices = indices_of(n)
    if want is not None and set(indices) <= set(kept):
      return indices, [kept[i] for i in indices]
    want, kept = set(indices), {}
  raise ovqa.BadRow("bad_video", "video_id", f"{path}: decodes to a different number of frames on each pass")


def read_video(path: str, num_frames: int, frame_size: int, recipe: str, jpeg_quality: int = 0):
  """uint8 [T, R, R, 3]: the recipe's frames of the video file `path` (module docstring), or with `jpeg_quality`
  their encode_jpeg fields; ovqa.BadRow otherwise."""
  def indices_of(n: int) -> list[int]:
    if n < num_frames:
      raise ovqa.BadRow("short_video", "video_id", f"{path}: {n} frame(s), fewer than --num-frames {num_frames}")
    return sample_indices(n, num_frames, recipe)

  _, frames = decode_frames(path, indices_of)
  squash = not path.lower().endswith(".gif")
  out = np.stack([resize_frame(f, recipe, frame_size, squash) for f in frames])
  return frames_lib.encode_jpeg(out, jpeg_quality) if jpeg_quality else out


def _read_task(args):
  """read_video in a worker process: the frames (or their JPEG fields), or (reason, message) (a BadRow does not
  pickle)."""
  try:
    return read_video(*args)
  except ovqa.BadRow as bad:
    return (bad.reason, bad.message)


# Codec per file type for `write_video` (the synthetic world and the fixtures write real videos in the datasets'
# layouts): (codec, pixel format, options).
_WRITERS = {".mp4": ("libx264", "yuv420p", {"crf": "12", "preset": "ultrafast"}),
            ".mkv": ("libx264", "yuv420p", {"crf": "12", "preset": "ultrafast"}),
            ".webm": ("libvpx", "yuv420p", {}),
            ".avi": ("mjpeg", "yuvj444p", {"qmin": "1", "qmax": "2"}),
            ".gif": ("gif", "rgb8", {})}


def write_video(path: str, frames: np.ndarray, fps: int = 10) -> None:
  """Writes uint8 [N, H, W, 3] RGB frames (H, W even) as the video file `path` (.mp4, .mkv, .webm, .avi or .gif, by
  its extension) with PyAV, atomically (temp then rename)."""
  import av  # pylint: disable=g-import-not-at-top
  ext = os.path.splitext(path)[1].lower()
  if ext not in _WRITERS:
    raise ValueError(f"{path}: cannot write {ext!r} videos (expected one of {tuple(_WRITERS)})")
  codec, pix_fmt, options = _WRITERS[ext]
  frames = np.asarray(frames, np.uint8)
  with evqa_io.atomic_path(path) as tmp:
    with av.open(tmp, "w", format={".mkv": "matroska", ".gif": "gif"}.get(ext, ext[1:])) as container:
      stream = container.add_stream(codec, rate=fps, options=options)
      stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
      for f in frames:
        container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
      container.mux(stream.encode(None))


def read_video_map(path: str) -> dict[str, str]:
  """MSVD-QA's youtube_mapping.txt ("<clip name> vid<N>" per line) -> {"vid<N>": name, "<N>": name}."""
  out = {}
  for i, line in enumerate(evqa_io.read_text(path, "video map").splitlines()):
    parts = line.split()
    if not parts:
      continue
    if len(parts) != 2:
      raise ovqa.ConversionError(f"{path}: line {i + 1}: expected '<clip name> vid<N>', got {line!r}")
    name, vid = parts
    out[vid] = name
    if vid.startswith("vid"):
      out[vid[3:]] = name
  return out


class VideoIndex:
  """{file stem: path} of the dataset's video files in `videos_dir` and one folder below (a top-level file wins);
  `path(video_id)`: the file of a CSV id (module docstring) or None."""

  def __init__(self, videos_dir: str, dataset: str, video_map: dict | None = None):
    if not os.path.isdir(videos_dir):
      raise ovqa.ConversionError(f"--videos {videos_dir} is not a folder")
    self.videos_dir, self.dataset, self.video_map = videos_dir, dataset, video_map or {}
    exts = DATASET_EXTENSIONS[dataset]
    self.files: dict[str, str] = {}
    with os.scandir(videos_dir) as top:
      entries = sorted(top, key=lambda e: e.name)
    for entry in [e for e in entries if e.is_dir()] + [e for e in entries if not e.is_dir()]:
      if entry.is_dir():
        with os.scandir(entry.path) as sub:
          files = sorted((e.name, e.path) for e in sub if e.is_file())
      else:
        files = [(entry.name, entry.path)] if entry.is_file() else []
      for name, path in files:
        stem, ext = os.path.splitext(name)
        if ext.lower() in exts:
          self.files[stem] = path  # top-level files come last: they win

  def candidates(self, video_id: str) -> list[str]:
    names = [video_id]
    if video_id in self.video_map:
      names.append(self.video_map[video_id])
    if self.dataset == "msrvtt" and video_id.isdigit():
      names.append(f"video{video_id}")
    if self.dataset == "activitynet":
      names.append(video_id[2:] if video_id.startswith("v_") else f"v_{video_id}")
    return names

  def path(self, video_id: str) -> str | None:
    for name in self.candidates(video_id):
      if name in self.files:
        return self.files[name]
    return None


class FrameVideos:
  """video_id -> {"frames": uint8 [T, R, R, 3]} (or with `jpeg_quality` the encode_jpeg fields) for
  ovqa.convert_with, decoded ahead in `workers` processes (in the order of `prefetch`, the ids' first appearance in
  the CSVs) or here; results of recent videos kept."""

  def __init__(self, index: VideoIndex, num_frames: int, frame_size: int, recipe: str, workers: int = 0,
               prefetch: Sequence[str] = (), jpeg_quality: int = 0):
    self.index, self.args = index, (num_frames, frame_size, recipe, jpeg_quality)
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._pending, self._pending_ids = iter(()), set()
    self._pool = None
    if workers > 0 and prefetch:
      ids = [v for v in dict.fromkeys(prefetch) if self.index.path(v)]
      self._pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
      self._pending = zip(ids, self._pool.map(_read_task, [(self.index.path(v), *self.args) for v in ids],
                                              chunksize=4))
      self._pending_ids = set(ids)

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=True)

  def _load(self, video_id: str):
    path = self.index.path(video_id)
    if path is None:
      names = ", ".join(repr(n) for n in dict.fromkeys(self.index.candidates(video_id)))
      exts = "/".join(DATASET_EXTENSIONS[self.index.dataset])
      return ("missing_video", f"no {self.index.dataset} video {names} ({exts}) in {self.index.videos_dir} nor one "
              "folder below")
    return _read_task((path, *self.args))

  def _put(self, video_id: str, value) -> None:
    self._cache[video_id] = value
    self._cache.move_to_end(video_id)
    while len(self._cache) > _CACHE_VIDEOS:
      self._cache.popitem(last=False)

  def __call__(self, video_id: str) -> dict:
    while video_id not in self._cache and video_id in self._pending_ids:  # the workers' results, in order
      got_id, got = next(self._pending)
      self._pending_ids.discard(got_id)
      self._put(got_id, got)
    if video_id not in self._cache:
      self._put(video_id, self._load(video_id))
    self._cache.move_to_end(video_id)
    value = self._cache[video_id]
    if isinstance(value, tuple):
      raise ovqa.BadRow(value[0], "video_id", f"video id {video_id!r}: {value[1]}")
    return value if isinstance(value, dict) else {"frames": value}


def record_spec(num_frames: int, size: int, frame_format: str = "raw") -> dict[str, Feature]:
  """The feature spec of a pixel record: data_prep/ovqa.py's, with the frames for the video (module docstring)."""
  spec = {k: v for k, v in ovqa.record_spec(num_frames, 1).items() if k not in ("video", "video_mask")}
  if frame_format == "jpeg":
    spec["frames_jpeg"] = Feature("uint8", (None,))
    spec["frames_jpeg_ends"] = Feature("int64", (num_frames,))
  else:
    spec["frames"] = Feature("uint8", (num_frames, size, size, 3))
  return spec


def _csv_video_ids(csv_dir: str) -> list[str]:
  ids = []
  for split in ovqa.SPLITS:
    path = os.path.join(csv_dir, f"{split}.csv")
    if os.path.exists(path):
      for v in ovqa.read_split_csv(path)["video_id"]:
        try:
          ids.append(evqa_io.check_id(v, path, "video id"))
        except ValueError:
          pass  # the row is refused (bad_video_id) when it is converted
  return ids


def convert(csv_dir: str, videos_dir: str, out_dir: str, *, dataset: str, num_frames: int = 3, frame_size: int = 224,
            recipe: str = "allinone", video_map: str | None = None, workers: int = 0, frame_format: str = "raw",
            jpeg_quality: int = 95, **kwargs) -> dict:
  """Converts the CSVs of `csv_dir` with the videos of `videos_dir` into pixel records at `out_dir` (module
  docstring); `kwargs`: ovqa.convert_with's (subtitles, cvqa_topk, skip_bad, num_shards, authors_vocab, ...).
  Returns the "conversion" summary; nothing is left at `out_dir` when it raises."""
  if dataset not in DATASET_EXTENSIONS:
    raise ovqa.ConversionError(f"dataset {dataset!r}: expected one of {tuple(DATASET_EXTENSIONS)}")
  if recipe not in RECIPES:
    raise ovqa.ConversionError(f"--recipe {recipe!r}: expected one of {RECIPES}")
  if num_frames < 1 or frame_size < 1:
    raise ovqa.ConversionError(f"--num-frames ({num_frames}) and --frame-size ({frame_size}) must be >= 1")
  if frame_format not in FRAME_FORMATS or not 1 <= jpeg_quality <= 100:
    raise ovqa.ConversionError(f"--frame-format {frame_format!r} / --jpeg-quality {jpeg_quality}: expected one of "
                               f"{FRAME_FORMATS} / 1..100")
  size = stored_size(frame_size, recipe)
  quality = jpeg_quality if frame_format == "jpeg" else 0

  @contextlib.contextmanager
  def frame_videos():
    index = VideoIndex(videos_dir, dataset, read_video_map(video_map) if video_map else None)
    videos = FrameVideos(index, num_frames, frame_size, recipe, workers,
                         _csv_video_ids(csv_dir) if workers > 0 else (), quality)
    try:
      yield (record_spec(num_frames, size, frame_format), videos,
             dict(video_input="frames", num_frames=num_frames, frame_size=frame_size, stored_size=size,
                  frame_recipe=recipe, frame_indices="segment middles" if recipe == "allinone" else "violet",
                  frame_format=frame_format, jpeg_quality=quality or None, dataset=dataset))
    finally:
      videos.close()

  source = {"videos": os.path.abspath(videos_dir), "video_map": os.path.abspath(video_map) if video_map else None}
  return ovqa.convert_with(csv_dir, out_dir, frame_videos, video_input=videos_dir, converter="data_prep.ovqa_frames",
                           extra_inputs=[video_map], source=source, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.ovqa_frames", description=__doc__.split("\n")[0])
  parser.add_argument("--ovqa-release", default=None,
                      help="the OVQA release's meta_data/<dataset>/ folder: its train/test.csv, subtitles and "
                           "vocabularies (sets --csv-dir, --subtitles, --authors-vocab unless given)")
  parser.add_argument("--csv-dir", default=None, help="directory with train.csv, test.csv and optionally val.csv")
  parser.add_argument("--videos", required=True, help="the dataset's video folder (files here or one folder below)")
  parser.add_argument("--dataset", choices=sorted(DATASET_EXTENSIONS), required=True,
                      help="the video naming (module docstring) and --cvqa-topk's default")
  parser.add_argument("--video-map", default=None, help="MSVD-QA's youtube_mapping.txt (ids vid<N> -> clip names)")
  parser.add_argument("--out", required=True, help="output directory (replaced as a whole)")
  parser.add_argument("--num-frames", type=settings.arg(settings.POSITIVE_INT, "--num-frames"), default=3)
  parser.add_argument("--frame-size", type=settings.arg(settings.POSITIVE_INT, "--frame-size"), default=224)
  parser.add_argument("--recipe", choices=RECIPES, default="allinone",
                      help="frame indices and resize: All-in-one's or VIOLET's (module docstring)")
  parser.add_argument("--subtitles", default=None, help="optional JSON (or .pkl) video_id -> subtitle text")
  parser.add_argument("--authors-vocab", default=None,
                      help="folder with the OVQA authors' train_vocab.json, test_vocab.json, ans2cat.json")
  parser.add_argument("--cvqa-vocab", default=None, help="FrozenBiLM's {answer: id} closed vocabulary file")
  parser.add_argument("--cvqa-topk", type=settings.arg(settings.COUNT, "--cvqa-topk"), default=None,
                      help="closed vocabulary size (0 = all train answers; default: --dataset's)")
  parser.add_argument("--skip-bad", action="store_true", help="skip and count bad rows instead of failing")
  parser.add_argument("--num-shards", type=settings.arg(settings.POSITIVE_INT, "--num-shards"), default=None)
  parser.add_argument("--frame-format", choices=FRAME_FORMATS, default="raw",
                      help="raw uint8 frames, or JPEG files (about 10x smaller; decoded by the input)")
  parser.add_argument("--jpeg-quality", type=settings.arg(settings.Num(1, 100, integer=True), "--jpeg-quality"),
                      default=95)
  parser.add_argument("--workers", type=settings.arg(settings.COUNT, "--workers"), default=0,
                      help="decoding processes (0: decode in this process)")
  common.add_trust_pickles(parser)
  args = parser.parse_args(argv)
  if args.ovqa_release:
    found = ovqa.release_paths(args.ovqa_release, args.subtitles)
    for key in ("csv_dir", "subtitles", "authors_vocab"):
      if getattr(args, key) is None:
        setattr(args, key, found[key])
  if args.csv_dir is None:
    parser.error("--csv-dir is required (or --ovqa-release)")
  if args.cvqa_topk is None:
    args.cvqa_topk = ovqa.CVQA_TOPK[args.dataset]
  evqa_io.check_args(args, ["out"])  # no input may be inside --out
  convert(args.csv_dir, args.videos, args.out, dataset=args.dataset, num_frames=args.num_frames,
          frame_size=args.frame_size, recipe=args.recipe, video_map=args.video_map, workers=args.workers,
          frame_format=args.frame_format, jpeg_quality=args.jpeg_quality,
          subtitles=args.subtitles, cvqa_topk=args.cvqa_topk, skip_bad=args.skip_bad, num_shards=args.num_shards,
          trust_pickles=args.trust_pickles, authors_vocab=args.authors_vocab, cvqa_vocab=args.cvqa_vocab)
  from data_prep import answer_stats
  print(answer_stats.format_table1(answer_stats.table1_from_dir(args.out)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
