"""Forward+backward time and peak memory of the GNN soft verbalizer as the answer vocabulary grows.

  python benchmarks/verbalizer_scaling.py [--sizes 1000,4000,16000,64000 --dim 1536 --k 10 --hops 2 --reps 2]

Answers are the most frequent purely alphabetic GloVe 6B words (or random ones with --answers random), grown into
their K-hop GloVe answer graphs (cached as .npz under --cache-dir). Node features are random normal [nodes, dim]
(timing does not depend on their values). Each measurement runs in its own subprocess, so its peak resident memory
(VmHWM) is that implementation's own. Compared: evqa_jax's jitted `Verbalizer("gat")` (per-node projections through
W_dst^T W_src, chunked edge loop with a hand-written backward, last layer on answers only, inner layer on receiving
nodes, each layer on its prefix of edges) against a PyTorch version of the authors' layer as written, which projects
both endpoints of every edge (E x D^2 work per layer). Both: L = 2, eps = 0.7, loss = sum of squared answer
embeddings, gradients for W_src / W_dst.
The torch side is skipped (reported with the reason) where it would exceed --torch-max-gb or --torch-max-s.
Prints one JSON line, with the machine, the load around each worker and the `usable` verdict of
benchmarks/machine.py (a worker's CPU counts as this process's own once it has exited).
"""

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  pylint: disable=wrong-import-position

EPS = 0.7


def _proc_status_gb(field: str):
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1e6  # kB
  except OSError:
    pass
  return None


def _rss_gb() -> float:
  """Peak resident memory of this process image. VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec,
  so a worker would report its parent's peak (GloVe loaded) whenever that is larger."""
  peak = _proc_status_gb("VmHWM")
  return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _current_rss_gb() -> float:
  cur = _proc_status_gb("VmRSS")
  return cur if cur is not None else _rss_gb()


def _features(num_nodes, dim, seed=0):
  import numpy as np

  return np.random.RandomState(seed).standard_normal((num_nodes, dim)).astype(np.float32)


def worker_jax(args) -> dict:
  import jax
  import jax.numpy as jnp

  from evqa_jax.graphs import answer_graph, padding
  from evqa_jax.models.verbalizer import Verbalizer

  graph = answer_graph.load_answer_graph(args.graph)
  max_nodes, max_edges, max_answers = padding.graph_budget(graph)
  fast = padding.verbalizer_budget(graph, max_answers=max_answers, max_edges=max_edges)
  padded, _ = padding.pad_graph(graph, _features(graph.num_nodes, args.dim), max_nodes, max_edges, max_answers)
  padded = jax.tree.map(jnp.asarray, padded)
  model = Verbalizer("gat", num_layers=2, eps=EPS)
  params = model.init(jax.random.PRNGKey(0), padded, max_answers, **fast)

  def loss(p, g):
    return jnp.sum(model.apply(p, g, max_answers, **fast) ** 2)

  step = jax.jit(jax.value_and_grad(loss))
  baseline = _current_rss_gb()
  t0 = time.perf_counter()
  jax.block_until_ready(step(params, padded))
  compile_and_first = time.perf_counter() - t0
  times = []
  for _ in range(args.reps):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, padded))
    times.append(time.perf_counter() - t0)
  return {"fwd_bwd_s": statistics.median(times), "times_s": times, "first_call_s": compile_and_first,
          "peak_rss_gb": _rss_gb(), "baseline_rss_gb": baseline,
          "padded": {"nodes": max_nodes, "edges": max_edges, "answers": max_answers, **fast}}


def worker_torch(args) -> dict:
  import numpy as np
  import torch

  from evqa_jax.graphs import answer_graph

  class AuthorsGATLayer(torch.nn.Module):
    """The authors' layer as written: both endpoints of every edge go through a D x D projection."""

    def __init__(self, dim):
      super().__init__()
      self.w_src = torch.nn.Linear(dim, dim, bias=False)
      self.w_dst = torch.nn.Linear(dim, dim, bias=False)
      with torch.no_grad():
        self.w_src.weight.copy_(torch.eye(dim))
        self.w_dst.weight.copy_(torch.eye(dim))

    def forward(self, h, src, dst):
      n = h.shape[0]
      e = torch.nn.functional.leaky_relu((self.w_dst(h[dst]) * self.w_src(h[src])).sum(-1), 0.2)
      emax = torch.full((n,), -torch.inf).scatter_reduce(0, dst, e, reduce="amax", include_self=True)
      ex = torch.exp(e - emax[dst])
      denom = torch.zeros(n).index_add(0, dst, ex)
      alpha = ex / denom[dst]
      return torch.zeros_like(h).index_add(0, dst, alpha[:, None] * h[src])

  graph = answer_graph.load_answer_graph(args.graph)
  h0 = torch.from_numpy(_features(graph.num_nodes, args.dim))
  src = torch.from_numpy(graph.senders.astype(np.int64))
  dst = torch.from_numpy(graph.receivers.astype(np.int64))
  layers = torch.nn.ModuleList([AuthorsGATLayer(args.dim) for _ in range(2)])
  a = graph.num_answers

  def step():
    layers.zero_grad(set_to_none=True)
    h = h0
    for layer in layers:
      h = layer(h, src, dst)
    out = EPS * h0[:a].detach() + (1 - EPS) * h[:a]
    loss = (out ** 2).sum()
    loss.backward()
    return float(loss)

  baseline = _current_rss_gb()
  t0 = time.perf_counter()
  step()
  first = time.perf_counter() - t0
  times = []
  for _ in range(args.reps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
  return {"fwd_bwd_s": statistics.median(times), "times_s": times, "first_call_s": first,
          "peak_rss_gb": _rss_gb(), "baseline_rss_gb": baseline, "threads": torch.get_num_threads()}


def build_graph(n, args, wv, path):
  import numpy as np

  from evqa_jax.graphs import answer_graph

  if os.path.exists(path):
    return answer_graph.load_answer_graph(path)
  alpha = [w for w in wv.words if re.fullmatch(r"[a-z]+", w)]
  if n > len(alpha):
    raise ValueError(f"--sizes: {n} answers requested but GloVe has {len(alpha)} alphabetic words")
  if args.answers == "frequent":
    answers = alpha[:n]
  else:
    answers = [alpha[i] for i in sorted(np.random.RandomState(args.seed).choice(len(alpha), n, replace=False))]
  t0 = time.perf_counter()
  graph = answer_graph.build_answer_graph(answers, wv, k=args.k, hops=args.hops)
  graph.info["build_s"] = time.perf_counter() - t0
  graph.save(path)
  return graph


def run_worker(impl, graph_path, args, timeout, monitor=None):
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--graph", graph_path, "--dim", str(args.dim),
         "--reps", str(args.reps)]
  try:
    with monitor.block(f"{impl}/{os.path.basename(graph_path)}") if monitor else contextlib.nullcontext():
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"skipped": f"timed out after {timeout:.0f}s"}
  if proc.returncode != 0:
    return {"failed": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default="1000,4000,16000,64000", help="answer vocabulary sizes")
  parser.add_argument("--dim", type=int, default=1536, help="node feature size D (DeBERTa-v2-xlarge: 1536)")
  parser.add_argument("--k", type=int, default=10, help="GloVe neighbours per word")
  parser.add_argument("--hops", type=int, default=2)
  parser.add_argument("--reps", type=int, default=2, help="timed forward+backward calls after the first")
  parser.add_argument("--answers", choices=["frequent", "random"], default="frequent")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--glove", default="pkg:glove-6b-50d")
  parser.add_argument("--cache-dir", default=os.path.join("/tmp", "evqa_verbalizer_bench"))
  parser.add_argument("--torch-max-gb", type=float, default=16.0, help="skip torch where its estimate is above")
  parser.add_argument("--torch-max-s", type=float, default=120.0, help="skip torch where its estimate is above")
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument("--worker", choices=["jax", "torch"], help=argparse.SUPPRESS)
  parser.add_argument("--graph", help=argparse.SUPPRESS)
  machine.add_arguments(parser)
  args = parser.parse_args()

  if args.worker:
    result = worker_jax(args) if args.worker == "jax" else worker_torch(args)
    print(json.dumps(result))
    return

  from evqa_jax.graphs import word_vectors

  monitor = machine.monitor_from_args(args)
  sizes = [int(s) for s in args.sizes.split(",") if s]
  os.makedirs(args.cache_dir, exist_ok=True)
  wv = word_vectors.load_word_vectors(args.glove)
  rows = []
  torch_rate = None  # seconds per (edge * D^2), from the last torch run
  for n in sizes:
    path = os.path.join(args.cache_dir, f"graph_{args.answers}{n}_k{args.k}_h{args.hops}_s{args.seed}.npz")
    graph = build_graph(n, args, wv, path)
    row = {"answers": n, "nodes": graph.num_nodes, "edges": graph.num_edges,
           "graph_build_s": graph.info.get("build_s")}
    print(f"[{n} answers] {graph.num_nodes} nodes, {graph.num_edges} edges; running jax", file=sys.stderr)
    row["jax"] = run_worker("jax", path, args, timeout=3600, monitor=monitor)
    work = graph.num_edges * args.dim ** 2
    # The authors' layer keeps about a dozen [edges, D] float32 tensors alive for backward (measured 7.6 GB at
    # 91k edges, D = 1536); its time scales with edges * D^2.
    est_gb = 14 * graph.num_edges * args.dim * 4 / 1e9 + 0.5
    est_s = None if torch_rate is None else torch_rate * work * (args.reps + 1)
    if args.no_torch:
      row["torch"] = {"skipped": "--no-torch"}
    elif est_gb > args.torch_max_gb:
      row["torch"] = {"skipped": f"estimated {est_gb:.1f} GB > --torch-max-gb {args.torch_max_gb}"}
    elif est_s is not None and est_s > args.torch_max_s * (args.reps + 1):
      row["torch"] = {"skipped": f"estimated {est_s / (args.reps + 1):.0f} s per step > --torch-max-s"}
    else:
      print(f"[{n} answers] running torch", file=sys.stderr)
      row["torch"] = run_worker("torch", path, args, timeout=args.torch_max_s * (args.reps + 1) * 2 + 60,
                                monitor=monitor)
      if "fwd_bwd_s" in row["torch"]:
        torch_rate = row["torch"]["fwd_bwd_s"] / work
    jx, th = row["jax"], row["torch"]
    if "fwd_bwd_s" in jx and "fwd_bwd_s" in th:
      row["speedup"] = th["fwd_bwd_s"] / jx["fwd_bwd_s"]
      row["peak_rss_ratio"] = jx["peak_rss_gb"] / th["peak_rss_gb"]
      row["peak_above_baseline_ratio"] = ((jx["peak_rss_gb"] - jx["baseline_rss_gb"]) /
                                          max(th["peak_rss_gb"] - th["baseline_rss_gb"], 1e-9))
    rows.append(row)
    print(json.dumps(row), file=sys.stderr)
  print(json.dumps({"benchmark": "verbalizer_scaling", "dim": args.dim, "k": args.k, "hops": args.hops,
                    "answers": args.answers, "reps": args.reps, "results": rows, **monitor.report()}))


if __name__ == "__main__":
  main()
