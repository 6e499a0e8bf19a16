"""Pixel frames stored as JPEG files in a record (OVQA pixel records, data_prep/ovqa_frames.py --frame-format jpeg):
the T frames' JPEG files back to back in `frames_jpeg` (uint8 [N]) and where each ends in `frames_jpeg_ends`
(int64 [T]). The converter encodes with `encode_jpeg`, the input decodes with `decode_jpeg` (PIL both ways)."""

import io

import numpy as np


def encode_jpeg(frames: np.ndarray, quality: int) -> dict:
  """uint8 [T, R, R, 3] -> the jpeg record fields: frames_jpeg (the T JPEG files back to back, uint8 [N]) and
  frames_jpeg_ends (int64 [T], where each ends)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  parts = []
  for f in frames:
    buf = io.BytesIO()
    Image.fromarray(f).save(buf, format="JPEG", quality=quality)
    parts.append(np.frombuffer(buf.getvalue(), np.uint8))
  ends = np.cumsum([len(p) for p in parts]).astype(np.int64)
  return {"frames_jpeg": np.concatenate(parts), "frames_jpeg_ends": ends}


def decode_jpeg(example, where: str) -> np.ndarray:
  """The jpeg record fields -> uint8 [T, R, R, 3] RGB; ValueError naming `where` (file, record) otherwise."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  data, ends = np.asarray(example["frames_jpeg"], np.uint8), np.asarray(example["frames_jpeg_ends"], np.int64)
  starts = np.concatenate([[0], ends[:-1]])
  if len(ends) == 0 or (np.diff(ends) <= 0).any() or ends[0] <= 0 or ends[-1] != len(data):
    raise ValueError(f"{where}: frames_jpeg_ends {ends.tolist()} do not cut the {len(data)} bytes of frames_jpeg")
  try:
    return np.stack([np.asarray(Image.open(io.BytesIO(data[a:b].tobytes())).convert("RGB"))
                     for a, b in zip(starts, ends)])
  except (OSError, ValueError, Image.DecompressionBombError) as e:
    raise ValueError(f"{where}: field 'frames_jpeg' does not decode as {len(ends)} JPEG frames of one size "
                     f"({type(e).__name__}: {e})") from None
