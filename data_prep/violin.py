"""VIOLIN converter: official release (annotation JSON + HDF5 frame features) -> TFRecord dataset.

    python -m data_prep.violin --annotation violin_annotation.json --features F.h5 \
        [--feature resnet|c3d|det] [--feature-dim D] [--max-frames 256] [--num-shards N] [--skip-bad] --out OUT

Raw format (REFERENCE.md section 2):
  violin_annotation.json  {clip_id: {"file": str, "split": "train"|"validate"|"test",
                                     "sub": [[text, start, end], ...],
                                     "statement": [[positive, negative], x 3]}}
  F.h5                    `<file>/<feature>_features`, keyed by the clip's "file" field as the authors'
                          violin_dataset.py reads them (`fin[clip['file'] + '/{}_features'.format(opt.feat)]`); each
                          file belongs to one clip. Per feature kind (RELEASE_FILES: the release's file names):
                            resnet  `resnet_features` [T, 2048], ResNet-101 pool5, 3 fps (all_res101_pool5_feat.h5)
                            c3d     `c3d_features` [T, 4096], C3D fc6, one row per 16 frames (all_c3d_fc6_features.h5)
                            det     `det_features` [T, 2048], Faster R-CNN (Visual Genome) region features pooled to
                                    one 2048-d row per frame, 3 fps (the paper's section 5.1). The release lists
                                    detection features as "TODO" and never shipped them: key and layout follow the
                                    loader's pattern for the other two kinds; the file name is ours

Record schema (one record per (clip, statement pair); split names as in the annotation):
  clip_id        string ()          annotation key
  pair_index     int32 ()           0..2, position of the pair in "statement"
  split          string ()          train | validate | test
  statement_pos  string ()          the positive statement (label 1)
  statement_neg  string ()          the negative statement (label 0)
  subtitles      string ()          all subtitle lines, stripped, joined by one space, in file order
  video          float32 [T_i, D]   frame features, rows L2-normalised, T_i <= max_frames (uniform subsample)
  video_len      int32 ()           T_i
The single-middle-frame ablation takes video[video_len // 2] in the task; the converter stores all frames.

Besides the shards, OUT holds metadata.json (task "violin", feature, feature_dim, max_frames, per-split
conversion counts, this schema) and violin_annotation.json: the annotation restricted to the converted clips,
the ground truth for `python -m evqa_jax.evaluate.violin --gt OUT/violin_annotation.json`.

Bad input (missing key, a clip's file absent from the HDF5 file (the error names the clip id, its file and the HDF5
path looked up), a file shared by two clips, wrong feature dimension, empty or non-finite
features, malformed subtitles or statements, unknown split) raises ConversionError naming the file, clip and
field; with --skip-bad the clip is skipped and counted under its reason instead.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Any, Iterator

import numpy as np

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import settings
from evqa_jax.data import records
from data_prep import common
from data_prep import features as features_lib
from evqa_jax.data.example import Feature

SPLITS = ("train", "validate", "test")
FEATURE_DIMS = {"resnet": 2048, "c3d": 4096, "det": 2048}
# The release's HDF5 file per feature kind (det: not released; the name used by our fixture and docs).
RELEASE_FILES = {"resnet": "all_res101_pool5_feat.h5", "c3d": "all_c3d_fc6_features.h5", "det": "all_det_features.h5"}
MAX_FRAMES = 256
ANNOTATION_COPY = "violin_annotation.json"


class ConversionError(ValueError):
  """Bad input; `reason` is the short key under which --skip-bad counts it."""

  def __init__(self, reason: str, message: str):
    self.reason = reason
    super().__init__(message)


def record_spec(feature_dim: int) -> dict[str, Feature]:
  return {
      "clip_id": Feature("string", ()),
      "pair_index": Feature("int32", ()),
      "split": Feature("string", ()),
      "statement_pos": Feature("string", ()),
      "statement_neg": Feature("string", ()),
      "subtitles": Feature("string", ()),
      "video": Feature("float32", (None, feature_dim)),
      "video_len": Feature("int32", ()),
  }


def l2_normalize_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
  norms = np.linalg.norm(x, axis=-1, keepdims=True)
  return (x / np.maximum(norms, eps)).astype(np.float32)


def subsample_indices(num_frames: int, max_frames: int) -> np.ndarray:
  """All frames when num_frames <= max_frames, else max_frames indices spread uniformly (first and last kept)."""
  if num_frames <= max_frames:
    return np.arange(num_frames)
  return np.round(np.linspace(0, num_frames - 1, max_frames)).astype(np.int64)


def prepare_video(features: np.ndarray, max_frames: int = MAX_FRAMES) -> np.ndarray:
  """[T, D] raw features -> [min(T, max_frames), D] float32 with L2-normalised rows."""
  return l2_normalize_rows(np.asarray(features, np.float64)[subsample_indices(len(features), max_frames)])


def parse_clip(clip_id: str, entry: Any, path: str) -> dict:
  """Validates one annotation entry; returns {split, subtitles, pairs: [(pos, neg), ...]}."""
  where = f"{path}: clip {clip_id!r}"
  try:
    evqa_io.check_id(clip_id, f"{path}: clip {clip_id!r}", "clip id")  # an HDF5 path component
  except ValueError as e:
    raise ConversionError("bad_clip_id", str(e)) from None
  if not isinstance(entry, dict):
    raise ConversionError("malformed_entry", f"{where}: expected an object, got {type(entry).__name__}")
  for key in ("file", "split", "sub", "statement"):
    if key not in entry:
      raise ConversionError("missing_field", f"{where}: missing field {key!r}")
  file = entry["file"]
  try:
    evqa_io.check_id(file, f"{where}: field 'file'", "file")  # an HDF5 path component
  except ValueError as e:
    raise ConversionError("bad_clip_id", str(e)) from None
  split = entry["split"]
  if split not in SPLITS:
    raise ConversionError("unknown_split", f"{where}: field 'split' is {split!r}, expected one of {SPLITS}")
  sub = entry["sub"]
  if not isinstance(sub, list):
    raise ConversionError("bad_subtitles", f"{where}: field 'sub' must be a list of [text, start, end]")
  lines = []
  for j, line in enumerate(sub):
    if (not isinstance(line, (list, tuple)) or len(line) != 3 or not isinstance(line[0], str)
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in line[1:])):
      raise ConversionError("bad_subtitles", f"{where}: field 'sub'[{j}] must be [text, start, end], got {line!r}")
    if line[0].strip():
      lines.append(line[0].strip())
  statements = entry["statement"]
  if not isinstance(statements, list) or not statements:
    raise ConversionError("bad_statement", f"{where}: field 'statement' must be a non-empty list of [pos, neg] pairs")
  pairs = []
  for j, pair in enumerate(statements):
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
        or not all(isinstance(s, str) and s.strip() for s in pair)):
      raise ConversionError("bad_statement",
                            f"{where}: field 'statement'[{j}] must be [positive, negative] non-empty strings, got {pair!r}")
    pairs.append((pair[0].strip(), pair[1].strip()))
  return {"split": split, "file": file, "subtitles": " ".join(lines), "pairs": pairs}


def check_clip_features(h5, clip_id: str, feature: str, feature_dim: int, path: str, file: str | None = None) -> str:
  """Checks presence, shape and dtype of a clip's features without reading them; returns the dataset key.

  The features are `<file>/<feature>_features`, `file` being the annotation's "file" field (the authors' key);
  None looks the clip id up instead.
  """
  file = clip_id if file is None else file
  key = f"{file}/{feature}_features"
  if file not in h5:
    also = "" if file == clip_id else (f"; the clip id is a group there, but the authors' loader reads the file's"
                                       if clip_id in h5 else "; nor is the clip id")
    raise ConversionError("unknown_clip_id", f"{path}: clip id {clip_id!r} (file {file!r} in the annotation): "
                          f"HDF5 path {key!r} is not in the features file{also}")
  if key not in h5 or not hasattr(h5[key], "shape"):
    raise ConversionError("missing_features", f"{path}: clip {clip_id!r} (file {file!r}): dataset {key!r} is missing")
  shape = h5[key].shape
  if len(shape) != 2 or shape[1] != feature_dim:
    hint = ("; detection features must be pooled to one row per frame first (the paper's pooling layer)"
            if feature == "det" and len(shape) == 3 else "")
    raise ConversionError("wrong_feature_dim",
                          f"{path}: clip {clip_id!r}: field {key!r} has shape {shape}, "
                          f"expected [T, {feature_dim}]{hint}")
  if shape[0] == 0:
    raise ConversionError("empty_features", f"{path}: clip {clip_id!r}: field {key!r} has no frames")
  if h5[key].dtype.kind not in "fiu":
    raise ConversionError("bad_features", f"{path}: clip {clip_id!r}: field {key!r} has dtype {h5[key].dtype}")
  return key


def load_clip_features(h5, clip_id: str, feature: str, feature_dim: int, path: str,
                       file: str | None = None) -> np.ndarray:
  key = check_clip_features(h5, clip_id, feature, feature_dim, path, file)
  try:
    x = np.asarray(evqa_io.read_h5_dataset(h5[key], f"{path}: clip {clip_id!r}: field {key!r}"))
  except Exception as e:  # h5py raises OSError/TypeError/ValueError for damaged datasets
    raise ConversionError("unreadable_features", f"{path}: clip {clip_id!r}: cannot read {key!r} ({e})") from e
  try:  # the one features check (data_prep/features.py): finite in float32, the compute dtype
    return features_lib.check_video(x, feature_dim, f"{path}: clip {clip_id!r}: field {key!r}")
  except features_lib.FeatureError as e:
    raise ConversionError("bad_features", str(e)) from None


class _Counts:
  def __init__(self):
    self.converted_clips = collections.Counter()
    self.converted_records = collections.Counter()
    self.skipped = collections.defaultdict(collections.Counter)

  def as_json(self, splits) -> dict:
    return {s: {"converted_clips": self.converted_clips[s], "converted_records": self.converted_records[s],
                "skipped_clips": dict(sorted(self.skipped[s].items()))} for s in splits}


def convert(annotation: str, features: str, out: str, feature: str = "resnet", feature_dim: int | None = None,
            max_frames: int = MAX_FRAMES, num_shards: int = 1, skip_bad: bool = False, verbose: bool = True) -> dict:
  """Converts the release into OUT; returns the per-split counts (also in metadata.json["conversion"])."""
  import h5py  # local: only the converter needs it

  if feature not in FEATURE_DIMS:
    raise ValueError(f"--feature must be one of {sorted(FEATURE_DIMS)}, got {feature!r}")
  feature_dim = FEATURE_DIMS[feature] if feature_dim is None else int(feature_dim)
  common.check_out(out, [annotation, features])
  try:
    ann = evqa_io.load_json(annotation, "annotation file")
  except (OSError, ValueError) as e:
    raise ConversionError("unreadable_annotation", str(e)) from e
  if not isinstance(ann, dict):
    raise ConversionError("malformed_annotation", f"{annotation}: expected a JSON object {{clip_id: entry}}")

  counts = _Counts()
  parsed: dict[str, dict[str, dict]] = {s: {} for s in SPLITS}
  for clip_id, entry in ann.items():
    try:
      clip = parse_clip(clip_id, entry, annotation)
    except ConversionError as e:
      if not skip_bad:
        raise
      split = entry.get("split") if isinstance(entry, dict) and entry.get("split") in SPLITS else "invalid"
      counts.skipped[split][e.reason] += 1
      continue
    parsed[clip["split"]][clip_id] = clip
  owner: dict[str, str] = {}  # file -> the first clip naming it (the authors assert each file is one clip's)
  for split in SPLITS:
    for clip_id in list(parsed[split]):
      first = owner.setdefault(parsed[split][clip_id]["file"], clip_id)
      if first != clip_id:
        e = ConversionError("duplicate_file", f"{annotation}: clip {clip_id!r}: field 'file' "
                            f"{parsed[split][clip_id]['file']!r} is also the file of clip {first!r} (one file per clip)")
        if not skip_bad:
          raise e
        counts.skipped[split][e.reason] += 1
        del parsed[split][clip_id]

  spec = record_spec(feature_dim)
  kept: dict[str, Any] = {}
  try:
    h5 = h5py.File(features, "r")
  except OSError as e:
    raise ConversionError("unreadable_features", f"{features}: cannot open HDF5 features file ({e})") from e
  with h5, common.build_output(out, [annotation, features], "data_prep.violin") as tmp:
    # Cheap checks first, so that a bad clip fails before any split is written.
    for split in SPLITS:
      for clip_id in list(parsed[split]):
        try:
          check_clip_features(h5, clip_id, feature, feature_dim, features, parsed[split][clip_id]["file"])
        except ConversionError as e:
          if not skip_bad:
            raise
          counts.skipped[split][e.reason] += 1
          del parsed[split][clip_id]

    def examples(split: str) -> Iterator[dict]:
      for clip_id, clip in parsed[split].items():
        try:
          video = prepare_video(load_clip_features(h5, clip_id, feature, feature_dim, features, clip["file"]),
                                max_frames)
        except ConversionError as e:
          if not skip_bad:
            raise
          counts.skipped[split][e.reason] += 1
          continue
        exs = [{"clip_id": clip_id, "pair_index": np.int32(j), "split": split, "statement_pos": pos,
                "statement_neg": neg, "subtitles": clip["subtitles"], "video": video,
                "video_len": np.int32(len(video))} for j, (pos, neg) in enumerate(clip["pairs"])]
        try:
          for j, ex in enumerate(exs):
            common.check_record(ex, spec, f"{annotation}: clip {clip_id!r}, statement pair {j}")
        except ValueError as e:
          if not skip_bad:
            raise ConversionError("bad_values", str(e)) from None
          counts.skipped[split]["bad_values"] += 1
          continue
        counts.converted_clips[split] += 1
        kept[clip_id] = ann[clip_id]
        counts.converted_records[split] += len(exs)
        yield from exs

    written_splits = []
    for split in SPLITS:
      if not parsed[split] and not counts.skipped[split]:
        continue
      records.write_split(tmp, split, examples(split), spec, num_shards=num_shards)
      written_splits.append(split)
    extra = set(h5.keys()) - set(owner)
    report_splits = written_splits + (["invalid"] if counts.skipped["invalid"] else [])
    conversion = counts.as_json(report_splits)
    common.check_converted(sum(counts.converted_records.values()),
                           {f"{s}/{k}": v for s in counts.skipped for k, v in counts.skipped[s].items()}, annotation)
    for split in written_splits:  # a split that --skip-bad emptied is an error too, not an empty split
      common.check_converted(counts.converted_records[split], counts.skipped[split], annotation, split)
    evqa_io.write_json(os.path.join(tmp, ANNOTATION_COPY), kept)
    records.update_metadata(
        tmp, task="violin", feature=feature, feature_dim=feature_dim, max_frames=max_frames,
        annotation_file=ANNOTATION_COPY, conversion=conversion, features_without_annotation=len(extra),
        record_schema=__doc__[__doc__.index("Record schema"):__doc__.index("Besides")].strip())
  if verbose:
    print_counts(conversion)
  return conversion


def print_counts(conversion: dict) -> None:
  for split, c in conversion.items():
    skipped = sum(c["skipped_clips"].values())
    reasons = ", ".join(f"{k}={v}" for k, v in c["skipped_clips"].items()) or "none"
    print(f"{split}: converted {c['converted_records']} records ({c['converted_clips']} clips), "
          f"skipped {skipped} clips ({reasons})")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--annotation", required=True, help="violin_annotation.json")
  p.add_argument("--features", required=True, help="HDF5 file with <file>/<feature>_features, <file> being each clip's \"file\" field in the "
                 "annotation (not its clip id), as the authors' violin_dataset.py reads it")
  p.add_argument("--feature", default="resnet", choices=sorted(FEATURE_DIMS))
  p.add_argument("--feature-dim", type=settings.arg(settings.POSITIVE_INT, "--feature-dim"), default=None, help="expected D (default: 2048 resnet and det, 4096 c3d)")
  p.add_argument("--max-frames", type=settings.arg(settings.POSITIVE_INT, "--max-frames"), default=MAX_FRAMES)
  p.add_argument("--num-shards", type=settings.arg(settings.POSITIVE_INT, "--num-shards"), default=1)
  p.add_argument("--skip-bad", action="store_true", help="skip and count bad clips instead of failing")
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  evqa_io.check_args(a, ["out"])
  convert(a.annotation, a.features, a.out, a.feature, a.feature_dim, a.max_frames, a.num_shards, a.skip_bad)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
