"""Synthetic VIOLIN world: deterministic clips, subtitles and statement pairs in the official raw format.

    python -m data_prep.synthetic_violin --out DIR [--seed 0] [--small]

Writes DIR/raw/violin_annotation.json and DIR/raw/violin_features.h5 (`<file>/resnet_features` [T, 512], <file>
being the annotation's "file" field, which this world sets to the clip id), exactly the layout of the release, then
runs the real converter (data_prep.violin) into DIR/records.
DIR/records/synthetic_statement_types.json adds what the release does not have: per clip and pair the
statement type ("visual" | "dialogue" | "combined") and how the negative was made ("edit" | "adversarial"),
so that accuracy can be broken down as in the paper's analysis.

The world (built so that the paper's Table 3 input ablation shows in a CPU demo):
- Every clip has three visual facts and three dialogue facts (a city, a food and a relative, each mentioned in one
  subtitle line among filler lines). Facts are drawn uniformly and independently per clip; the visual vocabulary is
  small (6 words per category) so that every visual concept has hundreds of train clips.
- Frame features [T, 512], 12 <= T <= 32 at 3 fps: per frame, the sum of the visual concepts shown in it, each a
  fixed random projection of its GloVe vector (centred on the mean of the world's visual vocabulary), plus a weak
  distractor concept in some frames and Gaussian noise. When each fact is visible:
    place   every frame;
    object  a long window (40-80% of the clip) that always covers the middle of the clip;
    action  a short window (about a fifth of the clip, at least 3 frames) in the first or last third, never
            touching the middle (the frames a middle-frame pick can land on, also after uniform subsampling to
            12 frames): a single middle frame shows place and object but never the action.
  Visual fact words never occur in subtitles and dialogue fact words never occur in the frames.
- Each clip has three statement pairs in shuffled order: a visual-fact statement, a dialogue-fact statement and
  a combined one. Negatives are (a) minimal edits (one fact word swapped for another word of the same category,
  same template, same length) or (b), for half the combined pairs, adversarial matching: the most similar
  (token Jaccard) positive statement of another clip of the same split and template that is false here.
  Replacement words are uniform over the category, like the true words, so a positive and a negative are equally
  likely a priori: statement-only models sit at chance, subtitles decide dialogue statements, video decides
  visual statements (the single middle frame only those not about the action), and combined statements may need
  either.

`ensure_world(DIR, preset)` builds the world once (file-locked, safe for concurrent sweep points) and returns
DIR/records; the VIOLIN task calls it for the demo and small configs.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from data_prep import violin
from data_prep import worlds
from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import pretrained

FEATURE_DIM = 512
FPS = 3.0
PROJECTION_SEED = 20200101  # fixed: the "visual encoder" is the same in every world
SIZES = {"default": {"train": 1500, "validate": 300, "test": 300},
         "small": {"train": 40, "validate": 12, "test": 12}}
PRESETS = tuple(SIZES)
# Bumped whenever the generator's output changes: ensure_world refuses a directory built by another version.
WORLD_VERSION = 2
MIN_FRAMES, MAX_FRAMES = 12, 32
NOISE_STD = 0.02
# Weights of the concept vectors in a frame (before the converter's L2 normalisation).
PLACE_WEIGHT, OBJECT_WEIGHT, ACTION_WEIGHT, DISTRACTOR_WEIGHT = 1.0, 1.0, 1.3, 0.4
# Frames around the middle that a single-frame pick may use: original indices in [0.42, 0.58] * (T - 1) (covers
# the lower/upper middle of the clip and of its 12-frame uniform subsample) plus (T-1)//2 and T//2.
MIDDLE_BAND = (0.42, 0.58)
TYPES_FILE = "synthetic_statement_types.json"

VISUAL = {
    "object": ["guitar", "umbrella", "laptop", "bottle", "dog", "bicycle"],
    "place": ["kitchen", "office", "beach", "hospital", "library", "church"],
    "action": ["dancing", "running", "cooking", "sleeping", "swimming", "singing"],
}
DIALOGUE = {
    "city": ["paris", "london", "tokyo", "chicago", "boston", "rome", "vegas", "miami", "berlin", "seattle",
             "dallas", "denver"],
    "food": ["pasta", "sushi", "pancakes", "tacos", "burgers", "soup", "salad", "cookies", "steak", "noodles",
             "sandwiches", "chocolate"],
    "relative": ["sister", "brother", "mother", "father", "uncle", "aunt", "cousin", "grandmother", "son",
                 "daughter", "nephew", "wife"],
}
DISTRACTORS = ["table", "chair", "window", "door", "lamp", "wall", "car", "tree", "shirt", "glass"]
PERSONS = ["man", "woman", "guy", "girl"]

SUBTITLE_TEMPLATES = {
    "city": ["We should really go to {city} next summer.", "My flight to {city} leaves tomorrow morning.",
             "I still can't believe we never made it to {city}."],
    "food": ["Who ate the last of the {food}?", "I made {food} for dinner tonight.",
             "Do you want some of my {food}?"],
    "relative": ["My {relative} is coming to visit this weekend.", "Have you talked to my {relative} lately?",
                 "I promised my {relative} I would call tonight."],
}
FILLERS = ["Are you serious right now?", "I don't know what to tell you.", "Just give me a minute.",
           "That's not what I meant.", "Okay, fine, whatever you say.", "Can we talk about this later?",
           "You have to listen to me.", "I told you this would happen.", "Well, that went great.",
           "Let's just get out of here."]

# (name, type, template); slots are the fact categories, {person} is fixed within a pair.
STATEMENT_TEMPLATES = [
    ("v_action_place", "visual", "A {person} is {action} in the {place}."),
    ("v_object_action", "visual", "Someone holds a {object} while {action}."),
    ("v_object_place", "visual", "There is a {object} in the {place}."),
    ("d_city", "dialogue", "The {person} talks about a trip to {city}."),
    ("d_food", "dialogue", "Someone mentions the {food} during the conversation."),
    ("d_relative", "dialogue", "The {person} brings up their {relative}."),
    ("c_place_city", "combined", "While in the {place}, the {person} talks about {city}."),
    ("c_object_food", "combined", "The {person} holding a {object} mentions the {food}."),
    ("c_action_relative", "combined", "Someone who is {action} brings up their {relative}."),
]
CATEGORIES = {**VISUAL, **DIALOGUE}


def _slots(template: str) -> list[str]:
  return [c for c in CATEGORIES if "{" + c + "}" in template]


def load_glove_vectors(words) -> dict[str, np.ndarray]:
  """Unit-norm GloVe 6B 50d vectors of `words` (error naming any word absent from the vocabulary)."""
  import pandas as pd
  d = pretrained.glove_6b_50d_dir()
  index = pd.read_parquet(os.path.join(d, "glove_6B_index.parquet"))["index"]
  emb = np.load(os.path.join(d, "glove_6B_50d_emb.npy"), mmap_mode="r")
  wanted = set(words)
  pos = {w: i for i, w in enumerate(index.tolist()) if w in wanted}
  missing = sorted(set(words) - set(pos))
  if missing:
    raise ValueError(f"GloVe 6B vocabulary lacks the world's words {missing}")
  out = {}
  for w in words:
    v = np.asarray(emb[pos[w]], np.float64)
    out[w] = v / np.linalg.norm(v)
  return out


def _concept_embeddings() -> dict[str, np.ndarray]:
  words = [w for ws in VISUAL.values() for w in ws] + DISTRACTORS
  glove = load_glove_vectors(words)
  # Centring removes the direction all GloVe vectors share, so that concepts are told apart by what differs.
  mean = np.mean([glove[w] for w in words], axis=0)
  proj = np.random.default_rng(PROJECTION_SEED).normal(0.0, 1.0 / np.sqrt(50), size=(50, FEATURE_DIM))
  return {w: (glove[w] - mean) / np.linalg.norm(glove[w] - mean) @ proj for w in words}


def middle_band(num_frames: int) -> tuple[int, int]:
  """[lo, hi] (inclusive) original frame indices a single middle-frame pick can land on."""
  lo = min(int(np.floor(MIDDLE_BAND[0] * (num_frames - 1))), (num_frames - 1) // 2)
  hi = max(int(np.ceil(MIDDLE_BAND[1] * (num_frames - 1))), num_frames // 2)
  return lo, hi


def _window(rng, num_frames: int) -> tuple[int, int]:
  """Anywhere, 40-80% of the clip."""
  length = int(rng.integers(max(2, int(0.4 * num_frames)), int(0.8 * num_frames) + 1))
  start = int(rng.integers(0, num_frames - length + 1))
  return start, start + length


def _middle_window(rng, num_frames: int) -> tuple[int, int]:
  """40-80% of the clip, always covering the middle band."""
  lo, hi = middle_band(num_frames)
  length = int(rng.integers(max(hi - lo + 1, int(0.4 * num_frames)), int(0.8 * num_frames) + 1))
  start = int(rng.integers(max(0, hi + 1 - length), min(lo, num_frames - length) + 1))
  return start, start + length


def _short_window(rng, num_frames: int) -> tuple[int, int]:
  """About a fifth of the clip (>= 3 frames, so that a uniform 12-frame subsample keeps one of them), entirely
  before or after the middle band."""
  lo, hi = middle_band(num_frames)
  length = max(3, int(round(0.2 * num_frames)))
  if length > lo or length > num_frames - 1 - hi:
    raise ValueError(f"a clip of {num_frames} frames has no room for a {length}-frame window off the middle")
  if rng.random() < 0.5:
    start = int(rng.integers(0, lo - length + 1))
  else:
    start = int(rng.integers(hi + 1, num_frames - length + 1))
  return start, start + length


def _make_clip(rng, concept: dict[str, np.ndarray]) -> tuple[dict, np.ndarray]:
  facts = {c: str(rng.choice(ws)) for c, ws in CATEGORIES.items()}
  num_frames = int(rng.integers(MIN_FRAMES, MAX_FRAMES + 1))
  video = np.zeros((num_frames, FEATURE_DIM))
  video += PLACE_WEIGHT * concept[facts["place"]]
  s, e = _middle_window(rng, num_frames)
  video[s:e] += OBJECT_WEIGHT * concept[facts["object"]]
  s, e = _short_window(rng, num_frames)
  video[s:e] += ACTION_WEIGHT * concept[facts["action"]]
  distractor = str(rng.choice(DISTRACTORS))
  s, e = _window(rng, num_frames)
  video[s:e] += DISTRACTOR_WEIGHT * concept[distractor]
  video += rng.normal(0.0, NOISE_STD, size=video.shape) * np.sqrt(FEATURE_DIM / 50)
  lines = [rng.choice(SUBTITLE_TEMPLATES[c]).format(**facts) for c in DIALOGUE]
  lines += [str(x) for x in rng.choice(FILLERS, size=int(rng.integers(2, 5)), replace=False)]
  order = rng.permutation(len(lines))
  duration = num_frames / FPS
  step = duration / len(lines)
  sub = [[lines[k], round(i * step, 2), round((i + 1) * step - 0.05, 2)] for i, k in enumerate(order)]
  return {"facts": facts, "sub": sub}, video.astype(np.float32)


def _fill(template: str, values: dict) -> str:
  return template.format(**values)


def _edit_negative(rng, template: str, values: dict, facts: dict) -> str:
  """Swaps one fact word of the statement for another word of its category (never the clip's own fact)."""
  slot = str(rng.choice(_slots(template)))
  others = [w for w in CATEGORIES[slot] if w != facts[slot]]
  return _fill(template, {**values, slot: str(rng.choice(others))})


def _tokens(s: str) -> set[str]:
  return set(s.lower().replace(",", " ").replace(".", " ").split())


def build_world(seed: int = 0, sizes: dict | None = None) -> tuple[dict, dict, dict]:
  """Returns (annotation, features {clip_id: [T, 512]}, types {clip_id: [[type, negative_kind] x 3]})."""
  sizes = SIZES["default"] if sizes is None else sizes
  rng = np.random.default_rng(seed)
  concept = _concept_embeddings()
  by_type = {t: [x for x in STATEMENT_TEMPLATES if x[1] == t] for t in ("visual", "dialogue", "combined")}
  annotation, features, types = {}, {}, {}
  for split in violin.SPLITS:
    clips = []
    for i in range(sizes[split]):
      clip_id = f"syn_{split}_{i:05d}"
      clip, video = _make_clip(rng, concept)
      pairs = []
      for t in ("visual", "dialogue", "combined"):
        name, _, template = by_type[t][int(rng.integers(len(by_type[t])))]
        values = {**clip["facts"], "person": str(rng.choice(PERSONS))}
        adversarial = t == "combined" and rng.random() < 0.5
        pairs.append({"type": t, "template": name, "text": template, "values": values,
                      "pos": _fill(template, values), "adversarial": adversarial})
      clips.append((clip_id, clip, video, pairs))
    # Adversarial matching needs the positives of the whole split.
    pool: dict[str, list[tuple[str, str, dict]]] = {}
    for clip_id, _, _, pairs in clips:
      for p in pairs:
        pool.setdefault(p["template"], []).append((clip_id, p["pos"], p["values"]))
    for clip_id, clip, video, pairs in clips:
      for p in pairs:
        slots = _slots(p["text"])
        candidates = [(s, v) for cid, s, v in pool[p["template"]]
                      if cid != clip_id and any(v[c] != clip["facts"][c] for c in slots)]
        if p["adversarial"] and candidates:
          toks = _tokens(p["pos"])
          scores = np.array([len(toks & _tokens(s)) / len(toks | _tokens(s)) for s, _ in candidates])
          best = np.flatnonzero(scores == scores.max())
          p["neg"] = candidates[int(best[rng.integers(len(best))])][0]
        else:
          p["adversarial"] = False
          p["neg"] = _edit_negative(rng, p["text"], p["values"], clip["facts"])
      order = rng.permutation(3)
      annotation[clip_id] = {
          "file": clip_id, "split": split, "sub": clip["sub"],  # the HDF5 key, as in the release
          "statement": [[pairs[k]["pos"], pairs[k]["neg"]] for k in order]}
      features[clip_id] = video
      types[clip_id] = [[pairs[k]["type"], "adversarial" if pairs[k]["adversarial"] else "edit"] for k in order]
  return annotation, features, types


def write_raw(raw_dir: str, annotation: dict, features: dict) -> tuple[str, str]:
  import h5py
  ann_path = os.path.join(raw_dir, "violin_annotation.json")
  h5_path = os.path.join(raw_dir, "violin_features.h5")
  evqa_io.write_json(ann_path, annotation)
  with evqa_io.atomic_path(h5_path) as tmp:
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
      for clip_id, video in features.items():
        f.create_group(clip_id).create_dataset("resnet_features", data=video, track_times=False)
  return ann_path, h5_path


def generate(out: str, seed: int = 0, small: bool = False, num_shards: int = 1, verbose: bool = True) -> dict:
  """Builds the world into OUT/raw and converts it into OUT/records; returns the conversion counts."""
  annotation, features, types = build_world(seed, SIZES["small" if small else "default"])
  ann_path, h5_path = write_raw(os.path.join(out, "raw"), annotation, features)
  rec = os.path.join(out, "records")
  counts = violin.convert(ann_path, h5_path, rec, feature="resnet", feature_dim=FEATURE_DIM,
                          num_shards=num_shards, verbose=verbose)
  from evqa_jax.data import records
  records.update_metadata(rec, synthetic={"world": "violin", "version": WORLD_VERSION, "seed": seed,
                                          "small": small, "statement_types_file": TYPES_FILE})
  # Written last: its presence marks a complete world (ensure_world).
  evqa_io.write_json(os.path.join(rec, TYPES_FILE), types)
  return counts


def ensure_world(world_dir: str, preset: str = "default", verbose: bool = True) -> str:
  """Builds the world of `preset` ("default" or "small", seed 0) in world_dir unless world_dir/records already
  holds a complete one (its statement-type file is written last); returns world_dir/records. Safe when several
  processes call it at once (a file lock serialises them). A world built by another generator version or preset
  raises an error naming the directory to delete (it is never removed here)."""
  if preset not in PRESETS:
    raise ValueError(f"unknown synthetic VIOLIN preset {preset!r} (choose from {list(PRESETS)})")
  records_dir = os.path.join(world_dir, "records")
  os.makedirs(world_dir, exist_ok=True)
  with evqa_io.file_lock(os.path.join(world_dir, ".build.lock")):
    if os.path.exists(os.path.join(records_dir, TYPES_FILE)):
      from evqa_jax.data import records  # pylint: disable=g-import-not-at-top
      built = records.load_metadata(records_dir).get("synthetic") or {}
      want = {"version": WORLD_VERSION, "small": preset == "small"}
      have = {k: built.get(k) for k in want}
      if have != want:
        raise ValueError(
            f"{world_dir} holds a synthetic VIOLIN world built with {have}, not {want} (preset {preset!r}): "
            f"delete {world_dir} (and runs trained on it) to rebuild it")
    else:
      if verbose:
        print(f"building the synthetic VIOLIN world ({preset}) in {world_dir}", flush=True)
      generate(world_dir, small=preset == "small", verbose=verbose)
  return records_dir


def main(argv=None) -> int:
  return worlds.generator_main(generate, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
  sys.exit(cli.run(main))
