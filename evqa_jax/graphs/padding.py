"""Static padding of answer graphs into `jraph.GraphsTuple`, so V_train and V_test graphs share one compiled function.

Padded layout for budgets (max_nodes, max_edges, max_answers):
  nodes  [0, A)                          the graph's answers, in vocabulary order
         [A, max_answers)                padded answer slots: zero features, no edges (masked out by `answer_mask`)
         [max_answers, max_answers+N-A)  the graph's other nodes, in graph order
         [..., max_nodes)                padding nodes (zero features); the last one receives every padding edge
  edges  the graph's edges sorted by receiver (so edges into answers come first), then padding edges
         max_nodes-1 -> max_nodes-1.
Padding edges only touch the last padding node, which is never an answer and never a sender into a real node, so
they cannot reach a real node's softmax or an answer's output. Padded answer slots have no in-edges: the verbalizer
returns zeros there and callers drop them from the answer softmax with `mask_answer_logits`.
`n_node` / `n_edge` describe two graphs, jraph-style: the real graph (its answer slots included) and the padding.
"""

import math
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from evqa_jax.graphs.answer_graph import AnswerGraph


def _round_up(x: int, multiple: int) -> int:
  return int(math.ceil(max(x, 1) / multiple) * multiple)


def graph_budget(*graphs: AnswerGraph, multiple: int = 128):
  """(max_nodes, max_edges, max_answers) that fit every graph, each rounded up to `multiple`."""
  if not graphs:
    raise ValueError("graph_budget needs at least one graph")
  max_answers = _round_up(max(g.num_answers for g in graphs), multiple)
  max_nodes = _round_up(max_answers + max(g.num_nodes - g.num_answers for g in graphs) + 1, multiple)
  max_edges = _round_up(max(g.num_edges for g in graphs), multiple)
  return max_nodes, max_edges, max_answers


def verbalizer_budget(*graphs: AnswerGraph, max_answers: int, max_edges: int, multiple: int = 128) -> dict:
  """Static bounds that let `Verbalizer` skip work, valid for every graph padded by `pad_graph` to these budgets.

  Returns keyword arguments for `Verbalizer.__call__`:
    num_receivers_padded R: every edge into a node >= R is a self-loop (for a K-hop answer graph these nodes are the
      last hop's words, which only send), so inner layers update nodes [0, R) only;
    num_receiver_edges_padded: all edges into nodes < R lie in this prefix of the receiver-sorted padded edges;
    num_answer_edges_padded: all edges into answer slots lie in this prefix (the last layer reads only those).
  """
  if not graphs:
    raise ValueError("verbalizer_budget needs at least one graph")
  bound = max_answers
  for g in graphs:
    recv = g.receivers[g.senders != g.receivers]
    if recv.size:
      bound = max(bound, int(node_positions(g, max_answers)[recv].max()) + 1)
  receivers = _round_up(bound, multiple)
  into_receivers = max(int(np.sum(node_positions(g, max_answers)[g.receivers] < receivers)) for g in graphs)
  into_answers = max(int(np.sum(g.receivers < g.num_answers)) for g in graphs)
  return {
      "num_receivers_padded": receivers,
      "num_receiver_edges_padded": min(_round_up(into_receivers, multiple), max_edges),
      "num_answer_edges_padded": min(_round_up(into_answers, multiple), max_edges),
  }


def node_positions(graph: AnswerGraph, max_answers: int) -> np.ndarray:
  """Padded position `[nodes]` of each of the graph's nodes (see module docstring)."""
  ids = np.arange(graph.num_nodes, dtype=np.int64)
  return np.where(ids < graph.num_answers, ids, ids + (max_answers - graph.num_answers))


def pad_graph(graph: AnswerGraph, node_features, max_nodes: int, max_edges: int, max_answers: int):
  """Pads `graph` with node features `[nodes, ...]` to static budgets.

  Returns:
    (jraph.GraphsTuple with nodes `[max_nodes, ...]`, senders/receivers `[max_edges]` int32, n_node/n_edge `[2]`;
     answer_mask `[max_answers]` bool, True on the graph's real answers).
  """
  n, e, a = graph.num_nodes, graph.num_edges, graph.num_answers
  if a > max_answers:
    raise ValueError(f"graph has {a} answers > max_answers={max_answers}")
  used = max_answers + (n - a)
  if used + 1 > max_nodes:
    raise ValueError(f"graph needs {used + 1} node slots ({a} answers padded to {max_answers}, {n - a} other nodes, "
                     f"1 padding node) > max_nodes={max_nodes}")
  if e > max_edges:
    raise ValueError(f"graph has {e} edges > max_edges={max_edges}")
  if node_features.shape[0] != n:
    raise ValueError(f"node_features has {node_features.shape[0]} rows for a graph of {n} nodes")

  pos = node_positions(graph, max_answers)
  senders = pos[graph.senders]
  receivers = pos[graph.receivers]
  order = np.lexsort((senders, receivers))
  pad_node = max_nodes - 1
  senders = np.concatenate([senders[order], np.full(max_edges - e, pad_node)]).astype(np.int32)
  receivers = np.concatenate([receivers[order], np.full(max_edges - e, pad_node)]).astype(np.int32)

  xp = jnp if isinstance(node_features, jax.Array) else np
  nodes = xp.zeros((max_nodes,) + tuple(node_features.shape[1:]), node_features.dtype)
  if xp is np:
    nodes[pos] = node_features
  else:
    nodes = nodes.at[jnp.asarray(pos)].set(node_features)

  padded = jraph.GraphsTuple(
      nodes=nodes, edges=None, globals=None,
      senders=xp.asarray(senders), receivers=xp.asarray(receivers),
      n_node=xp.asarray(np.array([used, max_nodes - used], np.int32)),
      n_edge=xp.asarray(np.array([e, max_edges - e], np.int32)))
  return padded, np.arange(max_answers) < a


def pad_answers(values, max_answers: int, fill=0):
  """Pads a per-answer array `[A, ...]` (e.g. is_base) to `[max_answers, ...]` with `fill`."""
  values = np.asarray(values)
  if values.shape[0] > max_answers:
    raise ValueError(f"{values.shape[0]} answers > max_answers={max_answers}")
  out = np.full((max_answers,) + values.shape[1:], fill, values.dtype)
  out[:values.shape[0]] = values
  return out


def mask_answer_logits(logits, answer_mask):
  """Sets the logits `[..., max_answers]` of padded answer slots to the dtype's minimum (zero softmax mass)."""
  return jnp.where(answer_mask, logits, jnp.finfo(logits.dtype).min)


def num_answer_edges(padded: jraph.GraphsTuple, max_answers: int) -> int:
  """How many leading edges of a padded graph go into answer slots (host-side helper for diagnostics)."""
  return int(np.sum(np.asarray(padded.receivers) < max_answers))

