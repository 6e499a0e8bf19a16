"""ST-Evidence-MCQ evaluator: QA, temporal- and spatial-evidence accuracy and the official overall_accuracy.

Usage:
  python -m evqa_jax.evaluate.st_evidence_mcq RESULTS.json [--out metrics.json]
      the authors' results file, exactly as their `eval_st_evidence_mcq.py RESULTS.json`
  python -m evqa_jax.evaluate.st_evidence_mcq --mcq-csv st_evidence_mcq.csv --temp-options temp_options.json \
      --mask-options mask_options.json --pred P.json [--out metrics.json]
      the release layout as ground truth
  python -m evqa_jax.evaluate.st_evidence_mcq --gt G_mcq.json --pred P.json [--out metrics.json]
      our converted ground truth (data_prep/st_evidence.py --mcq)

Results file (SalesforceAIResearch/EVQA `benchmark/st_evidence_mcq/*_st_evidence_mcq.py --task all`):
  {entry_id: {"answer": "A".."E" or null, "gt_answer": letter, "evidence_t": "A".."D" or null, "gt_evidence_t",
              "evidence_s": "A".."D" or null, "gt_evidence_s", ...}}
Scoring, as `eval_st_evidence_mcq.py`: per task, an entry counts when its ground truth is not None / "" / "None", is
valid when its prediction is not, and is correct when prediction == ground truth (so "F", "a" or "B." are simply
wrong); the denominators are the entries present in the results file. overall_accuracy = the correct answers of the
three tasks over all their questions.

Prediction file with separate ground truth (--pred): per entry either the authors' letters (answer, evidence_t,
evidence_s; any gt_* keys in it are ignored) or our option indices {"qa": int, "temporal": int, "spatial": int}
(0 -> "A"). Entries absent from --pred are not counted (the official denominator); --count-missing counts them wrong
(stricter than the official script, off by default). Entries not in the ground truth are ignored with a warning.

Release ground truth (what the authors' inference scripts put into gt_*):
  st_evidence_mcq.csv: entry_id, options (the authors' scripts; `candidates` in the dataset card is accepted too, as
    a python-list string) and answer (text): gt_answer = the letter of the option equal to it (strip, lower-case);
    a row whose entry_id or answer is a pandas NA string ("", "None", "NA", "null", ...) has no QA ground truth,
    as in the authors' pipeline (they read the CSV with pandas defaults and skip such a row);
  temp_options.json: {entry_id: {"time_evidence_options": [4 segment sets], "correct_answer": "A".."D"}}: gt_evidence_t
    = correct_answer (an integer index is taken as its letter);
  mask_options.json: {key: {["entry_id"], "options": [...] or "mcq_options": [...], "answer" (or "correct_answer"):
    0-based index}}: gt_evidence_s = chr(65 + answer), keyed by entry_id (or the key).
  An entry absent from temp_options / mask_options has no ground truth for that task (not counted, as in the
  official pipeline); an answer that is not among the options, an index out of range or fewer than 4 options is a
  malformed ground truth: an error naming the file and entry.

Our ground truth (--gt): {entry_id: {"qa": {"options": [...], "answer": int}, "temporal": {"options": [...],
  "answer": int}, "spatial": {"frame": int, "answer": int [, "options": [...]]}}}, 0-based indices.

Output: "official": the official summary JSON (total_entries; qa / temporal / spatial {accuracy, correct, total,
valid, coverage}; overall_accuracy; unrounded, as the official file), then our flat keys: qa, temporal, spatial,
overall_accuracy, pooled (all three right, our extra), <task>_{correct,total,valid,coverage}, num_entries,
num_missing_entries, num_unmatched_predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional, Sequence


from evqa_jax import cli
from evqa_jax import io
from evqa_jax import log
from evqa_jax.evaluate import json_safe, load_json_object, read_csv
from evqa_jax.metrics import st_evidence as st

NUM_SPATIAL_OPTIONS = 4
# pandas.read_csv's default NA strings (the authors' scripts read st_evidence_mcq.csv with the defaults).
PANDAS_NA = frozenset(["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                       "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"])
NUM_TEMPORAL_OPTIONS = 4


def _load_json(path: str, what: str, finite: bool = True) -> dict:
  return load_json_object(path, what, "{entry_id: {...}}", finite)


def _is_index(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


# ----------------------------------------------------------------------------------------------------------------------
# Ground truth: ours ({task: correct index}) and the release layout (letters).


def read_gt(path: str) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
  """Our ground-truth JSON. Returns ({entry_id: {task: correct index}}, {entry_id: {task: number of options}})."""
  raw = _load_json(path, "ground-truth JSON")
  answers, num_options = {}, {}
  for entry_id, rec in raw.items():
    where = f"ground-truth JSON {path} entry {entry_id}"
    if not isinstance(rec, dict):
      raise ValueError(f"{where}: expected an object with qa, temporal, spatial")
    answers[entry_id], num_options[entry_id] = {}, {}
    for task in st.MCQ_TASKS:
      sub = rec.get(task)
      if not isinstance(sub, dict):
        raise ValueError(f"{where}: missing or malformed '{task}' object")
      if task == "spatial":
        if not _is_index(sub.get("frame")):
          raise ValueError(f"{where}: spatial.frame must be an integer frame index, got {sub.get('frame')!r}")
        n = len(sub["options"]) if isinstance(sub.get("options"), list) else NUM_SPATIAL_OPTIONS
      else:
        options = sub.get("options")
        if not isinstance(options, list) or not options:
          raise ValueError(f"{where}: {task}.options must be a non-empty list")
        if task == "temporal":
          for k, opt in enumerate(options):
            st.parse_segments(opt, f"{where} temporal.options[{k}]")
        n = len(options)
      ans = sub.get("answer")
      if not _is_index(ans) or not 0 <= ans < n:
        raise ValueError(f"{where}: {task}.answer must be an integer in 0..{n - 1}, got {ans!r}")
      answers[entry_id][task] = ans
      num_options[entry_id][task] = n
  return answers, num_options


def _qa_letters(csv_path: str) -> dict[str, str]:
  """{entry_id: gt_answer letter} from st_evidence_mcq.csv, as the authors' inference scripts compute it."""
  df = read_csv(csv_path, "MCQ CSV")
  col = "options" if "options" in df.columns else "candidates"
  missing = [c for c in ("entry_id", col, "answer") if c not in df.columns]
  if missing:
    raise ValueError(f"MCQ CSV {csv_path}: missing column(s) {missing} (options may be named 'options' or "
                     f"'candidates'); found {list(df.columns)}")
  out = {}
  for line, rec in enumerate(df.to_dict("records"), start=2):
    entry_id = str(rec["entry_id"])
    where = f"MCQ CSV {csv_path} line {line} (entry {entry_id})"
    if entry_id in PANDAS_NA or rec["answer"] in PANDAS_NA:
      # The authors read this CSV with pandas defaults: such a cell is NaN, and their scripts skip the row (no
      # entry_id) or fail on it and leave the question out (answer): no QA ground truth, as theirs.
      continue
    options = st.parse_candidates(rec[col], where)
    answer = rec["answer"].strip().lower()
    hits = [i for i, o in enumerate(options) if o.strip().lower() == answer]
    if not answer or not hits:
      raise ValueError(f"{where}: answer {rec['answer']!r} is not one of the options {options}")
    out[entry_id] = st.option_letter(hits[0])
  return out


def _temporal_letters(path: str) -> dict[str, str]:
  raw = _load_json(path, "temp_options JSON")
  out = {}
  for entry_id, rec in raw.items():
    where = f"temp_options JSON {path} entry {entry_id}"
    options = rec.get("time_evidence_options") if isinstance(rec, dict) else None
    if not isinstance(options, list) or len(options) < NUM_TEMPORAL_OPTIONS:
      raise ValueError(f"{where}: time_evidence_options must list {NUM_TEMPORAL_OPTIONS} segment sets")
    ans = rec.get("correct_answer")
    letters = [st.option_letter(i) for i in range(len(options))]
    letter = st.option_letter(ans) if _is_index(ans) else ans
    if letter not in letters:
      raise ValueError(f"{where}: correct_answer {ans!r} is not one of the option letters {letters}")
    out[str(entry_id)] = letter
  return out


def _spatial_letters(path: str) -> dict[str, str]:
  raw = _load_json(path, "mask_options JSON")
  out = {}
  for key, rec in raw.items():
    where = f"mask_options JSON {path} entry {key}"
    if not isinstance(rec, dict):
      raise ValueError(f"{where}: expected an object with options and answer")
    options = rec["options"] if isinstance(rec.get("options"), list) else rec.get("mcq_options")
    if not isinstance(options, list) or len(options) < NUM_SPATIAL_OPTIONS:
      raise ValueError(f"{where}: options (or mcq_options) must list {NUM_SPATIAL_OPTIONS} masks")
    ans = rec.get("answer", rec.get("correct_answer"))
    if not _is_index(ans) or not 0 <= ans < len(options):
      raise ValueError(f"{where}: answer must be an option index in 0..{len(options) - 1}, got {ans!r}")
    out[str(rec.get("entry_id", key))] = st.option_letter(ans)
  return out


def read_release_gt(mcq_csv: Optional[str], temp_options: Optional[str],
                    mask_options: Optional[str]) -> dict[str, dict[str, str]]:
  """{entry_id: {"gt_answer", "gt_evidence_t", "gt_evidence_s"}} (letters) from the release files given; a task
  without its file, or an entry absent from it, has no ground truth."""
  out: dict[str, dict[str, str]] = {}
  for path, reader, key in ((mcq_csv, _qa_letters, "gt_answer"), (temp_options, _temporal_letters, "gt_evidence_t"),
                            (mask_options, _spatial_letters, "gt_evidence_s")):
    if path is not None:
      for entry_id, letter in reader(path).items():
        out.setdefault(entry_id, {})[key] = letter
  return out


# ----------------------------------------------------------------------------------------------------------------------
# Predictions.


def read_predictions(path: str, num_options: Optional[dict] = None) -> dict[str, dict[str, Any]]:
  """{entry_id: {"qa", "temporal", "spatial"}} of a prediction file; values as written (letters or indices).

  Either the authors' keys (answer, evidence_t, evidence_s: letters) or ours (qa, temporal, spatial: indices) per
  entry; nothing is rejected (an out-of-range or malformed choice simply scores wrong). `num_options` is accepted for
  the callers of the previous signature and only used to warn about entries that are not in the ground truth.
  """
  raw = _load_json(path, "prediction JSON", finite=False)
  preds = {}
  for entry_id, rec in raw.items():
    rec = rec if isinstance(rec, dict) else {}
    ours = not any(k in rec for k, _ in st.MCQ_RESULT_KEYS.values())
    preds[entry_id] = {t: rec.get(t if ours else pk) for t, (pk, _) in st.MCQ_RESULT_KEYS.items()}
  if num_options is not None:
    unmatched = [e for e in preds if e not in num_options]
    if unmatched:
      log.warning(f"{len(unmatched)} prediction entries are not in the ground truth and are ignored, "
                  f"e.g. {unmatched[:5]}")
  return preds


def official_summary(m: dict[str, Any]) -> dict[str, Any]:
  """The official `save_metrics_summary` JSON from `mcq_results_metrics` output."""
  out: dict[str, Any] = {"total_entries": m["total_entries"]}
  for t in st.MCQ_TASKS:
    out[t] = {k: m[t][k] for k in ("accuracy", "correct", "total", "valid", "coverage")}
  out["overall_accuracy"] = m["overall_accuracy"]
  return out


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m evqa_jax.evaluate.st_evidence_mcq",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("results", nargs="?", default=None, help="the authors' results file (ground truth inside)")
  parser.add_argument("--pred", default=None, help="prediction JSON scored against --gt or the release files")
  parser.add_argument("--gt", default=None, help="our ground-truth JSON (data_prep/st_evidence.py --mcq)")
  parser.add_argument("--mcq-csv", default=None, help="release st_evidence_mcq.csv (QA ground truth)")
  parser.add_argument("--temp-options", default=None, help="release temp_options.json (temporal ground truth)")
  parser.add_argument("--mask-options", default=None, help="release mask_options.json (spatial ground truth)")
  parser.add_argument("--count-missing", action="store_true",
                      help="stricter than the official script: ground-truth entries absent from --pred count wrong")
  parser.add_argument("--out", default=None, help="metrics JSON (default <results dir>/<results stem>_metrics.json)")
  args = parser.parse_args(argv)
  source = args.results if args.results is not None else args.pred
  out_path = args.out or (source and os.path.join(os.path.dirname(source),
                                                  os.path.splitext(os.path.basename(source))[0] + "_metrics.json"))
  io.check_args(args, {"out": out_path})

  release = any(p is not None for p in (args.mcq_csv, args.temp_options, args.mask_options))
  if args.results is not None:
    if args.pred or args.gt or release:
      parser.error("give either a results file, or --pred with --gt or the release files")
    results = _load_json(args.results, "results JSON", finite=False)
    results = {e: (r if isinstance(r, dict) else {}) for e, r in results.items()}
    missing = unmatched = 0
    source = args.results
  else:
    if args.pred is None or (args.gt is None) == (not release):
      parser.error("give a results file, or --pred with exactly one of --gt and the release files")
    gt = st.gt_letters(read_gt(args.gt)[0]) if args.gt else read_release_gt(args.mcq_csv, args.temp_options,
                                                                         args.mask_options)
    results, missing, unmatched = st.mcq_results(gt, read_predictions(args.pred), args.count_missing)
    if unmatched:
      print(f"warning: {unmatched} prediction entries are not in the ground truth and are ignored", file=sys.stderr)
    source = args.pred
  m = st.mcq_results_metrics(results)
  out = dict(official=official_summary(m), **st.flatten_mcq(m, missing), num_unmatched_predictions=unmatched)
  out = json_safe(out)
  io.write_json(out_path, out)
  for t in st.MCQ_TASKS:
    print(f"{t:>9}: {out[t]:6.2f}%  ({out[f'{t}_correct']}/{out[f'{t}_total']} correct, "
          f"{out[f'{t}_valid']} valid, coverage {out[f'{t}_coverage']:.1f}%)")
  print(f"Overall Accuracy (all tasks): {out['overall_accuracy']:.2f}%   [pooled, all three right: "
        f"{'-' if out['pooled'] is None else format(out['pooled'], '.2f')}]   {out['num_entries']} entries"
        + (f", {missing} ground-truth entries without prediction (not counted)" if missing and not args.count_missing
           else ""))
  print(f"official: {json.dumps(out['official'])}")
  return out


if __name__ == "__main__":
  sys.exit(cli.run(main))
