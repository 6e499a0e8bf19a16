"""OVQA as the authors run it: their prompt capitalisation, graph build parameters that the config cannot silently
diverge from, and their vocabulary / category files (release fixtures: tests/release_fixtures.py)."""

import os

import numpy as np
import pytest

from evqa_jax.graphs import answer_graph
from evqa_jax.tasks import ovqa

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
  with pytest.raises(ValueError, match=r"config.verbalizer.k = 5 but g.npz was built with k = 10.*"
                                       r"answer_graphs.py --data D --k 5 --hops 2 --min-sim -1.0"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=5, hops=2, min_sim=-1.0)
  with pytest.raises(ValueError, match="config.verbalizer.hops = 3 but g.npz was built with hops = 2"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=3, min_sim=-1.0)
  with pytest.raises(ValueError, match="config.verbalizer.min_sim = 0.2 but g.npz was built with min_sim = -1.0"):
    answer_graph.check_build_params(_graph(10, 2, None), "g.npz", "D", k=10, hops=2, min_sim=0.2)


def test_task_refuses_a_graph_built_with_other_knobs(monkeypatch):
  from configs import ovqa_msrvtt
  monkeypatch.chdir(REPO)  # the demo config names its data directory relative to the repository
  config = ovqa_msrvtt.get_config("demo,small")
  ovqa.OVQATask(config)  # the world's graphs are built with the config's defaults
  config.verbalizer.k = 7
  with pytest.raises(ValueError, match=r"config.verbalizer.k = 7 but .*graph_train.npz was built with k = 10"):
    ovqa.OVQATask(config)
