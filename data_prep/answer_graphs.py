"""Builds the OVQA answer graphs of a converted dataset.

  python data_prep/answer_graphs.py --data DIR --k 10 [--hops 2 --min-sim S --top-n N --glove pkg:glove-6b-50d]
  python data_prep/answer_graphs.py --data DIR --authors-graph META      # the OVQA authors' graphs instead

Reads DIR/vocab.json ({"vocab_train": [...], "vocab_test": [...]}, written by the OVQA converter) and writes
DIR/graph_train.npz and DIR/graph_test.npz (see evqa_jax.graphs.answer_graph), printing node / edge counts. DIR may
be a gs://... URI (each graph file is uploaded whole).
With --authors-graph META (their meta_data/<dataset>/, as for the converter's --authors-vocab) the graphs are read
from META/answer_graph/{train,test}_{edge_index,x}.pth (data_prep/ovqa_authors.py) instead of built; train on them
with --config.graph.source=authors.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evqa_jax import cli  # noqa: E402
from evqa_jax import io as evqa_io  # noqa: E402
from evqa_jax import settings  # noqa: E402
from evqa_jax.graphs import answer_graph  # noqa: E402
from evqa_jax.graphs import word_vectors  # noqa: E402


def read_vocab(path: str) -> dict:
  if not evqa_io.epath_of(path).exists():  # local, or gs://... (the graphs are then written beside it there)
    raise FileNotFoundError(f"{path}: no answer vocabulary (run the OVQA converter first)")
  vocab = evqa_io.load_json(path, "answer vocabulary")
  if not isinstance(vocab, dict):
    raise ValueError(f"{path}: expected a JSON object with vocab_train and vocab_test")
  for key in ("vocab_train", "vocab_test"):
    if not isinstance(vocab.get(key), list) or not vocab[key]:
      raise ValueError(f"{path}: field {key!r} must be a non-empty list of answer strings")
  return vocab


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", required=True, help="dataset directory holding vocab.json")
  parser.add_argument("--k", type=settings.arg(settings.POSITIVE_INT, "--k"), default=10, help="GloVe neighbours per word")
  parser.add_argument("--hops", type=settings.arg(settings.POSITIVE_INT, "--hops"), default=2, help="K in Eq. 2")
  parser.add_argument("--min-sim", type=settings.arg(settings.rule_of("graph.min_sim"), "--min-sim"), default=None, help="cosine cut-off for neighbours")
  parser.add_argument("--top-n", type=settings.arg(settings.POSITIVE_INT, "--top-n"), default=None, help="only the top-N most frequent words are candidates")
  parser.add_argument("--glove", default="pkg:glove-6b-50d",
                      help="word vectors: pkg:glove-6b-50d, a npy+parquet directory or a GloVe/word2vec text file")
  parser.add_argument("--authors-graph", default=None, metavar="META",
                      help="import the OVQA authors' META/answer_graph/*.pth instead of building (--k, --hops, "
                           "--min-sim, --top-n, --glove unused)")
  args = parser.parse_args(argv)
  # The graphs written into --data replace no input (the word vectors, the authors' graphs), under any spelling; a
  # gs:// bucket that cannot be used is named with its flag.
  evqa_io.check_outputs({"the input --glove": args.glove, "the input --authors-graph": args.authors_graph},
                        {"--data": [os.path.join(args.data, f"graph_{split}.npz") for split in ("train", "test")]})

  vocab = read_vocab(os.path.join(args.data, "vocab.json"))
  t0 = time.time()
  imported = {}
  if args.authors_graph:  # both read (and checked) before either file is replaced
    from data_prep import ovqa_authors  # pylint: disable=g-import-not-at-top
    imported = {split: ovqa_authors.read_authors_graph(args.authors_graph, split, vocab[f"vocab_{split}"])
                for split in ("train", "test")}
  wv = None if imported else word_vectors.load_word_vectors(args.glove)
  summary = {}
  for split in ("train", "test"):
    out = os.path.join(args.data, f"graph_{split}.npz")
    if imported:
      graph = imported[split]
      graph.save(out)
      stats = graph.stats()
      info = graph.info
      print(f"{split}: {stats['num_answers']} answers, {stats['num_nodes']} nodes with "
            f"{graph.node_features.shape[1]}-d features, {stats['num_edges']} edges ({info['num_given_edges']} "
            f"given, {info['num_given_self_loops']} of them self-loops, replaced by one per node) -> {out}")
    else:
      graph = answer_graph.build_answer_graph(vocab[f"vocab_{split}"], wv, k=args.k, hops=args.hops,
                                              min_sim=args.min_sim, top_n=args.top_n)
      graph.info["word_vectors"] = args.glove
      graph.save(out)
      stats = graph.stats()
      oov = graph.info["oov_answers"]
      print(f"{split}: {stats['num_answers']} answers, {stats['num_nodes']} nodes, {stats['num_edges']} edges "
            f"(incl. {stats['num_nodes']} self-loops; {graph.info['dropped_answer_answer_edges']} answer-answer "
            f"edges dropped), {len(oov)} answers without word vectors{': ' + ', '.join(oov[:10]) if oov else ''} "
            f"-> {out}")
    summary[split] = stats
  print(f"done in {time.time() - t0:.1f}s")
  return summary


if __name__ == "__main__":
  sys.exit(cli.run(main))
