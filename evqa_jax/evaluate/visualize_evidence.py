"""PNG strip of E-VQA evidence: frames with predicted and ground-truth masks, and both segment sets on a timeline.

    python -m evqa_jax.evaluate.visualize_evidence --records DIR --pred P.json --pred-masks DIR \
        --entries e1,e2 --out strip.png [--num-frames 8]

Per entry, one row of frames (evenly spread over the video; ground-truth mask tinted green, predicted mask tinted
red, overlap yellow) and under it a timeline: ground-truth segments (green, upper band), predicted segments (red,
lower band) and ticks at the frames shown. The timeline's label gives the question, the predicted and the true answer.
Frames and ground-truth masks come from the records (data_prep/st_evidence.py); predicted masks are the official
pred_masks/<entry_id>/masks/<frame>.png files, resized (nearest) to the records' frame size for display.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from evqa_jax import cli
from evqa_jax import io as io_lib
from evqa_jax import settings
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.metrics import st_evidence as st

GT_COLOUR = np.array([0, 220, 0], np.float64)
PRED_COLOUR = np.array([235, 0, 0], np.float64)


def find_records(records_dir: str, entry_ids: Sequence[str]) -> dict[str, dict]:
  """{entry_id: decoded record} searching every split of the records directory."""
  meta = records.load_metadata(records_dir)
  wanted, found = set(entry_ids), {}
  for split in sorted(meta.get("splits", {})):
    src = source_lib.TFRecordDataSource(records.split_paths(records_dir, split), records.load_spec(records_dir, split))
    for i in range(len(src)):
      ex = src[i]
      eid = str(ex["entry_id"])
      if eid in wanted and eid not in found:
        found[eid] = ex
    if len(found) == len(wanted):
      break
  missing = sorted(wanted - set(found))
  if missing:
    raise KeyError(f"entries {missing} are in no split of {records_dir}")
  return found


def read_pred_mask(pred_masks: str, entry_id: str, frame: int, size) -> Optional[np.ndarray]:
  """The predicted mask of a 6-fps frame resized to `size` (H, W), or None when no PNG was written for it."""
  d = os.path.join(pred_masks, io_lib.check_id(entry_id, f"--pred-masks {pred_masks}", "entry id"), "masks")
  if not io_lib.epath_of(d).is_dir():  # local or gs://...
    return None
  for name in sorted(p.name for p in io_lib.epath_of(d).iterdir()):
    stem = os.path.splitext(name)[0]
    if name.lower().endswith(".png") and stem.isdigit() and int(stem) == frame:
      m = io_lib.read_mask(os.path.join(d, name), "predicted mask")
      if m.shape != tuple(size):
        m = np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize((size[1], size[0]), Image.NEAREST)) > 127
      return m
  return None


def overlay(frame: np.ndarray, gt: Optional[np.ndarray], pred: Optional[np.ndarray], alpha: float = 0.55):
  """RGB uint8 [H, W, 3] with the masks blended in (green GT, red prediction, both -> yellow-ish)."""
  img = frame.astype(np.float64)
  tint = np.zeros_like(img)
  weight = np.zeros(img.shape[:2])
  for mask, colour in ((gt, GT_COLOUR), (pred, PRED_COLOUR)):
    if mask is not None and mask.any():
      tint[mask] += colour
      weight[mask] += 1
  sel = weight > 0
  tint[sel] = np.clip(tint[sel], 0, 255)
  img[sel] = (1 - alpha) * img[sel] + alpha * tint[sel]
  return np.clip(img, 0, 255).astype(np.uint8)


def render(records_dir: str, pred_json: str, pred_masks: str, entry_ids: Sequence[str], out: str,
           num_frames: int = 8) -> str:
  """Writes the strip PNG; returns its path."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  preds = io_lib.load_json(pred_json, "prediction JSON", finite=False)
  recs = find_records(records_dir, entry_ids)
  n = len(entry_ids)
  fig = plt.figure(figsize=(1.6 * num_frames, 3.0 * n))
  # Per entry: frames, timeline, and an empty spacer row that keeps the timeline's caption off the next frames.
  grid = fig.add_gridspec(3 * n, num_frames, height_ratios=[4, 1, 0.9] * n, hspace=0.45, wspace=0.05)
  for row, eid in enumerate(entry_ids):
    ex = recs[eid]
    valid = np.asarray(ex["frame_mask"]).astype(bool)
    positions = np.unique(np.round(np.linspace(0, int(valid.sum()) - 1, num_frames)).astype(int))
    resp = (preds.get(eid) or {}).get("parsed_response") or {}
    pred_segments, _ = st.parse_pred_segments(resp.get("segments", []))
    gt_segments = [tuple(map(float, s)) for s in np.asarray(ex["segments"]).reshape(-1, 2)]
    candidates = [str(c) for c in ex["candidates"]]
    pred_answer = st.answer_text(resp.get("answer"), candidates) or "-"
    size = np.asarray(ex["frames"]).shape[1:3]
    for col, k in enumerate(positions):
      ax = fig.add_subplot(grid[3 * row, col])
      frame_idx = int(ex["frame_indices"][k])
      gt = np.asarray(ex["masks"][k]).astype(bool)
      pm = read_pred_mask(pred_masks, eid, frame_idx, size)
      ax.imshow(overlay(np.asarray(ex["frames"][k]), gt, pm), interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
      ax.set_title(f"f{frame_idx}" + ("" if pm is None else " *"), fontsize=7)
      if col == 0:
        ax.set_ylabel(eid, fontsize=7)
    ax = fig.add_subplot(grid[3 * row + 1, :])
    duration = float(ex["num_video_frames"]) / float(ex["fps"])
    for s, e in gt_segments:
      ax.axvspan(s, e, ymin=0.5, ymax=1.0, color="tab:green", alpha=0.8)
    for s, e in pred_segments:
      ax.axvspan(s, e, ymin=0.0, ymax=0.5, color="tab:red", alpha=0.8)
    for k in positions:
      ax.axvline(float(ex["frame_times"][k]), color="k", lw=0.5, alpha=0.5)
    ax.set_xlim(0, duration)
    ax.set_yticks([0.25, 0.75])
    ax.set_yticklabels(["pred", "GT"], fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    true_answer = candidates[int(ex["answer_index"])]
    ax.set_xlabel(f"seconds    |    {ex['question']}  predicted: {pred_answer}  true: {true_answer}", fontsize=8)
  with io_lib.atomic_path(out) as tmp:  # makes the folder (local) or uploads (gs://...)
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  return out


def main(argv: Optional[Sequence[str]] = None) -> str:
  p = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.visualize_evidence", description=__doc__.split("\n")[0])
  p.add_argument("--records", required=True, help="records directory (data_prep/st_evidence.py output)")
  p.add_argument("--pred", required=True, help="prediction JSON (ST-Evidence-Gen format)")
  p.add_argument("--pred-masks", required=True, help="predicted masks: <dir>/<entry_id>/masks/<frame>.png")
  p.add_argument("--entries", required=True, help="comma-separated entry ids")
  p.add_argument("--out", required=True, help="PNG to write")
  p.add_argument("--num-frames", type=settings.arg(settings.POSITIVE_INT, "--num-frames"), default=8, help="frames shown per entry")
  a = p.parse_args(argv)
  io_lib.check_args(a, ["out"])
  entries = [io_lib.check_id(e.strip(), f"--entries item {k}", "entry id")
             for k, e in enumerate(a.entries.split(",")) if e.strip()]
  if not entries:
    p.error("--entries is empty")
  path = render(a.records, a.pred, a.pred_masks, entries, a.out, a.num_frames)
  print(path)
  return path


if __name__ == "__main__":
  sys.exit(cli.run(main))
