"""Synthetic E-VQA world: rendered videos with exact temporal and pixel evidence, in the ST-Evidence raw formats.

    python -m data_prep.synthetic_evqa --out DIR [--seed 0] [--small]

DIR/raw gets exactly the layout of the release:
  frames/<video_id>/<frame:05d>.png       64x64 RGB at 6 fps, 4-5 s per video
  train.csv, test.csv                     entry_id, video_id, video_path, question, candidates, answer, segment
  instruct/<entry_id>.json                train split, ST-Evidence-Instruct polygons (exterior + holes)
  gt_masks/<entry_id>/<frame:05d>.png     test split, 0/255 masks (frames without a PNG are empty)
  test_mcq.json, mcq_masks/<entry_id>/{0..3}.png   ST-Evidence-MCQ for the test split
then the real converter (data_prep.st_evidence) writes DIR/records (splits train and test, T = 30 frames, 64x64).

The world: each video shows 2-3 objects (distinct shapes among square, circle, triangle, diamond, cross, ring and
distinct colours) on a textured background; each object is on screen only during its own time window (windows
are disjoint, 1-2 s) and moves left, right, up or down or stays still (distinct per video). Every object is drawn
from a polygon, and the same polygon (rasterised by st_evidence.rasterize_polygon) is its evidence mask, so masks
are exact. One question per object, answerable only by looking inside that object's window (its colour, shape
or motion); evidence = the window [first / 6, (last + 1) / 6] seconds and the object's masks. Five options:
the answer plus the attributes of the other objects in the video plus random ones. MCQ distractors: other
objects' windows and shifted windows (temporal, tIoU < 0.3 with the answer); other objects' masks and shifted
copies of the answer mask (spatial, IoU < 0.3) on the middle frame of the window.
"""

from __future__ import annotations

import csv
import io
import os
import sys

import numpy as np
from PIL import Image

from data_prep import st_evidence
from data_prep import worlds
from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax.data import records

SIZE = 64
FPS = 6
NUM_FRAMES = 30
SIZES = {"default": {"train": 1200, "test": 200}, "small": {"train": 16, "test": 10}}
COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (235, 220, 40),
           "purple": (150, 50, 200), "orange": (245, 140, 30), "cyan": (40, 210, 220)}
SHAPES = ("square", "circle", "triangle", "diamond", "cross", "ring")
MOTIONS = ("left", "right", "up", "down", "none")
MOTION_ANSWERS = {"left": "left", "right": "right", "up": "up", "down": "down", "none": "it does not move"}
MOTION_PHRASES = {"left": "to the left", "right": "to the right", "up": "upwards", "down": "downwards"}
QUESTION_TYPES = {
    "colour_of_shape": "What colour is the {shape} that appears?",
    "shape_of_colour": "What shape is the {colour} object?",
    "motion_of_object": "Which way does the {colour} {shape} move?",
    "shape_by_motion": "What shape moves {phrase}?",
    "colour_by_motion": "What colour is the object that moves {phrase}?",
}
TYPES_FILE = "synthetic_question_types.json"


def shape_polygon(shape: str, cx: float, cy: float, r: float) -> tuple[list, list]:
  """(exterior, holes) with coordinates rounded to 0.01 px: the rounded polygon is both drawn and the mask."""
  def ngon(radius, n=20):
    a = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return [(cx + radius * np.cos(t), cy + radius * np.sin(t)) for t in a]
  holes = []
  if shape == "square":
    s = 0.8 * r
    ext = [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
  elif shape == "circle":
    ext = ngon(r)
  elif shape == "triangle":
    ext = [(cx, cy - r), (cx + 0.95 * r, cy + 0.8 * r), (cx - 0.95 * r, cy + 0.8 * r)]
  elif shape == "diamond":
    ext = [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
  elif shape == "cross":
    a = r / 3
    ext = [(cx - a, cy - r), (cx + a, cy - r), (cx + a, cy - a), (cx + r, cy - a), (cx + r, cy + a),
           (cx + a, cy + a), (cx + a, cy + r), (cx - a, cy + r), (cx - a, cy + a), (cx - r, cy + a),
           (cx - r, cy - a), (cx - a, cy - a)]
  elif shape == "ring":
    ext = ngon(r)
    holes = [ngon(0.5 * r)]
  else:
    raise ValueError(f"unknown shape {shape!r}")
  rnd = lambda pts: [[round(float(x), 2), round(float(y), 2)] for x, y in pts]
  return rnd(ext), [rnd(h) for h in holes]


def _background(rng) -> np.ndarray:
  yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
  img = np.full((SIZE, SIZE), float(rng.uniform(90, 150)))
  for _ in range(2):
    fx, fy = rng.uniform(-4, 4, size=2)
    img += rng.uniform(8, 20) * np.sin(2 * np.pi * (fx * xx + fy * yy) / SIZE + rng.uniform(0, 2 * np.pi))
  tint = rng.uniform(-12, 12, size=3)
  return img[..., None] + tint


def _windows(rng, num_frames: int, k: int) -> list[tuple[int, int]]:
  """k disjoint windows [first, last] (inclusive frame indices), 6-12 frames each, at least one frame apart."""
  max_len = min(12, (num_frames - (k - 1)) // k)
  lengths = rng.integers(6, max_len + 1, size=k)
  free = num_frames - int(lengths.sum()) - (k - 1)
  cuts = np.sort(rng.integers(0, free + 1, size=k))
  gaps = np.diff(np.concatenate([[0], cuts]))
  out, t = [], 0
  for i in range(k):
    t += int(gaps[i]) + (1 if i else 0)
    out.append((t, t + int(lengths[i]) - 1))
    t += int(lengths[i])
  return out


def _track(rng, motion: str, length: int, r: float) -> np.ndarray:
  """[length, 2] centres that keep the whole shape inside the frame."""
  lo, hi = r + 1.0, SIZE - r - 1.0
  dist = 0.0 if motion == "none" else float(rng.uniform(12, 22))
  dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "none": (0, 0)}[motion]
  start = np.array([rng.uniform(lo + max(0, -dx) * dist, hi - max(0, dx) * dist),
                    rng.uniform(lo + max(0, -dy) * dist, hi - max(0, dy) * dist)])
  steps = np.linspace(0.0, 1.0, length)[:, None]
  return start + steps * dist * np.array([dx, dy], np.float64)


def _options(rng, answer: str, pool: list[str], preferred: list[str]) -> tuple[list[str], int]:
  """5 options: the answer, the other objects' values first, then random ones; shuffled."""
  others = [v for v in preferred if v != answer]
  rest = [v for v in pool if v != answer and v not in others]
  rng.shuffle(rest)
  opts = [answer] + (others + rest)[:4]
  order = rng.permutation(5)
  opts = [opts[i] for i in order]
  return opts, opts.index(answer)


def _seg_iou(a, b) -> float:
  inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
  return inter / (a[1] - a[0] + b[1] - b[0] - inter)


def _fmt(x: float) -> float:
  return round(float(x), 4)


def make_video(rng, video_id: str, split: str) -> tuple[np.ndarray, list[dict]]:
  """Frames [N, 64, 64, 3] uint8 and one entry dict per object (question, options, evidence, per-frame polygons)."""
  n = int(rng.integers(4 * FPS, 5 * FPS + 1))
  k = int(rng.integers(2, 4))
  shapes = [str(s) for s in rng.choice(SHAPES, size=k, replace=False)]
  colours = [str(c) for c in rng.choice(list(COLOURS), size=k, replace=False)]
  motions = [str(m) for m in rng.choice(MOTIONS, size=k, replace=False)]
  windows = _windows(rng, n, k)
  bg = _background(rng)
  frames = np.repeat(bg[None], n, axis=0) + rng.normal(0, 3, size=(n, SIZE, SIZE, 3))
  objects = []
  for i in range(k):
    a, b = windows[i]
    r = float(rng.uniform(6, 9))
    centres = _track(rng, motions[i], b - a + 1, r)
    polys, masks = {}, {}
    for j, f in enumerate(range(a, b + 1)):
      ext, holes = shape_polygon(shapes[i], *centres[j], r)
      m = st_evidence.rasterize_polygon(ext, holes, SIZE, SIZE).astype(bool)
      frames[f][m] = np.asarray(COLOURS[colours[i]], np.float64) + rng.normal(0, 4, size=(int(m.sum()), 3))
      polys[f], masks[f] = (ext, holes), m
    objects.append({"shape": shapes[i], "colour": colours[i], "motion": motions[i], "window": (a, b),
                    "polygons": polys, "masks": masks})
  frames = np.clip(np.round(frames), 0, 255).astype(np.uint8)

  entries = []
  for i, obj in enumerate(objects):
    kinds = ["colour_of_shape", "shape_of_colour", "motion_of_object"]
    if obj["motion"] != "none":
      kinds += ["shape_by_motion", "colour_by_motion"]
    kind = kinds[int(rng.integers(len(kinds)))]
    others = [o for j, o in enumerate(objects) if j != i]
    fields = {"shape": obj["shape"], "colour": obj["colour"], "phrase": MOTION_PHRASES.get(obj["motion"], "")}
    question = QUESTION_TYPES[kind].format(**fields)
    if kind in ("colour_of_shape", "colour_by_motion"):
      opts, ans = _options(rng, obj["colour"], list(COLOURS), [o["colour"] for o in others])
    elif kind in ("shape_of_colour", "shape_by_motion"):
      opts, ans = _options(rng, obj["shape"], list(SHAPES), [o["shape"] for o in others])
    else:
      opts, ans = _options(rng, MOTION_ANSWERS[obj["motion"]], list(MOTION_ANSWERS.values()), [])
    a, b = obj["window"]
    entries.append({"entry_id": f"{video_id}_q{i}", "video_id": video_id, "question": question, "kind": kind,
                    "candidates": opts, "answer_index": ans, "segment": [_fmt(a / FPS), _fmt((b + 1) / FPS)],
                    "object": obj, "others": others, "num_frames": n})
  return frames, entries


def _mcq(rng, e: dict) -> tuple[dict, list[np.ndarray]]:
  """Temporal and spatial MCQ for one entry: (JSON entry without options_dir, 4 candidate masks)."""
  n, obj = e["num_frames"], e["object"]
  gt = tuple(e["segment"])
  dur = n / FPS
  # Distractors start and end on frame boundaries like the answer, so their numbers give nothing away.
  a, b = obj["window"]
  frames_len = b - a + 1
  cands = [(o["window"][0] / FPS, (o["window"][1] + 1) / FPS) for o in e["others"]]
  for shift in (frames_len + 3, -(frames_len + 3), frames_len + 6, -(frames_len + 6)):
    cands.append(((a + shift) / FPS, (b + 1 + shift) / FPS))
  for start in rng.integers(0, max(n - frames_len, 1), size=50):
    cands.append((start / FPS, (start + frames_len) / FPS))
  distract = []
  for s, t in cands:
    s, t = max(0.0, s), min(dur, t)
    c = (_fmt(s), _fmt(t))
    if t - s >= 0.5 and _seg_iou(c, gt) < 0.3 and all(_seg_iou(c, d) < 0.7 for d in distract):
      distract.append(c)
    if len(distract) == 3:
      break
  t_opts = [[list(gt)]] + [[list(d)] for d in distract]
  t_order = rng.permutation(4)
  t_opts = [t_opts[i] for i in t_order]

  ref = (a + b) // 2
  gt_mask = obj["masks"][ref]
  m_cands = [o["masks"][(o["window"][0] + o["window"][1]) // 2] for o in e["others"]]
  for dy, dx in rng.permutation([(0, 18), (0, -18), (18, 0), (-18, 0), (14, 14), (-14, -14), (14, -14), (-14, 14)]):
    shifted = np.zeros_like(gt_mask)
    src = gt_mask[max(0, -dy):SIZE - max(0, dy), max(0, -dx):SIZE - max(0, dx)]
    shifted[max(0, dy):max(0, dy) + src.shape[0], max(0, dx):max(0, dx) + src.shape[1]] = src
    m_cands.append(shifted)
  iou = lambda p, q: (p & q).sum() / max((p | q).sum(), 1)
  m_distract = []
  for m in m_cands:
    if m.sum() >= 10 and iou(m, gt_mask) < 0.3 and all(iou(m, d) < 0.7 for d in m_distract):
      m_distract.append(m)
    if len(m_distract) == 3:
      break
  if len(distract) < 3 or len(m_distract) < 3:
    raise RuntimeError(f"synthetic world: could not build MCQ distractors for {e['entry_id']}")
  m_opts = [gt_mask] + m_distract
  m_order = rng.permutation(4)
  entry = {"qa": {"options": e["candidates"], "answer": e["answer_index"]},
           "temporal": {"options": t_opts, "answer": int(np.flatnonzero(t_order == 0)[0])},
           "spatial": {"frame": int(ref), "answer": int(np.flatnonzero(m_order == 0)[0])}}
  return entry, [m_opts[i] for i in m_order]


def _save_png(path: str, arr: np.ndarray) -> None:
  with evqa_io.atomic_path(path) as tmp:
    Image.fromarray(arr).save(tmp, format="PNG", compress_level=1)


def write_raw(raw: str, seed: int, sizes: dict) -> dict:
  """Renders the world into RAW; returns {entry_id: question kind}."""
  rng = np.random.default_rng(seed)
  kinds = {}
  mcq = {}
  for split in ("train", "test"):
    rows, v = [], 0
    while len(rows) < sizes[split]:
      video_id = f"vid_{split}_{v:05d}"
      v += 1
      frames, entries = make_video(rng, video_id, split)
      for f in range(len(frames)):
        _save_png(os.path.join(raw, "frames", video_id, f"{f:05d}.png"), frames[f])
      for e in entries[:sizes[split] - len(rows)]:
        obj = e["object"]
        kinds[e["entry_id"]] = e["kind"]
        rows.append({"entry_id": e["entry_id"], "video_id": video_id, "video_path": f"videos/{video_id}.mp4",
                     "question": e["question"], "candidates": repr(e["candidates"]),
                     "answer": e["candidates"][e["answer_index"]], "segment": repr([e["segment"]])})
        if split == "train":
          js = {"fps": float(FPS), "width": SIZE, "height": SIZE, "evidence_objects": [{
              "ref_expression": f"the {obj['colour']} {obj['shape']}",
              "masks": [{"frame": f, "mask": {"exterior": ext, "holes": holes}}
                        for f, (ext, holes) in sorted(obj["polygons"].items())]}]}
          evqa_io.write_json(os.path.join(raw, "instruct", e["entry_id"] + ".json"), js, indent=None)
        else:
          for f, m in sorted(obj["masks"].items()):
            _save_png(os.path.join(raw, "gt_masks", e["entry_id"], f"{f:05d}.png"), m.astype(np.uint8) * 255)
          entry, opts = _mcq(rng, e)
          rel = f"mcq_masks/{e['entry_id']}/"
          entry["spatial"]["options_dir"] = rel
          for k, m in enumerate(opts):
            _save_png(os.path.join(raw, rel, f"{k}.png"), m.astype(np.uint8) * 255)
          mcq[e["entry_id"]] = entry
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(st_evidence.CSV_COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    evqa_io.write_text(os.path.join(raw, f"{split}.csv"), buf.getvalue())
  evqa_io.write_json(os.path.join(raw, "test_mcq.json"), mcq)
  return kinds


def generate(out: str, seed: int = 0, small: bool = False, num_shards: int = 1, verbose: bool = True) -> dict:
  """Builds the world into OUT/raw and converts it into OUT/records; returns {split: counts}."""
  raw, rec = os.path.join(out, "raw"), os.path.join(out, "records")
  kinds = write_raw(raw, seed, SIZES["small" if small else "default"])
  counts = {
      "train": st_evidence.convert(os.path.join(raw, "train.csv"), os.path.join(raw, "frames"), rec, "train",
                                   instruct_dir=os.path.join(raw, "instruct"), num_frames=NUM_FRAMES,
                                   frame_size=(SIZE, SIZE), num_shards=num_shards, verbose=verbose),
      "test": st_evidence.convert(os.path.join(raw, "test.csv"), os.path.join(raw, "frames"), rec, "test",
                                  masks_dir=os.path.join(raw, "gt_masks"), mcq_path=os.path.join(raw, "test_mcq.json"),
                                  num_frames=NUM_FRAMES, frame_size=(SIZE, SIZE), verbose=verbose),
  }
  evqa_io.write_json(os.path.join(rec, TYPES_FILE), kinds)
  records.update_metadata(rec, synthetic={"world": "evqa", "seed": seed, "small": small,
                                          "question_types_file": TYPES_FILE})
  return counts


def ensure_world(world_dir: str, preset: str = "default") -> str:
  """Builds the world of `preset` ("default" or "small", seed 0) in world_dir unless world_dir/records already holds
  one; returns world_dir/records. Several processes (parallel test workers, hosts sharing a disk) may ask at once:
  one builds, the others wait for the file lock and then find the records."""
  if preset not in SIZES:
    raise ValueError(f"unknown synthetic E-VQA preset {preset!r} (choose from {list(SIZES)})")
  records_dir = os.path.join(world_dir, "records")
  if os.path.exists(os.path.join(records_dir, "metadata.json")):
    return records_dir
  os.makedirs(world_dir, exist_ok=True)
  with evqa_io.file_lock(os.path.join(world_dir, ".build.lock")):
    if not os.path.exists(os.path.join(records_dir, "metadata.json")):
      print(f"Generating the synthetic E-VQA world ({preset}) in {world_dir} ...", flush=True)
      generate(world_dir, small=preset == "small", verbose=False)
  return records_dir


def main(argv=None) -> int:
  return worlds.generator_main(generate, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
  sys.exit(cli.run(main))
