"""ST-Evidence-Gen metrics (REFERENCE.md section 3) and DAVIS-2017 masklet aggregation; plain numpy.

Reproduces the benchmark evaluator, quirks included:
  - Answer: str(prediction).strip(); a letter A..F with an index inside the candidates selects candidates[index], any
    other string (option text "down", a letter past the candidates, "2") is compared as it is; correct when it equals
    the ground-truth answer after strip. A missing entry or a null answer is wrong; the denominator is every
    ground-truth entry.
  - Predicted segments are read as the official loader reads them (`parse_pred_segments`): [[s, e], ...], a flat
    [s1, e1, s2, e2] of numbers, {start, end} / {start_time, end_time} dicts, numbers as strings, extra elements
    ignored; what cannot be read is dropped and the entry counted once by kind (malformed / empty / parse error).
  - Temporal: intersection = sum over ALL (gt, pred) segment pairs of max(0, min(ends) - max(starts)); segments are not
    merged, so overlapping predicted segments count the same ground-truth time twice and IoU can exceed 1.
    Lengths are max(0, e - s), so a reversed segment has length 0. IoU = inter / (gt_len + pred_len - inter),
    IoP = inter / pred_len; an empty prediction (or ground truth) or a missing entry scores 0 and stays in the
    denominator. A non-positive union or predicted length scores 0 instead of dividing by zero.
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


def _pair(start: Any, end: Any) -> tuple[float, float]:
  """float() of both ends, as the official loader does: numbers, numeric strings (" 1.5", "1e3") and booleans."""
  return float(start), float(end)


def parse_segments(value: Any, where: str = "segments") -> list[tuple[float, float]]:
  """Ground-truth segments [[start, end], ...] in seconds, from a string "[[s, e], ...]" or a parsed list.

  The official ground-truth loader's shapes: each segment a list of >= 2 elements (the first two used), numbers or
  numeric strings; a reversed segment is kept (its length counts as 0). None, "" and "[]" mean no segments. Anything
  the official loader would silently drop (an unparsable string, a tuple, a segment it cannot read, a non-finite
  time) is a malformed ground truth here: ValueError naming `where`.
  """
  if value is None:
    return []
  parsed = value
  if isinstance(value, str):
    if not value.strip():
      return []
    try:
      parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
      raise ValueError(f"{where}: segment string {value!r} is not a list literal ({e})") from None
  if not isinstance(parsed, list):
    raise ValueError(f"{where}: segments must be a list of [start, end] lists, got {value!r}")
  out = []
  for seg in parsed:
    try:
      if not isinstance(seg, list) or len(seg) < 2:
        raise TypeError
      s, e = _pair(seg[0], seg[1])
    except OverflowError:  # an integer beyond float range
      s = e = math.inf
    except (TypeError, ValueError):
      raise ValueError(f"{where}: segment {seg!r} is not a [start, end] pair of numbers (in {value!r})") from None
    if not (math.isfinite(s) and math.isfinite(e)):
      raise ValueError(f"{where}: segment {seg!r} has a non-finite time")
    out.append((s, e))
  return out


# Kinds of unreadable predicted segments, counted once per entry (the official `format_errors` keys).
EMPTY_SEGMENTS = "empty_segments"
MALFORMED_SEGMENTS = "malformed_segments"
PARSE_ERRORS = "parse_errors"


def parse_pred_segments(value: Any) -> tuple[list[tuple[float, float]], Optional[str]]:
  """Predicted segments as the official loader reads them; never raises.

  Returns (segments, error kind or None):
    - a list of numbers only (booleans included) is flat: [s1, e1, s2, e2, ...] paired up, an odd last one dropped;
    - otherwise each element is read on its own: a list of >= 2 elements (first two), a {start, end} or
      {start_time, end_time} dict; ends through float(), so "1.5" is read. An element that cannot be read is dropped
      and the entry is MALFORMED_SEGMENTS (its readable segments still count);
    - an empty list is EMPTY_SEGMENTS, anything that is not a list (None, a string, a dict) PARSE_ERRORS, no segments.
  Reversed segments are kept; their length counts as 0.
  """
  if not isinstance(value, list):
    return [], PARSE_ERRORS
  if not value:
    return [], EMPTY_SEGMENTS
  out: list[tuple[float, float]] = []
  if all(isinstance(x, (int, float)) for x in value):
    for i in range(0, len(value) - 1, 2):
      out.append((float(value[i]), float(value[i + 1])))
    return out, None
  bad = False
  for seg in value:
    try:
      if isinstance(seg, list) and len(seg) >= 2:
        out.append(_pair(seg[0], seg[1]))
      elif isinstance(seg, dict) and "start" in seg and "end" in seg:
        out.append(_pair(seg["start"], seg["end"]))
      elif isinstance(seg, dict) and "start_time" in seg and "end_time" in seg:
        out.append(_pair(seg["start_time"], seg["end_time"]))
      else:
        bad = True
    except (TypeError, ValueError, OverflowError):
      bad = True
  return out, (MALFORMED_SEGMENTS if bad else None)


# The official evaluator maps these letters to candidates; any other answer is compared as text.
ANSWER_LETTERS = "ABCDEF"


def letter_to_index(letter: Any) -> Optional[int]:
  """"A" -> 0 .. "F" -> 5 after strip; None for anything else."""
  if not isinstance(letter, str):
    return None
  letter = letter.strip()
  if len(letter) != 1 or letter not in ANSWER_LETTERS:
    return None
  return ANSWER_LETTERS.index(letter)


# ----------------------------------------------------------------------------------------------------------------------
# Answer and temporal scores.


def answer_text(answer: Any, candidates: Sequence[str]) -> Optional[str]:
  """The answer text a prediction stands for: candidates[i] for a letter A..F inside the candidates, else
  str(answer).strip() (option text, a number, a letter past the candidates); None for a null answer."""
  if answer is None:
    return None
  text = str(answer).strip()
  idx = letter_to_index(text)
  if idx is not None and idx < len(candidates):
    return str(candidates[idx]).strip()
  return text


def answer_is_correct(answer: Any, candidates: Sequence[str], gt_answer: Any) -> bool:
  """True when the prediction (a letter or the answer text) equals the ground-truth answer after strip."""
  text = answer_text(answer, candidates)
  return text is not None and text == str(gt_answer).strip()


def _total_length(segments: Sequence[Sequence[float]]) -> float:
  return sum(max(0.0, e - s) for s, e in segments)


def temporal_iou_iop(gt_segments: Sequence[Sequence[float]],
                     pred_segments: Sequence[Sequence[float]]) -> tuple[float, float]:
  """(IoU, IoP) of one entry with the benchmark's unmerged pairwise intersection (IoU may exceed 1).

  Reversed segments have length 0 and intersect nothing; NaN ends (float("nan") is a readable number) intersect
  nothing either, through the same max/min argument order as the official evaluator.
  """
  if len(pred_segments) == 0 or len(gt_segments) == 0:
    return 0.0, 0.0
  inter = 0.0
  for gs, ge in gt_segments:
    for ps, pe in pred_segments:
      lo, hi = max(gs, ps), min(ge, pe)
      if hi > lo:
        inter += hi - lo
  gt_len = _total_length(gt_segments)
  pred_len = _total_length(pred_segments)
  union = gt_len + pred_len - inter
  iou = inter / union if union > 0 else 0.0
  iop = inter / pred_len if pred_len > 0 else 0.0
  return float(iou), float(iop)


def _mean_pct(values) -> float:
  """100 * mean with numpy's summation (the official mask means); NaN when empty."""
  values = np.asarray(values, dtype=np.float64)
  return 100.0 * float(values.mean()) if values.size else math.nan


def _official_pct(values: Sequence[float]) -> float:
  """100 * sum(values) / len(values) left to right in list order, the official script's own float expression (so its
  2-decimal rounding never flips on the last bit); 0 when empty, as it writes."""
  values = [float(v) for v in values]
  return 100 * sum(values) / len(values) if values else 0.0


def temporal_summary(ious: Sequence[float], iops: Sequence[float],
                     thresholds: Sequence[float] = TEMPORAL_THRESHOLDS) -> dict[str, float]:
  """mIoU, mIoP, tIoU@t, tIoP@t (% of entries with score >= t) and t_mean (mean of (IoU + IoP) / 2), all x 100.

  Args:
    ious, iops: one value per ground-truth entry, [num_entries] (0 for missing entries).
  """
  ious = [float(v) for v in ious]
  iops = [float(v) for v in iops]
  if len(ious) != len(iops):
    raise ValueError(f"{len(ious)} IoU values but {len(iops)} IoP values")
  out = {"mIoU": _official_pct(ious), "mIoP": _official_pct(iops)}
  for t in thresholds:
    out[f"tIoU@{t}"] = _official_pct([1 if v >= t else 0 for v in ious])
  for t in thresholds:
    out[f"tIoP@{t}"] = _official_pct([1 if v >= t else 0 for v in iops])
  out["t_mean"] = _official_pct([(a + b) / 2 for a, b in zip(ious, iops)])
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
  """J, F and JF = mean over the scored entries of (J + F) / 2, each x 100 (NaN when no entry has GT masks)."""
  return {"J": _mean_pct(entry_j), "F": _mean_pct(entry_f),
          "JF": _mean_pct([(j + f) / 2 for j, f in zip(entry_j, entry_f)])}


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
  out: dict[str, float | int] = {"accuracy": 100 * sum(map(bool, correct)) / len(correct) if len(correct) else 0.0}
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
# The keys of the authors' results file: {entry_id: {"answer", "gt_answer", "evidence_t", "gt_evidence_t",
# "evidence_s", "gt_evidence_s"}} (letters), one pair per task.
MCQ_RESULT_KEYS = {"qa": ("answer", "gt_answer"), "temporal": ("evidence_t", "gt_evidence_t"),
                   "spatial": ("evidence_s", "gt_evidence_s")}


def _blank(v: Any) -> bool:
  """The official evaluator's "no value": None, "" or the string "None"."""
  return v is None or (isinstance(v, str) and v in ("", "None"))


def mcq_task_counts(results: Mapping[str, Mapping[str, Any]], task: str) -> dict[str, float | int]:
  """One task of the authors' results file scored as the official evaluator does.

  An entry counts (total) when its ground truth is not blank; it is valid when its prediction is not blank; it is
  correct when prediction == ground truth (plain equality: "a" != "A", an out-of-range letter is simply wrong).
  Returns {"correct", "total", "valid", "accuracy", "coverage"} (percentages, 0 when total is 0).
  """
  pred_key, gt_key = MCQ_RESULT_KEYS[task]
  correct = total = valid = 0
  for rec in results.values():
    gt = rec.get(gt_key)
    if _blank(gt):
      continue
    total += 1
    pred = rec.get(pred_key)
    if _blank(pred):
      continue
    valid += 1
    correct += pred == gt
  return {"correct": correct, "total": total, "valid": valid,  # the official float expressions, in its order
          "accuracy": (correct / total * 100) if total > 0 else 0.0,
          "coverage": (valid / total * 100) if total > 0 else 0.0}


def mcq_results_metrics(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
  """ST-Evidence-MCQ metrics of a results dict in the authors' layout (`MCQ_RESULT_KEYS`), official semantics.

  The denominators are the entries of `results` (with a ground truth for that task), not a ground-truth file:
  an entry absent from the results is not counted. overall_accuracy = correct answers of the three tasks over their
  questions (NOT "all three right"; that is our extra "pooled", over the entries with all three ground truths).

  Returns {"qa", "temporal", "spatial": {"correct", "total", "valid", "accuracy", "coverage"},
  "overall_accuracy", "pooled", "total_entries"} (percent).
  """
  out: dict[str, Any] = {t: mcq_task_counts(results, t) for t in MCQ_TASKS}
  questions = sum(out[t]["total"] for t in MCQ_TASKS)
  right = sum(out[t]["correct"] for t in MCQ_TASKS)
  out["overall_accuracy"] = (right / questions * 100) if questions > 0 else 0.0
  full = all_right = 0
  for rec in results.values():
    pairs = [(rec.get(p), rec.get(g)) for p, g in MCQ_RESULT_KEYS.values()]
    if any(_blank(g) for _, g in pairs):
      continue
    full += 1
    all_right += all(not _blank(p) and p == g for p, g in pairs)
  out["pooled"] = 100.0 * all_right / full if full else math.nan
  out["total_entries"] = len(results)
  return out


def option_letter(index: Any) -> Any:
  """0 -> "A", 1 -> "B", ...; anything that is not a non-negative integer is returned as it is (it will not equal a
  ground-truth letter, so it scores wrong)."""
  if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
    return chr(ord("A") + index)
  return index


def mcq_metrics(gt_answers: Mapping[str, Mapping[str, int]],
                pred_answers: Mapping[str, Mapping[str, Any]], count_missing: bool = False) -> dict[str, Any]:
  """ST-Evidence-MCQ accuracies in percent from option indices, with the official evaluator's semantics.

  Args:
    gt_answers: {entry_id: {"qa": int, "temporal": int, "spatial": int}} correct option indices (0-based).
    pred_answers: {entry_id: {"qa": int or None, ...}} chosen indices. An entry of `pred_answers` that is not in
      `gt_answers` is ignored; a missing task, None or an out-of-range / non-integer index is wrong.
    count_missing: also count the ground-truth entries absent from `pred_answers` (all wrong). Off by default: the
      official denominators are the entries present in the results.
  Returns:
    {"qa", "temporal", "spatial": accuracy (percent), "overall_accuracy", "pooled" (all three right),
     "<task>_correct", "<task>_total", "<task>_valid", "<task>_coverage", "num_entries" (entries scored),
     "num_missing_entries" (ground-truth entries without prediction)}.
  """
  results, missing, _ = mcq_results(gt_letters(gt_answers), pred_answers, count_missing)
  return flatten_mcq(mcq_results_metrics(results), missing)


def gt_letters(gt_answers: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
  """{entry_id: {task: index}} -> {entry_id: {"gt_answer", "gt_evidence_t", "gt_evidence_s": letter}}."""
  return {e: {MCQ_RESULT_KEYS[t][1]: option_letter(i) for t, i in g.items()} for e, g in gt_answers.items()}


def mcq_results(gt: Mapping[str, Mapping[str, Any]], preds: Mapping[str, Mapping[str, Any]],
                count_missing: bool = False) -> tuple[dict[str, dict[str, Any]], int, int]:
  """The authors' results layout from separate ground truth and predictions.

  Args:
    gt: {entry_id: {"gt_answer", "gt_evidence_t", "gt_evidence_s"}} letters (a task may be absent: no ground truth).
    preds: {entry_id: {"qa", "temporal", "spatial"}} letters or 0-based indices (turned into letters).
    count_missing: keep the ground-truth entries absent from `preds` (all wrong); by default they are left out.
  Returns:
    (results, ground-truth entries without prediction, prediction entries without ground truth).
  """
  results = {}
  for entry_id, g in gt.items():
    p = preds.get(entry_id)
    if p is None and not count_missing:
      continue
    p = p or {}
    rec = dict(g)
    for task, (pk, _) in MCQ_RESULT_KEYS.items():
      rec[pk] = option_letter(p.get(task))
    results[entry_id] = rec
  return results, sum(e not in preds for e in gt), sum(e not in gt for e in preds)


def flatten_mcq(m: Mapping[str, Any], missing: int = 0) -> dict[str, Any]:
  """Flat keys of `mcq_results_metrics`: qa, temporal, spatial (accuracy), <task>_{correct,total,valid,coverage},
  overall_accuracy, pooled, num_entries, num_missing_entries."""
  out: dict[str, Any] = {}
  for t in MCQ_TASKS:
    out[t] = m[t]["accuracy"]
    for k in ("correct", "total", "valid", "coverage"):
      out[f"{t}_{k}"] = m[t][k]
  out["overall_accuracy"] = m["overall_accuracy"]
  out["pooled"] = m["pooled"]
  out["num_entries"] = m["total_entries"]
  out["num_missing_entries"] = missing
  return out
