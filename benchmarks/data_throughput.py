"""Input-pipeline throughput on records shaped like each task's; prints one JSON line.

    python benchmarks/data_throughput.py [--seconds 4] [--batch 16]

For OVQA (video [10, 768] float32 + question/answer), VIOLIN (features [<=64, 512] float32 + 2 statements +
subtitles) and E-VQA (frames uint8 [24, 64, 64, 3] + masks uint8 [24, 64, 64] + strings) it writes
temporary records, then measures examples/s of: decoding alone in this process (`decode`), and
make_train_loader with a trivial numpy transform and worker_count 1 and 2 (`workers_1`, `workers_2`; the
first batch, which includes worker start-up, is not timed). The JSON carries the machine, the load around each
measurement and the `usable` verdict of benchmarks/machine.py (each loader measurement's block includes joining
its workers, so their CPU counts as this benchmark's own, not as foreign).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  pylint: disable=wrong-import-position
from evqa_jax.data import pipeline  # pylint: disable=g-import-not-at-top
from evqa_jax.data import records
from evqa_jax.data.example import Feature
from evqa_jax.data.source import TFRecordDataSource

MAX_VIOLIN_FRAMES = 64

TASKS = {
    "ovqa": {
        "num_examples": 512,
        "spec": {"video": Feature("float32", (10, 768)), "question": Feature("string", ()),
                 "answer": Feature("string", ())},
    },
    "violin": {
        "num_examples": 256,
        "spec": {"features": Feature("float32", (None, 512)), "statements": Feature("string", (2,)),
                 "subtitles": Feature("string", ()), "label": Feature("int64", ())},
    },
    "evqa": {
        "num_examples": 192,
        "spec": {"frames": Feature("uint8", (24, 64, 64, 3)), "masks": Feature("uint8", (24, 64, 64)),
                 "question": Feature("string", ()), "answer": Feature("string", ())},
    },
}


def make_example(task: str, i: int, rng: np.random.Generator) -> dict:
  text = " ".join(f"w{j}" for j in rng.integers(0, 1000, size=12))
  if task == "ovqa":
    return {"video": rng.normal(size=(10, 768)).astype(np.float32), "question": text, "answer": f"a{i % 50}"}
  if task == "violin":
    n = int(rng.integers(16, MAX_VIOLIN_FRAMES + 1))
    return {"features": rng.normal(size=(n, 512)).astype(np.float32), "statements": [text, text[::-1]],
            "subtitles": text * 8, "label": i % 2}
  return {"frames": rng.integers(0, 256, size=(24, 64, 64, 3), dtype=np.uint8),
          "masks": (rng.random((24, 64, 64)) < 0.3).astype(np.uint8), "question": text, "answer": "yes"}


def transform_ovqa(ex):
  return {"video": ex["video"], "q_len": np.int32(len(ex["question"]))}


def transform_violin(ex):
  n = ex["features"].shape[0]
  return {"features": pipeline.pad_or_truncate(ex["features"], MAX_VIOLIN_FRAMES),
          "mask": pipeline.length_mask(n, MAX_VIOLIN_FRAMES), "label": np.int32(ex["label"])}


def transform_evqa(ex):
  return {"frames": ex["frames"], "masks": ex["masks"], "q_len": np.int32(len(ex["question"]))}


TRANSFORMS = {"ovqa": transform_ovqa, "violin": transform_violin, "evqa": transform_evqa}


def timed_loader(src, transform, batch, workers, seconds) -> float:
  loader = pipeline.make_train_loader(src, global_batch_size=batch, transform=transform, seed=0,
                                      worker_count=workers, process_index=0, process_count=1)
  with iter(loader) as it:
    next(it)  # worker start-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
      next(it)
      n += batch
    return n / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement")
  parser.add_argument("--batch", type=int, default=16, help="global batch size")
  machine.add_arguments(parser)
  args = parser.parse_args()
  monitor = machine.monitor_from_args(args)

  t0 = time.perf_counter()
  figures = {"benchmark": "data_throughput", "batch": args.batch,
             "seconds_per_measurement": args.seconds}
  with tempfile.TemporaryDirectory(prefix="evqa_data_bench_") as tmp:
    for task, cfg in TASKS.items():
      rng = np.random.default_rng(0)
      out = os.path.join(tmp, task)
      n = cfg["num_examples"]
      start = time.perf_counter()
      records.write_split(out, "train", (make_example(task, i, rng) for i in range(n)), cfg["spec"], num_shards=2)
      write_s = time.perf_counter() - start
      paths = records.split_paths(out, "train")
      src = TFRecordDataSource.from_split(out, "train")
      with monitor.block(f"{task}/decode"):
        start = time.perf_counter()
        for i in range(len(src)):
          TRANSFORMS[task](src[i])
        decode_s = time.perf_counter() - start
      loader_rates = {}
      for w in (1, 2):
        with monitor.block(f"{task}/workers_{w}"):
          loader_rates[f"workers_{w}_examples_per_s"] = round(
              timed_loader(src, TRANSFORMS[task], args.batch, w, args.seconds), 1)
      figures[task] = {
          "num_examples": n,
          "mean_record_bytes": round(sum(os.path.getsize(p) for p in paths) / n),
          "write_examples_per_s": round(n / write_s, 1),
          "decode_examples_per_s": round(n / decode_s, 1),
          **loader_rates,
      }
  figures["total_seconds"] = round(time.perf_counter() - t0, 1)
  figures.update(monitor.report())
  print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
  main()
