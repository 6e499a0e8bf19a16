"""The OVQA paper's qualitative figures (Open-vocabulary Video Question Answering, arXiv 2308.09363): their numbers
and their PNGs. The model side (one question through a trained model) is evqa_jax.projects.ovqa.figures; the command
is launch/ovqa_figures.py (Figs. 5/11, 6, 9) and `python -m evqa_jax.evaluate.ovqa ... --fig10` (Fig. 10).

  Figs. 5 / 11  top_confidences: the top-k softmax confidences over the answer vocabulary without / with the GNN
                soft verbalizer, for one question.
  Fig. 6        neighbour_attention: the GAT's alpha_ij over one answer's in-neighbours in the answer graph (Eq. 5).
  Fig. 9        tsne (exact t-SNE in NumPy) of answer embeddings without / with the verbalizer and the [MASK]
                feature m, coloured by base / common / rare / unseen.
  Fig. 10       accurate_categories: the categories of the answers a model gets right at >= 90% accuracy (share of
                each), model A vs model B.
Every PNG is written atomically (temp then rename).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from evqa_jax import io as io_lib
from evqa_jax.metrics import ovqa as ovqa_metrics

CATEGORIES = ovqa_metrics.CATEGORIES
CATEGORY_COLOURS = {"base": "C0", "common": "C2", "rare": "C1", "unseen": "C3", "": "0.6"}


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _save(fig, path: str) -> None:
  with io_lib.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
  _pyplot().close(fig)


def softmax(logits) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


# --------------------------------------------------------------------------------------------- Figs. 5 / 11

def top_confidences(logits: Mapping[str, Sequence[float]], answers: Sequence[str], k: int = 5) -> dict:
  """{name: [(answer, confidence), ...] the k most confident answers} of each logits `[A]` over `answers`
  (softmax over the whole vocabulary; ties by vocabulary order)."""
  out = {}
  for name, lg in logits.items():
    lg = np.asarray(lg, np.float64)
    if lg.shape != (len(answers),):
      raise ValueError(f"logits {name!r} have shape {lg.shape}, expected ({len(answers)},) (one per answer)")
    p = softmax(lg)
    order = np.argsort(-p, kind="stable")[:k]
    out[name] = [(str(answers[i]), float(p[i])) for i in order]
  return out


def plot_confidences(top: Mapping[str, list], path: str, title: str = "", truth: Optional[str] = None) -> None:
  """Figs. 5 / 11: one horizontal bar chart per model ("without" then "with" the verbalizer), the ground truth in
  green."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(top), figsize=(4.6 * len(top), 2.8), squeeze=False)
  right = 1.3 * max((p for rows in top.values() for _, p in rows), default=1.0)  # one scale for both panels
  for ax, (name, rows) in zip(axes[0], top.items()):
    labels = [a for a, _ in rows][::-1]
    values = [p for _, p in rows][::-1]
    ax.barh(range(len(rows)), values, color=["C2" if a == truth else "C0" for a in labels])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=9)
    for y, v in enumerate(values):
      ax.text(v, y, f" {v:.3f}", va="center", fontsize=8)
    ax.set_xlim(0, right)
    ax.set_xlabel("confidence (softmax over the answers)")
    ax.set_title(f"{name} the GNN soft verbalizer", fontsize=10)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  _save(fig, path)


# ---------------------------------------------------------------------------------------------------- Fig. 6

def neighbour_attention(alpha, senders, receivers, node_words: Sequence[str], target: int) -> list:
  """[(neighbour word, alpha_ij)] over the in-edges j -> i = `target` of one GAT layer (its self-loop included),
  largest first; the weights sum to 1 (Eq. 5's softmax over N(i))."""
  alpha, senders, receivers = (np.asarray(x) for x in (alpha, senders, receivers))
  sel = receivers == target
  if not sel.any():
    raise ValueError(f"answer {node_words[target]!r} (node {target}) has no in-edge in this layer's attention")
  rows = [(str(node_words[j]), float(a)) for j, a in zip(senders[sel], alpha[sel])]
  return sorted(rows, key=lambda r: (-r[1], r[0]))


def plot_attention(layers: Sequence[list], answer: str, path: str, max_neighbours: int = 16, title: str = "") -> None:
  """Fig. 6: per GAT layer, the answer in the centre and its in-neighbours around it, each edge's intensity and
  width its alpha_ij (the largest `max_neighbours`; the rest summed in the panel's caption)."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(layers), figsize=(5.2 * len(layers), 5.2), squeeze=False)
  for layer, (ax, rows) in enumerate(zip(axes[0], layers)):
    shown, rest = rows[:max_neighbours], rows[max_neighbours:]
    top = max(a for _, a in shown) if shown else 1.0
    angles = np.linspace(0, 2 * np.pi, len(shown), endpoint=False) + np.pi / 2
    for (word, a), t in zip(shown, angles):
      x, y = np.cos(t), np.sin(t)
      ax.plot([0, x], [0, y], color="C3", alpha=0.15 + 0.85 * a / top, lw=0.5 + 6 * a / top, zorder=1)
      ax.scatter([x], [y], s=30, color="C0", zorder=2)
      ax.text(1.12 * x, 1.12 * y, f"{word}\n{a:.3f}", ha="center", va="center", fontsize=8)
    ax.scatter([0], [0], s=120, color="C3", zorder=3)
    ax.text(0, -0.13, answer, ha="center", va="top", fontsize=10, weight="bold")
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    caption = f"GAT layer {layer + 1}: alpha_ij over {len(rows)} in-neighbours"
    if rest:
      caption += f"\n(+{len(rest)} not shown, alpha sum {sum(a for _, a in rest):.3f})"
    ax.set_title(caption, fontsize=9)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  _save(fig, path)


# ---------------------------------------------------------------------------------------------------- Fig. 9

def _sq_distances(x: np.ndarray) -> np.ndarray:
  s = np.sum(x * x, axis=1)
  d = s[:, None] + s[None, :] - 2.0 * x @ x.T
  np.fill_diagonal(d, 0.0)
  return np.maximum(d, 0.0)


def tsne_affinities(x, perplexity: float = 30.0, tol: float = 1e-5, max_steps: int = 200) -> np.ndarray:
  """t-SNE's symmetric input affinities P `[n, n]` (van der Maaten & Hinton 2008): each conditional row
  p_{j|i} = exp(-beta_i d_ij^2) / sum, beta_i bisected until its entropy is log(perplexity) (nats), then
  P = (P_cond + P_cond^T) / 2n."""
  x = np.asarray(x, np.float64)
  n = x.shape[0]
  if not 1 <= perplexity < n:
    raise ValueError(f"perplexity {perplexity} must be in [1, {n}) for {n} points")
  d = _sq_distances(x)
  target = np.log(perplexity)
  cond = np.zeros((n, n))
  for i in range(n):
    di = np.delete(d[i], i)
    lo, hi, beta = 0.0, np.inf, 1.0 / max(np.median(di), 1e-12)
    for _ in range(max_steps):
      w = np.exp(-(di - di.min()) * beta)
      p = w / w.sum()
      entropy = -np.sum(p * np.log(np.maximum(p, 1e-300)))
      if abs(entropy - target) < tol:
        break
      if entropy > target:  # too flat: sharpen
        lo, beta = beta, beta * 2 if hi == np.inf else (beta + hi) / 2
      else:
        hi, beta = beta, (beta + lo) / 2
    cond[i, np.arange(n) != i] = p
  return (cond + cond.T) / (2.0 * n)


def tsne_kl_and_gradient(p: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
  """KL(P || Q(y)) and its gradient 4 sum_j (p_ij - q_ij)(1 + |y_i - y_j|^2)^-1 (y_i - y_j), Student-t Q."""
  num = 1.0 / (1.0 + _sq_distances(y))
  np.fill_diagonal(num, 0.0)
  q = np.maximum(num / num.sum(), 1e-300)
  mask = p > 0
  kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
  pq = (p - q) * num
  grad = 4.0 * (np.diag(pq.sum(axis=1)) - pq) @ y
  return kl, grad


def tsne(x, perplexity: float = 30.0, iterations: int = 1000, learning_rate: Optional[float] = None,
         exaggeration: float = 12.0, exaggeration_iterations: int = 250, seed: int = 0) -> tuple[np.ndarray, float]:
  """Exact t-SNE of `x` `[n, d]` -> (`[n, 2]`, final KL): the 2008 paper's optimiser (momentum 0.5 then 0.8, gains,
  early exaggeration), PCA initialisation scaled to std 1e-4 (deterministic; `seed` only breaks a rank-deficient
  start). O(n^2) memory and time per step: for the few hundred points of a figure."""
  x = np.asarray(x, np.float64)
  n = x.shape[0]
  perplexity = min(perplexity, (n - 1) / 3.0) if n > 4 else max(1.0, (n - 1) / 2.0)
  p = np.maximum(tsne_affinities(x, perplexity), 1e-12)
  np.fill_diagonal(p, 0.0)
  xc = x - x.mean(axis=0)
  _, _, vt = np.linalg.svd(xc, full_matrices=False)
  y = xc @ vt[:2].T if vt.shape[0] >= 2 else np.random.RandomState(seed).randn(n, 2)
  y = y / max(np.std(y[:, 0]), 1e-12) * 1e-4 + np.random.RandomState(seed).randn(n, 2) * 1e-8
  lr = learning_rate if learning_rate is not None else max(n / exaggeration / 4.0, 50.0)
  update, gains = np.zeros_like(y), np.ones_like(y)
  for it in range(iterations):
    exag = exaggeration if it < exaggeration_iterations else 1.0
    _, grad = tsne_kl_and_gradient(p * exag, y)
    momentum = 0.5 if it < exaggeration_iterations else 0.8
    gains = np.where(np.sign(grad) != np.sign(update), gains + 0.2, gains * 0.8)
    gains = np.maximum(gains, 0.01)
    update = momentum * update - lr * gains * grad
    y = y + update
    y = y - y.mean(axis=0)
  kl, _ = tsne_kl_and_gradient(p, y)
  return y, kl


def plot_tsne(panels: Mapping[str, np.ndarray], words: Sequence[str], categories: Sequence[str], path: str,
              predictions: Mapping[str, str], title: str = "") -> None:
  """Fig. 9: one panel per embedding set, points `[n + 1, 2]` (the answers, then m last), coloured by category,
  the panel's prediction circled and m a black star."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.6), squeeze=False)
  for ax, (name, pts) in zip(axes[0], panels.items()):
    for cat in CATEGORIES + ("",):
      sel = [i for i, c in enumerate(categories) if c == cat]
      if sel:
        ax.scatter(pts[sel, 0], pts[sel, 1], s=18, color=CATEGORY_COLOURS[cat], label=cat or "no category")
    for i, w in enumerate(words):
      ax.annotate(w, pts[i], fontsize=6, alpha=0.8, xytext=(2, 2), textcoords="offset points")
      if w == predictions.get(name):
        ax.scatter([pts[i, 0]], [pts[i, 1]], s=160, facecolors="none", edgecolors="k", lw=1.2)
    ax.scatter([pts[-1, 0]], [pts[-1, 1]], marker="*", s=220, color="k", label="m ([MASK] feature)")
    ax.set_title(f"{name} the GNN soft verbalizer: predicts {predictions.get(name, '?')!r}", fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=7, loc="best")
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  _save(fig, path)


# --------------------------------------------------------------------------------------------------- Fig. 10

def accurate_categories(gt_answers: Sequence[str], predictions: Sequence[Optional[str]],
                        category_of: Mapping[str, str], threshold: float = 90.0) -> dict:
  """Fig. 10 of one model: the test answers it gets right on >= `threshold` % of their test samples, by category:
  {"answers": {category: count}, "shares": {category: % of those answers}, "num_answers": their total}."""
  per_answer = ovqa_metrics.per_answer_accuracy(gt_answers, predictions)
  counts = {c: 0 for c in CATEGORIES}
  for answer, (correct, total) in per_answer.items():
    if total and 100.0 * correct / total >= threshold:
      cat = category_of.get(answer)
      if cat not in counts:
        raise ValueError(f"test answer {answer!r} has no category (got {cat!r})")
      counts[cat] += 1
  n = sum(counts.values())
  return {"answers": counts, "shares": {c: (100.0 * v / n if n else 0.0) for c, v in counts.items()},
          "num_answers": n, "threshold": threshold}


def plot_categories(results: Mapping[str, dict], path: str, title: str = "") -> None:
  """Fig. 10: one pie per model of the categories of its answers at >= the threshold accuracy."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(results), figsize=(4.4 * len(results), 4.4), squeeze=False)
  for k, (ax, (label, r)) in enumerate(zip(axes[0], results.items())):
    cats = [c for c in CATEGORIES if r["answers"][c]]
    if cats:
      ax.pie([r["answers"][c] for c in cats], labels=[f"{c}\n{r['shares'][c]:.1f}%" for c in cats],
             colors=[CATEGORY_COLOURS[c] for c in cats], startangle=90, counterclock=False,
             textprops={"fontsize": 9})
    else:
      ax.text(0.5, 0.5, "no answer", ha="center", va="center")
      ax.axis("off")
    ax.set_title(f"({chr(ord('a') + k)}) {label}: {r['num_answers']} answers at >= {r['threshold']:g}%",
                 fontsize=10)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  _save(fig, path)
