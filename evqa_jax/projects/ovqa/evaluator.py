"""OVQA evaluation: predictions.csv in the official format (`index`, `prediction`), scored by evqa_jax.evaluate.ovqa
exactly as `python -m evqa_jax.evaluate.ovqa --train-csv T --test-csv S --pred P` scores anyone's file."""

import csv
import os

from evqa_jax import io as io_lib
from evqa_jax.evaluate import ovqa as ovqa_eval


def split_csv(data_dir: str, split: str) -> str:
  path = os.fspath(io_lib.epath_of(data_dir) / f"{split}.csv")  # local or gs://...
  if not io_lib.epath_of(path).exists():
    raise FileNotFoundError(f"{path} is missing: the OVQA converter copies each split's CSV next to the records")
  return path


def write_predictions(path: str, indices, predictions) -> None:
  with io_lib.atomic_path(path) as tmp:
    with open(tmp, "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["index", "prediction"])
      for idx, p in zip(indices, predictions):
        w.writerow([int(idx), p])


def evaluate(data_dir: str, answers, split: str, outputs: dict, out_dir: str) -> dict:
  """outputs["pred"] `[N]` (answer ids into `answers`, the eval vocabulary), outputs["index"] `[N]` -> metrics;
  writes out_dir/predictions.csv and out_dir/metrics.json."""
  preds = [answers[i] if 0 <= i < len(answers) else "" for i in outputs["pred"]]
  io_lib.makedirs(out_dir)
  pred_path = os.path.join(out_dir, "predictions.csv")
  write_predictions(pred_path, outputs["index"], preds)
  metrics = ovqa_eval.evaluate_files(split_csv(data_dir, "train"), split_csv(data_dir, split), pred_path)
  io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
  return metrics
