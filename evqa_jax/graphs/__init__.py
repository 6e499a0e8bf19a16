"""Answer graphs: word-vector kNN, K-hop growth, static padding into jraph.GraphsTuple."""

from evqa_jax.graphs.answer_graph import AnswerGraph, build_answer_graph, embed_nodes, load_answer_graph
from evqa_jax.graphs.padding import (graph_budget, mask_answer_logits, node_positions, pad_answers, pad_graph,
                                     verbalizer_budget)
from evqa_jax.graphs.word_vectors import WordVectors, cosine_knn, load_word_vectors, normalize_word
