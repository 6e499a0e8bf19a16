"""ST-Evidence-Gen metrics (REFERENCE.md section 3) and DAVIS-2017 masklet aggregation; plain numpy.

Reproduces the benchmark evaluator, quirks included:
  - Answer: the predicted letter A.. selects candidates[index]; correct when it equals the ground-truth answer text
    after strip. A missing entry, an unparsable letter or an index past the candidates is wrong; the denominator is
    every ground-truth entry.
  - Temporal: intersection = sum over ALL (gt, pred) segment pairs of max(0, min(ends) - max(starts)); segments are not
    merged, so overlapping predicted segments count the same ground-truth time twice and IoU can exceed 1.
    IoU = inter / (gt_len + pred_len - inter), IoP = inter / pred_len; an empty prediction or a missing entry scores 0
    and stays in the denominator. A non-positive union or predicted length (only reachable with duplicated segments on
    both sides, or zero-length predictions) scores 0 instead of dividing by zero.
  - Masks: only frames with a predicted mask are scored; a missing ground-truth mask is empty; both empty -> J = F = 1;
    exactly one empty -> J = F = 0; otherwise J = IoU and F = the DAVIS boundary F-measure (`f_measure`).
    Per entry: mean over frames. An entry without predicted masks scores 0; an entry without a ground-truth mask
    folder is skipped (the caller leaves it out).
  - Everything reported as mean x 100.

The boundary map follows the DAVIS `seg2bmap` rule: a pixel is a boundary pixel when it differs from its east,
south or south-east neighbour; on the last row only the east neighbour counts, on the last column only the south
neighbour, and the bottom-right pixel is never a boundary. Boundaries are matched within a disk (x^2 + y^2 <= r^2) of
radius r = ceil(0.008 * ||(H, W)||) pixels.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

TEMPORAL_THRESHOLDS = (0.3, 0.5)
BOUND_TH = 0.008

# ----------------------------------------------------------------------------------------------------------------------
# Parsing.


def parse_candidates(text: Any, where: str = "candidates") -> list[str]:
  """Candidate answers from a python-list string such as "['red', 'blue']" (ast.literal_eval)."""
  value = text
  if isinstance(text, str):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
      raise ValueError(f"{where}: candidates {text!r} is not a python list literal ({e})") from None
  if not isinstance(value, (list, tuple)):
    raise ValueError(f"{where}: candidates must be a list, got {text!r}")
  out = []
  for c in value:
    if isinstance(c, bool) or not isinstance(c, (str, int, float)):
      raise ValueError(f"{where}: candidate {c!r} is not a string")
    out.append(str(c))
  return out


def parse_segments(value: Any, where: str = "segments") -> list[tuple[float, float]]:
  """[[start, end], ...] in seconds, from a string "[[s, e], ...]" or an already parsed list.

  Raises ValueError naming `where` on anything else, on non-finite numbers and on end < start.
  None and "" mean no segments.
  """
  if value is None:
    return []
  parsed = value
  if isinstance(value, str):
    if not value.strip():
      return []
    try:
      parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError) as e:
      raise ValueError(f"{where}: segment string {value!r} is not a list literal ({e})") from None
  if not isinstance(parsed, (list, tuple)):
    raise ValueError(f"{where}: segments must be a list of [start, end] pairs, got {value!r}")
  out = []
  for seg in parsed:
    if not isinstance(seg, (list, tuple)) or len(seg) != 2 or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in seg):
      raise ValueError(f"{where}: segment {seg!r} is not a [start, end] pair of numbers (in {value!r})")
    try:
      s, e = float(seg[0]), float(seg[1])
    except OverflowError:  # an integer beyond float range
      s = e = math.inf
    if not (math.isfinite(s) and math.isfinite(e)):
      raise ValueError(f"{where}: segment {seg!r} has a non-finite time")
    if e < s:
      raise ValueError(f"{where}: segment {seg!r} ends before it starts")
    out.append((s, e))
  return out


def letter_to_index(letter: Any) -> Optional[int]:
  """"A" -> 0, "B" -> 1, ... after strip; None for anything else (an unparsable answer is simply wrong)."""
  if not isinstance(letter, str):
    return None
  letter = letter.strip()
  if len(letter) != 1 or not ("A" <= letter <= "Z"):
    return None
  return ord(letter) - ord("A")


# ----------------------------------------------------------------------------------------------------------------------
# Answer and temporal scores.


def answer_is_correct(letter: Any, candidates: Sequence[str], answer: str) -> bool:
  """True when candidates[letter index] equals the ground-truth answer after strip."""
  idx = letter_to_index(letter)
  if idx is None or idx >= len(candidates):
    return False
  return str(candidates[idx]).strip() == str(answer).strip()


def temporal_iou_iop(gt_segments: Sequence[Sequence[float]],
                     pred_segments: Sequence[Sequence[float]]) -> tuple[float, float]:
  """(IoU, IoP) of one entry with the benchmark's unmerged pairwise intersection (IoU may exceed 1)."""
  if len(pred_segments) == 0:
    return 0.0, 0.0
  inter = 0.0
  for gs, ge in gt_segments:
    for ps, pe in pred_segments:
      inter += max(0.0, min(ge, pe) - max(gs, ps))
  gt_len = float(sum(e - s for s, e in gt_segments))
  pred_len = float(sum(e - s for s, e in pred_segments))
  union = gt_len + pred_len - inter
  iou = inter / union if union > 0 else 0.0
  iop = inter / pred_len if pred_len > 0 else 0.0
  return iou, iop


def _mean_pct(values) -> float:
  values = np.asarray(values, dtype=np.float64)
  return 100.0 * float(values.mean()) if values.size else math.nan


def temporal_summary(ious: Sequence[float], iops: Sequence[float],
                     thresholds: Sequence[float] = TEMPORAL_THRESHOLDS) -> dict[str, float]:
  """mIoU, mIoP, tIoU@t, tIoP@t (% of entries with score >= t) and t_mean (mean of (IoU + IoP) / 2), all x 100.

  Args:
    ious, iops: one value per ground-truth entry, [num_entries] (0 for missing entries).
  """
  ious = np.asarray(ious, dtype=np.float64)
  iops = np.asarray(iops, dtype=np.float64)
  if ious.shape != iops.shape:
    raise ValueError(f"{ious.shape[0]} IoU values but {iops.shape[0]} IoP values")
  out = {"mIoU": _mean_pct(ious), "mIoP": _mean_pct(iops)}
  for t in thresholds:
    out[f"tIoU@{t}"] = _mean_pct(ious >= t)
  for t in thresholds:
    out[f"tIoP@{t}"] = _mean_pct(iops >= t)
  out["t_mean"] = _mean_pct((ious + iops) / 2.0)
  return out


# ----------------------------------------------------------------------------------------------------------------------
# Masks: DAVIS region similarity J and boundary F.


def seg2bmap(seg: np.ndarray) -> np.ndarray:
  """One-pixel-wide boundary map of a binary mask by the DAVIS rule, [H, W] -> bool [H, W].

  Boundary pixels sit half a pixel towards the origin from the true boundary: a pixel is marked when it differs from
  its east, south or south-east neighbour (pixels past the image count as background); the last row compares only with
  the east neighbour, the last column only with the south neighbour, and the bottom-right pixel is never marked.
  """
  seg = np.asarray(seg).astype(bool)
  if seg.ndim != 2:
    raise ValueError(f"seg2bmap expects a 2-D mask, got shape {seg.shape}")
  e = np.zeros_like(seg)
  s = np.zeros_like(seg)
  se = np.zeros_like(seg)
  e[:, :-1] = seg[:, 1:]
  s[:-1, :] = seg[1:, :]
  se[:-1, :-1] = seg[1:, 1:]
  b = (seg ^ e) | (seg ^ s) | (seg ^ se)
  b[-1, :] = seg[-1, :] ^ e[-1, :]
  b[:, -1] = seg[:, -1] ^ s[:, -1]
  b[-1, -1] = False
  return b


def disk(radius: int) -> np.ndarray:
  """Structuring element x^2 + y^2 <= r^2, bool [2r + 1, 2r + 1]."""
  r = int(radius)
  y, x = np.mgrid[-r:r + 1, -r:r + 1]
  return x * x + y * y <= r * r


def dilate_disk(bmap: np.ndarray, radius: int) -> np.ndarray:
  """Binary dilation by `disk(radius)`; pixels past the border never contribute. bool [H, W] -> bool [H, W].

  Each row of the disk is a horizontal run of half-width floor(sqrt(r^2 - dy^2)), so the dilation is an OR of
  2r + 1 shifted horizontal run-dilations (each a cumulative-sum window): O((2r + 1) H W) instead of O(r^2 H W).
  """
  bmap = np.asarray(bmap, dtype=bool)
  r = int(radius)
  h, w = bmap.shape
  if r <= 0:
    return bmap.copy()
  csum = np.zeros((h, w + 1), dtype=np.int32)
  np.cumsum(bmap, axis=1, out=csum[:, 1:])
  runs = {}
  out = np.zeros_like(bmap)
  for dy in range(-min(r, h - 1), min(r, h - 1) + 1):
    half = math.isqrt(r * r - dy * dy)
    if half not in runs:
      # Window [x - half, x + half] clipped to the image: pad the cumulative sum with its edge values.
      padded = np.concatenate([np.zeros((h, half), np.int32), csum, np.repeat(csum[:, -1:], half, axis=1)], axis=1)
      runs[half] = (padded[:, 2 * half + 1:2 * half + 1 + w] - padded[:, :w]) > 0
    run = runs[half]
    # out[y] |= run[y + dy] for rows where y + dy lies inside the image.
    if dy >= 0:
      out[:h - dy] |= run[dy:]
    else:
      out[-dy:] |= run[:h + dy]
  return out


def boundary_radius(shape: Sequence[int], bound_th: float = BOUND_TH) -> int:
  """DAVIS tolerance in pixels: bound_th itself when >= 1, else ceil(bound_th * ||(H, W)||)."""
  radius = bound_th if bound_th >= 1 else math.ceil(bound_th * float(np.linalg.norm(shape)))
  if radius != int(radius):
    raise ValueError(f"boundary tolerance {bound_th} pixels is not a whole number")
  return int(radius)


def db_eval_iou(annotation: np.ndarray, segmentation: np.ndarray) -> float:
  """DAVIS region similarity J = |A & S| / |A | S|; 1 when both are empty."""
  a = np.asarray(annotation).astype(bool)
  s = np.asarray(segmentation).astype(bool)
  if a.shape != s.shape:
    raise ValueError(f"annotation {a.shape} and segmentation {s.shape} shapes differ")
  union = np.count_nonzero(a | s)
  if union == 0:
    return 1.0
  return np.count_nonzero(a & s) / union


def f_measure(foreground_mask: np.ndarray, gt_mask: np.ndarray, bound_th: float = BOUND_TH) -> float:
  """DAVIS boundary F-measure of a predicted mask against the ground truth (both [H, W]).

  Precision = predicted boundary pixels within r of a ground-truth boundary pixel / predicted boundary pixels; recall
  the other way round. DAVIS's special cases: no predicted boundary (but some GT boundary) -> P = 1, R = 0; no GT
  boundary (but some predicted) -> P = 0, R = 1; neither -> P = R = 1. F = 2PR / (P + R), 0 when P + R = 0.
  """
  fg = np.asarray(foreground_mask).astype(bool)
  gt = np.asarray(gt_mask).astype(bool)
  if fg.shape != gt.shape:
    raise ValueError(f"prediction {fg.shape} and ground truth {gt.shape} shapes differ")
  radius = boundary_radius(fg.shape, bound_th)
  fg_boundary = seg2bmap(fg)
  gt_boundary = seg2bmap(gt)
  n_fg = np.count_nonzero(fg_boundary)
  n_gt = np.count_nonzero(gt_boundary)
  if n_fg == 0 and n_gt > 0:
    precision, recall = 1.0, 0.0
  elif n_fg > 0 and n_gt == 0:
    precision, recall = 0.0, 1.0
  elif n_fg == 0 and n_gt == 0:
    precision, recall = 1.0, 1.0
  else:
    # Only boundary pixels are ever counted, so the dilations can be computed inside the bounding box of both
    # boundary maps: every pixel that can reach a boundary pixel within r lies inside it. Exact, and much faster
    # for small objects in large frames.
    ys, xs = np.nonzero(fg_boundary | gt_boundary)
    box = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
    fg_boundary, gt_boundary = fg_boundary[box], gt_boundary[box]
    fg_dil = dilate_disk(fg_boundary, radius)
    gt_dil = dilate_disk(gt_boundary, radius)
    precision = np.count_nonzero(fg_boundary & gt_dil) / n_fg
    recall = np.count_nonzero(gt_boundary & fg_dil) / n_gt
  if precision + recall == 0:
    return 0.0
  return 2.0 * precision * recall / (precision + recall)


def frame_scores(gt_mask: Optional[np.ndarray], pred_mask: np.ndarray,
                 bound_th: float = BOUND_TH) -> tuple[float, float]:
  """(J, F) of one frame with the benchmark's empty-mask rules. gt_mask None = no GT PNG = empty."""
  pred = np.asarray(pred_mask).astype(bool)
  gt = np.zeros_like(pred) if gt_mask is None else np.asarray(gt_mask).astype(bool)
  if gt.shape != pred.shape:
    raise ValueError(f"ground-truth mask {gt.shape} and predicted mask {pred.shape} shapes differ")
  gt_any = bool(gt.any())
  pred_any = bool(pred.any())
  if not gt_any and not pred_any:
    return 1.0, 1.0
  if gt_any != pred_any:
    return 0.0, 0.0
  return float(db_eval_iou(gt, pred)), float(f_measure(pred, gt, bound_th))


def entry_mask_scores(frames: Iterable[tuple[Optional[np.ndarray], np.ndarray]],
                      bound_th: float = BOUND_TH) -> tuple[float, float]:
  """Mean (J, F) over the predicted frames of one entry; (0, 0) when there is no predicted frame.

  Args:
    frames: (gt_mask or None, pred_mask) for every frame that has a predicted mask, each [H, W].
  """
  js, fs = [], []
  for gt, pred in frames:
    j, f = frame_scores(gt, pred, bound_th)
    js.append(j)
    fs.append(f)
  if not js:
    return 0.0, 0.0
  return float(np.mean(js)), float(np.mean(fs))


def mask_summary(entry_j: Sequence[float], entry_f: Sequence[float]) -> dict[str, float]:
  """J, F and JF = (J + F) / 2 as mean over the scored entries x 100 (NaN when no entry has GT masks)."""
  j = _mean_pct(entry_j)
  f = _mean_pct(entry_f)
  return {"J": j, "F": f, "JF": (j + f) / 2.0}


def st_evidence_summary(correct: Sequence[bool], ious: Sequence[float], iops: Sequence[float],
                        entry_j: Sequence[float], entry_f: Sequence[float]) -> dict[str, float | int]:
  """All ST-Evidence-Gen metrics from per-entry scores.

  Args:
    correct, ious, iops: one value per ground-truth entry (missing entries: False / 0 / 0).
    entry_j, entry_f: one value per entry that has a ground-truth mask folder.
  Returns:
    accuracy, mIoU, mIoP, tIoU@0.3, tIoU@0.5, tIoP@0.3, tIoP@0.5, t_mean, J, F, JF (percent),
    num_entries, num_mask_entries.
  """
  if not len(correct) == len(ious) == len(iops):
    raise ValueError(f"per-entry lists differ in length: {len(correct)}, {len(ious)}, {len(iops)}")
  out: dict[str, float | int] = {"accuracy": _mean_pct(np.asarray(correct, dtype=bool))}
  out.update(temporal_summary(ious, iops))
  out.update(mask_summary(entry_j, entry_f))
  out["num_entries"] = len(correct)
  out["num_mask_entries"] = len(entry_j)
  return out


# ----------------------------------------------------------------------------------------------------------------------
# DAVIS-2017 aggregation (semi-supervised protocol) for DAVIS-style masklet data.


def db_statistics(per_frame_values: Sequence[float]) -> tuple[float, float, float]:
  """DAVIS (mean, recall, decay) of one object's per-frame scores.

  recall = fraction of frames scoring > 0.5; decay = mean of the first quarter minus mean of the last quarter
  (DAVIS's 4 bins, bin edges round(linspace(1, T, 5)) - 1, inclusive). NaN frames are ignored by the means. DAVIS
  stores the bin edges as uint8, which wraps past 255 frames; this uses full integers.
  """
  v = np.asarray(per_frame_values, dtype=np.float64)
  if v.size == 0:
    return math.nan, math.nan, math.nan
  with np.errstate(all="ignore"):
    mean = float(np.nanmean(v)) if np.any(~np.isnan(v)) else math.nan
    recall = float(np.mean(v > 0.5))
    ids = (np.round(np.linspace(1, len(v), 5) + 1e-10) - 1).astype(np.int64)
    first = v[ids[0]:ids[1] + 1]
    last = v[ids[3]:ids[4] + 1]
    first_m = np.nanmean(first) if np.any(~np.isnan(first)) else math.nan
    last_m = np.nanmean(last) if np.any(~np.isnan(last)) else math.nan
  return mean, recall, float(first_m - last_m)


def davis_sequence_scores(gt_masks: np.ndarray, pred_masks: np.ndarray, drop_first_last: bool = False,
                          bound_th: float = BOUND_TH) -> tuple[np.ndarray, np.ndarray]:
  """Per-object, per-frame J and F of one sequence (DAVIS semi-supervised protocol).

  Args:
    gt_masks: [objects, frames, H, W] binary, one channel per object.
    pred_masks: [pred_objects, frames, H, W] binary; pred_objects <= objects, missing objects count as empty.
    drop_first_last: drop the first and last frames (the semi-supervised protocol: the first frame is given).
  Returns:
    (J, F), each [objects, frames'] with DAVIS's own empty rules (J = 1 for two empty masks, F by `f_measure`).
  """
  gt = np.asarray(gt_masks).astype(bool)
  pred = np.asarray(pred_masks).astype(bool)
  if gt.ndim != 4 or pred.ndim != 4:
    raise ValueError(f"expected [objects, frames, H, W] masks, got {gt.shape} and {pred.shape}")
  if pred.shape[0] > gt.shape[0]:
    raise ValueError(f"prediction has {pred.shape[0]} objects but the sequence only {gt.shape[0]}")
  if pred.shape[1:] != gt.shape[1:]:
    raise ValueError(f"prediction frames/size {pred.shape[1:]} differ from ground truth {gt.shape[1:]}")
  if pred.shape[0] < gt.shape[0]:
    pad = np.zeros((gt.shape[0] - pred.shape[0],) + gt.shape[1:], dtype=bool)
    pred = np.concatenate([pred, pad], axis=0)
  if drop_first_last:
    gt, pred = gt[:, 1:-1], pred[:, 1:-1]
  n_obj, n_frames = gt.shape[:2]
  j = np.zeros((n_obj, n_frames))
  f = np.zeros((n_obj, n_frames))
  for o in range(n_obj):
    for t in range(n_frames):
      j[o, t] = db_eval_iou(gt[o, t], pred[o, t])
      f[o, t] = f_measure(pred[o, t], gt[o, t], bound_th)
  return j, f


def davis_aggregate(sequences: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
  """DAVIS-2017 global numbers from per-sequence (J [objects, frames], F [objects, frames]).

  Each object is one statistic (mean over its frames); the global means are over objects, J&F = (J + F) / 2.
  Returns {"J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay"} (fractions, as DAVIS
  prints them) and "per_object": {"<sequence>_<k>": {"J-Mean", "F-Mean"}} with k counted from 1.
  """
  stats = {"J": [], "F": []}
  per_object = {}
  for name, (j, f) in sequences.items():
    j = np.atleast_2d(np.asarray(j, dtype=np.float64))
    f = np.atleast_2d(np.asarray(f, dtype=np.float64))
    if j.shape != f.shape:
      raise ValueError(f"sequence {name}: J {j.shape} and F {f.shape} shapes differ")
    for o in range(j.shape[0]):
      js, fs = db_statistics(j[o]), db_statistics(f[o])
      stats["J"].append(js)
      stats["F"].append(fs)
      per_object[f"{name}_{o + 1}"] = {"J-Mean": js[0], "F-Mean": fs[0]}
  if not stats["J"]:
    raise ValueError("davis_aggregate needs at least one sequence with one object")
  out: dict[str, Any] = {}
  for key in ("J", "F"):
    arr = np.asarray(stats[key])
    out[f"{key}-Mean"] = float(np.mean(arr[:, 0]))
    out[f"{key}-Recall"] = float(np.mean(arr[:, 1]))
    out[f"{key}-Decay"] = float(np.mean(arr[:, 2]))
  out["J&F-Mean"] = (out["J-Mean"] + out["F-Mean"]) / 2.0
  out["per_object"] = per_object
  return out


# ----------------------------------------------------------------------------------------------------------------------
# ST-Evidence-MCQ.

MCQ_TASKS = ("qa", "temporal", "spatial")


def mcq_metrics(gt_answers: Mapping[str, Mapping[str, int]],
                pred_answers: Mapping[str, Mapping[str, Optional[int]]]) -> dict[str, float | int]:
  """ST-Evidence-MCQ accuracies in percent: QA, temporal, spatial and pooled (all three right).

  Args:
    gt_answers: {entry_id: {"qa": int, "temporal": int, "spatial": int}} correct option indices.
    pred_answers: {entry_id: {"qa": int, ...}} chosen option indices; a missing entry or task is wrong.
  Returns:
    {"qa", "temporal", "spatial", "pooled": percent over all ground-truth entries, "num_entries",
     "num_missing_entries"}.
  """
  correct = {t: 0 for t in MCQ_TASKS}
  pooled = 0
  missing = 0
  for entry_id, gt in gt_answers.items():
    pred = pred_answers.get(entry_id)
    if pred is None:
      missing += 1
      continue
    hits = [pred.get(t) is not None and pred.get(t) == gt[t] for t in MCQ_TASKS]
    for t, hit in zip(MCQ_TASKS, hits):
      correct[t] += hit
    pooled += all(hits)
  n = len(gt_answers)
  out: dict[str, float | int] = {t: 100.0 * correct[t] / n if n else math.nan for t in MCQ_TASKS}
  out["pooled"] = 100.0 * pooled / n if n else math.nan
  out["num_entries"] = n
  out["num_missing_entries"] = missing
  return out
