"""What the OVQA paper's qualitative figures show, computed by a trained model on one question (the plots and the
command: evqa_jax.evaluate.ovqa_figures, launch/ovqa_figures.py).

`inspect_question` runs the FrozenBiLM+ model of a task on one record of a split and returns
  feature      m `[H]`, the [MASK] feature (Fig. 9's m)
  answers      the split's scored answer vocabulary (V_test for the test split), `categories` of each
  logits / probs `[A]` with the verbalizer (the model as trained) and without it (Eq. 7's V: the frozen answer
               embeddings, the same weights with the verbalizer switched off; or a second run's model, `baseline`)
  embeddings   `[A, H]` answer embeddings without (V) and with (H_hat) the verbalizer (Fig. 9)
  attention    per GAT layer, alpha_ij per edge with the edge's sender / receiver as graph node ids (Fig. 6)
  graph        the split's answer graph (node words for the attention's ids)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.graphs import padding
from evqa_jax.models.verbalizer import canonical_variant


@dataclasses.dataclass
class QuestionView:
  index: int                      # the record's row in the split CSV (the predictions' `index`)
  label: int                      # ground-truth answer id in `answers` (-1: outside the scored vocabulary)
  answers: list
  categories: list                # base / common / rare / unseen of each answer ("" when unknown)
  feature: np.ndarray             # [H]
  logits: dict                    # {"with", "without"}: [A]
  embeddings: dict                # {"with", "without"}: [A, H]
  attention: list = dataclasses.field(default_factory=list)  # per layer {"alpha", "senders", "receivers"}
  graph: Any = None
  baseline_feature: Optional[np.ndarray] = None  # m of the baseline run, when one is given


def _check_model(task):
  model = task.model
  if not (hasattr(model, "mask_feature") and hasattr(model, "verbalizer")):
    raise ValueError(f"config.model.backbone = {task.config.model.backbone!r}: the verbalizer figures read the "
                     "[MASK] feature and the answer embeddings of FrozenBiLM+ (config.model.backbone = 'frozenbilm')")
  if model.head != "open":
    raise ValueError(f"config.model.head = {model.head!r}: the verbalizer figures need the open head")
  return model


def find_record(task, split: str, index: int) -> dict:
  """The preprocessed record of `split` whose `index` (its row in the split's CSV) is `index`."""
  src = task.source(split)
  if index < 0:
    raise ValueError(f"--index {index}: a row of the {split} CSV is >= 0")
  if index < len(src):
    ex = task.preprocess(src[index], False)
    if int(ex["index"]) == index:  # records in CSV order, none skipped: the usual case
      return ex
  for i in range(len(src)):
    ex = task.preprocess(src[i], False)
    if int(ex["index"]) == index:
      return ex
  raise KeyError(f"--index {index}: no record of split {split!r} ({len(src)} records) is row {index} of its CSV "
                 "(the converter skipped it, or the CSV is shorter)")


def _apply(model, params, *args, method, mutable=False, **static):
  """model.apply of `method` under one jit (the edge scans dispatch slowly op by op); `static` keyword arguments."""
  fn = jax.jit(lambda p, *a: model.apply({"params": p}, *a, method=method, mutable=mutable, **static))
  return fn(params, *args)


def _scores(module, batch, aux):
  """(the [MASK] feature `[1, H]`, answer embeddings `[A, H]`, logits `[1, A]`) of one model, in one program."""
  feature = module.mask_feature(batch, True)
  return feature, module.answer_embeddings(aux), module.score(feature, aux)


def inspect_question(task, params: dict, split: str, index: int, baseline: Optional[tuple] = None) -> QuestionView:
  """The module docstring's view of row `index` of `split`. `params`: the run's parameters (host arrays, as
  runs.checkpointing.load_params returns them); `baseline`: (task, params) of a run trained without the verbalizer
  (its logits are the "without" ones), or None for the same weights with the verbalizer switched off."""
  model = _check_model(task)
  ex = find_record(task, split, index)
  batch = {k: jnp.asarray(np.asarray(v))[None] for k, v in ex.items()}
  aux = jax.tree.map(jnp.asarray, task.aux_inputs(split))
  answers = list(task.input.answers_train if split == task.config.data.train_split else task.input.answers_eval)
  n = len(answers)
  cats = task.input.vocab.get("categories", {})
  (feature, emb_with, logits_with), state = _apply(model, params, batch, aux, method=_scores,
                                                    mutable=["intermediates"])
  plain = model.clone(verbalizer=None)
  emb_without = _apply(plain, params, aux, method=type(plain).answer_embeddings)
  base_feature = None
  if baseline is None:
    logits_without = _apply(plain, params, feature, aux, method=type(plain).score)
  else:
    b_task, b_params = baseline
    b_model = _check_model(b_task)
    b_answers = list(b_task.input.answers_train if split == b_task.config.data.train_split
                     else b_task.input.answers_eval)
    if b_answers != answers:
      raise ValueError(f"the baseline run scores another {split} answer vocabulary ({len(b_answers)} answers vs "
                       f"{n}): both runs must read the same converted data")
    b_ex = find_record(b_task, split, index)
    b_batch = {k: jnp.asarray(np.asarray(v))[None] for k, v in b_ex.items()}
    b_aux = jax.tree.map(jnp.asarray, b_task.aux_inputs(split))
    (base_feature, _, logits_without) = _apply(b_model, b_params, b_batch, b_aux, method=_scores)
    base_feature = np.asarray(base_feature[0], np.float32)

  attention = []
  vc = task.config.verbalizer
  if model.verbalizer is not None and canonical_variant(vc.variant) == "gat":
    key = "train" if split == task.config.data.train_split else "eval"
    graph = task.input.graphs[key]
    pos = padding.node_positions(graph, aux["answer_mask"].shape[0])
    size = max(int(pos.max()), int(np.max(aux["senders"])), int(np.max(aux["receivers"]))) + 1
    node_of = np.full(size, -1, np.int64)  # padded position -> graph node id (-1: padding)
    node_of[pos] = np.arange(graph.num_nodes)
    layers = state["intermediates"]["verbalizer"]
    for layer in range(vc.num_layers):
      alpha = np.asarray(layers[f"gat_{layer}"]["attention"][0], np.float64)
      s = node_of[np.asarray(aux["senders"])[:alpha.shape[0]]]
      r = node_of[np.asarray(aux["receivers"])[:alpha.shape[0]]]
      keep = (s >= 0) & (r >= 0) & (alpha > 0)  # padding edges, edges into nodes the layer does not update
      attention.append({"alpha": alpha[keep], "senders": s[keep], "receivers": r[keep]})
  else:
    graph = None
  return QuestionView(
      index=int(ex["index"]), label=int(ex["label"]), answers=answers, categories=[cats.get(a, "") for a in answers],
      feature=np.asarray(feature[0], np.float32),
      logits={"with": np.asarray(logits_with[0, :n], np.float64), "without": np.asarray(logits_without[0, :n],
                                                                                         np.float64)},
      embeddings={"with": np.asarray(emb_with[:n], np.float32), "without": np.asarray(emb_without[:n], np.float32)},
      attention=attention, graph=graph, baseline_feature=base_feature)
