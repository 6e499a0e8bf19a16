"""Trivial E-VQA predictions scored by the official evaluators, for comparison with a trained model.

    python benchmarks/evqa_trivial_baselines.py [--records data/synthetic_evqa/records] [--split test] [--out DIR]

ST-Evidence-Gen (evqa_jax.evaluate.st_evidence on the records' ground-truth copies), every entry answered "A" and
given the whole video [0, num_video_frames / fps] as its one segment, with a mask PNG at native resolution for every
frame of the video:
  whole_video_empty   empty masks
  whole_video_box     a centred box covering the middle half of each side (a quarter of the frame)
  whole_video_full    the full frame
ST-Evidence-MCQ (evqa_jax.evaluate.st_evidence_mcq): always the first option of every task.
Prints one JSON line {baseline: metrics}; with --out also writes the prediction files and metrics there. The default
--records, the demo's world (`configs/evqa_gen.py:demo`), is generated on first use as the demo does.

    python benchmarks/evqa_trivial_baselines.py --rescore runs/evqa_demo/eval/test_step200 [--out DIR]

scores a model's Gen predictions (predictions.json + pred_masks/) under the baselines' frame protocol instead: the
evaluator scores only frames that have a predicted PNG and counts a frame where both masks are empty as J = F = 1,
so the whole-video baselines (a PNG on every frame) collect 1s on every frame without the object. The rescore copies
the model's masks and adds an empty PNG for every other frame of the video (the model's masklet is empty outside its
predicted evidence), so model and baselines are scored on the same frames. Prints {"rescored": metrics}; on the
synthetic world (whose records carry synthetic_question_types.json) also {"by_kind": {kind: {"n", "accuracy",
"tIoU", "J", "F"}}} (in %) from the run's per_entry.json: which kinds of question the model has learnt.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evqa_jax.data import records  # pylint: disable=g-import-not-at-top
from evqa_jax.data import source as source_lib
from evqa_jax.evaluate import json_safe
from evqa_jax.evaluate import st_evidence as st_eval
from evqa_jax.evaluate import st_evidence_mcq as mcq_eval
from evqa_jax.metrics import st_evidence as st
from evqa_jax.projects.evqa import evaluator as evqa_task

MASKS = ("empty", "box", "full")
DEMO_WORLD = "data/synthetic_evqa"  # configs/evqa_gen.py:demo's world (its data.dir's parent)


def trivial_mask(kind: str, height: int, width: int) -> np.ndarray:
  """bool [H, W]: empty, full, or a centred box over rows H/4..3H/4 and columns W/4..3W/4."""
  m = np.zeros((height, width), bool)
  if kind == "full":
    m[:] = True
  elif kind == "box":
    m[height // 4:height - height // 4, width // 4:width - width // 4] = True
  elif kind != "empty":
    raise ValueError(f"unknown trivial mask {kind!r}: expected one of {MASKS}")
  return m


def _entries(records_dir: str, split: str) -> list[dict]:
  src = source_lib.TFRecordDataSource(records.split_paths(records_dir, split), records.load_spec(records_dir, split))
  out = []
  for i in range(len(src)):
    ex = src[i]
    out.append({"entry_id": str(ex["entry_id"]), "video_id": str(ex["video_id"]),
                "num_video_frames": int(ex["num_video_frames"]), "fps": float(ex["fps"]),
                "orig_size": tuple(int(x) for x in ex["orig_size"]),
                "mask_name_digits": int(ex.get("mask_name_digits", st_eval.AUTHORS_MASK_DIGITS))})
  return out


def gen_baseline(records_dir: str, split: str, mask_kind: str, out_dir: str) -> dict:
  """Writes and scores one whole-video baseline; returns the ST-Evidence-Gen metrics."""
  gt = records.load_metadata(records_dir)["ground_truth"][split]
  preds = []
  for e in _entries(records_dir, split):
    mask = trivial_mask(mask_kind, *e["orig_size"])
    preds.append({"entry_id": e["entry_id"], "video_id": e["video_id"], "answer": "A",
                  "segments": [(0.0, round(e["num_video_frames"] / e["fps"], 4))],
                  "masks": {f: mask for f in range(e["num_video_frames"])},
                  "mask_name_digits": e["mask_name_digits"]})
  pred_json, mask_root = evqa_task.write_gen_predictions(preds, out_dir)
  gt_masks = os.path.join(records_dir, gt["gt_masks"]) if gt.get("gt_masks") else None
  metrics, _ = st_eval.evaluate(os.path.join(records_dir, gt["csv"]), pred_json, gt_masks,
                                mask_root if gt_masks else None)
  return json_safe(metrics)


def mcq_baseline(records_dir: str, split: str, out_dir: str) -> dict:
  gt = records.load_metadata(records_dir)["ground_truth"][split]
  if not gt.get("mcq"):
    return {}
  gt_path = os.path.join(records_dir, gt["mcq"])
  answers, num_options = mcq_eval.read_gt(gt_path)
  pred_path = os.path.join(out_dir, "mcq_predictions.json")
  with open(pred_path, "w") as f:
    json.dump({k: {"qa": 0, "temporal": 0, "spatial": 0} for k in answers}, f)
  return json_safe(st.mcq_metrics(answers, mcq_eval.read_predictions(pred_path, num_options)))


def rescore_every_frame(records_dir: str, split: str, pred_dir: str, out_dir: str) -> dict:
  """The model's predictions in `pred_dir` with an empty mask PNG added on every frame that has none; Gen metrics."""
  gt = records.load_metadata(records_dir)["ground_truth"][split]
  pred_json = os.path.join(pred_dir, "predictions.json")
  src_root = os.path.join(pred_dir, "pred_masks")
  if not os.path.isfile(pred_json) or not os.path.isdir(src_root):
    raise FileNotFoundError(f"--rescore {pred_dir}: expected predictions.json and pred_masks/ (an eval/<split>_step<N> "
                            "directory of a training run)")
  mask_root = os.path.join(out_dir, "pred_masks")
  for e in _entries(records_dir, split):
    src = os.path.join(src_root, e["entry_id"], "masks")
    dst = os.path.join(mask_root, e["entry_id"], "masks")
    os.makedirs(dst, exist_ok=True)
    have = set(os.listdir(src)) if os.path.isdir(src) else set()
    empty = trivial_mask("empty", *e["orig_size"])
    for f in range(e["num_video_frames"]):
      name = st_eval.mask_file_name(f, e["mask_name_digits"])
      if name in have:
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
      else:
        evqa_task.write_mask_png(os.path.join(dst, name), empty)
  gt_masks = os.path.join(records_dir, gt["gt_masks"])
  metrics, _ = st_eval.evaluate(os.path.join(records_dir, gt["csv"]), pred_json, gt_masks, mask_root)
  return json_safe(metrics)


def by_question_kind(records_dir: str, pred_dir: str) -> dict:
  """Per-entry results of `pred_dir/per_entry.json` averaged per synthetic question kind; {} off the synthetic world."""
  kinds_path = os.path.join(records_dir, "synthetic_question_types.json")
  per_entry_path = os.path.join(pred_dir, "per_entry.json")
  if not (os.path.isfile(kinds_path) and os.path.isfile(per_entry_path)):
    return {}
  with open(kinds_path) as f:
    kinds = json.load(f)
  with open(per_entry_path) as f:
    per_entry = json.load(f)
  groups = {}
  for entry_id, r in per_entry.items():
    if entry_id not in kinds:
      raise KeyError(f"{per_entry_path}: entry {entry_id!r} is not in {kinds_path}")
    groups.setdefault(kinds[entry_id], []).append(r)
  out = {}
  for kind, rows in sorted(groups.items()):
    out[kind] = {"n": len(rows), "accuracy": 100.0 * float(np.mean([bool(r["correct"]) for r in rows]))}
    for key, name in (("IoU", "tIoU"), ("J", "J"), ("F", "F")):
      out[kind][name] = 100.0 * float(np.mean([r[key] for r in rows]))
  return out


def trivial_baselines(records_dir: str, split: str = "test", out_dir: str | None = None) -> dict:
  """{"whole_video_<mask>": Gen metrics for each mask kind, "mcq_first_option": MCQ metrics}."""
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    root = out_dir or tmp
    for kind in MASKS:
      results[f"whole_video_{kind}"] = gen_baseline(records_dir, split, kind, os.path.join(root, f"whole_video_{kind}"))
    mcq_dir = os.path.join(root, "mcq_first_option")
    os.makedirs(mcq_dir, exist_ok=True)
    results["mcq_first_option"] = mcq_baseline(records_dir, split, mcq_dir)
  return results


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--records", default=os.path.join(DEMO_WORLD, "records"))
  p.add_argument("--split", default="test")
  p.add_argument("--out", default=None, help="keep the prediction files here")
  p.add_argument("--rescore", default=None, help="a model's eval/<split>_step<N> directory: score its masks with an "
                 "empty PNG on every frame it left out (the baselines' frame protocol)")
  a = p.parse_args(argv)
  if os.path.normpath(a.records) == os.path.join(DEMO_WORLD, "records"):
    from data_prep import synthetic_evqa  # pylint: disable=g-import-not-at-top
    synthetic_evqa.ensure_world(DEMO_WORLD, "default")  # the demo's world, built once (what the demo would build)
  if not os.path.exists(os.path.join(a.records, "metadata.json")):
    raise SystemExit(f"{a.records} holds no records: run `python -m data_prep.synthetic_evqa --out "
                     f"{os.path.dirname(os.path.normpath(a.records))}` (or train the demo once) first")
  if a.rescore:
    with tempfile.TemporaryDirectory() as tmp:
      results = {"rescored": rescore_every_frame(a.records, a.split, a.rescore, a.out or tmp)}
    kinds = by_question_kind(a.records, a.rescore)
    if kinds:
      results["by_kind"] = kinds
    print(json.dumps(results, sort_keys=True))
    return results
  results = trivial_baselines(a.records, a.split, a.out)
  print(json.dumps(results, sort_keys=True))
  return results


if __name__ == "__main__":
  main()
