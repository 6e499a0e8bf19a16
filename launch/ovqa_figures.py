"""The OVQA paper's qualitative figures of one question from a trained FrozenBiLM+ checkpoint (arXiv 2308.09363):

  python launch/ovqa_figures.py --config=configs/ovqa_msrvtt.py --workdir=runs/msrvtt --checkpoint=best \
      --index=12 --out_dir=figs [--split=test] [--figures=5,6,9] [--answer=WORD] [--top=5] [--tsne_points=60]
  (two runs, as the paper compares FrozenBiLM+ with and without the verbalizer:)
      ... --baseline_config=configs/ovqa_msrvtt.py:baseline --baseline_workdir=runs/msrvtt_baseline

Writes, for row --index of the split's CSV (the predictions' `index`), into --out_dir:
  fig5_confidences.png  Figs. 5 / 11: the top --top softmax confidences over the split's answer vocabulary
                        without and with the GNN soft verbalizer. "Without" is the same checkpoint with the
                        verbalizer switched off (Eq. 7's V: the frozen answer embeddings), or the baseline run's
                        model when --baseline_workdir is given.
  fig6_attention.png    Fig. 6: each GAT layer's alpha_ij (Eq. 5) over the in-neighbours of one answer in the answer
                        graph (--answer; default: the verbalizer's top prediction).
  fig9_tsne.png         Fig. 9: t-SNE (exact, NumPy: evqa_jax.evaluate.ovqa_figures.tsne) of the answer embeddings
                        without (V) and with (H_hat) the verbalizer and the [MASK] feature m, coloured by base /
                        common / rare / unseen: the --tsne_points answers scored highest by either, the same set in
                        both panels.
  figures.json          every plotted number (confidences, attention weights, t-SNE coordinates).
Fig. 10 (categories of the answers a model gets right at >= 90%) reads two prediction files:
`python -m evqa_jax.evaluate.ovqa ... --fig10 fig10.png` (docs/ovqa.md).
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

config_flags.DEFINE_config_file("config", None, "The run's config (configs/ovqa_<dataset>.py[:variants]).",
                                lock_config=True)
config_flags.DEFINE_config_file("baseline_config", None, "Optional: the config of a run trained without the "
                                "verbalizer (Figs. 5/11's 'without'; default: the same checkpoint, verbalizer off).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "The run's directory (launch/train.py).")
flags.DEFINE_string("checkpoint", "best", "last, best or a step number.")
flags.DEFINE_string("baseline_workdir", None, "The baseline run's directory (with --baseline_config).")
flags.DEFINE_string("baseline_checkpoint", "best", "The baseline run's checkpoint: last, best or a step number.")
flags.DEFINE_string("split", "test", "The split whose question is shown (its answer vocabulary is scored).")
flags.DEFINE_integer("index", None, "Row of the split's CSV (the predictions' `index` column).")
flags.DEFINE_list("figures", ["5", "6", "9"], "Which figures: 5 (= 11), 6, 9.")
flags.DEFINE_string("answer", None, "Fig. 6's answer (default: the top prediction with the verbalizer).")
flags.DEFINE_integer("top", 5, "Figs. 5/11: answers shown per model.")
flags.DEFINE_integer("neighbours", 16, "Fig. 6: in-neighbours drawn per layer (the largest alpha_ij).")
flags.DEFINE_integer("tsne_points", 60, "Fig. 9: answers embedded (the highest scored by either model).")
flags.DEFINE_float("perplexity", 10.0, "Fig. 9: t-SNE perplexity.")
flags.DEFINE_integer("tsne_iterations", 1000, "Fig. 9: t-SNE iterations.")
flags.DEFINE_string("out_dir", None, "Folder for the PNGs and figures.json.")
flags.mark_flags_as_required(["config", "workdir", "index", "out_dir"])
FLAGS = flags.FLAGS

FIGURE_FILES = {"5": "fig5_confidences.png", "6": "fig6_attention.png", "9": "fig9_tsne.png"}


def load_run(config, workdir: str, checkpoint: str):
  """(task, host parameters, step) of `checkpoint` of a launch/train.py workdir trained with `config`."""
  from evqa_jax import projects
  from evqa_jax.io import absolute
  from evqa_jax.runs import checkpointing
  from evqa_jax.runs import workdir as workdir_lib
  from evqa_jax.train import evaluation
  from evqa_jax.train import trainer
  workdir = absolute(workdir)
  task = projects.build_task(config)
  workdir_lib.check_same_experiment(config, workdir)
  step = trainer.resolve_checkpoint(workdir, checkpoint, evaluation.selection(config, task))
  step, params = checkpointing.load_params(workdir, step, config.checkpoint.allow_unverified)
  return task, params, step


def figures(view, wanted, out_dir: str, answer=None, top: int = 5, neighbours: int = 16, tsne_points: int = 60,
            perplexity: float = 10.0, tsne_iterations: int = 1000, title: str = "") -> dict:
  """Draws the `wanted` figures of an `inspect_question` view into out_dir; returns their numbers."""
  import numpy as np
  from evqa_jax.evaluate import ovqa_figures as F
  truth = view.answers[view.label] if view.label >= 0 else None
  out = {"index": view.index, "ground_truth": truth, "num_answers": len(view.answers)}
  logits = {"without": view.logits["without"], "with": view.logits["with"]}
  predictions = {k: view.answers[int(np.argmax(v))] for k, v in logits.items()}
  out["predictions"] = predictions
  if "5" in wanted:
    conf = F.top_confidences(logits, view.answers, top)
    F.plot_confidences(conf, os.path.join(out_dir, FIGURE_FILES["5"]), title, truth)
    out["fig5"] = {k: [{"answer": a, "confidence": p} for a, p in v] for k, v in conf.items()}
  if "6" in wanted:
    if not view.attention:
      raise ValueError("Fig. 6 needs the GAT verbalizer (config.verbalizer.variant = 'E'); this run has "
                       f"{'none' if view.graph is None else 'another variant'}")
    target_word = answer or predictions["with"]
    if target_word not in view.answers:
      raise ValueError(f"--answer {target_word!r} is not an answer of the split's vocabulary")
    target = view.answers.index(target_word)
    layers = [F.neighbour_attention(a["alpha"], a["senders"], a["receivers"], view.graph.node_words, target)
              for a in view.attention]
    F.plot_attention(layers, target_word, os.path.join(out_dir, FIGURE_FILES["6"]), neighbours, title)
    out["fig6"] = {"answer": target_word, "layers": [[{"word": w, "alpha": a} for w, a in rows] for rows in layers]}
  if "9" in wanted:
    n = min(tsne_points, len(view.answers))
    chosen = []
    for i in np.stack([np.argsort(-logits["with"], kind="stable"), np.argsort(-logits["without"], kind="stable")],
                      axis=1).reshape(-1):
      if int(i) not in chosen:
        chosen.append(int(i))
      if len(chosen) == n:
        break
    panels, kl = {}, {}
    for name, key in (("without", "without"), ("with", "with")):
      points = np.concatenate([view.embeddings[key][chosen], view.feature[None]], axis=0)
      panels[name], kl[name] = F.tsne(points, perplexity, tsne_iterations)
    words = [view.answers[i] for i in chosen]
    cats = [view.categories[i] for i in chosen]
    F.plot_tsne(panels, words, cats, os.path.join(out_dir, FIGURE_FILES["9"]), predictions, title)
    out["fig9"] = {"answers": words, "categories": cats, "kl": kl,
                   "points": {k: v.tolist() for k, v in panels.items()}}
  return out


def main(argv):
  del argv
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from evqa_jax import io as io_lib
  wanted = [f.strip() for f in FLAGS.figures if f.strip()]
  wanted = ["5" if f == "11" else f for f in wanted]
  bad = [f for f in wanted if f not in FIGURE_FILES]
  if bad or not wanted:
    raise ValueError(f"--figures {FLAGS.figures}: choose among 5 (= 11), 6 and 9")
  if (FLAGS.baseline_config is None) != (FLAGS.baseline_workdir is None):
    raise ValueError("--baseline_config and --baseline_workdir go together (or leave both out: the same checkpoint "
                     "with the verbalizer switched off)")
  outputs = {"--out_dir": FLAGS.out_dir}
  inputs = {"the input --workdir": FLAGS.workdir, "the input --baseline_workdir": FLAGS.baseline_workdir,
            "the data config.data.dir": FLAGS.config.data.dir}
  io_lib.check_outputs(inputs, outputs)
  from data_prep import worlds
  worlds.ensure_synthetic_world(FLAGS.config)
  from evqa_jax.projects.ovqa import figures as model_figures
  task, params, step = load_run(FLAGS.config, FLAGS.workdir, FLAGS.checkpoint)
  baseline = None
  if FLAGS.baseline_workdir:
    worlds.ensure_synthetic_world(FLAGS.baseline_config)
    b_task, b_params, _ = load_run(FLAGS.baseline_config, FLAGS.baseline_workdir, FLAGS.baseline_checkpoint)
    baseline = (b_task, b_params)
  view = model_figures.inspect_question(task, params, FLAGS.split, FLAGS.index, baseline)
  io_lib.makedirs(FLAGS.out_dir)
  title = f"{FLAGS.config.dataset} {FLAGS.split} row {FLAGS.index} (step {step})"
  out = figures(view, wanted, FLAGS.out_dir, FLAGS.answer, FLAGS.top, FLAGS.neighbours, FLAGS.tsne_points,
                FLAGS.perplexity, FLAGS.tsne_iterations, title)
  out["step"] = step
  io_lib.write_json(os.path.join(FLAGS.out_dir, "figures.json"), out)
  for f in wanted:
    print(os.path.join(FLAGS.out_dir, FIGURE_FILES[f]))
  return 0


if __name__ == "__main__":
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  from evqa_jax import cli
  sys.exit(cli.run_absl(main))
