"""OVQA as the authors run it: their prompt capitalisation, graph build parameters that the config cannot silently
diverge from, and their vocabulary / category files (release fixtures: tests/release_fixtures.py)."""

import os

import numpy as np
import pytest

from evqa_jax.graphs import answer_graph
from evqa_jax.projects.ovqa import input as ovqa
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
  import release_fixtures as R
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
  task = OVQATask(config)
  assert task.input.answers_train[:2] == ["guitar", "woman"]
  is_base = task.aux_inputs("train")["is_base"]
  np.testing.assert_array_equal(np.nonzero(is_base)[0], [1])  # "woman": base by their category, 2 train rows
