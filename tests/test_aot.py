"""Ahead-of-time compiles of the trainer's own train step for a TPU topology, from this CPU host (needs libtpu:
`pip install -e .[tpu]`; skipped, loudly, only where libtpu cannot be imported)."""

import os
import sys

import jax
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from configs import violin  # noqa: E402
from evqa_jax.train import aot  # noqa: E402
import chips  # noqa: E402  pylint: disable=wrong-import-position
import verbalizer_memory  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _libtpu_or_skip():
  try:
    import libtpu  # noqa: F401
  except ImportError as e:
    pytest.skip(f"SKIPPED LOUDLY: libtpu is not importable ({e}); no TPU compile was checked. "
                "Install it with `pip install -e .[tpu]`")


def test_topologies_give_one_device_per_chip():
  """v5e:2x4 is 8 single-core chips; v4:2x2x2 is 8 chips of two TensorCores each, which a v4 job runs as 8 megacore
  devices (libtpu's default description lists the 16 cores: a 4x2 mesh would not fit it)."""
  _libtpu_or_skip()
  for topology, kind in (("v5e:2x4", "TPU v5 lite"), ("v4:2x2x2", "TPU v4")):
    devices = aot.topology_devices(topology)
    assert len(devices) == 8 and {d.device_kind for d in devices} == {kind}, topology
    assert len({tuple(d.coords) for d in devices}) == 8, topology  # one device per chip
    assert kind in chips.CHIP_HBM


def test_tiny_violin_train_step_compiles_for_v5e_2x2(monkeypatch):
  """The VIOLIN `:small` config (1-layer BERT, tiny LSTMs) on a v5e:2x2 slice with a 2 x 2 data x model mesh."""
  _libtpu_or_skip()
  monkeypatch.chdir(REPO)  # the :small config names its synthetic world relative to the repository
  config = violin.get_config("small")
  from data_prep import worlds
  worlds.ensure_synthetic_world(config)  # as launch/aot_check.py does
  report = aot.compile_train_step(config, mesh_shape=(2, 2), topology="v5e:2x2")
  assert report["platform"] == "tpu" and report["device_kind"] == "TPU v5 lite" and report["devices"] == 4
  assert report["mesh"] == {"data": 2, "model": 2}
  # The donated train state aliases its outputs: arguments and outputs overlap by the state's bytes.
  assert 0 < report["alias_size_in_bytes"] <= report["argument_size_in_bytes"]
  assert report["peak_estimate_bytes"] == (report["argument_size_in_bytes"] + report["output_size_in_bytes"]
                                           + report["temp_size_in_bytes"] - report["alias_size_in_bytes"])
  assert report["peak_estimate_bytes"] < 16 * 2**30  # far inside a v5e chip's 16 GiB
  # Per-device FLOPs include at least the frozen BERT layer's matmuls over this device's rows (2 FLOPs per weight
  # per token: 2 statements x 16 + 24 subtitle tokens for each of the 8 / 2 rows of a data shard).
  per_device_tokens = (2 * 16 + 24) * config.batch_size // 2
  encoder_weights = 32 * 32 * 4 + 32 * 64 * 2  # one layer: q, k, v, o and the two MLP matrices
  assert report["flops"] > 2 * encoder_weights * per_device_tokens, report["flops"]


def test_unknown_topology_names_the_fix():
  _libtpu_or_skip()
  with pytest.raises(RuntimeError, match=r"topology 'v5e:3x7'.*pip install -e \.\[tpu\]"):
    aot.topology_devices("v5e:3x7")


def test_roofline_of_a_report_hand_computed():
  """Fit and roofline of a compile report against a v5e chip (16 GiB, 819 GB/s; 197 TFLOP/s bf16 passed in)."""
  report = {"device_kind": "TPU v5 lite", "peak_estimate_bytes": 17 * 2**30, "flops": 0.5 * 197e12,
            "bytes_accessed": 1.0 * 819e9}
  r = chips.roofline(report, 197e12)
  assert (r["hbm_bytes"], r["fits"]) == (16 * 2**30, False)
  # compute 0.5 s < memory 1.0 s: memory bound, and at best half the peak.
  assert r["roofline_bound"] == "memory" and r["roofline_step_s"] == pytest.approx(1.0)
  assert r["mfu_ceiling"] == pytest.approx(0.5)
  r = chips.roofline(dict(report, peak_estimate_bytes=16 * 2**30, bytes_accessed=0.25 * 819e9), 197e12)
  assert r["fits"] and r["roofline_bound"] == "compute" and r["mfu_ceiling"] == pytest.approx(1.0)
  assert r["roofline_step_s"] == pytest.approx(0.5)
  assert chips.roofline({"device_kind": "cpu", "flops": 1e9}, None) == {}  # unknown chip, no peak: nothing invented


def test_missing_cost_figures_are_missing_not_zero():
  """A cost report without a figure (XLA's `cost_analysis()` has no "flops" key on some backends, or no report at
  all) gives None, JSON null, never 0; the compile table prints "n/a" and computes no roofline from it."""
  import compile_table  # pylint: disable=g-import-not-at-top

  class Compiled:
    def __init__(self, cost):
      self.cost = cost

    def memory_analysis(self):
      return None

    def cost_analysis(self):
      if isinstance(self.cost, Exception):
        raise self.cost
      return self.cost

  assert aot.analysis(Compiled([{"flops": 3.0, "bytes accessed": 5.0, "transcendentals": 0.0}])) == {
      "flops": 3.0, "bytes_accessed": 5.0, "transcendentals": 0.0}  # a reported 0 stays 0
  assert aot.analysis(Compiled({"bytes accessed": 5.0})) == {"flops": None, "bytes_accessed": 5.0,
                                                             "transcendentals": None}
  for cost in (None, [], {}):
    assert aot.analysis(Compiled(cost)) == {"flops": None, "bytes_accessed": None, "transcendentals": None}
  out = aot.analysis(Compiled(RuntimeError("no cost model")))
  assert out["flops"] is None and out["cost_error"] == "no cost model"
  row = {"command": "c", "device_kind": "TPU v5 lite", "devices": 4, "mesh": {"data": 4, "model": 1},
         "peak_estimate_bytes": 2**30, "global_batch_size": 4, "flops": None, "bytes_accessed": 1e9}
  cells = compile_table.markdown([row]).splitlines()[-1].split(" | ")
  assert cells[7] == "n/a" and cells[9:13] == ["", "", "", " |"], cells  # FLOPs n/a; no roofline, MFU, rate or model MFU
  # A missing byte count on a chip with a known bandwidth: no roofline from the FLOPs alone.
  assert "roofline_step_s" not in chips.roofline(dict(row, flops=1e12, bytes_accessed=None), 197e12)
  assert "roofline_step_s" in chips.roofline(dict(row, flops=1e12), 197e12)


def test_verbalizer_path_memory_on_v5e_is_its_design_bound():
  """The OVQA answer path alone (node means from a frozen float32 word table, 2 bf16 GAT layers, gradient for their
  weights) on one v5e chip at 8k nodes, 32k edges, D = 512 needs temporaries within its design, a few [nodes, D]
  float32 arrays plus a few [chunk, D] edge-loop buffers. A single gather of all sub-words (the old answer encoder)
  made an [nodes, 5 -> 8 sublanes, D] float32 array and its flat copy: 132 MiB here, 14 GiB at MSRVTT scale."""
  _libtpu_or_skip()
  import jax.numpy as jnp
  import jraph
  from evqa_jax.models.verbalizer import Verbalizer
  from evqa_jax.projects.ovqa.model import mean_subword_embeddings
  nodes, edges, dim, vocab, answers, subwords, chunk = 8192, 32768, 512, 8192, 1024, 5, 4096
  device = jax.sharding.SingleDeviceSharding(aot.topology_devices("v5e:2x2")[0])
  model = Verbalizer("gat", num_layers=2, eps=0.7, edge_chunk=chunk, dtype=jnp.bfloat16)

  def loss(params, table, tokens, mask, senders, receivers, feature):
    h = mean_subword_embeddings(table, tokens, mask)
    graph = jraph.GraphsTuple(nodes=h, edges=None, globals=None, senders=senders, receivers=receivers,
                              n_node=None, n_edge=None)
    out = model.apply({"params": params}, graph, answers).astype(jnp.float32)
    return jnp.sum(jax.nn.log_softmax(feature @ out.T))

  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=device)  # noqa: E731
  params = {f"gat_{i}": {"w_dst": spec((dim, dim), jnp.float32), "w_src": spec((dim, dim), jnp.float32)}
            for i in range(2)}
  args = (params, spec((vocab, dim), jnp.float32), spec((nodes, subwords), jnp.int32),
          spec((nodes, subwords), jnp.bool_), spec((edges,), jnp.int32), spec((edges,), jnp.int32),
          spec((8, dim), jnp.float32))
  temp = jax.jit(jax.grad(loss)).lower(*args).compile().memory_analysis().temp_size_in_bytes
  node_f32, chunk_bf16 = nodes * dim * 4, chunk * dim * 2
  bound = 3 * node_f32 + 4 * chunk_bf16 + 16 * edges  # 64.5 MiB
  assert 0 < temp <= bound, (temp / 2**20, bound / 2**20)


def test_verbalizer_step_takes_only_the_word_table_of_the_frozen_lm(monkeypatch):
  """lower_verbalizer_step (benchmarks/verbalizer_memory.py) on the OVQA test config and a 4 x 2 CPU mesh: of the
  frozen LM only its word-embedding table is an argument (at its place in the tree, with the trainer's sharding), and
  the gradient is for the verbalizer's parameters alone."""
  import mesh_equivalence  # pylint: disable=g-import-not-at-top
  config = mesh_equivalence.config_in_repo("ovqa", monkeypatch)
  lowered, report = verbalizer_memory.lower_verbalizer_step(config, (4, 2))
  assert report["mesh"] == {"data": 4, "model": 2} and report["verbalizer"]["variant"] == config.verbalizer.variant
  (verbalizer, frozen, aux, feature, labels), _ = lowered.args_info
  shape = config.pretrained.shape
  table = frozen["lm"]["embeddings"]["word_embeddings"]["embedding"]
  assert jax.tree.structure(frozen) == jax.tree.structure({"lm": {"embeddings": {"word_embeddings": {"embedding": 0}}}})
  assert table.shape == (shape.vocab_size, shape.hidden_size) and table.dtype == "float32"
  assert feature.shape == (config.batch_size, shape.hidden_size) and labels.shape == (config.batch_size,)
  assert set(verbalizer) and set(aux) >= {"senders", "receivers", "answer_mask"}
  grads = lowered.out_info[1]
  assert jax.tree.structure(grads) == jax.tree.structure(verbalizer)
