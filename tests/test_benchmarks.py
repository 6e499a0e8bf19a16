"""benchmarks/machine.py's usable verdict on hand-made blocks, compile_table.py's bookkeeping, gpu_mfu.py at toy size
on CPU and step_breakdown.py's accounting."""

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import machine  # noqa: E402  pylint: disable=wrong-import-position


def _block(label, foreign, load_before=0.5, load_after=0.5):
  return {"label": label, "wall_s": 1.0, "load1_before": load_before, "load1_after": load_after, "own_cores": 1.0,
          "foreign_cores": foreign}


def test_verdict_hand_computed(monkeypatch):
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  mon = machine.Monitor(max_foreign_cores=0.2, max_load_per_core=1.0)
  mon.start_load1 = 0.4
  mon.blocks = [_block("a", 0.05), _block("b", 0.2, load_after=2.0)]  # at both thresholds: still usable
  v = mon.verdict()
  assert v["usable"] and v["reasons"] == []
  assert v["load1_max_per_core"] == 1.0 and v["foreign_cores_max"] == 0.2 and v["foreign_cores_mean"] == 0.125

  mon.blocks.append(_block("c", 0.9, load_before=2.6))  # another process took 0.9 cores; load 1.3 per core
  v = mon.verdict()
  assert not v["usable"]
  assert v["load1_max_per_core"] == 1.3 and v["foreign_cores_max"] == 0.9
  assert len(v["reasons"]) == 2
  assert "2.60 on 2 cores" in v["reasons"][0] and "during 1 of 3 timed blocks" in v["reasons"][1]
  assert "first: c" in v["reasons"][1]

  assert not machine.Monitor().verdict()["usable"]  # nothing timed: nothing to quote


def test_verdict_counts_hypervisor_steal(monkeypatch):
  """Steal (the host running someone else on this VM's cores) is its own reason, separate from foreign processes;
  blocks recorded before steal was measured (no "steal_cores") are judged on the rest."""
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  mon = machine.Monitor(max_foreign_cores=0.2, max_load_per_core=1.0, max_steal_cores=0.2)
  mon.start_load1 = 0.4
  mon.blocks = [_block("old", 0.0), dict(_block("a", 0.1), steal_cores=0.2)]
  v = mon.verdict()
  assert v["usable"] and v["steal_cores_max"] == 0.2 and v["steal_cores_mean"] == 0.2
  mon.blocks += [dict(_block("b", 0.0), steal_cores=0.5), dict(_block("c", 0.0), steal_cores=0.3)]
  v = mon.verdict()
  assert not v["usable"] and v["reasons"] == [
      "the hypervisor stole more than 0.2 cores during 2 of 4 timed blocks (max 0.50; first: b)"]
  assert v["steal_cores_mean"] == round((0.2 + 0.5 + 0.3) / 3, 3) and v["thresholds"]["max_steal_cores"] == 0.2


def test_block_measures_own_cpu_not_as_foreign():
  mon = machine.Monitor()
  with mon.block("spin"):
    cpu0 = time.process_time()
    x = 0
    for i in range(3_000_000):
      x += i
    cpu = time.process_time() - cpu0
  (rec,) = mon.blocks
  assert rec["label"] == "spin" and rec["wall_s"] > 0
  # The loop's CPU is this process's own (to the 10 ms tick of os.times), whatever else the machine runs.
  assert abs(rec["own_cores"] * rec["wall_s"] - cpu) < 0.03
  assert 0.0 <= rec["foreign_cores"] <= os.cpu_count() + 0.1
  assert 0.0 <= rec["steal_cores"] <= os.cpu_count() + 0.1
  report = mon.report(log=False)
  assert set(report) == {"machine", "load", "usable", "utc"}
  assert report["utc"]["start"] <= report["utc"]["end"] and report["utc"]["end"].endswith("Z")
  m = report["machine"]
  assert m["cpu_count"] == os.cpu_count() and m["usable_cores"] >= 1 and m["cpu_model"]
  info = machine.cpuinfo()
  if "cpu family" in info:  # Linux x86: the numbers that tell a vague "AMD EPYC" model name's generation apart
    assert m["cpu_id"]["family"] == int(info["cpu family"]) and m["cpu_id"]["model"] == int(info["model"])
  assert set(machine.PACKAGES) <= set(m["versions"]) and m["versions"]["jax"]
  if os.path.isdir(os.path.join(REPO, ".git")) or os.path.isfile(os.path.join(REPO, ".git")):
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert m["git_commit"].split("+")[0] == head and len(head) == 40
  assert report["load"]["blocks"] == mon.blocks


def test_cpu_id_names_the_core_generation():
  """A VM may call its CPU just "AMD EPYC": family/model/stepping (Zen 3 Milan is family 25 model 1, Zen 4 Genoa
  model 17) and the cache size come from /proc/cpuinfo's fields; missing or malformed fields are left out."""
  milan = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "1", "model name": "AMD EPYC", "stepping": "1",
           "cache size": "512 KB"}
  assert machine.cpu_id(milan) == {"vendor": "AuthenticAMD", "family": 25, "model": 1, "stepping": 1,
                                   "cache_size": "512 KB"}
  assert machine.cpu_id({"cpu family": "6", "model": "unknown"}) == {"family": 6}
  assert machine.cpu_id({}) == {}


def test_git_commit_names_the_timed_code(tmp_path, monkeypatch):
  """A benchmark names the code it timed, its own script included (benchmarks/), but not its outputs (a compile
  table it writes row by row under docs/ must not make its later rows "+dirty")."""
  git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True, text=True)  # noqa: E731
  git("init", "-q")
  files = {"evqa_jax/m.py": "x = 1\n", "benchmarks/b.py": "y = 1\n", "docs/benchmarks/t.jsonl": "{}\n",
           "README.md": "r\n"}
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
  head = git("rev-parse", "HEAD").stdout.strip()
  monkeypatch.setattr(machine, "ROOT", str(tmp_path))
  assert machine.git_commit() == head
  for name in ("docs/benchmarks/t.jsonl", "README.md"):  # outputs and docs: clean
    (tmp_path / name).write_text("edited\n")
  (tmp_path / "untracked.py").write_text("")
  assert machine.git_commit() == head
  (tmp_path / "benchmarks" / "b.py").write_text("y = 2\n")  # a benchmark script: part of a figure
  assert machine.git_commit() == head + "+dirty"
  git("checkout", "-q", "--", "benchmarks")
  (tmp_path / "evqa_jax" / "m.py").write_text("x = 2\n")  # library code
  assert machine.git_commit() == head + "+dirty"
  monkeypatch.setattr(machine, "ROOT", str(tmp_path / "nowhere"))
  assert machine.git_commit() is None


def test_block_counts_a_waited_for_child_as_own_cpu():
  """compile_table.py times each launch/aot_check.py run as a child process: its CPU is the block's own, not foreign
  (else every compile row would call itself unusable)."""
  mon = machine.Monitor()
  spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n  pass\n"
  with mon.block("child"):
    subprocess.run([sys.executable, "-c", spin], check=True)
  (rec,) = mon.blocks
  assert rec["own_cores"] * rec["wall_s"] >= 0.5


def test_compile_table_quotes_compile_seconds_only_from_an_idle_machine():
  import compile_table  # pylint: disable=g-import-not-at-top
  row = {"command": "python launch/aot_check.py --mesh=4x1", "device_kind": "TPU v5 lite", "devices": 4,
         "mesh": {"data": 4, "model": 1}, "argument_size_in_bytes": 2**30, "temp_size_in_bytes": 2**31,
         "peak_estimate_bytes": 3 * 2**30, "hbm_bytes": 16 * 2**30, "fits": True, "flops": 1.5e12,
         "bytes_accessed": 0.5 * 819e9, "compile_seconds": 123.4, "global_batch_size": 4}
  busy, idle = (compile_table.markdown([dict(row, compile_seconds_usable=u)]).splitlines()[-1] for u in (False, True))
  # The roofline columns come from the row's counts (benchmarks/chips.py): 1.5e12 / 197e12 = 7.61 ms of compute
  # against 0.5 s of HBM traffic at 819 GB/s: memory-bound, MFU ceiling 0.0152, 4 examples / 0.5 s.
  assert busy.split(" | ")[1:] == ["TPU v5 lite x 4", "4 x 1", "1.00", "2.00", "3.00 / 16", "yes", "1.5e+12", "–",
                                   "0.5 (memory)", "0.02", "8", " |"]
  assert idle.split(" | ")[8] == "123.4"
  # With the step's model FLOPs (no remat recompute): the model MFU ceiling over the same roofline time.
  model = compile_table.markdown([dict(row, model_flops=1.0e12)]).splitlines()[-1]
  assert model.split(" | ")[-1] == f"{1.0e12 / 197e12 / 0.5:.2f} |"
  # Rows written before the load was recorded have no verdict: not quoted either.
  assert compile_table.markdown([row]).splitlines()[-1].split(" | ")[8] == "–"


def test_compile_table_summary_picks_the_fastest_fitting_paper_row_and_its_time_to_train():
  """Per slice the fitting OVQA paper-config row with the most roofline examples/s (a row that does not fit, a
  reduced-depth row, another task and the JustAsk backbone are passed over); time to train = train-set size x 20 epochs / examples/s."""
  import compile_table  # pylint: disable=g-import-not-at-top
  base = {"task": "ovqa", "device_kind": "TPU v5 lite", "devices": 8, "hbm_bytes": 16 * 2**30,
          "peak_estimate_bytes": 8 * 2**30, "global_batch_size": 64, "flops": 197e12 * 0.1, "bytes_accessed": 0.0}
  rows = [dict(base, command="slow", flops=197e12 * 0.2),                       # 0.2 s: 320 examples/s
          dict(base, command="fast"),                                           # 0.1 s: 640 examples/s
          dict(base, command="too big", peak_estimate_bytes=17 * 2**30, flops=197e12 * 0.01),
          dict(base, command="x --config.pretrained.shape.num_hidden_layers=2", flops=197e12 * 0.01),
          dict(base, command="violin", task="violin", flops=197e12 * 0.01),
          dict(base, command="x --config=configs/ovqa_msrvtt.py:justask,scale", flops=197e12 * 0.01)]
  table = compile_table.summary(rows).splitlines()
  assert len(table) == 4 and table[2].startswith("| TPU v5 lite x 8 | `fast` | 8 | 8.00 / 16 | 0.1 | 1.00 | 640 |")
  hours = [float(c.split()[0]) for c in table[2].strip(" |").split(" | ")[-4:]]
  assert hours == [round(n * 20 / 640 / 3600, 2) for n in (159_000, 32_000, 32_000, 39_000)]  # 1.38 h for MSRVTT-QA
  assert table[3].startswith("| authors | 4 GPUs x batch 8")


def test_compile_table_row_replaces_the_same_command(tmp_path):
  """A recompiled command replaces its row in place (the table holds each command's latest compile); a new command
  is appended; a file that is not JSON lines is refused with its line number and left as it was."""
  import compile_table  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "table.jsonl")
  for row in ({"command": "a", "v": 1}, {"command": "b", "v": 1}, {"command": "a", "v": 2}, {"command": "c", "v": 1}):
    compile_table.write_row(path, row)
  with open(path) as f:
    assert [json.loads(l) for l in f] == [{"command": "a", "v": 2}, {"command": "b", "v": 1}, {"command": "c", "v": 1}]
  assert os.listdir(tmp_path) == ["table.jsonl"]  # no temp file left behind
  with open(path, "a") as f:
    f.write("not json\n")
  with open(path) as f:
    before = f.read()
  with pytest.raises(SystemExit, match=r"table\.jsonl:4: not a JSON line"):
    compile_table.write_row(path, {"command": "d"})
  with open(path) as f:
    assert f.read() == before


def test_aot_check_refuses_a_negative_gathered_run():
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "aot_check.py"),
                        "--config=configs/ovqa_msrvtt.py:tiny", "--deberta_max_gathered_run=-1"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
  assert out.returncode != 0 and "--deberta_max_gathered_run=-1: must be >= 0" in out.stderr


def test_gpu_mfu_runs_the_paper_architecture_at_toy_size_on_cpu():
  """benchmarks/gpu_mfu.py --tiny (the OVQA paper's architecture at toy size, the trainer's own step) on CPU with a
  given peak: one JSON line whose MFU is XLA's FLOPs per step / step time / peak, with the levers set by --set (the
GPU attention path, relative_gather=dpa, which needs the attention dropout off); the
  FLOPs cover at least the frozen LM's forward and input-gradient matmuls (2 layers, 4 x (10 + 32) tokens)."""
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_mfu.py"), "--tiny", "--steps", "1",
                        "--peak_flops", "1e12", "--set", "model.relative_gather=dpa", "--set", "model.dropout=0.0",
                        "--set", "frozen_param_dtype=bfloat16"],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
  assert r["shapes"] == "tiny" and r["batch_size"] == 4 and r["peak_flops_per_device"] == 1e12
  assert r["settings"] == ["model.relative_gather=dpa", "model.dropout=0.0", "frozen_param_dtype=bfloat16"]
  assert r["mfu"] == round(r["flops_per_step"] / r["step_s"] / 1e12, 4)
  layer_weights = 4 * 64 * 64 + 2 * 64 * 128  # q, k, v, o and the two FFN matrices of one layer
  assert r["flops_per_step"] > 2 * (2 * layer_weights * 2 * 4 * (10 + 32))
  import gpu_mfu  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"model": {"remat": "none"}, "batch_size": 32})
  gpu_mfu.set_field(config, "model.remat=full")
  gpu_mfu.set_field(config, "batch_size=128")
  assert (config.model.remat, config.batch_size) == ("full", 128)
  with pytest.raises(SystemExit, match="the config has no field 'model.no_such_field'"):
    gpu_mfu.set_field(config, "model.no_such_field=1")


_HLO = """HloModule jit_step, entry_computation_layout={(bf16[4,8]{1,0})->f32[4,16]{1,0}}

%fused_computation.1 (param_0.1: bf16[4,8], param_1.1: bf16[8,16]) -> f32[4,16] {
  %param_0.1 = bf16[4,8]{1,0} parameter(0)
  %param_1.1 = bf16[8,16]{1,0} parameter(1)
  %convolution.1 = f32[4,16]{1,0} convolution(%param_0.1, %param_1.1), window={size=1}, dim_labels=bf_io->bf
}

%body.1 (p.1: (s32[], f32[4,16])) -> (s32[], f32[4,16]) {
  %p.1 = (s32[], f32[4,16]{1,0}) parameter(0)
  %gte.1 = f32[4,16]{1,0} get-tuple-element(%p.1), index=1
  %add.1 = f32[4,16]{1,0} add(%gte.1, %gte.1), metadata={op_name="jit(train_step)/transpose(jvp(Model))/lm/deberta/encoder/layer_3/attention/self/add"}
}

ENTRY %main.1 (param.1: bf16[4,8], param.2: bf16[8,16]) -> f32[4,16] {
  %param.1 = bf16[4,8]{1,0} parameter(0)
  %param.2 = bf16[8,16]{1,0} parameter(1)
  %fusion.1 = f32[4,16]{1,0:T(8,128)} fusion(%param.1, %param.2), kind=kOutput, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(Model)/Model.mask_feature/lm/deberta/encoder/layer_0/intermediate/dense/dot_general"}
  %tuple.1 = (s32[], f32[4,16]{1,0}) tuple(%param.1, %fusion.1)
  %while.1 = (s32[], f32[4,16]{1,0}) while(%tuple.1), condition=%cond.1, body=%body.1, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %copy.1 = f32[4,16]{1,0} copy(%fusion.1)
}
"""


def test_step_breakdown_charges_bytes_and_dot_flops_to_scopes():
  """benchmarks/step_breakdown.py on a hand-written optimized-HLO module: a fusion is charged its operands' and
  result's bytes and its convolution's 2 x 4 x 16 x 8 FLOPs; a while body's add is charged 3 times (its known trip
  count) to the backward of the layers' attention (layer number folded); parameters and tuples cost nothing."""
  import step_breakdown  # pylint: disable=g-import-not-at-top
  r = step_breakdown.breakdown(_HLO)
  fusion = 4 * 8 * 2 + 8 * 16 * 2 + 4 * 16 * 4  # two bf16 operands, an f32 result
  add = 3 * (3 * 4 * 16 * 4)
  copy = 2 * 4 * 16 * 4
  assert r["parsed_bytes"] == fusion + add + copy
  assert r["parsed_dot_flops"] == 2 * 4 * 16 * 8
  scopes = dict(r["bytes_by_scope"])
  assert scopes["encoder/layer_*/intermediate/dense"] == fusion
  assert scopes["bwd:encoder/layer_*/attention/self"] == add
  assert dict(r["bytes_by_opcode"]) == {"fusion:kOutput": fusion, "add": add, "copy": copy}


def test_step_breakdown_splits_token_pair_bytes_inside_and_outside_the_layers():
  """With the sequence length, each array an instruction reads or writes is charged to token-pair arrays (two
  dimensions of S, 2S - 1 or 2S - 2, or one flattened S x S, S x (2S - 1), S x (2S - 2) dimension) or the rest, inside
  the LM's layers or outside them. At S = 4 the hand-written module's [4, 16] arrays are token-pair (16 = S x S), the
  [4, 8] operand is not (8 is none of 4, 7, 6); the fusion and the loop's add sit in layers, the copy outside."""
  import step_breakdown  # pylint: disable=g-import-not-at-top
  assert step_breakdown.is_token_pair([32, 24, 266, 531], step_breakdown.token_pair_dims(266))
  assert step_breakdown.is_token_pair([32, 24, 140980], step_breakdown.token_pair_dims(266))
  assert not step_breakdown.is_token_pair([32, 266, 1536], step_breakdown.token_pair_dims(266))
  r = step_breakdown.breakdown(_HLO, seq_len=4)
  add = 3 * (3 * 4 * 16 * 4)
  assert r["bytes_token_pair"] == {"layers:token_pair": 8 * 16 * 2 + 4 * 16 * 4 + add, "layers:other": 4 * 8 * 2,
                                   "rest:token_pair": 2 * 4 * 16 * 4, "rest:other": 0}
  assert sum(r["bytes_token_pair"].values()) == r["parsed_bytes"]
  assert "bytes_token_pair" not in step_breakdown.breakdown(_HLO)
