"""Verbalizer (OVQA Eq. 5-7, Table 5 variants) against dense adjacency-matrix references in numpy / jnp."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evqa_jax.graphs.answer_graph import AnswerGraph
from evqa_jax.graphs.padding import pad_answers, pad_graph, verbalizer_budget
from evqa_jax.models.verbalizer import Verbalizer, canonical_variant, edge_attention

D = 8
SLOPE = 0.2


def random_graph(seed, num_nodes=11, num_answers=4, max_in=3):
  """Unique edges j -> i, a self-loop on every node; node num_nodes-1 receives nothing but its self-loop."""
  rng = np.random.RandomState(seed)
  senders, receivers = [], []
  for i in range(num_nodes - 1):
    for j in rng.choice([x for x in range(num_nodes) if x != i], size=rng.randint(0, max_in + 1), replace=False):
      senders.append(j)
      receivers.append(i)
  senders += list(range(num_nodes))
  receivers += list(range(num_nodes))
  perm = rng.permutation(len(senders))  # unsorted on purpose
  return AnswerGraph([f"w{i}" for i in range(num_nodes)], np.array(senders)[perm], np.array(receivers)[perm],
                     num_answers)


def adjacency(graph):
  adj = np.zeros((graph.num_nodes, graph.num_nodes), bool)
  adj[graph.receivers, graph.senders] = True  # adj[i, j]: edge j -> i
  return adj


def dense_gat(xp, h, adj, w_dst, w_src):
  """Independent reference: full score matrix, masked row softmax."""
  s = (h @ w_dst) @ (h @ w_src).T
  s = xp.where(s >= 0, s, SLOPE * s)
  s = xp.where(adj, s, -1e30)
  s = s - s.max(axis=1, keepdims=True)
  p = xp.exp(s) * adj
  p = p / xp.maximum(p.sum(axis=1, keepdims=True), 1e-30)
  return p @ h


def dense_mean(h, adj):
  return (adj @ h) / np.maximum(adj.sum(1, keepdims=True), 1)


def random_params(seed, layers=2):
  rng = np.random.RandomState(seed)
  return {"params": {f"gat_{l}": {"w_dst": np.eye(D) + 0.3 * rng.randn(D, D).astype(np.float32),
                                  "w_src": np.eye(D) + 0.3 * rng.randn(D, D).astype(np.float32)}
                     for l in range(layers)}}


def run(model, variables, graph, num_answers, *rest, **static):
  """model.apply under one jit: compiles faster than op-by-op dispatch of the edge scans."""
  return jax.jit(lambda v, g, *r: model.apply(v, g, num_answers, *r, **static))(variables, graph, *rest)


def padded(graph, feats, budget=(16, 64, 4)):
  g, mask = pad_graph(graph, feats, *budget)
  return jax.tree.map(jnp.asarray, g), mask


@pytest.mark.parametrize("use_product", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_gat_matches_dense_reference(seed, use_product):
  graph = random_graph(seed)
  feats = np.random.RandomState(10 + seed).randn(graph.num_nodes, D).astype(np.float32)
  params = random_params(seed)
  adj = adjacency(graph)
  h1 = dense_gat(np, feats, adj, params["params"]["gat_0"]["w_dst"], params["params"]["gat_0"]["w_src"])
  h2 = dense_gat(np, h1, adj, params["params"]["gat_1"]["w_dst"], params["params"]["gat_1"]["w_src"])
  v = feats[:4]
  ref_layer1 = h1[:4]
  ref = 0.7 * v + 0.3 * h2[:4]

  g, _ = padded(graph, feats)
  out = run(Verbalizer("gat", eps=0.7, use_product=use_product, edge_chunk=5), params, g, 4)
  np.testing.assert_allclose(out, ref, atol=1e-6)  # measured 7.6e-8 (values up to 2.7); bound 1e-6
  gat = params["params"]["gat_1"]
  off = 0.7 * v + 0.3 * dense_gat(np, h1, adj, gat["w_dst"], 0.999 * np.asarray(gat["w_src"]))[:4]
  # One weight matrix x0.999 moves it 1.3e-5 (seed 0): within the old bound 1e-5 + 1e-5 |x|, beyond the new one.
  assert np.abs(out - off).max() > 1e-6
  one = run(Verbalizer("gat", num_layers=1, eps=0.0, use_product=use_product),
      {"params": {"gat_0": params["params"]["gat_0"]}}, g, 4)
  np.testing.assert_allclose(one, ref_layer1, atol=1e-6)  # measured 1.4e-7; bound 1e-6


@pytest.mark.parametrize("chunk", [4, 1000])
def test_custom_backward_matches_autodiff_of_dense_reference(chunk):
  graph = random_graph(3)
  rng = np.random.RandomState(4)
  feats = rng.randn(graph.num_nodes, D).astype(np.float32)
  cot = rng.randn(4, D).astype(np.float32)
  params = random_params(5)
  g, _ = padded(graph, feats)
  adj = jnp.asarray(adjacency(graph))
  model = Verbalizer("gat", eps=0.6, edge_chunk=chunk)

  def loss_ours(p, x):
    return jnp.sum(model.apply(p, g._replace(nodes=x), 4) * cot)

  def loss_ref(p, x_real):
    h = x_real
    for l in range(2):
      h = dense_gat(jnp, h, adj, p["params"][f"gat_{l}"]["w_dst"], p["params"][f"gat_{l}"]["w_src"])
    return jnp.sum((0.6 * jax.lax.stop_gradient(x_real[:4]) + 0.4 * h[:4]) * cot)

  gp, gx = jax.jit(jax.grad(loss_ours, argnums=(0, 1)))(params, g.nodes)
  rp, rx = jax.jit(jax.grad(loss_ref, argnums=(0, 1)))(params, jnp.asarray(feats))
  for l in range(2):
    for w in ("w_dst", "w_src"):
      # measured 3.3e-7 (gradients up to 0.47); bound 2e-6
      np.testing.assert_allclose(gp["params"][f"gat_{l}"][w], rp["params"][f"gat_{l}"][w], atol=2e-6)
  np.testing.assert_allclose(gx[:graph.num_nodes], rx, atol=2e-6)  # measured 3.0e-7 (up to 0.99); bound 2e-6
  np.testing.assert_array_equal(gx[graph.num_nodes:], 0.0)


def test_edge_attention_ignores_edges_into_non_targets_and_has_finite_grads():
  rng = np.random.RandomState(0)
  h = jnp.asarray(rng.randn(6, D).astype(np.float32))
  senders = jnp.array([1, 2, 3, 0, 4, 5, 5])
  receivers = jnp.array([0, 0, 1, 4, 4, 5, 2])  # edges into 2, 4, 5 are outside targets [0, 2)
  out = edge_attention(h[:2], h, h, senders, receivers, 2, SLOPE, 3)
  s0 = jax.nn.leaky_relu(jnp.array([h[0] @ h[1], h[0] @ h[2]]), SLOPE)
  a0 = jax.nn.softmax(s0)
  np.testing.assert_allclose(out[0], a0[0] * h[1] + a0[1] * h[2], atol=1e-6)  # measured 0; bound 1e-6
  np.testing.assert_allclose(out[1], h[3], atol=1e-6)
  grads = jax.grad(lambda x: jnp.sum(edge_attention(x[:2], x, x, senders, receivers, 2, SLOPE, 3) ** 2))(h)
  assert np.all(np.isfinite(grads))
  np.testing.assert_array_equal(grads[5], 0.0)  # node 5 only sends into a non-target


def test_padding_budget_changes_nothing():
  graph = random_graph(7)
  feats = np.random.RandomState(8).randn(graph.num_nodes, D).astype(np.float32)
  params = random_params(9)
  model = Verbalizer("gat", eps=0.5, edge_chunk=7)
  cot = np.random.RandomState(1).randn(4, D).astype(np.float32)
  results = []
  for budget in [(16, 64, 4), (40, 200, 12)]:
    g, mask = padded(graph, feats, budget)
    out = run(model, params, g, budget[2])
    assert mask.sum() == 4 and mask[:4].all()
    np.testing.assert_array_equal(out[4:], 0.0)  # padded answer slots are isolated
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, g, budget[2])[:4] * cot)))(params)
    results.append((np.asarray(out[:4]), grads))
  np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), results[0][1], results[1][1])


def test_eps_one_returns_inputs_exactly_and_stop_gradient():
  graph = random_graph(11)
  feats = np.random.RandomState(12).randn(graph.num_nodes, D).astype(np.float32)
  params = random_params(13)
  g, _ = padded(graph, feats)
  out = run(Verbalizer("gat", eps=1.0), params, g, 4)
  np.testing.assert_array_equal(np.asarray(out), feats[:4])

  cot = np.random.RandomState(2).randn(4, D).astype(np.float32)

  def grad_x(eps):
    model = Verbalizer("gat", eps=eps)
    return jax.jit(jax.grad(lambda x: jnp.sum(model.apply(params, g._replace(nodes=x), 4) * cot)))(g.nodes)

  np.testing.assert_array_equal(grad_x(1.0), 0.0)  # V under stop-gradient: nothing flows
  np.testing.assert_allclose(grad_x(0.7), 0.3 * grad_x(0.0), atol=3e-6)  # measured 8.6e-7; bound 3e-6


def test_eps_base_fixed():
  graph = random_graph(14)
  feats = np.random.RandomState(15).randn(graph.num_nodes, D).astype(np.float32)
  params = random_params(16)
  g, _ = padded(graph, feats, (16, 64, 8))
  is_base = pad_answers(np.array([True, False, True, False]), 8, fill=False)
  paper = np.asarray(run(Verbalizer("gat", eps=0.6), params, g, 8, is_base))
  code = np.asarray(run(Verbalizer("gat", eps=0.6, eps_base_fixed=True), params, g, 8, is_base))
  np.testing.assert_array_equal(np.asarray(code[[0, 2]]), feats[[0, 2]])
  np.testing.assert_allclose(code[[1, 3]], paper[[1, 3]], atol=1e-7)
  assert not np.allclose(paper[0], feats[0])
  with pytest.raises(ValueError, match="is_base"):
    run(Verbalizer("gat", eps_base_fixed=True), params, g, 8)


def test_init_is_identity_and_logically_partitioned():
  graph = random_graph(17)
  g, _ = padded(graph, np.ones((graph.num_nodes, D), np.float32))
  variables = Verbalizer("E").init(jax.random.PRNGKey(0), g, 4)
  w = variables["params"]["gat_1"]["w_src"]
  assert isinstance(w, nn.LogicallyPartitioned) and w.names == ("embed", "mlp")
  np.testing.assert_array_equal(nn.unbox(variables)["params"]["gat_0"]["w_dst"], np.eye(D))


def test_variants_against_numpy():
  graph = random_graph(18)
  feats = np.random.RandomState(19).randn(graph.num_nodes, D).astype(np.float32)
  g, _ = padded(graph, feats)
  adj = adjacency(graph)
  eps = 0.25
  v = feats[:4]

  np.testing.assert_array_equal(np.asarray(run(Verbalizer("A"), {}, g, 4)), v)

  hard = dense_mean(feats, adj)[:4]
  np.testing.assert_allclose(run(Verbalizer("hard", eps=eps), {}, g, 4), eps * v + (1 - eps) * hard, atol=1e-6)

  # Hand check of (B) for answer 0: mean of itself and its in-neighbours.
  nbrs = sorted(set(graph.senders[graph.receivers == 0].tolist()))
  np.testing.assert_allclose(run(Verbalizer("B", eps=0.0), {}, g, 4)[0], feats[nbrs].mean(0), atol=1e-6)

  soft = Verbalizer("C", eps=eps, mlp_dim=5)
  variables = soft.init(jax.random.PRNGKey(1), g, 4)
  rng = np.random.RandomState(3)
  f32 = lambda *shape: rng.randn(*shape).astype(np.float32)
  p = {"params": {"mlp": {"mlp_in": {"kernel": f32(D, 5), "bias": f32(5)},
                          "mlp_out": {"kernel": f32(5, D), "bias": f32(D)}}}}
  mlp = p["params"]["mlp"]
  ref_c = hard + np.maximum(hard @ mlp["mlp_in"]["kernel"] + mlp["mlp_in"]["bias"], 0) @ mlp["mlp_out"]["kernel"] + \
      mlp["mlp_out"]["bias"]
  # measured 5.6e-7 (values up to 6.5); bound 2e-6
  out_c = run(soft, p, g, 4)
  np.testing.assert_allclose(out_c, eps * v + (1 - eps) * ref_c, atol=2e-6)
  # the MLP's output bias x0.999 moves the reference by 2.2e-3
  assert np.abs(out_c - eps * v - (1 - eps) * (ref_c - 0.001 * mlp["mlp_out"]["bias"])).max() > 2e-6
  # At init the MLP adds ~nothing: measured 2.0e-6; bound 1e-5
  np.testing.assert_allclose(run(soft, variables, g, 4), run(Verbalizer("B", eps=eps), {}, g, 4), atol=1e-5)

  mean2 = dense_mean(dense_mean(feats, adj), adj)[:4]
  np.testing.assert_allclose(run(Verbalizer("graph_mean", eps=eps), {}, g, 4), eps * v + (1 - eps) * mean2,
                             atol=1e-6)
  assert canonical_variant("e") == "gat"
  with pytest.raises(ValueError, match="unknown verbalizer variant"):
    canonical_variant("F")


def hop_graph():
  """Answers 0-1, hop-1 nodes 2-4, hop-2 nodes 5-7 that only send (the K-hop answer graph's shape)."""
  edges = [(2, 0), (3, 0), (4, 1), (2, 1), (5, 2), (6, 3), (7, 4), (3, 2), (1, 4)]
  n = 8
  s = [e[0] for e in edges] + list(range(n))
  r = [e[1] for e in edges] + list(range(n))
  return AnswerGraph([f"w{i}" for i in range(n)], np.array(s), np.array(r), 2)


@pytest.mark.parametrize("variant", ["gat", "graph_mean", "hard"])
def test_verbalizer_budget_skips_only_dead_work(variant):
  graph = hop_graph()
  feats = np.random.RandomState(20).randn(graph.num_nodes, D).astype(np.float32)
  budget = (24, 32, 4)
  g, _ = padded(graph, feats, budget)
  fast_kw = verbalizer_budget(graph, max_answers=4, max_edges=32, multiple=1)
  # Answers padded to 4 slots, then hop-1 nodes 2-4 at slots 4-6 receive; 9 edges + 5 self-loops go into slots < 7;
  # 4 edges + 2 self-loops go into the answers.
  assert fast_kw == {"num_receivers_padded": 7, "num_receiver_edges_padded": 14, "num_answer_edges_padded": 6}
  assert verbalizer_budget(graph, max_answers=4, max_edges=32, multiple=8) == {
      "num_receivers_padded": 8, "num_receiver_edges_padded": 16, "num_answer_edges_padded": 8}
  model = Verbalizer(variant, eps=0.3, edge_chunk=4)
  params = random_params(21) if variant == "gat" else {}
  full = run(model, params, g, 4)
  fast = run(model, params, g, 4, **fast_kw)
  np.testing.assert_allclose(fast, full, atol=1e-6)
  if variant == "gat":
    gf = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, g, 4) ** 2)))(params)
    gr = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, g, 4, **fast_kw) ** 2)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), gf, gr)  # measured 0; bound 1e-6


def test_one_compilation_for_train_and_test_graphs():
  traces = []
  model = Verbalizer("gat", eps=0.7)
  budget = (32, 96, 8)

  @jax.jit
  def step(params, g):
    traces.append(1)
    return model.apply(params, g, budget[2])

  params = random_params(22)
  outs = []
  for seed, n_ans in [(23, 4), (24, 6)]:
    graph = random_graph(seed, num_nodes=14, num_answers=n_ans)
    feats = np.random.RandomState(seed).randn(graph.num_nodes, D).astype(np.float32)
    g, mask = padded(graph, feats, budget)
    outs.append((step(params, g), mask, graph, feats))
  assert len(traces) == 1
  for out, mask, graph, feats in outs:
    adj = adjacency(graph)
    h = feats
    for l in range(2):
      h = dense_gat(np, h, adj, params["params"][f"gat_{l}"]["w_dst"], params["params"][f"gat_{l}"]["w_src"])
    n = graph.num_answers
    np.testing.assert_allclose(out[:n], 0.7 * feats[:n] + 0.3 * h[:n], atol=1e-6)  # measured 1.9e-7; bound 1e-6
    assert mask.sum() == n


def test_backward_in_order_is_the_identity_and_ties_the_gradients():
  """OVQA's `backward_in_order(feature, nodes)`: values and gradients untouched; in the backward pass the feature's
  cotangent leaves through one optimization barrier together with the nodes' (so the LM's backward waits for the
  whole verbalizer's, as XLA's TPU scheduler otherwise interleaves them and keeps 14 GiB more alive)."""
  from evqa_jax.projects.ovqa.model import backward_in_order

  def loss(w, x, y):
    f, n = backward_in_order(x * w, y)
    return jnp.sum(f * jnp.sum(jnp.tanh(n * w), axis=0))

  def plain(w, x, y):
    return jnp.sum(x * w * jnp.sum(jnp.tanh(y * w), axis=0))

  x, y = np.arange(6.0).reshape(2, 3) / 5, np.arange(12.0).reshape(4, 3) / 7
  assert float(loss(0.7, x, y)) == float(plain(0.7, x, y))
  assert float(jax.grad(loss)(0.7, x, y)) == pytest.approx(float(jax.grad(plain)(0.7, x, y)), rel=1e-6)
  barriers = [e for e in jax.make_jaxpr(jax.grad(loss))(0.7, x, y).jaxpr.eqns
              if e.primitive.name == "optimization_barrier"]
  assert [[v.aval.shape for v in e.invars] for e in barriers] == [[(2, 3), (4, 3)]]
