"""The OVQA paper's tables as commands: the two published truths (`:paper`, `:released`), the zero-shot guard, the
OVQA release layout (its own CSVs, subtitles) and OVQA-trained checkpoints (release fixtures: data_prep/fixtures.py).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import ovqa_msrvtt
from evqa_jax.train import partition

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------- the two published truths

def their_lrs(lr, total, warmup_fraction=0.1):
  """The lr each optimizer.step() of mlvlab/OVQA train.py runs at, for param_groups[0]: the Adam's initial lr at
  step 0, then util/misc.py adjust_learning_rate(curr_step = s - 1), which train.py calls after each step."""
  warm = round(warmup_fraction * total)

  def gamma(step):
    if step < warm:
      return step / max(1, warm)
    return max(0.0, (total - step) / max(1, total - warm))

  return [lr] + [lr * gamma(s - 1) for s in range(1, total)]


def _update_sizes(optim_config, total):
  """Per step, the size of Adam's update of a constant gradient (= the lr that step ran at, Adam normalising the
  gradient away) for a verbalizer weight and an adapter weight."""
  tx, schedule = partition.make_optimizer(optim_config, total)
  params = {"verbalizer": {"gat_0": {"w_dst": jnp.zeros((2, 2))}},
            "lm": {"layer_0": {"adapter": {"kernel": jnp.zeros((3,))}}}}
  grads = jax.tree.map(lambda x: jnp.full(x.shape, 0.5), params)
  state = tx.init(params)
  sizes = {"verbalizer": [], "adapter": []}
  update = jax.jit(tx.update)
  for _ in range(total):
    updates, state = update(grads, state, params)
    sizes["verbalizer"].append(float(-updates["verbalizer"]["gat_0"]["w_dst"][0, 0]))
    sizes["adapter"].append(float(-updates["lm"]["layer_0"]["adapter"]["kernel"][0]))
  return sizes, [float(schedule(s)) for s in range(total)]


def test_paper_and_released_learning_rates():
  total, lr = 20, 5e-5
  paper = ovqa_msrvtt.get_config()
  assert ovqa_msrvtt.get_config("paper").to_dict() == paper.to_dict()  # the default, named
  released = ovqa_msrvtt.get_config("released")
  assert ovqa_msrvtt.get_config("authors_eps").to_dict() == released.to_dict()  # the old name, kept
  assert (paper.verbalizer.eps_base_fixed, released.verbalizer.eps_base_fixed) == (False, True)
  assert paper.verbalizer.eps == released.verbalizer.eps == 0.7

  ours = [lr * s / 2 for s in range(2)] + [lr * (total - s) / (total - 2) for s in range(2, total)]
  sizes, schedule = _update_sizes(paper.optim, total)
  np.testing.assert_allclose(schedule, ours, rtol=1e-6)
  for group in ("verbalizer", "adapter"):  # one schedule for every trainable parameter
    np.testing.assert_allclose(sizes[group], ours, rtol=1e-5, atol=1e-12)

  sizes, schedule = _update_sizes(released.optim, total)
  theirs = their_lrs(lr, total)
  assert theirs[:4] == pytest.approx([5e-5, 0.0, 2.5e-5, 5e-5])
  np.testing.assert_allclose(schedule, theirs, rtol=1e-6)
  for group in ("verbalizer", "adapter"):  # their GNN weights (gnn1/gnn2) sit in param_groups[0] too
    np.testing.assert_allclose(sizes[group], theirs, rtol=1e-5, atol=1e-12)


def test_constant_lr_params():
  """optim.constant_lr_params: the named parameters train at the constant peak lr, the rest on the schedule."""
  total, lr = 10, 5e-5
  config = ovqa_msrvtt.get_config()
  config.optim.constant_lr_params = ("verbalizer",)
  sizes, schedule = _update_sizes(config.optim, total)
  np.testing.assert_allclose(sizes["verbalizer"], [lr] * total, rtol=1e-5)
  np.testing.assert_allclose(sizes["adapter"], schedule, rtol=1e-5, atol=1e-12)
  assert schedule[0] == 0.0 and schedule[1] == pytest.approx(lr)  # warm-up of 1 step, then linear decay
  # The train state's optimiser shardings (optax.tree_map_params) see moments per parameter, the count replicated.
  from evqa_jax.train import sharding
  from evqa_jax.train import steps
  mesh = sharding.make_mesh((-1, 1), ("data", "model"))
  tx, _ = partition.make_optimizer(config.optim, total)
  params = jax.device_put({"verbalizer": {"w": jnp.zeros((2, 2))}, "adapter": {"b": jnp.zeros((3,))}},
                          sharding.replicated(mesh))
  shardings = steps.opt_state_shardings(tx, params, mesh)
  assert len(jax.tree.leaves(shardings)) == 2 * 2 + 2  # Adam's mu and nu per parameter, Adam's and our counts
  config.optim.constant_lr_params = ("verbalizer", "gat$")
  with pytest.raises(ValueError, match=r"config.optim.constant_lr_params = \('verbalizer', 'gat\$'\): \['gat\$'\] "
                                       r"match\(es\) no trainable parameter"):
    _update_sizes(config.optim, total)


def test_cvqa_topk_per_dataset():
  """The paper's closed vocabularies: the dataset configs and the converter's --dataset agree."""
  import importlib
  from data_prep import ovqa as prep
  for dataset, k in {"msrvtt": 4000, "msvd": 1852, "tgif": 1540, "activitynet": 1654}.items():
    config = importlib.import_module(f"configs.ovqa_{dataset}").get_config("cvqa")
    assert config.data.cvqa_topk == prep.CVQA_TOPK[dataset] == k
    assert config.data.use_subtitles == (dataset != "tgif")  # OVQA dataset.py: no subtitles on TGIF


# ------------------------------------------------------------------------------------------ the OVQA release layout

def _records(out, split):
  """The split's records as plain dicts of text (the fields the prompt uses)."""
  from evqa_jax.data import records as records_lib
  from evqa_jax.data import source as source_lib
  src = source_lib.TFRecordDataSource(records_lib.split_paths(out, split), records_lib.load_spec(out, split))
  return [{k: str(src[i][k]) for k in ("video_id", "question", "answer", "subtitles")} for i in range(len(src))]


def test_ovqa_release_folder_converts_with_subtitles(tmp_path):
  """`python -m data_prep.ovqa --ovqa-release meta_data/msrvtt --dataset msrvtt`: their own CSVs (question, answer,
  video_id, type only), features, subtitles and vocabularies; their subtitles.pkl only behind --trust-pickles, a
  JSON copy by default; the prompt ends in " Subtitles: {text}" as dataset.py builds it."""
  import json
  import pickle
  from data_prep import fixtures as R
  from data_prep import ovqa as prep
  from evqa_jax import io as evqa_io
  from evqa_jax.projects.ovqa.backbones import frozenbilm as ovqa_input
  meta = R.ovqa_meta_data(str(tmp_path / "meta_data" / "msrvtt"))
  out = str(tmp_path / "records")
  with pytest.raises(evqa_io.UnsafeInputError, match=r"subtitles.pkl: .*pickled Python objects.*--trust-pickles"):
    prep.main(["--ovqa-release", meta["dir"], "--dataset", "msvd", "--out", out])
  assert not os.path.exists(out)
  with open(os.path.join(meta["dir"], "subtitles.pkl"), "rb") as f:
    subs = pickle.load(f)  # the test's own fixture
  with open(os.path.join(meta["dir"], "subtitles.json"), "w") as f:
    json.dump({str(k): v for k, v in subs.items()}, f)
  prep.main(["--ovqa-release", meta["dir"], "--dataset", "msvd", "--out", out])
  metadata = json.loads(open(os.path.join(out, "metadata.json")).read())
  assert metadata["cvqa_topk"] == 1852 and metadata["has_subtitles"]
  assert metadata["vocab_source"] == os.path.abspath(meta["dir"])
  assert metadata["source"]["subtitles"].endswith("subtitles.json")
  vocab = json.loads(open(os.path.join(out, "vocab.json")).read())
  assert vocab["vocab_test"] == list(meta["test_vocab"])  # their id order
  import pandas as pd
  train = pd.read_csv(os.path.join(out, "train.csv"), dtype=str, keep_default_na=False)
  assert list(train.columns) == ["video_id", "question", "answer", "type"] and len(train) == 10  # every train row
  rows = _records(out, "train")
  first = rows[0]
  assert (first["video_id"], first["subtitles"]) == ("7010", "he plays the guitar while a woman sings")
  assert rows[3]["subtitles"] == ""  # video 7012 has none
  prompt = ovqa_input.build_prompt(first["question"], first["subtitles"], "[MASK]")
  assert prompt == "Question: What is a man playing? Answer: [MASK]. Subtitles: he plays the guitar while a woman sings"
  # The pickle, trusted, gives the same records.
  prep.main(["--ovqa-release", meta["dir"], "--subtitles", os.path.join(meta["dir"], "subtitles.pkl"),
             "--trust-pickles", "--dataset", "msvd", "--out", str(tmp_path / "from_pkl")])
  assert _records(str(tmp_path / "from_pkl"), "train") == rows


# ------------------------------------------------------------------------------------ OVQA-trained checkpoints

def their_gnn(x, edge_index, weights):
  """mlvlab/OVQA model/gnn.py GNNSoftVerbalizer, one layer per (W_src, W_dst) of `weights` (torch Linear weights:
  y = x W^T): self-loops removed then one added per node; alpha_ij = softmax_j LeakyReLU_0.2((W_dst x_i) .
  (W_src x_j)); x_i' = sum_j alpha_ij x_j (messages are the raw x_j)."""
  src, dst = edge_index
  keep = src != dst
  n = len(x)
  src, dst = np.concatenate([src[keep], np.arange(n)]), np.concatenate([dst[keep], np.arange(n)])
  for w_src, w_dst in weights:
    score = np.einsum("ed,ed->e", x[dst] @ w_dst.T, x[src] @ w_src.T)
    score = np.where(score > 0, score, 0.2 * score)
    h = np.zeros_like(x)
    for i in range(n):
      into = dst == i
      w = np.exp(score[into] - score[into].max())
      h[i] = (w / w.sum()) @ x[src[into]]
    x = h
  return x


def test_ovqa_checkpoint_evaluates_as_their_model(tmp_path, monkeypatch):
  """config.pretrained.init_from = an OVQA-trained checkpoint (data_prep.fixtures.ovqa_checkpoint: FrozenBiLM's
  names + lm_predictions.lm_head.gnn{1,2}.lin_{src,dst}.weight) on the authors' graph: launch/evaluate.py
  --zero_shot scores it with its GNN; the logits are the [MASK] feature against eps V + (1 - eps) GNN(x)[:|V|]
  computed here with their GNN from their files and the checkpoint's tensors; a FrozenBiLM checkpoint (no GNN) with
  variant E is refused. Two test answers are base answers, so the paper's rule (eps for every answer, the default
  config) and the released code's (eps = 1 on base answers, `:released`) give different logits: each is asserted
  for its config."""
  import jax
  import pandas as pd
  import torch
  from data_prep import answer_graphs
  from data_prep import fixtures as R
  from data_prep import ovqa as prep
  from evqa_jax.data import pipeline
  from evqa_jax.models import encoders
  from evqa_jax.train import partition
  from evqa_jax.train import steps as steps_lib
  from evqa_jax.train import trainer
  deb = R.deberta_v2_dir(str(tmp_path / "deberta-v2-xlarge"))
  base = ("guitar", "red")  # test answers 0 and 1 (test_vocab.json's order)
  meta = R.ovqa_meta_data(str(tmp_path / "meta_data" / "msrvtt"), embed_dim=deb["config"]["hidden_size"],
                          categories={a: "base" for a in base})
  frozenbilm = str(tmp_path / "frozenbilm.pth")
  R.frozenbilm_checkpoint(frozenbilm, deb["state_dict"], deb["config"])
  ovqa = str(tmp_path / "ovqa_msrvtt.pth")
  sd = R.ovqa_checkpoint(ovqa, deb["state_dict"], deb["config"])
  out = str(tmp_path / "records")
  prep.convert(meta["dir"], os.path.join(meta["dir"], "clipvitl14.pth"), out, subtitles=os.path.join(
      meta["dir"], "subtitles.pkl"), trust_pickles=True, verbose=False, authors_vocab=meta["dir"])
  answer_graphs.main(["--data", out, "--authors-graph", meta["dir"]])
  config = ovqa_msrvtt.get_config()  # the paper's config, shrunk to the fixture
  config.data.dir, config.pretrained.dir, config.pretrained.init_from = out, deb["path"], frozenbilm
  config.graph.source = "authors"
  config.data.max_tokens = 48  # 10 visual + 48 text tokens within the fixture's 64 positions
  config.batch_size = config.eval_batch_size = 8  # the 8 test devices (conftest)
  with pytest.raises(ValueError, match=r"--zero_shot scores untrained weights.*:baseline"):
    trainer.evaluate_checkpoint(config, str(tmp_path / "refused"), None, ["test"])

  config.pretrained.init_from = ovqa
  seen = {}

  def spy(state, task, shardings):
    seen["state"], seen["task"] = load(state, task, shardings), task
    return seen["state"]
  load = steps_lib.load_pretrained_into
  monkeypatch.setattr(steps_lib, "load_pretrained_into", spy)
  workdir = tmp_path / "ovqa_eval"
  result = trainer.evaluate_checkpoint(config, str(workdir), None, ["test"])

  task, state = seen["task"], seen["state"]
  params = jax.device_get(partition.merge_params(state["trainable"], state["frozen"]))
  w = {k: sd[k].double().numpy() for k in sd if ".gnn" in k}
  for layer in (1, 2):  # torch Linear weight W (y = x W^T) -> our kernel W^T
    for side in ("src", "dst"):
      np.testing.assert_array_equal(params["verbalizer"][f"gat_{layer - 1}"][f"w_{side}"],
                                    w[f"lm_predictions.lm_head.gnn{layer}.lin_{side}.weight"].T.astype(np.float32))
  test = task.source("test")
  batch = pipeline.stack_examples([task.preprocess(test[i], train=False) for i in range(len(test))])
  numeric = {k: v for k, v in batch.items() if np.asarray(v).dtype.kind in "biuf"}
  aux = task.aux_inputs("test")
  logits, feature = (np.asarray(x, np.float64) for x in jax.jit(lambda p, b, a: (
      task.model.apply({"params": p}, b, a), task.model.apply({"params": p}, b, True, method="mask_feature")))(
          params, numeric, aux))
  words = np.asarray(encoders.word_embeddings("deberta_v2", params["lm"]), np.float64)
  np.testing.assert_array_equal(words, deb["state_dict"]["deberta.embeddings.word_embeddings.weight"].numpy())
  tok = task.input.tokenizer
  answers = list(meta["test_vocab"])
  v = np.stack([words[tok(a, add_special_tokens=False)["input_ids"][:5]].mean(0) for a in answers])
  graph = os.path.join(meta["dir"], "answer_graph")
  gnn = their_gnn(torch.load(os.path.join(graph, "test_x.pth")).double().numpy(),
                  torch.load(os.path.join(graph, "test_edge_index.pth")).numpy(),
                  [tuple(w[f"lm_predictions.lm_head.gnn{i}.lin_{side}.weight"] for side in ("src", "dst"))
                   for i in (1, 2)])
  theirs = feature @ (0.7 * v + 0.3 * gnn[:5]).T
  assert np.abs(gnn[:5] - v).max() > 0.05  # the GNN moves the answers: a real test of its weights
  bound = 1e-6  # measured 1.2e-7 (the paper's rule) and 9.3e-8 (the released rule), logits up to 0.43; bound 1e-6
  np.testing.assert_allclose(logits[:, :5], theirs, rtol=0, atol=bound)
  assert np.abs(feature @ (0.7 * v + 0.3 * 0.999 * gnn[:5]).T - theirs).max() > 100 * bound  # GNN x0.999: 2.2e-4
  # The released code's rule on the same weights: eps = 1 on the base answers, 0.7 on the rest.
  assert answers[:2] == list(base) and np.asarray(aux["is_base"])[:5].tolist() == [True, True, False, False, False]
  eps = np.array([1.0, 1.0, 0.7, 0.7, 0.7])[:, None]
  released = feature @ (eps * v + (1 - eps) * gnn[:5]).T
  assert np.abs(released - theirs)[:, :2].min() > 1e-3  # every base logit differs: the two rules are told apart
  released_model = task.model.clone(verbalizer={**task.model.verbalizer, "eps_base_fixed": True})
  got = np.asarray(jax.jit(lambda p, b, a: released_model.apply({"params": p}, b, a))(params, numeric, aux),
                   np.float64)
  np.testing.assert_allclose(got[:, :5], released, rtol=0, atol=bound)
  assert np.abs(logits[:, :2] - released[:, :2]).min() > 100 * bound  # the paper's config is not the released rule
  pred = [answers[i] for i in np.argmax(theirs, axis=1)]
  written = pd.read_csv(workdir / "eval" / "test_zero_shot" / "predictions.csv", dtype=str, keep_default_na=False)
  assert written.sort_values("index")["prediction"].tolist() == pred
  gold = [a for _, a, _ in R.MSRVTT_ROWS["test"]]
  assert result["eval"]["test"]["total"] == pytest.approx(100 * np.mean([p == a for p, a in zip(pred, gold)]))


def test_ovqa_checkpoint_errors(tmp_path):
  """Their train.py's own file (the whole nn.Module pickled) is refused with the conversion; a GNN checkpoint into
  the no-verbalizer config, or with a missing side, is an error naming the key."""
  import torch
  from evqa_jax import io as evqa_io
  from evqa_jax.projects.ovqa import checkpoint
  path = str(tmp_path / "best_model.pth")
  torch.save({"model": torch.nn.Linear(2, 2), "epoch": 3}, path)
  with pytest.raises(evqa_io.UnsafeInputError, match=r"best_model.pth: .*refused.*OVQA's train.py pickles the whole "
                                                     r"model.*state_dict\(\)"):
    checkpoint.read(path, trust_pickles=False)
  assert set(checkpoint.read(path, trust_pickles=True)) == {"weight", "bias"}  # trusted: its state dict
  eye = np.eye(3, dtype=np.float32)
  ckpt = {"lm_predictions.lm_head.gnn1.lin_src.weight": 2 * eye, "lm_predictions.lm_head.gnn1.lin_dst.weight": eye}
  layers = checkpoint.verbalizer_weights(ckpt, "c.pth")
  assert len(layers) == 1 and np.array_equal(layers[0]["w_src"], 2 * eye)
  config = ovqa_msrvtt.get_config("baseline")
  with pytest.raises(ValueError, match=r"c.pth holds a trained GNN verbalizer .* config.verbalizer.variant = 'A': "
                                       r"set it to 'E'"):
    checkpoint.load_verbalizer({"lm": {}}, layers, config.verbalizer, "c.pth")
  config = ovqa_msrvtt.get_config()
  with pytest.raises(ValueError, match=r"c.pth holds 1 GNN layers but config.verbalizer.num_layers = 2"):
    checkpoint.load_verbalizer({"verbalizer": {}}, layers, config.verbalizer, "c.pth")
  del ckpt["lm_predictions.lm_head.gnn1.lin_dst.weight"]
  with pytest.raises(ValueError, match=r"c.pth: lm_predictions.lm_head.gnn1.lin_dst.weight is missing"):
    checkpoint.verbalizer_weights(ckpt, "c.pth")
