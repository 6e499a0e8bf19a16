"""ST-Evidence-Gen evaluator: answer accuracy, temporal IoU/IoP and mask J/F, as the official script computes them.

Usage (the official script's `eval_st_evidence.py --gt_file G --pred_file P [--eval_masks --gt_mask_dir D
--pred_mask_dir M]`):
  python -m evqa_jax.evaluate.st_evidence --gt-csv gt.csv --pred preds.json [--gt-masks gt_masks \
      [--pred-masks pred_masks] [--mask-mode concat|seperate]] [--out metrics.json] [--per-entry per_entry.json]

Inputs, read exactly as SalesforceAIResearch/EVQA `benchmark/st_evidence_gen/eval_st_evidence.py` reads them:
  --gt-csv: columns entry_id, candidates (python-list string), answer (text), segment ("[[s, e], ...]" seconds);
    other columns are ignored. A row the official loader would silently misread (unparsable candidates or segments,
    a repeated or empty entry_id) is an error naming the file, line and entry.
  --pred: JSON {entry_id: {"parsed_response": {"answer": ..., "segments": ...}, ["mask_folder": dir]}}.
    answer: a letter A..F (mapped to the candidates) or the answer text itself ("down"), compared after strip;
    segments: [[s, e], ...], a flat [s1, e1, s2, ...], [{start, end}] or [{start_time, end_time}], numbers or numeric
    strings, extra elements ignored, reversed segments length 0. Unreadable parts score 0 and are counted by kind
    (none_responses, empty_segments, malformed_segments, parse_errors); nothing in a prediction aborts the run.
  --gt-masks: <dir>/<entry_id>/<name>.png, binarised as PIL convert('L') > 0. Masks are scored only when given
    (the official --eval_masks). An entry without a GT folder is skipped.
  --pred-masks: <dir>/<entry_id>/masks/<name>.png; default, as the official script: the --pred path with ".json"
    removed, + "/concat" (or "/seperate" with --mask-mode seperate). An entry's "mask_folder" key, when present,
    takes precedence (a path relative to the working directory, as in the official script). A predicted PNG is
    matched to the GT PNG of exactly the same file name (no GT PNG = empty mask); unreadable PNGs are skipped, as
    the official script skips them, and reported (a warning naming each file; `unreadable_mask_files` in the
    output); entries without a predicted folder score 0, as the official, and are reported too
    (`num_missing_mask_folders`; a folder laid out like the ground truth, <dir>/<entry_id>/*.png, is named so).
    Names: the authors' prediction scripts write frame i of the 6-fps video as `str(i).zfill(5) + ".png"`, the naming
    of the release's masks (`mask_file_name`); our writer reuses the padding of each entry's GT folder
    (`mask_name_digits`, stored by the converter).

Leniency beyond the official script (off by default):
  --match-frame-numbers   also match numeric names by value (12.png <-> 00012.png).

Output (--out, default <pred dir>/<pred stem>_eval.json as the official script): "official": the official JSON's
blocks with its rounding (qa_metrics, temporal_metrics, format_errors, mask_metrics, num_samples); then our
unrounded flat keys (accuracy, mIoU, mIoP, tIoU@0.3, tIoU@0.5, tIoP@0.3, tIoP@0.5, t_mean, J, F, JF in percent;
num_correct, num_entries, num_mask_entries, num_mask_frames, num_missing_predictions, num_unmatched_predictions,
format_errors_<kind>; with masks num_missing_mask_folders, unreadable_mask_files) and "per_sample_scores"
({entry_id: {correct, IoU, IoP[, J, F, num_mask_frames][, mask_folder_missing][, unreadable_masks][, missing |
format_error]}}). Where ours differs from the official script (a GT/prediction mask
size mismatch: the official loses every mask metric, ours scores that frame 0 and counts it) the README says so.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

from evqa_jax import cli
from evqa_jax import io
from evqa_jax import log
from evqa_jax.evaluate import json_safe, load_json_object, read_csv
from evqa_jax.metrics import st_evidence as st

GT_COLUMNS = ("entry_id", "candidates", "answer", "segment")
# The official format_errors keys, in its order; ours adds the kinds the official script would crash on.
OFFICIAL_ERROR_KINDS = ("none_responses", "empty_segments", "malformed_segments", "parse_errors")
EXTRA_ERROR_KINDS = ("invalid_entries", "bad_mask_folder", "mask_size_mismatch", "unreadable_masks")
TEMPORAL_KEYS = {"mIoU": "mIoU", "mIoP": "mIoP", "t_mean": "t_mean", "TIoU@0.3": "tIoU@0.3", "TIoU@0.5": "tIoU@0.5",
                 "TIoP@0.3": "tIoP@0.3", "TIoP@0.5": "tIoP@0.5"}


def read_gt_csv(path: str) -> list[dict[str, Any]]:
  """Ground-truth rows: [{"entry_id", "candidates": [str], "answer": str, "segments": [(s, e)]}]."""
  df = read_csv(path, "ground-truth CSV", GT_COLUMNS)
  rows, seen = [], set()
  for line, rec in enumerate(df.to_dict("records"), start=2):
    entry_id = str(rec["entry_id"])  # verbatim: the official script matches ids without stripping
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


def read_predictions(path: str) -> tuple[dict[str, dict[str, Any]], collections.Counter]:
  """Reads the prediction JSON as the official loader does; never raises on an entry.

  Returns ({entry_id: {"answer": raw answer or None, "segments": [(s, e)], "error": kind or None,
  "mask_folder": str or None}}, Counter of format errors by kind over every entry of the file).
  """
  raw = load_json_object(path, "prediction JSON", "{entry_id: {\"parsed_response\": {...}}}", finite=False)
  preds, errors = {}, collections.Counter()
  for entry_id, rec in raw.items():
    answer, segments, kind, folder = None, [], None, None
    resp = rec.get("parsed_response") if isinstance(rec, dict) else None
    if not isinstance(rec, dict) or not (resp is None or isinstance(resp, dict)):
      kind = "invalid_entries"  # the official script would crash here
    elif resp is None:
      kind = "none_responses"
    else:
      answer = resp.get("answer")
      segments, kind = st.parse_pred_segments(resp.get("segments", []))
    if isinstance(rec, dict) and rec.get("mask_folder"):
      if isinstance(rec["mask_folder"], str):
        folder = rec["mask_folder"]
      else:
        errors["bad_mask_folder"] += 1
    if kind is not None:
      errors[kind] += 1
    preds[str(entry_id)] = {"answer": answer, "segments": segments, "error": kind, "mask_folder": folder}
  return preds, errors


def read_mask(path: str) -> Optional[np.ndarray]:
  """bool [H, W] = PIL convert('L') > 0 (so a colour pixel whose luminance rounds to 0 is background, exactly as the
  official script); None when the file cannot be read as an image (the official script then skips the frame)."""
  try:
    return io.read_mask(path)  # the one mask reader (the converter's too)
  except (OSError, ValueError):  # the official loader skips any unreadable file
    return None


def _png_names(directory: str) -> list[str]:
  """Names ending in ".png" (case-sensitive, as the official glob('*.png')), sorted."""
  return sorted(p.name for p in io.epath_of(directory).iterdir() if p.name.endswith(".png"))


# The authors' prediction scripts (benchmark/st_evidence_gen/*_st_evidence.py, unipixel_video_seg.py) name the mask of
# 6-fps frame i `str(i).zfill(5) + ".png"`, and the evaluator pairs files by exact name: the release's ground truth is
# named so too (else none of their masks would score).
AUTHORS_MASK_DIGITS = 5


def mask_file_name(frame: int, digits: int = AUTHORS_MASK_DIGITS) -> str:
  """The PNG name of 6-fps frame `frame`, zero-padded to `digits` digits ("00012.png"; digits 0: "12.png")."""
  return f"{int(frame):0{int(digits)}d}.png" if digits else f"{int(frame)}.png"


def mask_name_digits(names: Sequence[str], where: str) -> int:
  """The zero-padding of one ground-truth mask folder's PNG names, so that a predicted PNG of any frame gets the name
  the official evaluator looks for (it pairs predicted and ground-truth PNGs by exact file name).

  Every name must be `<frame>.png` (ASCII digits) with one padding throughout: the length of a name with a leading
  zero ("00012.png" -> 5), or none ("12.png" -> 0); no names -> AUTHORS_MASK_DIGITS. Otherwise a ValueError naming
  `where` and the file (two names for one frame, "5.png" and "00005.png", are two paddings).
  """
  stems = []
  for name in names:
    stem = name[:-len(".png")] if name.endswith(".png") else ""
    if not (stem.isascii() and stem.isdigit()):
      raise ValueError(f"{where}: mask {name!r} is not named <frame>.png (the frame index at 6 fps); the official "
                       "evaluator pairs predicted and ground-truth masks by file name")
    stems.append(stem)
  if not stems:
    return AUTHORS_MASK_DIGITS
  padded = [s for s in stems if len(s) > 1 and s[0] == "0"]
  digits = len(padded[0]) if padded else 0
  for stem in stems:
    if mask_file_name(int(stem), digits) != stem + ".png":
      raise ValueError(f"{where}: masks {padded[0]}.png and {stem}.png are zero-padded differently; the official "
                       "evaluator pairs predicted and ground-truth masks by file name, so one folder needs one naming")
  return digits


def _frame_number_key(name: str):
  stem = name[:-len(".png")]
  return int(stem) if stem.isdigit() else name


def entry_mask_scores_from_dirs(gt_dir: str, pred_dir: Optional[str], bound_th: float = st.BOUND_TH,
                                match_frame_numbers: bool = False,
                                errors: Optional[collections.Counter] = None,
                                unreadable: Optional[list] = None) -> Optional[tuple[float, float, int]]:
  """(J, F, number of scored frames) of one entry whose GT folder exists, as the official `evaluate_single_entry`.

  No predicted folder or no PNG in it -> (0, 0, 0). Each readable predicted PNG is scored against the GT PNG of the
  same file name (an absent or unreadable GT PNG is empty). When no predicted PNG is readable the official script
  drops the entry from the mask means: None. A GT/prediction size mismatch scores that frame 0 (counted in `errors`).
  Unreadable predicted PNGs (truncated, not an image) are skipped, as the official `load_mask` -> None -> `continue`,
  and their paths appended to `unreadable` (reported by `evaluate`: never a silent skip).
  """
  if pred_dir is None or not io.epath_of(pred_dir).is_dir():
    return 0.0, 0.0, 0
  names = _png_names(pred_dir)
  if not names:
    return 0.0, 0.0, 0
  gt_names = {}
  if io.epath_of(gt_dir).is_dir():
    for n in _png_names(gt_dir):
      gt_names[_frame_number_key(n) if match_frame_numbers else n] = n
  js, fs = [], []
  for name in names:
    pred = read_mask(os.path.join(pred_dir, name))
    if pred is None:
      if errors is not None:
        errors["unreadable_masks"] += 1
      if unreadable is not None:
        unreadable.append(os.path.join(pred_dir, name))
      continue
    gt_name = gt_names.get(_frame_number_key(name) if match_frame_numbers else name)
    gt = read_mask(os.path.join(gt_dir, gt_name)) if gt_name is not None else None
    if gt is not None and gt.shape != pred.shape:
      # The official empty-mask rules decide without comparing pixels; two non-empty masks of different sizes make
      # the official script lose every mask metric: ours scores the frame 0 and counts it.
      if gt.any() and pred.any() and errors is not None:
        errors["mask_size_mismatch"] += 1
      j = f = float(not gt.any() and not pred.any())
    else:
      j, f = st.frame_scores(gt, pred, bound_th)
    js.append(j)
    fs.append(f)
  if not js:
    return None
  return float(np.mean(js)), float(np.mean(fs)), len(js)


def _pred_mask_dir(pred: Optional[dict], entry_id: str, pred_masks: Optional[str]) -> Optional[str]:
  """The official choice: the entry's mask_folder when present, else <pred_masks>/<entry_id>/masks."""
  folder = pred.get("mask_folder") if pred else None
  if folder:
    return folder
  if pred_masks:
    return os.path.join(pred_masks, entry_id, "masks")
  return None


def evaluate(gt_csv: str, pred_json: str, gt_masks: Optional[str], pred_masks: Optional[str],
             bound_th: float = st.BOUND_TH,
             match_frame_numbers: bool = False) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
  """Scores one prediction set. Returns (flat metrics, per-entry scores).

  Masks are scored only when gt_masks is given; pred_masks is the base folder (<pred_masks>/<entry_id>/masks), and
  an entry's mask_folder key overrides it; with neither an entry's masks score 0.
  """
  gt_rows = read_gt_csv(gt_csv)
  preds, errors = read_predictions(pred_json)
  if gt_masks is not None and not io.epath_of(gt_masks).is_dir():
    raise FileNotFoundError(f"--gt-masks directory {gt_masks} does not exist")

  gt_ids = {r["entry_id"] for r in gt_rows}
  unmatched = sorted(set(preds) - gt_ids)
  if unmatched:
    log.warning(f"{len(unmatched)} prediction entries are not in {gt_csv} and are ignored, e.g. {unmatched[:5]}")

  correct, ious, iops, entry_j, entry_f = [], [], [], [], []
  per_entry: dict[str, dict[str, Any]] = {}
  missing = mask_frames = 0
  unreadable: list = []  # predicted PNGs skipped as unreadable (paths)
  no_folder: list = []  # entries with GT masks whose predicted mask folder does not exist (scored 0)
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
    if pred is None:
      rec["missing"] = True
    elif pred["error"]:
      rec["format_error"] = pred["error"]
    if gt_masks is not None and io.epath_of(os.path.join(gt_masks, eid)).exists():  # exists(), as the official check
      pred_dir = _pred_mask_dir(pred, eid, pred_masks)
      if pred_dir is None or not io.epath_of(pred_dir).is_dir():
        no_folder.append(eid)
        rec["mask_folder_missing"] = True
      before = len(unreadable)
      scores = entry_mask_scores_from_dirs(os.path.join(gt_masks, eid), pred_dir, bound_th, match_frame_numbers,
                                           errors, unreadable)
      if len(unreadable) > before:
        rec["unreadable_masks"] = unreadable[before:]
      if scores is not None:
        j, f, n = scores
        entry_j.append(j)
        entry_f.append(f)
        mask_frames += n
        rec.update(J=j, F=f, num_mask_frames=n)
    per_entry[eid] = rec

  metrics = st.st_evidence_summary(correct, ious, iops, entry_j, entry_f)
  metrics["num_correct"] = int(sum(correct))
  metrics["num_mask_frames"] = mask_frames
  metrics["num_missing_predictions"] = missing
  metrics["num_unmatched_predictions"] = len(unmatched)
  metrics["masks_scored"] = gt_masks is not None
  if gt_masks is not None:
    metrics["num_missing_mask_folders"] = len(no_folder)
    metrics["unreadable_mask_files"] = unreadable
    report_masks(no_folder, unreadable, pred_masks)
  for kind in OFFICIAL_ERROR_KINDS + EXTRA_ERROR_KINDS:
    metrics[f"format_errors_{kind}"] = errors[kind]
  metrics["format_errors_total"] = sum(errors[k] for k in OFFICIAL_ERROR_KINDS)
  return metrics, per_entry


def report_masks(no_folder: list, unreadable: list, pred_masks: Optional[str]) -> None:
  """Warning lines (stderr) for predicted masks that could not be scored, so that no score hides them: unreadable
  PNGs (skipped, as the official script skips them; each file named) and entries without a predicted mask folder
  (scored 0, as the official), with the layout the folder has when it matches nothing the evaluator reads."""
  if unreadable:
    print(f"warning: {len(unreadable)} predicted mask PNG(s) cannot be read (truncated or not an image) and are "
          f"skipped, as the official evaluator skips them: {', '.join(unreadable[:10])}"
          f"{' ...' if len(unreadable) > 10 else ''} (listed in unreadable_mask_files)", file=sys.stderr)
  if not no_folder:
    return
  where = f"--pred-masks {pred_masks}" if pred_masks else "no --pred-masks / mask_folder"
  hint = ""
  if pred_masks and not io.epath_of(pred_masks).is_dir():
    hint = f": {pred_masks} does not exist"
  elif pred_masks:
    flat = [e for e in no_folder if io.epath_of(os.path.join(pred_masks, e)).is_dir()
            and _png_names(os.path.join(pred_masks, e))]
    if flat:
      hint = (f": {len(flat)} of them hold PNGs directly in {pred_masks}/<entry_id>/ (the ground truth's layout), "
              f"but predicted masks are read from {pred_masks}/<entry_id>/masks/*.png (the official layout)")
  print(f"warning: {len(no_folder)} entr{'y' if len(no_folder) == 1 else 'ies'} with ground-truth masks have no "
        f"predicted mask folder ({where}) and score 0 J and F, e.g. {no_folder[:5]}{hint} (num_missing_mask_folders)",
        file=sys.stderr)


def official_block(metrics: dict[str, Any]) -> dict[str, Any]:
  """The official output JSON's blocks, with its rounding (2 decimals), from our flat metrics."""
  out = {
      "num_samples": metrics["num_entries"],
      "qa_metrics": {"accuracy": round(metrics["accuracy"], 2), "correct": metrics["num_correct"],
                     "total": metrics["num_entries"]},
      "temporal_metrics": {k: round(metrics[ours], 2) for k, ours in TEMPORAL_KEYS.items()},
      "format_errors": dict(total=metrics["format_errors_total"],
                            **{k: metrics[f"format_errors_{k}"] for k in OFFICIAL_ERROR_KINDS}),
  }
  if metrics.get("masks_scored") and metrics["num_mask_entries"] > 0:
    out["mask_metrics"] = {"J": round(metrics["J"], 2), "F": round(metrics["F"], 2), "J&F": round(metrics["JF"], 2),
                           "num_entries": metrics["num_mask_entries"], "total_masks": metrics["num_mask_frames"]}
  return out


def format_table(metrics: dict[str, Any]) -> str:
  keys = ["accuracy", "mIoU", "mIoP", "tIoU@0.3", "tIoU@0.5", "tIoP@0.3", "tIoP@0.5", "t_mean", "J", "F", "JF"]
  head = "".join(f"{k:>10}" for k in keys)
  vals = "".join(f"{'-':>10}" if metrics[k] is None else f"{metrics[k]:10.2f}" for k in keys)
  errs = ", ".join(f"{k}: {metrics[f'format_errors_{k}']}" for k in OFFICIAL_ERROR_KINDS + EXTRA_ERROR_KINDS
                   if metrics[f"format_errors_{k}"])
  return (f"{head}\n{vals}\n{metrics['num_entries']} entries, {metrics['num_mask_entries']} scored for masks, "
          f"{metrics['num_missing_predictions']} without prediction; format errors {metrics['format_errors_total']}"
          + (f" ({errs})" if errs else ""))


def default_pred_masks(pred_json: str, mask_mode: str) -> str:
  """The official default: the prediction path with every ".json" removed, + "/concat" or "/seperate"."""
  return pred_json.replace(".json", "") + "/" + mask_mode


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.st_evidence", description=__doc__.split("\n")[0])
  parser.add_argument("--gt-csv", required=True, help="ground-truth CSV")
  parser.add_argument("--pred", required=True, help="prediction JSON")
  parser.add_argument("--gt-masks", default=None, help="ground-truth masks <dir>/<entry_id>/<name>.png; scores masks")
  parser.add_argument("--pred-masks", default=None,
                      help="predicted masks <dir>/<entry_id>/masks/<name>.png (default: <pred without .json>/concat)")
  parser.add_argument("--mask-mode", default="concat", choices=["concat", "seperate"],
                      help="sub-folder of the default --pred-masks, as the official --mask_mode")
  parser.add_argument("--match-frame-numbers", action="store_true",
                      help="leniency beyond the official script: match 12.png with 00012.png")
  parser.add_argument("--out", default=None, help="metrics JSON to write (default <pred dir>/<pred stem>_eval.json)")
  parser.add_argument("--per-entry", default=None, help="optional JSON of per-entry scores")
  args = parser.parse_args(argv)

  pred_masks = args.pred_masks
  if args.gt_masks is not None and pred_masks is None:
    pred_masks = args.pred_masks = default_pred_masks(args.pred, args.mask_mode)
  out_path = args.out or os.path.join(os.path.dirname(args.pred),
                                      os.path.splitext(os.path.basename(args.pred))[0] + "_eval.json")
  io.check_args(args, {"out": out_path, "per_entry": args.per_entry})
  metrics, per_entry = evaluate(args.gt_csv, args.pred, args.gt_masks, pred_masks,
                                match_frame_numbers=args.match_frame_numbers)
  out = json_safe(dict(official=official_block(metrics), **metrics, per_sample_scores=per_entry))
  io.write_json(out_path, out)
  if args.per_entry:
    io.write_json(args.per_entry, json_safe(per_entry))
  print(format_table(out))
  print(f"official: {json.dumps(out['official'])}")
  return out


if __name__ == "__main__":
  sys.exit(cli.run(main))
