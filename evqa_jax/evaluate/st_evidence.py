"""ST-Evidence-Gen evaluator: answer accuracy, temporal IoU/IoP and mask J/F, as the benchmark computes them.

Usage:
  python -m evqa_jax.evaluate.st_evidence --gt-csv gt.csv --gt-masks gt_masks --pred preds.json \
      --pred-masks pred_masks --out metrics.json [--per-entry per_entry.json]

Inputs:
  --gt-csv: columns entry_id, video_id, video_path, question, candidates (python-list string), answer (text),
    segment ("[[s, e], ...]" seconds); only entry_id, candidates, answer and segment are read.
  --gt-masks: <dir>/<entry_id>/<frame>.png, any non-zero pixel = object (all objects merged).
  --pred: JSON {entry_id: {"video_id": ..., "parsed_response": {"answer": "A".."E", "segments": [[s, e], ...]}}}.
    A null/missing parsed_response, answer or segments means no answer / no segments (scored wrong / 0).
  --pred-masks: <dir>/<entry_id>/masks/<frame>.png (0/255; any non-zero = object). A frame is matched with the
    ground-truth PNG of the same frame: same file name, or the same number when both names are numeric
    (00012.png and 12.png are frame 12).

Output keys (percent): accuracy, mIoU, mIoP, tIoU@0.3, tIoU@0.5, tIoP@0.3, tIoP@0.5, t_mean, J, F, JF; plus
num_entries, num_mask_entries (entries with a GT mask folder), num_missing_predictions, num_unmatched_predictions
(prediction entries not in the GT, ignored). Semantics and quirks: `evqa_jax.metrics.st_evidence`.
Malformed segments, unreadable PNGs and GT/prediction mask size mismatches raise errors naming the file.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from evqa_jax import cli
from evqa_jax import io
from evqa_jax.evaluate import json_safe, load_json_object
from evqa_jax.metrics import st_evidence as st

GT_COLUMNS = ("entry_id", "candidates", "answer", "segment")


def read_gt_csv(path: str) -> list[dict[str, Any]]:
  """Ground-truth rows: [{"entry_id", "candidates": [str], "answer": str, "segments": [(s, e)]}]."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"ground-truth CSV {path} does not exist")
  try:
    df = pd.read_csv(io.text_stream(path, "ground-truth CSV"), dtype=str, keep_default_na=False)
  except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
    raise ValueError(f"ground-truth CSV {path}: cannot parse CSV ({e})") from None
  missing = [c for c in GT_COLUMNS if c not in df.columns]
  if missing:
    raise ValueError(f"ground-truth CSV {path}: missing column(s) {missing}; found {list(df.columns)}")
  rows, seen = [], set()
  for line, rec in enumerate(df.to_dict("records"), start=2):
    entry_id = str(rec["entry_id"]).strip()
    where = f"ground-truth CSV {path} line {line} (entry {entry_id})"
    io.check_id(entry_id, f"{where}: field 'entry_id'", "entry id")  # names <gt-masks>/<entry_id>/
    if entry_id in seen:
      raise ValueError(f"{where}: entry_id appears twice")
    seen.add(entry_id)
    rows.append({
        "entry_id": entry_id,
        "candidates": st.parse_candidates(rec["candidates"], where),
        "answer": rec["answer"],
        "segments": st.parse_segments(rec["segment"], where),
    })
  return rows


def read_predictions(path: str) -> dict[str, dict[str, Any]]:
  """{entry_id: {"answer": letter or None, "segments": [(s, e)]}} from the prediction JSON."""
  raw = load_json_object(path, "prediction JSON", "{entry_id: {...}}")
  preds = {}
  for entry_id, rec in raw.items():
    where = f"prediction JSON {path} entry {entry_id}"
    if not isinstance(rec, dict):
      raise ValueError(f"{where}: expected an object with parsed_response, got {rec!r}")
    resp = rec.get("parsed_response")
    if resp is None:
      resp = {}
    if not isinstance(resp, dict):
      raise ValueError(f"{where}: parsed_response must be an object {{answer, segments}}, got {resp!r}")
    preds[str(entry_id)] = {"answer": resp.get("answer"),
                            "segments": st.parse_segments(resp.get("segments"), f"{where} parsed_response.segments")}
  return preds


def read_mask(path: str) -> np.ndarray:
  """Binary mask of a PNG, bool [H, W]: any non-zero pixel (colour channels of RGB(A)) is object."""
  try:
    with Image.open(path) as im:
      im.load()
      mode = im.mode
      arr = np.asarray(im)
  except (OSError, ValueError, SyntaxError) as e:
    raise ValueError(f"cannot read mask PNG {path}: {e}") from None
  if arr.ndim == 3:
    if mode in ("RGBA", "LA", "PA", "La", "RGBa"):
      arr = arr[..., :-1]
    arr = arr.any(axis=-1)
  elif arr.ndim != 2:
    raise ValueError(f"mask PNG {path}: unexpected array shape {arr.shape}")
  return arr != 0


def _frame_key(name: str):
  stem = os.path.splitext(name)[0]
  return int(stem) if stem.isdigit() else stem


def _frame_pngs(directory: str) -> dict[Any, str]:
  """{frame key: file name} of the PNGs in a folder; numeric names are keyed by their value ("00012" == "12")."""
  if not os.path.isdir(directory):
    return {}
  out = {}
  for name in sorted(os.listdir(directory)):
    if not name.lower().endswith(".png") or not os.path.isfile(os.path.join(directory, name)):
      continue
    key = _frame_key(name)
    if key in out:
      raise ValueError(f"{directory}: {out[key]} and {name} name the same frame")
    out[key] = name
  return out


def entry_mask_scores_from_dirs(gt_dir: str, pred_dir: str,
                                bound_th: float = st.BOUND_TH) -> tuple[float, float, int]:
  """(J, F, number of scored frames) of one entry from its GT mask folder and predicted masks folder.

  Only frames with a predicted PNG are scored; each is matched with the GT PNG of the same frame (same file name, or
  the same number when both names are numeric, e.g. 00012.png and 12.png); a frame without a GT PNG is empty.
  """
  pred_frames = _frame_pngs(pred_dir)
  gt_frames = _frame_pngs(gt_dir)

  def frames():
    for key, name in pred_frames.items():
      pred_path = os.path.join(pred_dir, name)
      pred = read_mask(pred_path)
      gt = None
      if key in gt_frames:
        gt_path = os.path.join(gt_dir, gt_frames[key])
        gt = read_mask(gt_path)
        if gt.shape != pred.shape:
          raise ValueError(f"mask size mismatch: ground truth {gt_path} is {gt.shape[1]}x{gt.shape[0]} (WxH) but "
                           f"prediction {pred_path} is {pred.shape[1]}x{pred.shape[0]}")
      yield gt, pred

  j, f = st.entry_mask_scores(frames(), bound_th)
  return j, f, len(pred_frames)


def evaluate(gt_csv: str, pred_json: str, gt_masks: Optional[str], pred_masks: Optional[str],
             bound_th: float = st.BOUND_TH) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
  """Scores one prediction set. Returns (metrics, per-entry scores). Masks are skipped when gt_masks is None."""
  gt_rows = read_gt_csv(gt_csv)
  preds = read_predictions(pred_json)
  for root, what in ((gt_masks, "--gt-masks"), (pred_masks, "--pred-masks")):
    if root is not None and not os.path.isdir(root):
      raise FileNotFoundError(f"{what} directory {root} does not exist")
  if (gt_masks is None) != (pred_masks is None):
    raise ValueError("give both the ground-truth and the predicted mask directories, or neither")

  gt_ids = {r["entry_id"] for r in gt_rows}
  unmatched = sorted(set(preds) - gt_ids)
  if unmatched:
    print(f"warning: {len(unmatched)} prediction entries are not in {gt_csv} and are ignored, e.g. {unmatched[:5]}",
          file=sys.stderr)

  correct, ious, iops, entry_j, entry_f = [], [], [], [], []
  per_entry: dict[str, dict[str, Any]] = {}
  missing = 0
  for row in gt_rows:
    eid = row["entry_id"]
    pred = preds.get(eid)
    if pred is None:
      missing += 1
      ok, iou, iop = False, 0.0, 0.0
    else:
      ok = st.answer_is_correct(pred["answer"], row["candidates"], row["answer"])
      iou, iop = st.temporal_iou_iop(row["segments"], pred["segments"])
    correct.append(ok)
    ious.append(iou)
    iops.append(iop)
    rec: dict[str, Any] = {"correct": bool(ok), "IoU": iou, "IoP": iop}
    if gt_masks is not None:
      gt_dir = os.path.join(gt_masks, eid)
      if os.path.isdir(gt_dir):
        j, f, n = entry_mask_scores_from_dirs(gt_dir, os.path.join(pred_masks, eid, "masks"), bound_th)
        entry_j.append(j)
        entry_f.append(f)
        rec.update(J=j, F=f, num_mask_frames=n)
    per_entry[eid] = rec

  metrics = st.st_evidence_summary(correct, ious, iops, entry_j, entry_f)
  metrics["num_missing_predictions"] = missing
  metrics["num_unmatched_predictions"] = len(unmatched)
  return metrics, per_entry


def format_table(metrics: dict[str, Any]) -> str:
  keys = ["accuracy", "mIoU", "mIoP", "tIoU@0.3", "tIoU@0.5", "tIoP@0.3", "tIoP@0.5", "t_mean", "J", "F", "JF"]
  head = "".join(f"{k:>10}" for k in keys)
  vals = "".join(f"{'-':>10}" if metrics[k] is None else f"{metrics[k]:10.2f}" for k in keys)
  return (f"{head}\n{vals}\n{metrics['num_entries']} entries, {metrics['num_mask_entries']} with ground-truth masks, "
          f"{metrics['num_missing_predictions']} without prediction")


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.st_evidence", description=__doc__.split("\n")[0])
  parser.add_argument("--gt-csv", required=True, help="ground-truth CSV")
  parser.add_argument("--gt-masks", required=True, help="ground-truth masks: <dir>/<entry_id>/<frame>.png")
  parser.add_argument("--pred", required=True, help="prediction JSON")
  parser.add_argument("--pred-masks", required=True, help="predicted masks: <dir>/<entry_id>/masks/<frame>.png")
  parser.add_argument("--out", required=True, help="metrics JSON to write")
  parser.add_argument("--per-entry", default=None, help="optional JSON of per-entry scores")
  args = parser.parse_args(argv)

  metrics, per_entry = evaluate(args.gt_csv, args.pred, args.gt_masks, args.pred_masks)
  metrics = json_safe(metrics)
  io.write_json(args.out, metrics)
  if args.per_entry:
    io.write_json(args.per_entry, json_safe(per_entry))
  print(format_table(metrics))
  return metrics


if __name__ == "__main__":
  sys.exit(cli.run(main))
