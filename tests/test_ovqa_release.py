"""OVQA as the authors run it: their prompt capitalisation, graph build parameters that the config cannot silently
diverge from, and their vocabulary / category files (release fixtures: data_prep/fixtures.py)."""

import os

import numpy as np
import pytest

from evqa_jax.graphs import answer_graph
from evqa_jax.projects.ovqa.backbones import frozenbilm as ovqa
from evqa_jax.projects.ovqa.task import Task as OVQATask

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("question, expected", [
    ("what is the man doing", "Question: What is the man doing? Answer: [MASK]."),
    ("What is the MAN doing?", "Question: What is the man doing? Answer: [MASK]."),  # the rest is lower-cased
    ("who is TV host", "Question: Who is tv host? Answer: [MASK]."),
    (" what is it ", "Question: what is it? Answer: [MASK]."),  # str.capitalize() sees the space first
])
def test_prompt_capitalises_as_the_authors(question, expected):
  assert ovqa.build_prompt(question, "", "[MASK]") == expected
  # FrozenBiLM / OVQA dataset.py: question.capitalize().strip(), "?" appended, f" Question: {q} Answer: {mask}."
  q = question.capitalize().strip()
  q = q if q[-1] == "?" else q + "?"
  assert f" Question: {q} Answer: [MASK].".strip() == expected


def _graph(k, hops, min_sim):
  return answer_graph.AnswerGraph(["a", "b"], [0, 1], [0, 1], 2, {"k": k, "hops": hops, "min_sim": min_sim})


def test_graph_build_parameters_checked():
  answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=2, min_sim=-1.0)
  answer_graph.check_build_params(_graph(10, 2, 0.3), "g.npz", "D", k=10, hops=2, min_sim=0.3)
  with pytest.raises(ValueError, match=r"config.graph.k = 5 but g.npz was built with k = 10.*"
                                       r"answer_graphs.py --data D --k 5 --hops 2 --min-sim -1.0"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=5, hops=2, min_sim=-1.0)
  with pytest.raises(ValueError, match="config.graph.hops = 3 but g.npz was built with hops = 2"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=3, min_sim=-1.0)
  with pytest.raises(ValueError, match="config.graph.min_sim = 0.2 but g.npz was built with min_sim = -1.0"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=2, min_sim=0.2)
  # The authors' graph has no k / hops of ours: it needs config.graph.source = "authors", which skips them.
  theirs = answer_graph.AnswerGraph(["a", "b"], [0, 1], [0, 1], 2, {"source": "authors", "edge_index": "e.pth"})
  answer_graph.check_build_params(theirs, "g.npz", "D", k=5, hops=3, min_sim=0.2, source="authors")
  with pytest.raises(ValueError, match=r"g.npz is the OVQA authors' answer graph \(imported from e.pth\).*"
                                       r"set config.graph.source = 'authors'"):
    answer_graph.check_build_params(theirs, "g.npz", "D", k=10, hops=2, min_sim=-1.0)
  with pytest.raises(ValueError, match=r"config.graph.source = 'authors' but g.npz was built by .*--authors-graph"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=2, min_sim=-1.0, source="authors")
  with pytest.raises(ValueError, match=r"config.graph.source = 'glov': expected 'glove'"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=2, min_sim=-1.0, source="glov")


def test_task_refuses_a_graph_built_with_other_knobs(monkeypatch):
  from configs import ovqa_msrvtt
  monkeypatch.chdir(REPO)  # the demo config names its data directory relative to the repository
  config = ovqa_msrvtt.get_config("demo,small")
  from data_prep import worlds
  worlds.ensure_synthetic_world(config)
  OVQATask(config)  # the world's graphs are built with the config's defaults
  config.graph.k = 7
  with pytest.raises(ValueError, match=r"config.graph.k = 7 but .*graph_train.npz was built with k = 10"):
    OVQATask(config)


def _release(tmp_path, categories=None):
  from data_prep import fixtures as R
  rel = R.msrvtt_qa(str(tmp_path / "MSRVTT-QA"))
  train = [a for _, a, _ in R.MSRVTT_ROWS["train"]]
  test = [a for _, a, _ in R.MSRVTT_ROWS["test"]]
  authors = R.ovqa_authors_files(str(tmp_path / "meta_data"), train, test, categories=categories)
  return rel, authors


def test_authors_vocabulary_and_categories(tmp_path):
  import json
  from data_prep import ovqa as prep
  # Their categories may disagree with the CSV counts (they count over their own pool): theirs win.
  rel, authors = _release(tmp_path, categories={"guitar": "base", "woman": "common"})
  out = tmp_path / "out"
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), str(out), cvqa_topk=3, verbose=False,
               authors_vocab=authors["dir"])
  with open(out / "vocab.json") as f:
    vocab = json.load(f)
  assert vocab["vocab_train"] == ["guitar", "woman", "dog", "red", "kitchen", "two", "bike", "pasta"]
  assert vocab["vocab_test"] == ["guitar", "red", "song", "night", "man"]  # their id order, not ours
  assert vocab["vocab_cvqa"] == ["guitar", "woman", "dog"]
  assert vocab["categories"]["guitar"] == "base" and vocab["categories"]["woman"] == "common"
  assert vocab["categories"]["red"] == "rare" and vocab["categories"]["song"] == "unseen"
  assert vocab["train_counts"]["guitar"] == 2  # counts stay the CSV's
  # Without the flag: our own derivation (test answers seen in train first, then unseen alphabetically).
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), str(tmp_path / "ours"), verbose=False)
  with open(tmp_path / "ours" / "vocab.json") as f:
    ours = json.load(f)
  assert ours["vocab_test"] == ["guitar", "red", "man", "night", "song"] and ours["categories"]["guitar"] == "rare"


def test_authors_vocab_bad_rows_and_files(tmp_path):
  import json
  from data_prep import ovqa as prep
  from data_prep import ovqa_authors
  rel, authors = _release(tmp_path)
  feats = os.path.join(rel["dir"], "clipvitl14.pth")
  with open(os.path.join(authors["dir"], "test_vocab.json"), "w") as f:
    json.dump({"guitar": 0, "red": 1, "song": 2, "night": 3}, f)  # "man" (test row 4) missing
  with pytest.raises(prep.ConversionError, match=r"test.csv, row 4 \(line 6\), field 'answer': answer 'man' is not "
                                                 r"in the authors' test_vocab.json"):
    prep.convert(rel["dir"], feats, str(tmp_path / "out"), verbose=False, authors_vocab=authors["dir"])
  summary = prep.convert(rel["dir"], feats, str(tmp_path / "out"), verbose=False, skip_bad=True,
                         authors_vocab=authors["dir"])
  assert summary["test"]["skipped"] == {"answer_not_in_vocab": 1}
  with open(os.path.join(authors["dir"], "ans2cat.json"), "w") as f:
    json.dump({"guitar": "base"}, f)
  with pytest.raises(ovqa_authors.AuthorsVocabError, match=r"ans2cat.json: answer 'woman' has category None"):
    ovqa_authors.read_authors_vocab(authors["dir"])
  with open(os.path.join(authors["dir"], "train_vocab.json"), "w") as f:
    json.dump({"guitar": 0, "woman": 2}, f)
  with pytest.raises(ovqa_authors.AuthorsVocabError, match=r"train_vocab.json: answer 'woman' has id 2"):
    ovqa_authors.read_authors_vocab(authors["dir"])


def test_task_takes_base_answers_from_the_categories(tmp_path, monkeypatch):
  from configs import ovqa_msrvtt
  from data_prep import ovqa as prep
  rel, authors = _release(tmp_path, categories={"woman": "base"})
  out = str(tmp_path / "out")
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), out, verbose=False,
               authors_vocab=authors["dir"])
  monkeypatch.chdir(REPO)
  config = ovqa_msrvtt.get_config("demo,small")
  config.data.dir, config.data.synthetic, config.verbalizer.variant = out, "", "A"
  config.data.use_subtitles = False  # converted without them
  task = OVQATask(config)
  assert task.input.answers_train[:2] == ["guitar", "woman"]
  is_base = task.aux_inputs("train")["is_base"]
  np.testing.assert_array_equal(np.nonzero(is_base)[0], [1])  # "woman": base by their category, 2 train rows


def test_subtitles_asked_of_records_converted_without_them(tmp_path, monkeypatch):
  """A config that puts subtitles in the prompt (config.data.use_subtitles, the paper configs but TGIF's) on records
  converted without --subtitles stops with one line naming the key and the records folder instead of training on
  prompts without them; the same records with use_subtitles=False load."""
  from configs import ovqa_msrvtt
  from data_prep import ovqa as prep
  rel, authors = _release(tmp_path)
  out = str(tmp_path / "out")
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), out, verbose=False,
               authors_vocab=authors["dir"])
  monkeypatch.chdir(REPO)
  config = ovqa_msrvtt.get_config("demo,small")
  config.data.dir, config.data.synthetic, config.verbalizer.variant = out, "", "A"
  assert config.data.use_subtitles
  with pytest.raises(ValueError) as e:
    OVQATask(config)
  assert str(e.value) == (
      f"config.data.use_subtitles = True but the records in {out} were converted without subtitles (metadata.json: "
      "has_subtitles false): convert again with --subtitles (or --ovqa-release with its subtitles.json), or pass "
      "--config.data.use_subtitles=False")
  config.data.use_subtitles = False
  assert OVQATask(config).input.metadata["has_subtitles"] is False


def test_cvqa_vocab_is_frozenbilms_zero_shot_vocabulary(tmp_path, monkeypatch):
  """`--cvqa-vocab vocab1000.json` (FrozenBiLM's {answer: id} file, which its zero-shot videoqa.py scores): the
  closed head's answers are exactly that file's, in id order, whatever the train counts; a malformed file names
  itself."""
  import json
  from configs import ovqa_msrvtt
  from data_prep import ovqa as prep
  from data_prep import ovqa_authors
  rel, authors = _release(tmp_path)
  vocab_file = tmp_path / "vocab1000.json"
  vocab_file.write_text(json.dumps({"woman": 1, "piano": 0, "a word no one answers": 2}))
  out = str(tmp_path / "out")
  assert prep.main(["--csv-dir", rel["dir"], "--features", os.path.join(rel["dir"], "clipvitl14.pth"),
                    "--authors-vocab", authors["dir"], "--cvqa-vocab", str(vocab_file), "--out", out]) == 0
  vocab = json.loads(open(os.path.join(out, "vocab.json")).read())
  assert vocab["vocab_cvqa"] == ["piano", "woman", "a word no one answers"]
  assert vocab["vocab_train"] == list(authors["train_vocab"])  # the open vocabularies are untouched
  monkeypatch.chdir(REPO)
  config = ovqa_msrvtt.get_config("demo,small,cvqa")
  config.data.dir, config.data.synthetic, config.data.use_subtitles = out, "", False
  task = OVQATask(config)
  assert task.input.answers_eval == task.input.answers_train == vocab["vocab_cvqa"]
  vocab_file.write_text(json.dumps({"piano": 0, "woman": 0}))
  with pytest.raises(ovqa_authors.AuthorsVocabError, match=r"vocab1000.json: answers 'piano' and 'woman' share id 0"):
    prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), str(tmp_path / "bad"), verbose=False,
                 cvqa_vocab=str(vocab_file))


def test_variant_a_in_any_spelling_loads_no_graphs(tmp_path, monkeypatch):
  """`config.verbalizer.variant` is read through verbalizer.canonical_variant everywhere: A, a and none need no
  answer graphs (the converted release below has none) and build no verbalizer; a GNN variant asks for them."""
  from configs import ovqa_msrvtt
  from data_prep import ovqa as prep
  rel, authors = _release(tmp_path)
  out = str(tmp_path / "out")
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), out, verbose=False,
               authors_vocab=authors["dir"])
  monkeypatch.chdir(REPO)
  for variant in ("A", "a", "none", "None"):
    config = ovqa_msrvtt.get_config("demo,small")
    config.data.dir, config.data.synthetic, config.verbalizer.variant = out, "", variant
    config.data.use_subtitles = False  # converted without them
    task = OVQATask(config)
    assert not task.input.use_graph and task.input.graphs == {} and task.model.verbalizer is None, variant
    assert "senders" not in task.aux_inputs("train") and task.describe() == "OVQA FrozenBiLM+ (bert)"
  config.verbalizer.variant = "gat"
  with pytest.raises(FileNotFoundError, match=r"graph_train.npz is missing: the verbalizer \(config.verbalizer.variant "
                                              r"= 'gat'\) needs answer graphs"):
    OVQATask(config)


# ------------------------------------------------------------------------------------ the authors' answer graphs

def test_authors_answer_graph_import(tmp_path):
  import json
  import jax
  import torch
  from data_prep import answer_graphs
  from data_prep import ovqa_authors
  _, authors, out = _converted(tmp_path)
  summary = answer_graphs.main(["--data", out, "--authors-graph", authors["dir"]])
  assert summary["train"] == {"num_answers": 8, "num_nodes": 10, "num_edges": 14, "num_oov_answers": 0}
  g = answer_graph.load_answer_graph(os.path.join(out, "graph_train.npz"))
  assert g.node_words == list(authors["train_vocab"]) + ["", ""]  # their neighbour words are not released
  # Their edges 8->0, 9->1, 0->8, 2->3 (source, target); their self-loop 1->1 replaced, as their GATConv does, by
  # one self-loop per node; sorted by (receiver, sender).
  assert list(zip(g.senders.tolist(), g.receivers.tolist())) == [
      (0, 0), (8, 0), (1, 1), (9, 1), (2, 2), (2, 3), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (0, 8), (8, 8),
      (9, 9)]
  x = torch.load(os.path.join(authors["dir"], "answer_graph", "train_x.pth")).numpy()
  assert x.shape == (10, 32) and g.node_features.dtype == np.float32
  np.testing.assert_array_equal(g.node_features, x)
  assert g.info["source"] == "authors" and (g.info["num_given_edges"], g.info["num_given_self_loops"]) == (5, 1)
  t = answer_graph.load_answer_graph(os.path.join(out, "graph_test.npz"))
  assert (t.num_answers, t.num_nodes, t.node_words[:5]) == (5, 7, list(authors["test_vocab"]))

  graph_dir = os.path.join(authors["dir"], "answer_graph")
  for split in ("train", "test"):  # features of another LM's width: refused when the model is traced
    torch.save(torch.load(os.path.join(graph_dir, f"{split}_x.pth"))[:, :8].clone(),
               os.path.join(graph_dir, f"{split}_x.pth"))
  answer_graphs.main(["--data", out, "--authors-graph", authors["dir"]])
  config = _tiny(out, "open")
  config.verbalizer.variant, config.graph.source = "E", "authors"
  with pytest.raises(ValueError, match=r"node features are 8-d but the LM's word embeddings are 32-d"):
    jax.eval_shape(OVQATask(config).init_params, jax.random.key(0))
  os.remove(os.path.join(out, "graph_train.npz"))
  for name, obj, message in (
      ("test_edge_index.pth", torch.zeros(3, 2, dtype=torch.int64),
       r"test_edge_index.pth: edge_index has shape \(3, 2\), expected \[2, edges\]"),
      ("test_edge_index.pth", torch.tensor([[7], [0]]),
       r"test_edge_index.pth: edge_index edge 0 \(7 -> 0\) names a node outside the 7 nodes of .*test_x.pth"),
      ("test_edge_index.pth", torch.zeros(2, 1), r"test_edge_index.pth: edge_index has dtype torch.float32"),
      ("test_x.pth", torch.zeros(3, 32), r"test_x.pth: x \(node features\) has 3 rows but .*test_vocab.json holds 5"),
      ("test_x.pth", {"x": torch.zeros(7, 32)}, r"test_x.pth: x \(node features\) must be a tensor, found dict")):
    saved = torch.load(os.path.join(graph_dir, name))
    torch.save(obj, os.path.join(graph_dir, name))
    with pytest.raises(ovqa_authors.AuthorsVocabError, match=message):
      answer_graphs.main(["--data", out, "--authors-graph", authors["dir"]])
    torch.save(saved, os.path.join(graph_dir, name))
  assert not os.path.exists(os.path.join(out, "graph_train.npz"))  # both splits are checked before either is written
  with open(os.path.join(out, "vocab.json")) as f:  # our own vocabulary: their x rows would be the wrong answers
    vocab = json.load(f)
  vocab["vocab_test"] = sorted(vocab["vocab_test"])
  with open(os.path.join(out, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  with pytest.raises(ovqa_authors.AuthorsVocabError, match=r"vocab.json V_test is not .*test_vocab.json in id order"):
    answer_graphs.main(["--data", out, "--authors-graph", authors["dir"]])


def test_zero_shot_is_frozenbilm_plus(tmp_path, monkeypatch):
  """launch/evaluate.py --zero_shot (trainer.evaluate_checkpoint without a checkpoint: the paper's Table 6) scores
  FrozenBiLM+ without a verbalizer: with the learned GAT of variant E, which no checkpoint filled, it refuses (an
  identity-initialised GNN is not the paper's zero-shot model); with variant A (`:baseline`) its answer embeddings
  are the frozen mean sub-word embeddings V, its predictions the argmax of the [MASK] feature against them.
  (The GNN on the authors' graph with trained weights: tests/test_ovqa_paper.py, from an OVQA checkpoint.)"""
  import json
  import jax
  import pandas as pd
  from data_prep import answer_graphs
  from evqa_jax.data import pipeline
  from evqa_jax.models import encoders
  from evqa_jax.train import partition
  from evqa_jax.train import steps as steps_lib
  from evqa_jax.train import trainer
  from data_prep import fixtures as R
  _, authors, out = _converted(tmp_path)
  answer_graphs.main(["--data", out, "--authors-graph", authors["dir"]])
  config = _tiny(out, "open")
  config.verbalizer.variant, config.graph.source = "E", "authors"
  with pytest.raises(ValueError, match=r"--zero_shot scores untrained weights, but config.verbalizer.variant = 'E' "
                                       r"is a learned verbalizer .*use --config=configs/ovqa_msrvtt.py:baseline"):
    trainer.evaluate_checkpoint(config, str(tmp_path / "refused"), None, ["test"])
  config.verbalizer.variant = "A"
  seen = {}  # the state it scores, as the zero-shot path builds it (one compile: the eval step)

  def spy(state, task, shardings):
    seen["state"], seen["task"] = load(state, task, shardings), task
    return seen["state"]
  load = steps_lib.load_pretrained_into
  monkeypatch.setattr(steps_lib, "load_pretrained_into", spy)
  workdir = tmp_path / "zero_shot"
  result = trainer.evaluate_checkpoint(config, str(workdir), None, ["test"])

  task, state = seen["task"], seen["state"]
  params = jax.device_get(partition.merge_params(state["trainable"], state["frozen"]))
  assert int(state["step"]) == 0 and "verbalizer" not in params
  test = task.source("test")
  batch = pipeline.stack_examples([task.preprocess(test[i], train=False) for i in range(len(test))])
  apply = jax.jit(lambda p, b, a: (task.model.apply({"params": p}, b, True, method="mask_feature"),
                                   task.model.apply({"params": p}, a, method="answer_embeddings")))
  feature, emb = (np.asarray(x, np.float64) for x in apply(params, batch, task.aux_inputs("test")))
  words = np.asarray(encoders.word_embeddings("bert", params["lm"]), np.float64)
  tok = task.input.tokenizer
  answers = list(authors["test_vocab"])
  v = np.stack([words[tok(a, add_special_tokens=False)["input_ids"][:5]].mean(0) for a in answers])
  np.testing.assert_allclose(emb[:5], v, rtol=1e-5, atol=1e-6)
  pred = [answers[i] for i in np.argmax(feature @ emb[:5].T, axis=1)]
  written = pd.read_csv(workdir / "eval" / "test_zero_shot" / "predictions.csv", dtype=str, keep_default_na=False)
  assert written.sort_values("index")["prediction"].tolist() == pred
  gold = [a for _, a, _ in R.MSRVTT_ROWS["test"]]
  assert result["step"] == 0 and result["eval"]["test"]["total"] == pytest.approx(
      100 * np.mean([p == a for p, a in zip(pred, gold)]))
  assert json.loads((workdir / "evaluate_zero_shot.json").read_text())["eval"] == result["eval"]


# ----------------------------------------------------------------------------------------- CVQA: FrozenBiLM's head

def _converted(tmp_path, cvqa_topk=0):
  from data_prep import ovqa as prep
  rel, authors = _release(tmp_path)
  out = str(tmp_path / "records")
  prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), out, cvqa_topk=cvqa_topk, verbose=False,
               authors_vocab=authors["dir"])
  return rel, authors, out


def _tiny(data_dir, head):
  from configs import ovqa_msrvtt
  config = ovqa_msrvtt.get_config("tiny")  # random 2-layer BERT, MiniLM's tokenizer
  config.data.dir, config.data.synthetic = data_dir, ""
  config.model.head, config.verbalizer.variant = head, "A"
  config.data.use_subtitles = False  # _converted() converts without them
  return config


def test_cvqa_is_frozenbilms_head(tmp_path):
  """FrozenBiLM's closed-vocabulary head (the paper's CVQA row): the [MASK] feature dotted with the frozen mean
  sub-word embeddings of exactly the top-k train answers, no parameter of its own, train rows outside the top-k
  dropped (FrozenBiLM datasets/videoqa_dataset.py), answers outside it never predicted."""
  import flax.linen as nn
  import jax
  import pandas as pd
  from evqa_jax.data import pipeline
  from evqa_jax.models import encoders
  from data_prep import fixtures as R
  _, _, out = _converted(tmp_path, cvqa_topk=3)
  task = OVQATask(_tiny(out, "cvqa"))
  # The authors' train_vocab order (by train count): guitar, woman (2 rows each), then dog.
  top3 = ["guitar", "woman", "dog"]
  assert task.input.answers_train == task.input.answers_eval == top3
  train_answers = [a for _, a, _ in R.MSRVTT_ROWS["train"]]
  src = task.source("train")
  assert len(src) == 5 and len(train_answers) == 10  # rows 0, 1, 2, 3, 8: guitar, woman, guitar, dog, woman
  assert [int(src[i]["index"]) for i in range(5)] == [0, 1, 2, 3, 8]
  assert [str(src[i]["answer"]) for i in range(5)] == ["guitar", "woman", "guitar", "dog", "woman"]

  # Jitted: eagerly, each op of the init and of the applies below would be compiled on its own.
  params = jax.jit(lambda r: nn.meta.unbox(task.init_params(r)))(jax.random.key(0))
  assert set(params) == {"lm"}  # nothing trained in the head: the answer embeddings are the frozen LM's
  test = task.source("test")
  batch = pipeline.stack_examples([task.preprocess(test[i], train=False) for i in range(len(test))])
  assert batch["label"].tolist() == [0, -1, -1, -1, -1]  # guitar; red, song, night, man are outside the top 3
  aux = task.aux_inputs("test")
  np.testing.assert_array_equal(aux["answer_tokens"], task.aux_inputs("train")["answer_tokens"])
  numeric = {k: v for k, v in batch.items() if np.asarray(v).dtype.kind in "biuf"}
  logits, feature, pred = map(np.asarray, jax.jit(lambda p, b, a: (
      task.model.apply({"params": p}, b, a), task.model.apply({"params": p}, b, True, method="mask_feature"),
      task.predict(p, b, a)["pred"]))(params, numeric, aux))
  words = np.asarray(encoders.word_embeddings("bert", params["lm"]))
  tok = task.input.tokenizer
  answers = np.stack([words[tok(a, add_special_tokens=False)["input_ids"][:5]].mean(0) for a in top3])
  np.testing.assert_allclose(logits[:, :3], feature @ answers.T, rtol=1e-5, atol=1e-5)
  assert logits.shape[1] >= 3 and np.all(logits[:, 3:] == np.finfo(np.float32).min)  # padding never predicted
  np.testing.assert_array_equal(pred, np.argmax(feature @ answers.T, axis=1))
  task.evaluate("test", {"pred": pred, "index": batch["index"]}, str(tmp_path / "eval"))
  written = pd.read_csv(tmp_path / "eval" / "predictions.csv", dtype=str, keep_default_na=False)
  assert set(written["prediction"]) <= set(top3)

  mlp = OVQATask(_tiny(out, "cvqa_mlp"))  # the extra baseline: an MLP over the same answers and train rows
  assert len(mlp.source("train")) == 5 and "cvqa_head" in jax.eval_shape(mlp.init_params, jax.random.key(0))


# ------------------------------------------------------------------------------------------------ paper start point

def test_paper_configs_require_init_from(tmp_path):
  import subprocess
  import sys
  from configs import ovqa_activitynet, ovqa_msrvtt, ovqa_msvd, ovqa_tgif
  from evqa_jax.projects.ovqa.backbones.frozenbilm import FrozenBiLM
  for module in (ovqa_msrvtt, ovqa_msvd, ovqa_tgif, ovqa_activitynet):
    config = module.get_config()
    config.data.dir = str(tmp_path / "no_records")  # the start point is checked before any data is looked for
    with pytest.raises(ValueError, match=rf"config.pretrained.init_from is empty, but configs/ovqa_{config.dataset}.py"
                                         r".*--config.pretrained.init_from=none"):
      OVQATask(config)
    config.pretrained.init_from = "none"
    assert FrozenBiLM.init_from_path(config) == ""
    config.pretrained.init_from = "~/m/frozenbilm.pth"
    assert FrozenBiLM.init_from_path(config) == "~/m/frozenbilm.pth"
    for variant in ("demo", "small", "tiny"):
      config = module.get_config(variant)
      assert FrozenBiLM.init_from_path(config) == ""
  proc = subprocess.run([sys.executable, "launch/train.py", "--config=configs/ovqa_msrvtt.py",
                         f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=REPO))
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and lines[-1].startswith("error: config.pretrained.init_from is empty"), proc.stderr


# ------------------------------------------------------------------------------------------------ model selection

def _write_eval(workdir, split, step, metrics):
  import json
  d = workdir / "eval" / f"{split}_step{step}"
  d.mkdir(parents=True)
  (d / "metrics.json").write_text(json.dumps(metrics))


def test_best_eval_selects_over_the_written_evaluations(tmp_path):
  import ml_collections
  from evqa_jax.train import evaluation
  for step, total, macc in ((2, 50.0, 10.0), (4, 50.0, 30.0), (6, 40.0, 35.0), (8, 60.0, 5.0)):
    _write_eval(tmp_path, "test", step, {"total": total, "mAcc": macc, "n": 5})
  _write_eval(tmp_path, "val", 4, {"total": 1.0})
  select = {"split": "test", "metric": "total", "mode": "max"}
  best = evaluation.best_eval(str(tmp_path), select, ["test", "val"], up_to_step=6)
  assert (best["step"], best["value"]) == (2, 50.0)  # tie with step 4: the earlier one, as the authors' strict >
  assert best["eval"] == {"test": {"total": 50.0, "mAcc": 10.0, "n": 5}}  # no val evaluation at step 2
  best = evaluation.best_eval(str(tmp_path), select, ["test", "val"])
  assert best["step"] == 8
  assert evaluation.best_eval(str(tmp_path), dict(select, metric="mAcc"), ["test"])["step"] == 6
  assert evaluation.best_eval(str(tmp_path), dict(select, mode="min"), ["test"])["step"] == 6
  assert evaluation.best_eval(str(tmp_path / "none"), select, ["test"]) is None
  with pytest.raises(ValueError, match=r"config.select.metric = 'BNG' is not a number in .*test_step2"):
    evaluation.best_eval(str(tmp_path), dict(select, metric="BNG"), ["test"])
  config = ml_collections.ConfigDict({"data": {"eval_splits": ("validate", "test")},
                                      "select": {"split": "", "metric": "", "mode": "max"}})
  task = type("T", (), {"main_metric": "accuracy"})()
  assert evaluation.selection(config, task) == {"split": "validate", "metric": "accuracy", "mode": "max"}
  assert evaluation.selection(ml_collections.ConfigDict({"data": {"eval_splits": ()}}), task) is None
  config.select.split = "train"
  with pytest.raises(ValueError, match=r"config.select.split = 'train' is not evaluated during training"):
    evaluation.selection(config, task)


def test_best_checkpoint_outlives_max_to_keep(tmp_path):
  import ml_collections
  import orbax.checkpoint as ocp
  from evqa_jax.runs import checkpointing
  keep = checkpointing.KeepSteps()
  mngr = checkpointing.make_checkpoint_manager(str(tmp_path), ml_collections.ConfigDict(
      {"checkpoint": {"max_to_keep": 1, "replica_parallel": None}}), keep)
  for step in (1, 2, 3):
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"x": np.full(2, step)})))
    keep.steps = {1}  # step 1 became the best
  mngr.wait_until_finished()
  assert mngr.all_steps() == [1, 3]
  mngr.close()


# ------------------------------------------------------------------------------------------------ end to end

def test_release_end_to_end(tmp_path):
  """The released files as a user has them -> data_prep.ovqa (with the authors' vocabulary) -> the paper config from
  a FrozenBiLM checkpoint over a DeBERTa-v2 folder, 2 steps -> evaluate-only on the best checkpoint ->
  predictions.csv scored by the official command with the authors' ans2cat / test_vocab."""
  import json
  pytest.importorskip("torch")
  pytest.importorskip("sentencepiece")
  from data_prep import fixtures as R
  from configs import ovqa_msrvtt
  from evqa_jax.evaluate import ovqa as ovqa_eval
  from evqa_jax.train import trainer
  _, authors, out = _converted(tmp_path)
  deberta = R.deberta_v2_dir(str(tmp_path / "deberta-v2-xlarge"))
  ckpt = str(tmp_path / "frozenbilm.pth")
  R.frozenbilm_checkpoint(ckpt, deberta["state_dict"], deberta["config"])
  config = ovqa_msrvtt.get_config()  # the paper's config, shrunk to the fixture
  config.data.dir, config.pretrained.dir, config.pretrained.init_from = out, deberta["path"], ckpt
  config.verbalizer.variant = "A"  # no answer graphs here
  config.data.use_subtitles = False  # converted without them (test_ovqa_paper.py runs the release with them)
  config.data.max_tokens = 48  # 10 visual + 48 text tokens within the fixture's 64 positions
  config.batch_size = config.eval_batch_size = 8  # the 8 test devices (conftest)
  config.total_epochs, config.eval_every_epochs, config.checkpoint_every_epochs = None, None, None
  config.total_steps, config.eval_every_steps, config.checkpoint_every_steps = 2, 1, 1
  config.checkpoint.max_to_keep, config.log_every_steps = 1, 1
  workdir = tmp_path / "run"
  trainer.train_and_evaluate(config, str(workdir))

  final = json.loads((workdir / "final_metrics.json").read_text())
  by_step = {s: json.loads((workdir / "eval" / f"test_step{s}" / "metrics.json").read_text()) for s in (1, 2)}
  assert final["step"] == 2 and final["eval"]["test"] == by_step[2]  # the last step, as before
  best_step = 2 if by_step[2]["total"] > by_step[1]["total"] else 1
  assert final["best"] == {"step": best_step, "split": "test", "metric": "total", "mode": "max",
                           "value": by_step[best_step]["total"], "eval": {"test": by_step[best_step]}}
  assert sorted(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit()) == sorted({best_step, 2})

  result = trainer.evaluate_checkpoint(config, str(workdir), "best", ["test", "val"])
  assert result["step"] == best_step and result["eval"]["test"] == by_step[best_step]
  assert set(result["eval"]) == {"test", "val"}
  assert (workdir / "eval" / f"val_step{best_step}" / "predictions.csv").exists()

  official = ovqa_eval.main(["--test-csv", os.path.join(out, "test.csv"),
                             "--ans2cat", os.path.join(authors["dir"], "ans2cat.json"),
                             "--test-vocab", os.path.join(authors["dir"], "test_vocab.json"),
                             "--pred", str(workdir / "eval" / f"test_step{best_step}" / "predictions.csv"),
                             "--out", str(tmp_path / "official.json")])
  assert official["total"] == by_step[best_step]["total"]  # total accuracy does not depend on the categories
  assert set(official["official"]) and official["unseen"] is not None
