"""The OVQA paper's qualitative figures (evqa_jax.evaluate.ovqa_figures, evqa_jax.projects.ovqa.figures,
launch/ovqa_figures.py, the evaluator's --fig10): the plotted numbers against hand cases and independent NumPy
references, and the command on a checkpoint of the tiny synthetic world."""

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from evqa_jax.evaluate import ovqa_figures as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _png(path):
  with Image.open(path) as im:
    return im.format, im.size


# ------------------------------------------------------------------------------------------- Figs. 5/11, Fig. 10

def test_top_confidences_hand_case(tmp_path):
  answers = ["a", "b", "c", "d"]
  logits = {"without": [0.0, np.log(3.0), 0.0, np.log(2.0)], "with": [np.log(4.0), 0.0, 0.0, 0.0]}
  top = F.top_confidences(logits, answers, k=2)
  assert top["without"] == [("b", pytest.approx(3 / 7, abs=1e-12)), ("d", pytest.approx(2 / 7, abs=1e-12))]
  assert top["with"] == [("a", pytest.approx(4 / 7, abs=1e-12)), ("b", pytest.approx(1 / 7, abs=1e-12))]
  with pytest.raises(ValueError, match="one per answer"):
    F.top_confidences({"x": [0.0]}, answers)
  F.plot_confidences(top, str(tmp_path / "f5.png"), "t", truth="a")
  assert _png(tmp_path / "f5.png")[0] == "PNG"


def test_fig10_from_two_prediction_files(tmp_path):
  """Train counts: yes 150 (base), no 20 (common), dog 3 (rare); test answers yes x3, no x2, dog, cat (unseen).
  Model A: yes 3/3, no 1/2, dog 0/1, cat 0/1 -> only 'yes' at >= 90%: base 100%.
  Model B: yes 3/3, no 2/2, dog 1/1, cat 0/1 -> base, common, rare one each: 33.3% each."""
  from evqa_jax.evaluate import ovqa as ovqa_cli
  train = ["yes"] * 150 + ["no"] * 20 + ["dog"] * 3
  test = ["yes", "yes", "yes", "no", "no", "dog", "cat"]
  pd.DataFrame({"question": "q", "answer": train}).to_csv(tmp_path / "train.csv", index=False)
  pd.DataFrame({"question": "q", "answer": test}).to_csv(tmp_path / "test.csv", index=False)
  pd.DataFrame({"index": range(7), "prediction": ["yes", "yes", "yes", "no", "yes", "yes", "dog"]}).to_csv(
      tmp_path / "a.csv", index=False)
  pd.DataFrame({"index": range(7), "prediction": ["yes", "yes", "yes", "no", "no", "dog", "dog"]}).to_csv(
      tmp_path / "b.csv", index=False)
  out = ovqa_cli.main(["--train-csv", str(tmp_path / "train.csv"), "--test-csv", str(tmp_path / "test.csv"),
                       "--pred", str(tmp_path / "a.csv"), "--label", "VIOLET", "--pred", str(tmp_path / "b.csv"),
                       "--label", "VIOLET+", "--out", str(tmp_path / "m.json"), "--fig10", str(tmp_path / "f10.png")])
  assert out["fig10"]["VIOLET"]["answers"] == {"base": 1, "common": 0, "rare": 0, "unseen": 0}
  assert out["fig10"]["VIOLET"]["shares"]["base"] == 100.0
  assert out["fig10"]["VIOLET+"]["answers"] == {"base": 1, "common": 1, "rare": 1, "unseen": 0}
  assert out["fig10"]["VIOLET+"]["shares"]["rare"] == pytest.approx(100 / 3)
  assert json.loads((tmp_path / "m.json").read_text())["fig10"] == out["fig10"]
  assert _png(tmp_path / "f10.png")[0] == "PNG"
  # at a 50% bar model A's 'no' (1/2) counts too
  r = F.accurate_categories(test, ["yes", "yes", "yes", "no", "yes", "yes", "dog"],
                            {"yes": "base", "no": "common", "dog": "rare", "cat": "unseen"}, 50.0)
  assert r["answers"] == {"base": 1, "common": 1, "rare": 0, "unseen": 0}


# ---------------------------------------------------------------------------------------------------- t-SNE

def test_tsne_affinities_reach_the_perplexity_and_the_gradient_is_the_kl_gradient():
  rng = np.random.RandomState(0)
  x = rng.randn(12, 5)
  perp = 4.0
  p = F.tsne_affinities(x, perp)
  np.testing.assert_allclose(p, p.T, atol=0)
  assert p.sum() == pytest.approx(1.0, abs=1e-12) and np.all(np.diag(p) == 0)
  # Each conditional row (recovered from the construction below) has entropy log(perp).
  d = ((x[:, None] - x[None]) ** 2).sum(-1)
  for i in range(12):
    di = np.delete(d[i], i)
    lo, hi = 1e-6, 1e3  # independent bisection on log(beta)
    for _ in range(200):
      mid = np.sqrt(lo * hi)
      q = np.exp(-(di - di.min()) * mid)
      q /= q.sum()
      h = -(q * np.log(q)).sum()
      lo, hi = (mid, hi) if h > np.log(perp) else (lo, mid)
    row = np.zeros(12)
    row[np.arange(12) != i] = q
    cond_i = row
    assert -(cond_i[cond_i > 0] * np.log(cond_i[cond_i > 0])).sum() == pytest.approx(np.log(perp), abs=1e-4)
  # Gradient vs central differences of the KL.
  y = rng.randn(12, 2)
  kl, grad = F.tsne_kl_and_gradient(p, y)
  num = np.zeros_like(y)
  for i in range(12):
    for j in range(2):
      e = np.zeros_like(y)
      e[i, j] = 1e-6
      num[i, j] = (F.tsne_kl_and_gradient(p, y + e)[0] - F.tsne_kl_and_gradient(p, y - e)[0]) / 2e-6
  np.testing.assert_allclose(grad, num, atol=1e-7)  # a 1% error in the 4x factor would move it ~1e-3
  assert kl > 0


def test_tsne_keeps_separated_clusters_apart():
  rng = np.random.RandomState(1)
  centres = np.eye(3, 10) * 20.0
  x = np.concatenate([c + rng.randn(10, 10) for c in centres])
  y, kl = F.tsne(x, perplexity=5.0, iterations=400)
  assert y.shape == (30, 2) and np.isfinite(y).all() and kl < 1.0
  d = ((y[:, None] - y[None]) ** 2).sum(-1)
  np.fill_diagonal(d, np.inf)
  nearest = d.argmin(axis=1)
  assert np.all(nearest // 10 == np.arange(30) // 10)  # every point's nearest neighbour is in its own cluster
  y2, _ = F.tsne(x, perplexity=5.0, iterations=400)
  np.testing.assert_array_equal(y, y2)  # deterministic


# ------------------------------------------------------------------------------------- Fig. 6: GAT attention

def test_sown_attention_equals_the_dense_softmax():
  """The GAT layers' sown alpha_ij (models/verbalizer.py) against the dense masked softmax of test_verbalizer's
  reference, on its random graph: each row of the dense attention matrix, per layer."""
  import jax
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import test_verbalizer as tv
  from evqa_jax.models.verbalizer import Verbalizer
  graph = tv.random_graph(0)
  feats = np.random.RandomState(10).randn(graph.num_nodes, tv.D).astype(np.float32)
  params = tv.random_params(0)
  adj = tv.adjacency(graph)

  def dense_alpha(h, w):
    s = (h @ w["w_dst"]) @ (h @ w["w_src"]).T
    s = np.where(s >= 0, s, tv.SLOPE * s)
    s = np.where(adj, s, -np.inf)
    e = np.exp(s - s.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)

  a1 = dense_alpha(feats, params["params"]["gat_0"])
  h1 = a1 @ feats
  a2 = dense_alpha(h1, params["params"]["gat_1"])
  g, _ = tv.padded(graph, feats)
  model = Verbalizer("gat", eps=0.7, edge_chunk=5)
  _, state = jax.jit(lambda v, g: model.apply(v, g, 4, mutable=["intermediates"]))(params, g)
  # max_answers == num_answers here, so padded positions are node ids; nodes 11..15 are padding
  senders, receivers = np.asarray(g.senders), np.asarray(g.receivers)
  for layer, (dense, targets) in enumerate(((a1, graph.num_nodes), (a2, 4))):  # the last layer: answers only
    alpha = np.asarray(state["intermediates"][f"gat_{layer}"]["attention"][0])
    assert alpha.shape == senders.shape
    for i in range(targets):
      rows = F.neighbour_attention(alpha, senders, receivers, graph.node_words, i)
      assert sum(a for _, a in rows) == pytest.approx(1.0, abs=1e-6)
      got = {w: a for w, a in rows}
      want = {graph.node_words[j]: dense[i, j] for j in np.flatnonzero(adj[i])}
      assert got.keys() == want.keys()
      # measured <= 1.7e-7; one W_src x0.999 in the second layer moves its weights 3.4e-4
      np.testing.assert_allclose([got[w] for w in want], list(want.values()), atol=1e-6)
  assert np.all(alpha[receivers >= 4] == 0)  # the last layer: edges into nodes it does not compute get 0
  # applied without `mutable`, nothing is sown and the output is unchanged
  out = jax.jit(lambda v, g: model.apply(v, g, 4))(params, g)
  np.testing.assert_allclose(out, 0.7 * feats[:4] + 0.3 * (a2 @ h1)[:4], atol=1e-6)


# ----------------------------------------------------------------------- the command on a checkpoint (tiny world)

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """A workdir holding random weights of the tiny config (shapes from `init_params` traced, not compiled; GAT
  weights the identity plus noise) as a step-1 checkpoint, written as training writes one (state, checksums,
  config.json): no training, no compile."""
  import jax
  import flax.linen as nn
  import orbax.checkpoint as ocp
  from flax import traverse_util
  sys.path.insert(0, REPO)
  from configs import ovqa_msrvtt
  from data_prep import worlds
  from evqa_jax import projects
  from evqa_jax import io as io_lib
  from evqa_jax.runs import checkpointing, safeguards
  from evqa_jax.runs import workdir as workdir_lib
  config = ovqa_msrvtt.get_config("tiny")
  worlds.ensure_synthetic_world(config)
  task = projects.build_task(config)
  shapes = traverse_util.flatten_dict(nn.meta.unbox(jax.eval_shape(task.init_params, jax.random.PRNGKey(0))))
  rng = np.random.RandomState(0)
  params = {}
  for path, s in shapes.items():
    noise = rng.randn(*s.shape).astype(np.float32)
    if "verbalizer" in path:
      params[path] = np.eye(s.shape[0], dtype=np.float32) + 0.2 * noise
    elif path[-1] == "scale":
      params[path] = 1.0 + 0.1 * noise
    else:  # word embeddings large enough for peaked attention (alpha_ij far from uniform)
      params[path] = (0.3 if "word_embeddings" in path else 0.05) * noise
  params = traverse_util.unflatten_dict(params)
  workdir = tmp_path_factory.mktemp("run")
  state = {"step": np.asarray(1, np.int32), "trainable": params, "frozen": {}}
  mngr = checkpointing.make_checkpoint_manager(str(workdir), config)
  mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(
      {"step": 1, "checksums": safeguards.state_checksums(state)})))
  mngr.wait_until_finished()
  mngr.close()
  io_lib.write_json(str(workdir / "config.json"), {"identity": workdir_lib.config_identity(config)})
  from evqa_jax.projects.ovqa import figures
  view = figures.inspect_question(task, params, "test", 3)
  return {"config": config, "task": task, "params": params, "workdir": str(workdir), "view": view}


def test_inspect_question_against_numpy(tiny_run):
  """m, V and H_hat recomputed in NumPy from the parameters: V the mean sub-word input embeddings, H_hat two dense
  GAT layers over the test graph and Eq. 7; the logits m.V and m.H_hat; the sown attention rows sum to 1."""
  from evqa_jax.graphs import padding
  task, params, view = tiny_run["task"], tiny_run["params"], tiny_run["view"]
  assert view.index == 3 and view.answers == list(task.input.answers_eval)
  aux = task.aux_inputs("test")
  emb = np.asarray(params["lm"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
  n = len(view.answers)
  mask = aux["answer_token_mask"][:n].astype(np.float64)
  v = (emb[aux["answer_tokens"][:n]] * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  np.testing.assert_allclose(view.embeddings["without"], v, atol=1e-6)  # measured 0
  graph = task.input.graphs["eval"]
  pos = padding.node_positions(graph, aux["answer_mask"].shape[0])
  nmask = aux["node_token_mask"][pos].astype(np.float64)
  h = (emb[aux["node_tokens"][pos]] * nmask[..., None]).sum(1) / nmask.sum(1, keepdims=True)
  adj = np.zeros((graph.num_nodes,) * 2, bool)
  adj[graph.receivers, graph.senders] = True

  def gnn(src_scale=1.0):
    x, alphas = h, []
    for layer in ("gat_0", "gat_1"):
      w = params["verbalizer"][layer]
      s = (x @ w["w_dst"]) @ (x @ (w["w_src"] * (src_scale if layer == "gat_1" else 1.0))).T
      s = np.where(adj, np.where(s >= 0, s, 0.2 * s), -np.inf)
      a = np.exp(s - s.max(1, keepdims=True))
      a /= a.sum(1, keepdims=True)
      alphas.append(a)
      x = a @ x
    eps = task.config.verbalizer.eps
    return alphas, eps * v + (1 - eps) * x[:n]

  alphas, h_hat = gnn()
  # measured 1.2e-7 (H_hat, values up to ~1), 4.4e-7 (logits, up to 3.4); the second layer's W_src x0.999 moves
  # them 1.5e-4 and 5.8e-4
  np.testing.assert_allclose(view.embeddings["with"], h_hat, atol=1e-6)
  m = view.feature.astype(np.float64)
  np.testing.assert_allclose(view.logits["without"], v @ m, atol=3e-6)
  np.testing.assert_allclose(view.logits["with"], h_hat @ m, atol=3e-6)
  alphas_off, h_off = gnn(0.999)
  assert np.abs(view.embeddings["with"] - h_off).max() > 1e-5 and np.abs(view.logits["with"] - h_off @ m).max() > 3e-5
  assert np.abs(view.logits["with"] - view.logits["without"]).max() > 0.1  # the verbalizer changes the scores
  target = int(np.argmax(view.logits["with"]))
  for layer, dense in enumerate(alphas):
    rows = F.neighbour_attention(view.attention[layer]["alpha"], view.attention[layer]["senders"],
                                 view.attention[layer]["receivers"], graph.node_words, target)
    want = {graph.node_words[j]: dense[target, j] for j in np.flatnonzero(adj[target])}
    assert {w for w, _ in rows} == set(want)
    # measured <= 4.4e-8; the W_src change moves the last layer's weights of this answer 2.3e-5
    np.testing.assert_allclose([a for _, a in rows], [want[w] for w, _ in rows], atol=1e-6)
  assert np.abs(alphas_off[1][target] - alphas[1][target]).max() > 1e-5


def test_command_loads_the_checkpoint_and_writes_the_figures_and_their_numbers(tiny_run, tmp_path):
  """launch/ovqa_figures.py's pieces in-process (a subprocess would compile the model again): the checkpoint read
  back equals what was written; the figures' numbers are the view's."""
  sys.path.insert(0, REPO)
  from launch import ovqa_figures as cmd
  task, params, step = cmd.load_run(tiny_run["config"], tiny_run["workdir"], "last")
  assert step == 1
  import jax
  jax.tree.map(np.testing.assert_array_equal, params, tiny_run["params"])
  view = tiny_run["view"]
  out = cmd.figures(view, ["5", "6", "9"], str(tmp_path), top=5, tsne_points=20, tsne_iterations=300)
  for name in cmd.FIGURE_FILES.values():
    assert _png(tmp_path / name)[0] == "PNG"
  top = F.top_confidences(view.logits, view.answers, 5)
  for k in ("with", "without"):
    assert [r["answer"] for r in out["fig5"][k]] == [a for a, _ in top[k]]
    p = F.softmax(view.logits[k])
    np.testing.assert_allclose([r["confidence"] for r in out["fig5"][k]], np.sort(p)[::-1][:5], rtol=1e-12)
  target = view.answers.index(out["predictions"]["with"])
  assert out["fig6"]["answer"] == view.answers[int(np.argmax(view.logits["with"]))]
  for layer, rows in zip(view.attention, out["fig6"]["layers"]):
    sel = layer["receivers"] == target
    assert len(rows) == int(sel.sum()) and sum(r["alpha"] for r in rows) == pytest.approx(1.0, abs=1e-5)
  # a baseline run (here the same weights) gives the "without" logits instead of the verbalizer switched off
  from evqa_jax.projects.ovqa import figures
  twice = figures.inspect_question(tiny_run["task"], tiny_run["params"], "test", 3,
                                   baseline=(tiny_run["task"], tiny_run["params"]))
  np.testing.assert_array_equal(twice.logits["without"], view.logits["with"])
  np.testing.assert_array_equal(twice.baseline_feature, view.feature)
  chosen = out["fig9"]["answers"]
  assert len(chosen) == 20 and len(out["fig9"]["points"]["with"]) == 21  # 20 answers and m
  assert view.answers[int(np.argmax(view.logits["with"]))] in chosen
  assert view.answers[int(np.argmax(view.logits["without"]))] in chosen


def test_no_figure_overwrites_an_input(tiny_run, tmp_path, capsys):
  """--fig10 naming a prediction file, and launch/ovqa_figures.py's --out_dir naming the workdir, are refused before
  anything is written."""
  import subprocess
  from evqa_jax import cli
  from evqa_jax.evaluate import ovqa as ovqa_cli
  (tmp_path / "test.csv").write_text("answer\ndog\n")
  (tmp_path / "p.csv").write_text("index,prediction\n0,dog\n")
  code = cli.run(ovqa_cli.main, ["--train-csv", str(tmp_path / "test.csv"), "--test-csv", str(tmp_path / "test.csv"),
                                 "--pred", str(tmp_path / "p.csv"), "--out", str(tmp_path / "m.json"),
                                 "--fig10", str(tmp_path / "p.csv")])
  assert code == 2 and "--fig10" in capsys.readouterr().err
  assert (tmp_path / "p.csv").read_text() == "index,prediction\n0,dog\n" and not (tmp_path / "m.json").exists()
  before = sorted(os.listdir(tiny_run["workdir"]))
  cmd = [sys.executable, os.path.join(REPO, "launch", "ovqa_figures.py"), "--config",
         os.path.join(REPO, "configs", "ovqa_msrvtt.py") + ":tiny", "--workdir", tiny_run["workdir"], "--index=3",
         f"--out_dir={tiny_run['workdir']}"]
  proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode != 0 and "--out_dir" in proc.stderr and "is or holds the input --workdir" in proc.stderr
  assert sorted(os.listdir(tiny_run["workdir"])) == before
