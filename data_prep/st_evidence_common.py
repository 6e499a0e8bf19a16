"""What the E-VQA converter (data_prep/st_evidence.py) and its release layouts (data_prep/evqa_release.py) share: the
error that names a bad item and the --skip-bad key it is counted under, image reading, COCO RLE masks and numbered
frame folders. Both import it; neither imports the other's internals (st_evidence.py uses evqa_release.py's layouts).
"""

from __future__ import annotations

import os

import numpy as np

from evqa_jax import io as evqa_io

IMAGE_EXTS = (".png", ".jpg", ".jpeg")


class ConversionError(ValueError):
  """Bad input; `reason` is the short key under which --skip-bad counts it."""

  def __init__(self, reason: str, message: str):
    self.reason = reason
    super().__init__(message)


def read_image(path: str, mode: str, where: str) -> np.ndarray:
  """`evqa_io.read_image` (decompression bombs refused); any failure is this item's ConversionError."""
  try:
    return evqa_io.read_image(path, mode)
  except (OSError, ValueError) as e:
    raise ConversionError("unreadable_image", f"{where}: {e}") from e


def decode_rle(rle: dict, height: int, width: int, where: str) -> np.ndarray:
  """COCO RLE (column-major runs starting with zeros; counts a list or the compressed string) -> [H, W] uint8."""
  size, counts = rle.get("size"), rle.get("counts")
  if not isinstance(size, (list, tuple)) or list(size) != [height, width]:
    raise ConversionError("bad_mask", f"{where}: RLE size {size!r} differs from the frame size [{height}, {width}]")
  if isinstance(counts, str):
    runs, p = [], 0
    while p < len(counts):
      x, k, more = 0, 0, True
      while more:
        c = ord(counts[p]) - 48
        x |= (c & 0x1F) << (5 * k)
        more = bool(c & 0x20)
        p += 1
        k += 1
        if not more and (c & 0x10):
          x |= -1 << (5 * k)
      if len(runs) > 2:
        x += runs[-2]
      runs.append(x)
  elif isinstance(counts, list) and all(isinstance(c, int) for c in counts):
    runs = counts
  else:
    raise ConversionError("bad_mask", f"{where}: RLE counts must be a list of ints or a string")
  if any(r < 0 for r in runs) or sum(runs) != height * width:
    raise ConversionError("bad_mask", f"{where}: RLE runs sum to {sum(runs)}, expected {height * width}")
  flat = np.zeros(height * width, np.uint8)
  pos = 0
  for i, r in enumerate(runs):
    if i % 2:
      flat[pos:pos + r] = 1
    pos += r
  return flat.reshape(width, height).T.copy()


def numbered_images(directory: str, exts=IMAGE_EXTS) -> dict[int, str]:
  """{frame number: path} of `<number>.<ext>` files (and ST-Evidence-Instruct's `frame_<number>.jpg`)."""
  out = {}
  for name in os.listdir(directory):
    stem, ext = os.path.splitext(name)
    if stem.startswith("frame_"):
      stem = stem[len("frame_"):]
    if ext.lower() in exts and stem.isdigit():
      out[int(stem)] = os.path.join(directory, name)
  return out


class FrameFolders:
  """The converter's frame source over `<frames_dir>/<video_id>/<number>.png|jpg` folders: the frames of the most
  recent video (rows of one video are usually adjacent in the CSV). The release layouts (evqa_release.py) give the
  same interface: `get(video_id, where)` -> ({frame number: path}, (height, width)), `frame(index, where)`."""

  def __init__(self, frames_dir: str):
    self.frames_dir = frames_dir
    self.key = None
    self.value = None
    self.decoded: dict[int, np.ndarray] = {}

  def get(self, video_id: str, where: str) -> tuple[dict[int, str], tuple[int, int]]:
    if self.key == video_id:
      return self.value
    d = os.path.join(self.frames_dir, video_id)
    if not os.path.isdir(d):
      raise ConversionError("missing_frames", f"{where}: field 'video_id': no frame folder {d}")
    files = numbered_images(d)
    if not files:
      raise ConversionError("missing_frames", f"{where}: frame folder {d} has no numbered PNG/JPG files")
    n = len(files)
    if sorted(files) != list(range(n)):
      gaps = sorted(set(range(max(files) + 1)) - set(files))[:5]
      raise ConversionError("missing_frames", f"{where}: frame folder {d} is missing frames {gaps} (frames must be 0..N-1)")
    first = read_image(files[0], "RGB", where)
    self.key, self.value, self.decoded = video_id, (files, first.shape[:2]), {0: first}
    return self.value

  def frame(self, index: int, where: str) -> np.ndarray:
    """Decoded frame `index` of the cached video (each frame is decoded once per video)."""
    if index not in self.decoded:
      files, (h0, w0) = self.value
      img = read_image(files[index], "RGB", where)
      if img.shape[:2] != (h0, w0):
        raise ConversionError("bad_frame", f"{where}: frame {files[index]} is {img.shape[1]}x{img.shape[0]}, "
                              f"frame 0 is {w0}x{h0}")
      self.decoded[index] = img
    return self.decoded[index]
