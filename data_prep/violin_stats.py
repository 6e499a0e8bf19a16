"""VIOLIN's dataset statistics (section 3.2, section 5's split, appendix A.1-A.2) from the annotation file, with the
paper's figures beside them: a check that a download (or a conversion's annotation copy) is the whole release.

    python -m data_prep.violin_stats violin_annotation.json [--top 20] [--json OUT.json] \
        [--features all_res101_pool5_feat.h5 [--feature resnet] [--fps 3]]

Prints, over the clips of the file (each entry validated as the converter validates it, data_prep.violin):
  clips, statements (the paper's (V, S, H) triplets: a positive and a negative per pair), statements per clip,
  statements per split (train / validate / test), mean words a statement (positive, negative, all; words are the
  whitespace-separated tokens), and the paper's numbers beside each (95,322 triplets, 15,887 clips, 6 a clip,
  76,122 / 9,600 / 9,600, 18 words);
  Figs. 6-7: the positive and negative statements' length histograms (words, one row per length);
  Table 7: the most common words of the positive statements (`--top`; the paper splits them into nouns, verbs and
  adjectives with a part-of-speech tagger, which this command does not have, so the words come unsplit).
Table 1 (statistics per video source: clips, mean positive / negative statement words, mean subtitle words) when the
entries carry a "source" field, grouped by it, beside the paper's Table 1 (printed in the authors' README,
jimmy646/violin: the paper's text holds only its caption); without that field the overall row only.
With `--features all_res101_pool5_feat.h5` (or the C3D file, `--feature c3d`) the clips' lengths, frames / `--fps`
(3: the release's features are sampled at 3 frames per second): their mean (the paper: 35.2 s; 40 s for MovieClips,
15-40 s for TV shows) and Fig. 8, the TV-show clips' length histogram (1-second bins; TV shows: every source but
MovieClips; all clips when no entry names its source). The annotation holds no durations: without --features no
Fig. 8.
"""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Sequence

from evqa_jax import cli
from evqa_jax import io as evqa_io
from data_prep import violin

# Section 3.2 and section 5 (the split is of the triplets), as printed.
PAPER = {"clips": 15887, "statements": 95322, "statements_per_clip": 6,
         "split_statements": {"train": 76122, "validate": 9600, "test": 9600}, "mean_words": 18,
         "mean_clip_seconds": 35.2}
# Table 1 as the authors' README prints it: source -> (episodes, clips, mean clip seconds, mean positive / negative
# statement words, mean subtitle words).
PAPER_TABLE1 = {
    "Friends": (234, 2676, 32.89, 17.94, 17.85, 72.80),
    "Desperate Housewives": (180, 3466, 32.56, 17.79, 17.81, 69.19),
    "How I Met Your Mother": (207, 1944, 31.64, 18.08, 18.06, 76.78),
    "Modern Family": (210, 1917, 32.04, 18.52, 18.20, 98.50),
    "MovieClips": (5885, 5885, 40.00, 17.79, 17.81, 69.20),
    "All": (6716, 15887, 35.20, 18.10, 18.04, 76.40),
}
FEATURE_DIMS = {"resnet": 2048, "c3d": 4096}


def _is_movieclips(source: str) -> bool:
  return source.replace(" ", "").replace("_", "").lower() == "movieclips"


def clip_seconds(features: str, clips: dict, feature: str = "resnet", fps: float = 3.0) -> dict:
  """{clip id: frames / fps} from the features file (each clip's `<file>/<feature>_features` [T, D], checked as the
  converter checks it)."""
  import h5py  # pylint: disable=g-import-not-at-top
  if fps <= 0:
    raise ValueError(f"--fps {fps} must be > 0")
  try:
    h5 = h5py.File(features, "r")
  except OSError as e:
    raise violin.ConversionError("unreadable_features", f"{features}: cannot open HDF5 features file ({e})") from e
  with h5:
    return {clip_id: h5[violin.check_clip_features(h5, clip_id, feature, FEATURE_DIMS[feature], features,
                                                   c["file"])].shape[0] / fps
            for clip_id, c in clips.items()}


def statistics(annotation: str, top: int = 20, features: str | None = None, feature: str = "resnet",
               fps: float = 3.0) -> dict:
  """The statistics of the module docstring for one annotation file; ConversionError names a bad entry."""
  ann = evqa_io.load_json(annotation, "annotation file")
  if not isinstance(ann, dict):
    raise violin.ConversionError("malformed_annotation", f"{annotation}: expected a JSON object {{clip_id: entry}}")
  split_statements = {s: 0 for s in violin.SPLITS}
  lengths = {"positive": collections.Counter(), "negative": collections.Counter()}
  words = collections.Counter()
  clips, per_source = {}, collections.defaultdict(lambda: {"clips": 0, "pos": [], "neg": [], "sub": []})
  for clip_id, entry in ann.items():
    clip = violin.parse_clip(clip_id, entry, annotation)
    clips[clip_id] = clip
    source = entry.get("source")
    if source is not None and not isinstance(source, str):
      raise violin.ConversionError("malformed_entry", f"{annotation}: clip {clip_id!r}: field 'source' must be a "
                                   f"string, got {source!r}")
    for key in ([source] if source else []) + ["All"]:
      group = per_source[key]
      group["clips"] += 1
      group["pos"] += [len(p.split()) for p, _ in clip["pairs"]]
      group["neg"] += [len(n.split()) for _, n in clip["pairs"]]
      group["sub"].append(len(clip["subtitles"].split()))
    split_statements[clip["split"]] += 2 * len(clip["pairs"])
    for pos, neg in clip["pairs"]:
      lengths["positive"][len(pos.split())] += 1
      lengths["negative"][len(neg.split())] += 1
      words.update(w.strip(".,!?;:\"'").lower() for w in pos.split())
  words.pop("", None)

  def mean(*counters):
    n = sum(sum(c.values()) for c in counters)
    return round(sum(k * v for c in counters for k, v in c.items()) / n, 2) if n else 0.0

  statements = sum(split_statements.values())
  avg = lambda xs: round(sum(xs) / len(xs), 2) if xs else 0.0  # noqa: E731
  table1 = {src: {"clips": g["clips"], "mean_words_positive": avg(g["pos"]), "mean_words_negative": avg(g["neg"]),
                  "mean_subtitle_words": avg(g["sub"])} for src, g in sorted(per_source.items(), key=lambda kv:
                                                                                 (kv[0] == "All", kv[0]))}
  lengths_s = None
  if features:
    seconds = clip_seconds(features, clips, feature, fps)
    for src in table1:
      sel = [t for cid, t in seconds.items() if src == "All" or ann[cid].get("source") == src]
      table1[src]["mean_clip_seconds"] = avg(sel)
    named = any(ann[cid].get("source") for cid in seconds)
    tv = [t for cid, t in seconds.items() if not (named and _is_movieclips(ann[cid].get("source") or "movieclips"))]
    lengths_s = {"tv_only": named, "histogram": dict(sorted(collections.Counter(int(t) for t in tv).items()))}
  return {
      "clips": len(ann),
      "statements": statements,
      "statements_per_clip": round(statements / len(ann), 2) if ann else 0.0,
      "split_statements": split_statements,
      "mean_words": mean(lengths["positive"], lengths["negative"]),
      "mean_words_positive": mean(lengths["positive"]),
      "mean_words_negative": mean(lengths["negative"]),
      "length_histogram": {kind: dict(sorted(c.items())) for kind, c in lengths.items()},
      "top_positive_words": words.most_common(top),
      "table1": table1,
      "clip_lengths": lengths_s,
  }


def format_statistics(s: dict) -> str:
  """Markdown: the totals beside the paper's, the length histograms (Figs. 6-7) and the common words (Table 7)."""
  p, sp = PAPER, s["split_statements"]
  lines = ["| | this file | paper |", "|---|---:|---:|",
           f"| clips | {s['clips']:,} | {p['clips']:,} |",
           f"| statements ((V, S, H) triplets) | {s['statements']:,} | {p['statements']:,} |",
           f"| statements per clip | {s['statements_per_clip']:g} | {p['statements_per_clip']} |"]
  lines += [f"| {split} statements | {sp[split]:,} | {p['split_statements'][split]:,} |" for split in violin.SPLITS]
  lines += [f"| mean words a statement (positive / negative) | {s['mean_words']:g} ({s['mean_words_positive']:g} / "
            f"{s['mean_words_negative']:g}) | {p['mean_words']} (\"almost the same\") |", "",
            "| words (Figs. 6-7) | positive statements | negative statements |", "|---:|---:|---:|"]
  hist = s["length_histogram"]
  for n in sorted(set(hist["positive"]) | set(hist["negative"])):
    lines.append(f"| {n} | {hist['positive'].get(n, 0)} | {hist['negative'].get(n, 0)} |")
  lines += ["", "| most common words of the positive statements (Table 7, not split by part of speech) | count |",
            "|---|---:|"]
  lines += [f"| {w} | {c} |" for w, c in s["top_positive_words"]]
  t1 = s["table1"]
  has_len = any("mean_clip_seconds" in r for r in t1.values())
  lines += ["", "| source (Table 1, this file) | clips | mean clip length (s) | mean positive statement words | "
            "mean negative statement words | mean subtitle words |", "|---|---:|---:|---:|---:|---:|"]
  for src, r in t1.items():
    length = f"{r['mean_clip_seconds']:g}" if has_len else "- (needs --features)"
    lines.append(f"| {src} | {r['clips']:,} | {length} | {r['mean_words_positive']:g} | "
                 f"{r['mean_words_negative']:g} | {r['mean_subtitle_words']:g} |")
  if len(t1) == 1:
    lines.append("(no entry names its source: Table 1's per-source rows need a 'source' field)")
  lines += ["", "| source (Table 1, paper) | episodes | clips | mean clip length (s) | mean positive statement words | "
            "mean negative statement words | mean subtitle words |", "|---|---:|---:|---:|---:|---:|---:|"]
  lines += [f"| {src} | {e:,} | {c:,} | {ln:.2f} | {p:.2f} | {n:.2f} | {sub:.2f} |"
            for src, (e, c, ln, p, n, sub) in PAPER_TABLE1.items()]
  cl = s["clip_lengths"]
  if cl is not None:
    which = "TV-show clips" if cl["tv_only"] else "all clips (no entry names its source)"
    lines += ["", f"| clip length, s (Fig. 8: {which}, 1-second bins) | clips |", "|---:|---:|"]
    lines += [f"| {k}-{k + 1} | {v} |" for k, v in cl["histogram"].items()]
    lines.append(f"(paper: mean {PAPER['mean_clip_seconds']} s over all clips; TV-show clips 15 to 40 s)")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.violin_stats", description=__doc__.split("\n")[0])
  parser.add_argument("annotation", help="violin_annotation.json (the release's, or a converted folder's copy)")
  parser.add_argument("--top", type=int, default=20, help="common words to list")
  parser.add_argument("--json", default=None, help="also write the statistics as JSON here")
  parser.add_argument("--features", default=None, help="the release's features HDF5: clip lengths (Fig. 8)")
  parser.add_argument("--feature", choices=sorted(FEATURE_DIMS), default="resnet", help="which features file it is")
  parser.add_argument("--fps", type=float, default=3.0, help="frames per second of the features")
  args = parser.parse_args(argv)
  evqa_io.check_args(args, ["json"])
  s = statistics(args.annotation, args.top, args.features, args.feature, args.fps)
  print(format_statistics(s))
  if args.json:
    evqa_io.write_json(args.json, s)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
