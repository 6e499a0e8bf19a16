"""VIOLIN's dataset statistics (section 3.2, section 5's split, appendix A.1-A.2) from the annotation file, with the
paper's figures beside them: a check that a download (or a conversion's annotation copy) is the whole release.

    python -m data_prep.violin_stats violin_annotation.json [--top 20] [--json OUT.json]

Prints, over the clips of the file (each entry validated as the converter validates it, data_prep.violin):
  clips, statements (the paper's (V, S, H) triplets: a positive and a negative per pair), statements per clip,
  statements per split (train / validate / test), mean words a statement (positive, negative, all; words are the
  whitespace-separated tokens), and the paper's numbers beside each (95,322 triplets, 15,887 clips, 6 a clip,
  76,122 / 9,600 / 9,600, 18 words);
  Figs. 6-7: the positive and negative statements' length histograms (words, one row per length);
  Table 7: the most common words of the positive statements (`--top`; the paper splits them into nouns, verbs and
  adjectives with a part-of-speech tagger, which this command does not have, so the words come unsplit).
Fig. 8 (TV-show clip lengths) needs the clips' durations, which the annotation does not hold (the feature file's
frame counts at 3 fps give them).
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
         "split_statements": {"train": 76122, "validate": 9600, "test": 9600}, "mean_words": 18}


def statistics(annotation: str, top: int = 20) -> dict:
  """The statistics of the module docstring for one annotation file; ConversionError names a bad entry."""
  ann = evqa_io.load_json(annotation, "annotation file")
  if not isinstance(ann, dict):
    raise violin.ConversionError("malformed_annotation", f"{annotation}: expected a JSON object {{clip_id: entry}}")
  split_statements = {s: 0 for s in violin.SPLITS}
  lengths = {"positive": collections.Counter(), "negative": collections.Counter()}
  words = collections.Counter()
  for clip_id, entry in ann.items():
    clip = violin.parse_clip(clip_id, entry, annotation)
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
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.violin_stats", description=__doc__.split("\n")[0])
  parser.add_argument("annotation", help="violin_annotation.json (the release's, or a converted folder's copy)")
  parser.add_argument("--top", type=int, default=20, help="common words to list")
  parser.add_argument("--json", default=None, help="also write the statistics as JSON here")
  args = parser.parse_args(argv)
  evqa_io.check_args(args, ["json"])
  s = statistics(args.annotation, args.top)
  print(format_statistics(s))
  if args.json:
    evqa_io.write_json(args.json, s)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
