"""OVQA converter: the FrozenBiLM / Just Ask release (CSVs + frame-feature dict) -> TFRecord records.

    python -m data_prep.ovqa --csv-dir D --features F [--subtitles S] --out OUT \
        [--num-frames 10] [--feature-dim 768] [--dataset msrvtt|msvd|tgif|activitynet | --cvqa-topk K] [--skip-bad]
        [--num-shards N] [--authors-vocab A] [--cvqa-vocab V] [--trust-pickles]
        [--feature-dtype source|float16|float32]
    python -m data_prep.ovqa --ovqa-release meta_data/msrvtt --dataset msrvtt --out OUT   # the OVQA release's folder:
        # D = A = meta_data/msrvtt, F = its clipvitl14.pth, S = its subtitles.json, else subtitles.pkl (that one
        # only with --trust-pickles)

Input (REFERENCE.md section 1, "Data"):
  D/train.csv, D/test.csv (required), D/val.csv (optional): columns question, answer, video_id, and optionally
      type (question type; MSRVTT/MSVD 0-5 = what/how/color/where/who/when) and id. Read as text, so answers such
      as "none" or "null" stay strings.
  F: video_id -> float [T_video, feature_dim] (.pth torch dict, .npz, HDF5; a pickled .npy dict only with
     --trust-pickles; see features.py).
  S (optional): subtitles, JSON (or FrozenBiLM .pkl, only with --trust-pickles: unpickling runs code) video_id -> text.

Output OUT (replaced as a whole, atomically: built in a temporary sibling directory and renamed into place; an OUT
that holds an input, or a non-empty folder no converter wrote, is refused; see data_prep/common.py):
  {split}-*.tfrecord(.idx)  one record per converted CSV row, splits train / val (when D has it) / test
  {split}.csv               copies of the CSVs holding exactly the converted rows, in order (for the evaluator)
  vocab.json                {"train_counts": {answer: count}, "vocab_train": [...], "vocab_test": [...],
                             "vocab_cvqa": [...], "categories": {answer: "base"|"common"|"rare"|"unseen"}}
  metadata.json             spec + splits (evqa_jax.data.records) and "task": "ovqa", "num_frames", "feature_dim",
                            "feature_dtype" (the video field's), "vocab_file", "csv_files", "cvqa_topk",
                            "has_subtitles", "vocab_source" ("csv" or the --authors-vocab folder), "conversion" (per
                            split: converted, skipped per reason, the first skipped rows with their messages)

Record schema (one record per row):
  index          int64 []          row index in OUT/{split}.csv (= the source CSV row when nothing was skipped)
  id             string []         the CSV's `id`, or the source CSV row index as text when there is no id column
  video_id       string []
  question       string []
  answer         string []
  question_type  int64 []          the CSV's `type`, -1 when the column is absent or the cell empty
  subtitles      string []         "" when the video has none
  video          float16 or        T = num_frames: frames floor(j * T_video / T) when T_video > T, else all
                 float32 [T, dim]  frames followed by zero rows; the dtype is metadata.json's "feature_dtype" (and
                                   the spec's): by default (--feature-dtype source) the source's, float16 features
                                   stay float16 (FrozenBiLM's CLIP) and float32 stay float32 (Just Ask's S3D;
                                   float64 is stored as float32, the compute dtype); --feature-dtype float16 halves
                                   the records at float16's precision (values below its range become 0)
  video_mask     int64 [T]         1 on real frames, 0 on padding

Vocabularies: vocab_train = every train answer, most frequent first, ties alphabetical; vocab_test = the answers
of the test split, those in vocab_train in vocab_train order, then unseen ones alphabetically; vocab_cvqa = the
first k of vocab_train (k = --cvqa-topk, 0 = all). Category of an answer by its train count c: base c >= 101,
common 11..100, rare 1..10, unseen 0. With --authors-vocab A (the OVQA release's train_vocab.json,
test_vocab.json, ans2cat.json; data_prep/ovqa_authors.py) vocab_train, vocab_test (their id order), vocab_cvqa
(first k of their V_train) and categories are theirs, and a train / test row whose answer is outside their
vocabulary of that split is bad (answer_not_in_vocab). With --cvqa-vocab V (FrozenBiLM's {answer: id} vocabulary
file, e.g. its zero-shot `vocab1000.json`) vocab_cvqa is V's answers in id order instead: FrozenBiLM's zero-shot
closed vocabulary (its videoqa.py scores exactly the answers of --<dataset>_vocab_path).

Bad rows (empty question or answer, non-integer type, video id missing from F, features that are not a finite
float [T_video >= 1, dim] array, or not finite once cast to the storage dtype; in "source" storage a video whose
dtype is wider than the first video's) raise ConversionError naming the CSV file, row and field; with --skip-bad they
are skipped and counted per reason. A missing column or a missing train/test CSV is always an error.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import math
import os
import sys
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import settings
from evqa_jax.data import records
from evqa_jax.data.example import Feature
from evqa_jax.metrics import ovqa as ovqa_metrics
from data_prep import common
from data_prep import features as features_lib
from data_prep import ovqa_authors

SPLITS = ("train", "val", "test")
REQUIRED_SPLITS = ("train", "test")
REQUIRED_COLUMNS = ("question", "answer", "video_id")
CATEGORIES = ovqa_metrics.CATEGORIES
BAD_REASONS = ("empty_question", "empty_answer", "bad_type", "bad_video_id", "unknown_video", "bad_features",
               "answer_not_in_vocab", "bad_values",
               "missing_video", "bad_video", "short_video")  # the last three: raw videos (data_prep/ovqa_frames.py)
VOCAB_FILE = "vocab.json"
# The paper's closed vocabularies (appendix B, FrozenBiLM / JustAsk settings): top-k train answers per dataset; the
# dataset configs' data.cvqa_topk.
CVQA_TOPK = {"msrvtt": 4000, "msvd": 1852, "tgif": 1540, "activitynet": 1654}
EXAMPLES_PER_SHARD = 4096
_MAX_LISTED_SKIPS = 100
_CACHE_VIDEOS = 4096


class ConversionError(ValueError):
  """Bad converter input; the message names the file, and the row and field where there is one."""


def record_spec(num_frames: int = 10, feature_dim: int = 768, feature_dtype: str = "float16") -> dict[str, Feature]:
  """The feature spec of an OVQA record (see the module docstring)."""
  return {
      "index": Feature("int64", ()),
      "id": Feature("string", ()),
      "video_id": Feature("string", ()),
      "question": Feature("string", ()),
      "answer": Feature("string", ()),
      "question_type": Feature("int64", ()),
      "subtitles": Feature("string", ()),
      "video": Feature(feature_dtype, (num_frames, feature_dim)),
      "video_mask": Feature("int64", (num_frames,)),
  }


def answer_category(train_count: int) -> str:
  """base (>= 101 train occurrences), common (11..100), rare (1..10) or unseen (0), as the metrics define it."""
  return ovqa_metrics.category_of_count(train_count)


def build_vocab(train_answers: Sequence[str], test_answers: Sequence[str], cvqa_topk: int = 0) -> dict:
  """The vocab.json content for the given answer columns (see the module docstring)."""
  counts = collections.Counter(train_answers)
  vocab_train = [a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
  test_set = set(test_answers)
  vocab_test = [a for a in vocab_train if a in test_set] + sorted(test_set - set(counts))
  vocab_cvqa = vocab_train[:cvqa_topk] if cvqa_topk > 0 else list(vocab_train)
  categories = {a: answer_category(counts.get(a, 0)) for a in vocab_train + vocab_test}
  return {
      "train_counts": {a: counts[a] for a in vocab_train},
      "vocab_train": vocab_train,
      "vocab_test": vocab_test,
      "vocab_cvqa": vocab_cvqa,
      "categories": categories,
  }


def read_split_csv(path: str) -> pd.DataFrame:
  """Reads one split's CSV as text (no NaN conversion); ConversionError on a missing file or column."""
  if not os.path.exists(path):
    raise ConversionError(f"split file {path} does not exist")
  text = evqa_io.read_text(path, "split file")
  try:
    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
  except Exception as e:
    raise ConversionError(f"{path}: cannot read as CSV ({e})") from e
  missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
  if missing:
    raise ConversionError(
        f"{path}: missing column(s) {missing} (columns: {list(df.columns)}; required: {list(REQUIRED_COLUMNS)})")
  return df


class BadRow(Exception):
  """A row the converter skips with --skip-bad (else a ConversionError naming file, row and `field`); `reason` is
  one of BAD_REASONS."""

  def __init__(self, reason: str, field: str, message: str):
    super().__init__(message)
    self.reason = reason
    self.field = field
    self.message = message


class _VideoCache:
  """Sampled features per video id (rows of one video are usually adjacent; many videos repeat)."""

  def __init__(self, store: features_lib.FeatureStore, num_frames: int, feature_dim: int, dtype: str,
               from_source: bool):
    self.store = store
    self.dtype = dtype
    self.from_source = from_source  # storage chosen from the first video: a wider one would lose precision
    self.num_frames = num_frames
    self.feature_dim = feature_dim
    self._cache: collections.OrderedDict = collections.OrderedDict()

  def get(self, video_id: str):
    if video_id in self._cache:
      self._cache.move_to_end(video_id)
      value = self._cache[video_id]
    else:
      value = self._load(video_id)
      self._cache[video_id] = value
      if len(self._cache) > _CACHE_VIDEOS:
        self._cache.popitem(last=False)
    if isinstance(value, BadRow):
      raise value
    return {"video": value[0], "video_mask": value[1]}

  def _load(self, video_id: str):
    if not video_id or video_id not in self.store:
      return BadRow("unknown_video", "video_id",
                     f"unknown video id {video_id!r} (not in the feature file {self.store.path})")
    try:
      x = features_lib.check_video(
          self.store[video_id], self.feature_dim, f"video {video_id!r} in {self.store.path}")
    except features_lib.FeatureError as e:
      return BadRow("bad_features", "video_id", str(e))
    if self.from_source and self.dtype == "float16" and x.dtype != np.float16:
      return BadRow("bad_features", "video_id",
                     f"video {video_id!r} in {self.store.path} has {x.dtype} features but the file's first video "
                     f"{self.dtype}, the dtype the records keep: pass --feature-dtype float32 (or float16)")
    return features_lib.sample_frames(x, self.num_frames, self.dtype)


def _row_example(row: Mapping[str, str], index: int, source_row: int, has_type: bool, has_id: bool,
                 videos, subtitles: Mapping[str, str]) -> dict:
  question = row["question"]
  answer = row["answer"]
  video_id = row["video_id"]  # verbatim: one id rule everywhere (evqa_io.check_id refuses surrounding spaces)
  try:
    evqa_io.check_id(video_id, "field 'video_id'", "video id")
  except ValueError as e:
    raise BadRow("bad_video_id", "video_id", str(e)) from None
  if not question.strip():
    raise BadRow("empty_question", "question", "empty question")
  if not answer.strip():
    raise BadRow("empty_answer", "answer", "empty answer")
  question_type = -1
  if has_type and row["type"].strip():
    try:
      question_type = int(row["type"].strip())
    except ValueError:
      raise BadRow("bad_type", "type", f"question type {row['type']!r} is not an integer") from None
    if not -2**63 <= question_type < 2**63:
      raise BadRow("bad_type", "type", f"question type {row['type']!r} does not fit int64")
  return {
      "index": np.int64(index),
      "id": row["id"] if has_id else str(source_row),
      "video_id": video_id,
      "question": question,
      "answer": answer,
      "question_type": np.int64(question_type),
      "subtitles": subtitles.get(video_id, ""),
      **videos(video_id),  # the video's fields: features (video, video_mask) or frames (data_prep/ovqa_frames.py)
  }


def convert(csv_dir: str, features: str, out_dir: str, *, subtitles: str | None = None, num_frames: int = 10,
            feature_dim: int = 768, cvqa_topk: int = 4000, skip_bad: bool = False, num_shards: int | None = None,
            trust_pickles: bool = False, verbose: bool = True, authors_vocab: str | None = None,
            feature_dtype: str = "source", cvqa_vocab: str | None = None) -> dict:
  """Converts an OVQA release into `out_dir` (see the module docstring); returns the "conversion" summary.

  Raises ConversionError on bad input (unless `skip_bad` and the problem is confined to rows); nothing is
  left at `out_dir` (nor changed there) when it raises.
  """
  if num_frames < 1 or feature_dim < 1:
    raise ConversionError(f"num_frames ({num_frames}) and feature_dim ({feature_dim}) must be >= 1")
  if feature_dtype not in features_lib.FEATURE_DTYPES:
    raise ConversionError(f"feature_dtype {feature_dtype!r}: expected one of {features_lib.FEATURE_DTYPES}")

  @contextlib.contextmanager
  def feature_videos():
    with features_lib.FeatureStore(features, trust_pickles) as store:
      dtype = feature_dtype
      if dtype == "source":
        first = features_lib.first_video_dtype(store)
        dtype = features_lib.storage_dtype(first) if first is not None and first.kind == "f" else "float32"
      videos = _VideoCache(store, num_frames, feature_dim, dtype, from_source=feature_dtype == "source")
      yield (record_spec(num_frames, feature_dim, dtype), videos.get,
             dict(num_frames=num_frames, feature_dim=feature_dim, feature_dtype=dtype))

  return convert_with(csv_dir, out_dir, feature_videos, video_input=features, converter="data_prep.ovqa",
                      subtitles=subtitles, cvqa_topk=cvqa_topk, skip_bad=skip_bad, num_shards=num_shards,
                      trust_pickles=trust_pickles, verbose=verbose, authors_vocab=authors_vocab,
                      cvqa_vocab=cvqa_vocab, source={"features": os.path.abspath(features)})


def convert_with(csv_dir: str, out_dir: str, open_videos, *, video_input: str, converter: str,
                 subtitles: str | None = None, cvqa_topk: int = 4000, skip_bad: bool = False,
                 num_shards: int | None = None, trust_pickles: bool = False, verbose: bool = True,
                 authors_vocab: str | None = None, cvqa_vocab: str | None = None, source: dict | None = None,
                 extra_inputs: Sequence[str | None] = ()) -> dict:
  """The conversion of the CSVs with the video fields of `open_videos()`: a context manager yielding (the record
  spec, `video_id -> {field: array}` (raising BadRow), the video's metadata.json fields). `video_input`: the
  video file or folder (an input --out must not touch, as `extra_inputs`). Features: `convert`; raw videos:
  data_prep/ovqa_frames.py."""
  csv_paths = {s: os.path.join(csv_dir, f"{s}.csv") for s in SPLITS}
  splits = [s for s in SPLITS if s in REQUIRED_SPLITS or os.path.exists(csv_paths[s])]
  inputs = [csv_dir, video_input, subtitles, authors_vocab, cvqa_vocab, *extra_inputs]
  common.check_out(out_dir, inputs)
  frames = {s: read_split_csv(csv_paths[s]) for s in splits}
  subs = features_lib.load_subtitles(subtitles, trust_pickles) if subtitles else {}
  # The authors' V_train / V_test / categories (data_prep/ovqa_authors.py); their rows must be in them.
  authors = ovqa_authors.read_authors_vocab(authors_vocab) if authors_vocab else None
  allowed = {s: set(authors[f"vocab_{s}"]) for s in ("train", "test")} if authors else {}
  closed = ovqa_authors.read_vocab_file(cvqa_vocab) if cvqa_vocab else None  # FrozenBiLM's {answer: id}
  summary = {}
  kept_rows: dict[str, list[int]] = {}
  with common.build_output(out_dir, inputs, converter) as tmp_dir, open_videos() as (spec, videos, video_meta):
    for split in splits:
      df = frames[split]
      kept = kept_rows[split] = []
      skipped = collections.Counter()
      skipped_rows: list[dict] = []
      has_type, has_id = "type" in df.columns, "id" in df.columns

      def examples(df=df, split=split, kept=kept, skipped=skipped, skipped_rows=skipped_rows,
                   has_type=has_type, has_id=has_id) -> Iterator[dict]:
        for row_idx, row in enumerate(df.to_dict("records")):
          where = f"{csv_paths[split]}, row {row_idx} (line {row_idx + 2})"
          try:
            ex = _row_example(row, len(kept), row_idx, has_type, has_id, videos, subs)
            if split in allowed and ex["answer"] not in allowed[split]:
              raise BadRow("answer_not_in_vocab", "answer", f"answer {ex['answer']!r} is not in the authors' "
                           f"{split}_vocab.json ({authors_vocab})")
            try:
              common.check_record(ex, spec, where)
            except ValueError as e:
              raise BadRow("bad_values", "video", str(e)) from None
          except BadRow as bad:
            where = f"{where}, field {bad.field!r}"
            if not skip_bad:
              raise ConversionError(f"{where}: {bad.message} (use --skip-bad to skip such rows)") from None
            skipped[bad.reason] += 1
            if len(skipped_rows) < _MAX_LISTED_SKIPS:
              skipped_rows.append({"row": row_idx, "reason": bad.reason, "message": f"{where}: {bad.message}"})
            continue
          kept.append(row_idx)
          yield ex

      shards = num_shards or max(1, math.ceil(len(df) / EXAMPLES_PER_SHARD))
      records.write_split(tmp_dir, split, examples(), spec, num_shards=shards)
      common.check_converted(len(kept), skipped, f"{csv_paths[split]} ({len(df)} rows)", split)
      with evqa_io.atomic_path(os.path.join(tmp_dir, f"{split}.csv")) as tmp:
        df.iloc[kept].to_csv(tmp, index=False)
      summary[split] = {
          "rows": len(df),
          "converted": len(kept),
          "skipped": {r: skipped[r] for r in BAD_REASONS if skipped[r]},
          "skipped_rows": skipped_rows,
      }
      if verbose:
        reasons = ", ".join(f"{r}: {n}" for r, n in summary[split]["skipped"].items()) or "none"
        print(f"{split}: converted {len(kept)} of {len(df)} rows, skipped {len(df) - len(kept)} ({reasons})")

    train_answers = frames["train"]["answer"].iloc[kept_rows["train"]].tolist()
    test_answers = frames["test"]["answer"].iloc[kept_rows["test"]].tolist()
    vocab = build_vocab(train_answers, test_answers, cvqa_topk)
    if authors:
      vocab = ovqa_authors.apply(vocab, authors, cvqa_topk)
    if closed:
      vocab["vocab_cvqa"] = closed
    evqa_io.write_json(os.path.join(tmp_dir, VOCAB_FILE), vocab, indent=1)
    records.update_metadata(
        tmp_dir,
        task="ovqa",
        **video_meta,
        vocab_file=VOCAB_FILE,
        csv_files={s: f"{s}.csv" for s in splits},
        cvqa_topk=cvqa_topk,
        has_subtitles=bool(subs),
        vocab_source=os.path.abspath(authors_vocab) if authors_vocab else "csv",
        cvqa_vocab_source=os.path.abspath(cvqa_vocab) if cvqa_vocab else None,
        conversion=summary,
        source={"csv_dir": os.path.abspath(csv_dir), **(source or {}),
                "subtitles": os.path.abspath(subtitles) if subtitles else None},
    )
  return summary


def release_paths(release: str, subtitles: str | None) -> dict:
  """The converter's inputs in the OVQA release's `meta_data/<dataset>/` folder (mlvlab/OVQA README and dataset.py:
  train.csv, test.csv, clipvitl14.pth, subtitles.pkl, train_vocab.json, test_vocab.json, ans2cat.json). Subtitles:
  `subtitles` when given, else subtitles.json (a JSON copy of their pickle), else subtitles.pkl, else none."""
  if not os.path.isdir(release):
    raise ConversionError(f"--ovqa-release {release}: not a folder (expected OVQA's meta_data/<dataset>/)")
  if subtitles is None:
    for name in ("subtitles.json", "subtitles.pkl"):
      if os.path.exists(os.path.join(release, name)):
        subtitles = os.path.join(release, name)
        break
  return {"csv_dir": release, "features": os.path.join(release, "clipvitl14.pth"), "subtitles": subtitles,
          "authors_vocab": release}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.ovqa", description=__doc__.split("\n")[0])
  parser.add_argument("--ovqa-release", default=None,
                      help="the OVQA release's meta_data/<dataset>/ folder: its train/test.csv, clipvitl14.pth, "
                           "subtitles (.json, else .pkl) and vocabularies (sets --csv-dir, --features, --subtitles, "
                           "--authors-vocab unless given)")
  parser.add_argument("--dataset", choices=sorted(CVQA_TOPK), default=None,
                      help="sets --cvqa-topk to the paper's closed vocabulary of the dataset " +
                           ", ".join(f"{d} {k}" for d, k in sorted(CVQA_TOPK.items())))
  parser.add_argument("--csv-dir", default=None, help="directory with train.csv, test.csv and optionally val.csv")
  parser.add_argument("--features", default=None, help="feature dict: .pth, .npy, .npz or .h5")
  parser.add_argument("--subtitles", default=None, help="optional JSON (or .pkl) video_id -> subtitle text")
  parser.add_argument("--out", required=True, help="output directory (replaced as a whole)")
  parser.add_argument("--num-frames", type=settings.arg(settings.POSITIVE_INT, "--num-frames"), default=10)
  parser.add_argument("--feature-dim", type=settings.arg(settings.POSITIVE_INT, "--feature-dim"), default=768)
  parser.add_argument("--feature-dtype", choices=features_lib.FEATURE_DTYPES, default="source",
                      help="storage dtype of the video features (default: the source's, float64 as float32; "
                           "float16 halves the records, values below its range become 0)")
  parser.add_argument("--cvqa-topk", type=settings.arg(settings.COUNT, "--cvqa-topk"), default=None,
                      help="closed vocabulary size (0 = all train answers; default: --dataset's, else 4000)")
  parser.add_argument("--skip-bad", action="store_true", help="skip and count bad rows instead of failing")
  parser.add_argument("--authors-vocab", default=None,
                      help="folder with the OVQA authors' train_vocab.json, test_vocab.json, ans2cat.json: use their "
                           "V_train, V_test and categories")
  parser.add_argument("--cvqa-vocab", default=None,
                      help="FrozenBiLM's {answer: id} vocabulary file (its zero-shot vocab1000.json): the closed "
                           "vocabulary (vocab_cvqa) instead of the top-k train answers")
  parser.add_argument("--num-shards", type=settings.arg(settings.POSITIVE_INT, "--num-shards"), default=None,
                      help=f"shards per split (default: one per {EXAMPLES_PER_SHARD} rows)")
  common.add_trust_pickles(parser)
  args = parser.parse_args(argv)
  if args.ovqa_release:
    found = release_paths(args.ovqa_release, args.subtitles)
    for key, value in found.items():
      if getattr(args, key) is None:
        setattr(args, key, value)
  for flag in ("csv_dir", "features"):
    if getattr(args, flag) is None:
      parser.error(f"--{flag.replace('_', '-')} is required (or --ovqa-release)")
  if args.cvqa_topk is None:
    args.cvqa_topk = CVQA_TOPK[args.dataset] if args.dataset else 4000
  evqa_io.check_args(args, ["out"])  # no input (--authors-vocab included) may be inside --out
  convert(args.csv_dir, args.features, args.out, subtitles=args.subtitles, num_frames=args.num_frames,
          feature_dim=args.feature_dim, cvqa_topk=args.cvqa_topk, skip_bad=args.skip_bad,
          num_shards=args.num_shards, trust_pickles=args.trust_pickles,
          authors_vocab=args.authors_vocab, feature_dtype=args.feature_dtype, cvqa_vocab=args.cvqa_vocab)
  from data_prep import answer_stats
  print(answer_stats.format_table1(answer_stats.table1_from_dir(args.out)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
