"""benchmarks/machine.py's usable verdict on hand-made blocks, and benchmarks/ovqa_vs_torch.py end to end (tiny)."""

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
  info = machine._io().cpuinfo()  # pylint: disable=protected-access
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


def test_git_commit_names_the_timed_code_code_version_only_the_code_paths(tmp_path, monkeypatch):
  """A benchmark names the code it timed, its own script included (benchmarks/), but not its outputs (a compile
  table it writes row by row under docs/ must not make its later rows "+dirty"); a training run's code_version()
  looks at the code paths only."""
  from evqa_jax import io as io_lib
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
  monkeypatch.setattr(io_lib, "REPO", str(tmp_path))
  clean = {"commit": head, "dirty": False}
  assert machine.git_commit() == head and io_lib.code_version() == clean
  for name in ("docs/benchmarks/t.jsonl", "README.md"):  # outputs and docs: clean for both
    (tmp_path / name).write_text("edited\n")
  (tmp_path / "untracked.py").write_text("")
  assert machine.git_commit() == head and io_lib.code_version() == clean
  (tmp_path / "benchmarks" / "b.py").write_text("y = 2\n")  # a benchmark script: part of a figure, not of a result
  assert machine.git_commit() == head + "+dirty" and io_lib.code_version() == clean
  git("checkout", "-q", "--", "benchmarks")
  (tmp_path / "evqa_jax" / "m.py").write_text("x = 2\n")  # library code: both
  assert machine.git_commit() == head + "+dirty" and io_lib.code_version() == {"commit": head, "dirty": True}
  monkeypatch.setattr(io_lib, "REPO", str(tmp_path / "nowhere"))
  assert machine.git_commit() is None and io_lib.code_version() == {}


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
         "compile_seconds": 123.4, "roofline_step_s": 0.5, "roofline_bound": "memory", "mfu_ceiling": 0.1}
  busy, idle = (compile_table.markdown([dict(row, compile_seconds_usable=u)]).splitlines()[-1] for u in (False, True))
  assert busy.split(" | ")[1:] == ["TPU v5 lite x 4", "4 x 1", "1.00", "2.00", "3.00 / 16", "yes", "1.5e+12", "–",
                                   "0.5 (memory)", "0.10 |"]
  assert idle.split(" | ")[8] == "123.4"
  # Rows written before the load was recorded have no verdict: not quoted either.
  assert compile_table.markdown([row]).splitlines()[-1].split(" | ")[8] == "–"


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


def test_ovqa_vs_torch_runs_end_to_end(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  out = tmp_path / "bench.json"
  env = dict(os.environ, XLA_FLAGS="", PYTHONPATH=REPO)  # one CPU device, as the benchmark runs
  cmd = [sys.executable, os.path.join(REPO, "benchmarks", "ovqa_vs_torch.py"), "--quick", "--batch", "2",
         "--text-len", "12", "--frames", "2", "--answers", "64", "--minilm-layers", "1", "--deberta-layers", "1",
         "--threefry", "both", "--out", str(out)]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result == json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["setting"]["quick"] and result["setting"]["blocks"] == 1
  assert (result["setting"]["minilm_layers"], result["setting"]["deberta_layers"]) == (1, 1)
  assert result["setting"]["threefry"] == "both" and not result["setting"]["unrolled_cpu_threefry"]
  sides = {"minilm": ("jax", "torch", "flax", "jax_unrolled"), "deberta": ("jax", "torch", "jax_unrolled")}
  for model, fws in sides.items():
    r = result["models"][model]
    assert set(r["examples_per_s"]) == set(fws)
    for fw in fws:
      assert r["examples_per_s"][fw]["train"] > 0 and r["examples_per_s"][fw]["infer"] > 0
    assert len(set(r["trainable_params"].values())) == 1 and set(r["trainable_params"]) == set(fws) - {"jax_unrolled"}
    for fw in set(fws) & {"jax", "flax"}:  # the jax and flax sides are checked against torch
      assert r["parity"][fw]["max_abs_logit_diff"] < 1e-3 and r["parity"][fw]["same_top1"] == 1.0
    assert set(r["ratio_jax_over_torch"]) == {"train", "infer"}
    assert r["jax_compile_s"]["train"] >= 0 and r["jax_unrolled_compile_s"]["train"] >= 0
    # The two lowerings draw the same dropout masks: the same first step from the same state.
    first = r["first_train_step"]
    assert first["jax"]["loss"] == pytest.approx(first["jax_unrolled"]["loss"], rel=1e-5)
    assert first["jax"]["grad_norm"] == pytest.approx(first["jax_unrolled"]["grad_norm"], rel=1e-5)
    for ref in ("jax", "torch"):
      assert r[f"ratio_jax_unrolled_over_{ref}"]["train"] == pytest.approx(
          r["examples_per_s"]["jax_unrolled"]["train"] / r["examples_per_s"][ref]["train"], rel=1e-2)
  assert set(result["models"]["minilm"]["ratio_jax_over_flax"]) == {"train", "infer"}
  assert result["summary"]["minilm"]["flax"] == result["models"]["minilm"]["examples_per_s"]["flax"]
  # The machine block and the verdict: one load record per (model, side, mode) block.
  assert isinstance(result["usable"], bool) and result["usable"] == result["load"]["usable"]
  assert len(result["load"]["blocks"]) == 2 * 4 + 2 * 3
  assert result["summary"]["minilm"]["jax_unrolled"] == result["models"]["minilm"]["examples_per_s"]["jax_unrolled"]
  assert {"cpu_model", "cpu_flags", "cpu_count", "versions"} <= set(result["machine"])
  for b in result["load"]["blocks"]:
    assert {"load1_before", "load1_after", "foreign_cores", "own_cores", "wall_s"} <= set(b)
  if not result["usable"]:
    assert result["load"]["reasons"] and "UNUSABLE" in proc.stderr


def test_ovqa_vs_torch_threefry_flags(capsys):
  import ovqa_vs_torch  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit):
    ovqa_vs_torch.main(["--unrolled-threefry", "--threefry", "both"])
  assert "--unrolled-threefry is --threefry unrolled" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    ovqa_vs_torch.main(["--threefry", "fast"])
  assert "invalid choice: 'fast'" in capsys.readouterr().err


HLO = """HloModule jit_train_step, is_scheduled=true

%fused_dot (p0: f32[4,8], p1: f32[8,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(M)/ffn/dot_general"}
}

%fused_gelu (p0: f32[4,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  ROOT %m = f32[4,8]{1,0} multiply(%p0, %p0), metadata={op_name="jit(train_step)/jvp(M)/ffn/erfc"}
}

%body (t: (u32[4,8], s32[])) -> (u32[4,8], s32[]) {
  %t = (u32[4,8]{1,0}, s32[]) parameter(0)
  %g = u32[4,8]{1,0} get-tuple-element(%t), index=0
  %x = u32[4,8]{1,0} xor(%g, %g), metadata={op_name="jit(train_step)/jvp(M)/Dropout_0/jit(_bernoulli)/jit(_uniform)/while/body/xor"}
  %i = s32[] get-tuple-element(%t), index=1
  ROOT %r = (u32[4,8]{1,0}, s32[]) tuple(%x, %i)
}

%cond (t: (u32[4,8], s32[])) -> pred[] {
  %t = (u32[4,8]{1,0}, s32[]) parameter(0)
  ROOT %c = pred[] constant(false)
}

%fused_adam (p0: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  ROOT %a = f32[8,8]{1,0} add(%p0, %p0), metadata={op_name="jit(train_step)/add"}
}

%fused_t (p0: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %tr = f32[8,8]{0,1} transpose(%p0), dimensions={1,0}
  ROOT %cp = f32[8,8]{1,0} copy(%tr), metadata={op_name="state['frozen']['w']"}
}

ENTRY %main (x: f32[4,8], w: f32[8,8], s: (u32[4,8], s32[])) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0), metadata={op_name="x"}
  %w = f32[8,8]{1,0} parameter(1), metadata={op_name="state['trainable']['LayerNorm']"}
  %s = (u32[4,8]{1,0}, s32[]) parameter(2)
  %dot_fusion = f32[4,8]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  %gelu_fusion = f32[4,8]{1,0} fusion(%dot_fusion), kind=kLoop, calls=%fused_gelu
  %while.3 = (u32[4,8]{1,0}, s32[]) while(%s), condition=%cond, body=%body
  %adam_fusion = f32[8,8]{1,0} fusion(%w), kind=kLoop, calls=%fused_adam
  %copy_fusion = f32[8,8]{1,0} fusion(%w), kind=kLoop, calls=%fused_t
  ROOT %out = f32[4,8]{1,0} add(%gelu_fusion, %gelu_fusion), metadata={op_name="jit(train_step)/transpose(jvp(M))/add"}
}
"""


def test_profile_classifies_hlo_instructions():
  import profile_ovqa_step as prof  # pylint: disable=import-outside-toplevel
  order, top = prof.parse_hlo(HLO)
  assert order == ["x", "w", "s", "dot_fusion", "gelu_fusion", "while.3", "adam_fusion", "copy_fusion", "out"]
  kinds = {n: prof.categorize(*top[n]) for n in order}
  assert kinds["dot_fusion"] == "matmul" and kinds["gelu_fusion"] == "GELU (erf)"
  assert kinds["while.3"] == "dropout RNG"  # through the while body it calls
  assert kinds["adam_fusion"] == "optimizer" and kinds["copy_fusion"] == "data movement"
  assert kinds["out"] == "other elementwise/reduce"
  assert prof.pass_of(top["out"][1]) == "backward" and prof.pass_of(top["dot_fusion"][1]) == "forward"
  assert prof.pass_of(top["adam_fusion"][1]) == "optimizer/other"
  # Overlapping op intervals (two threads) count once in the busy time; shares are of the summed op time.
  assert prof.union_ns([(0, 10), (5, 10), (30, 5)]) == 20
  assert prof.shares({"matmul": 3.0, "softmax": 1.0}) == {"matmul": 0.75, "softmax": 0.25}


def test_profile_idle_gaps_are_charged_to_the_op_before_them():
  """Idle time between ops (the host share, split up): overlapping ops merge, each gap goes to the op that ended
  last before it. Two steps in 200 us of wall: gaps of 5 us (after a), 20 us (after b, which ends after c) and 60 us
  (after d)."""
  import profile_ovqa_step as prof  # pylint: disable=import-outside-toplevel
  ev = [("a", 0, 10_000), ("b", 15_000, 10_000), ("c", 16_000, 4_000), ("d", 45_000, 5_000),
        ("a", 110_000, 5_000)]
  kinds = {"a": "matmul", "b": "softmax", "c": "matmul", "d": "dropout RNG"}
  g = prof.idle_gaps(ev, kinds, wall_ns=200_000.0, steps=2)
  assert g["count_per_step"] == 1.5 and g["share_of_wall"] == round(85 / 200, 4)
  assert g["share_of_wall_by_previous_op"] == {"dropout RNG": 0.3, "softmax": 0.1, "matmul": 0.025}
  assert g["us"] == {"p50": 20.0, "p90": 60.0, "p99": 60.0, "max": 60.0} and g["over_50us_per_step"] == 0.5
  assert g["largest"][0] == ["d", "a", 60.0] and g["largest"][-1] == ["a", "b", 5.0]
  assert prof.idle_gaps([("a", 0, 5)], kinds, 10.0, 1) == {"count_per_step": 0.0, "share_of_wall": 0.0}


def test_toeplitz_backward_compares_scan_and_gathers(monkeypatch):
  """benchmarks/toeplitz_backward.py at tiny shapes: both backwards compiled and timed side by side, the same
  gradients (runs of one at 8 tokens: a permutation either way), and the module's default restored."""
  import toeplitz_backward  # pylint: disable=g-import-not-at-top
  from evqa_jax.models import deberta_v2  # pylint: disable=g-import-not-at-top
  out = toeplitz_backward.main(["--deberta-layers", "1", "--batch", "2", "--text-len", "6", "--frames", "2",
                                "--rounds", "2", "--steps", "1"])
  assert out["setting"]["tokens"] == 8 and deberta_v2.MAX_GATHERED_RUN == out["setting"]["max_gathered_run"] == 8
  assert {k: len(v) for k, v in out["seconds_per_gradient_blocks"].items()} == {"scan": 2, "gathers": 2}
  assert out["max_abs_gradient_difference"] == {"scan": 0.0}
  assert [b["label"] for b in out["load"]["blocks"]] == ["scan/0", "gathers/0", "gathers/1", "scan/1"]
  # --gather-only: one relative gather's gradient, three ways, the encoder's index at 8 tokens (15 rows).
  out = toeplitz_backward.main(["--deberta-layers", "1", "--batch", "2", "--text-len", "6", "--frames", "2",
                                "--rounds", "1", "--steps", "1", "--gather-only"])
  heads = toeplitz_backward.ovqa_vs_torch.DEBERTA_XSMALL["num_attention_heads"]
  assert out["setting"]["x_shape"] == [2, heads, 8, 15]
  assert out["max_abs_gradient_difference"] == {"scan": 0.0, "take_along_axis": 0.0}
  assert [b["label"] for b in out["load"]["blocks"]] == ["scan/0", "gathers/0", "take_along_axis/0"]
  assert deberta_v2.MAX_GATHERED_RUN == 8


def test_xla_cpu_kernels_gemms_hand_counted_and_checked_against_float64():
  """benchmarks/xla_cpu_kernels.py's GEMM part at tiny shapes: FLOPs counted by hand, each side's result within
  1e-5 of float64 numpy, one alternating block per side and shape."""
  pytest.importorskip("torch")
  import xla_cpu_kernels as xk  # pylint: disable=g-import-not-at-top
  specs = {s["name"]: s for s in xk.gemm_shapes(batch=2, tokens=8)}
  assert xk.gemm_flops(specs["dense_hxh"]) == 2 * 16 * 384 * 384
  assert xk.gemm_flops(specs["ffn_down_dx"]) == 2 * 16 * 1536 * 384  # [16, 384] x [1536, 384]^T
  assert xk.gemm_flops(specs["attn_scores"]) == 2 * (2 * 12) * 8 * 8 * 32
  assert xk.gemm_flops(specs["attn_context"]) == 2 * (2 * 12) * 8 * 8 * 32
  out = xk.main(["--batch", "2", "--text-len", "6", "--frames", "2", "--repeats", "1", "--gemm-seconds", "0.001",
                 "--flag-sets="])
  g = out["gemms"]
  assert set(g) == set(specs) and "flag_screen" not in out
  # Forward shares: 4 h x h projections + FFN up + FFN down + the two attention matmuls of one layer.
  total = 4 * 2 * 16 * 384 * 384 + 2 * (2 * 16 * 384 * 1536) + 2 * (2 * 24 * 8 * 8 * 32)
  assert g["dense_hxh"]["share_of_layer_forward_flops"] == round(4 * 2 * 16 * 384 * 384 / total, 4)
  assert g["ffn_down_dx"]["share_of_layer_forward_flops"] == 0.0
  for r in g.values():
    assert max(r["relative_error_vs_float64"].values()) < 1e-5
    # The ratio comes from the unrounded medians (a busy machine's tiny-shape rates once rounded to 0.0 GFLOP/s).
    assert r["ratio_jax_over_torch"] == pytest.approx(r["gflops_per_s"]["jax"] / r["gflops_per_s"]["torch"],
                                                      rel=2e-3, abs=1e-3)
  assert len(out["load"]["blocks"]) == 2 * len(specs)


def test_xla_cpu_kernels_flag_screen_bookkeeping(monkeypatch):
  """The flag screen's subprocesses (stubbed): each gets the environment's XLA flags + its set; a set whose losses
  differ from the default's is marked, rates are relative to the mean of the two default runs, a failed child is
  recorded with its exit status."""
  import xla_cpu_kernels as xk  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("XLA_FLAGS", "--base")
  rates = {"": [(10.0, 40.0), (14.0, 60.0)], "--a": [(18.0, 50.0)]}
  seen = []

  def fake_run(cmd, capture_output, text, env, check):
    del capture_output, text, check
    flags = env["XLA_FLAGS"]
    seen.append(flags)
    assert "--child-step" in cmd
    if flags == "--base --b":
      return subprocess.CompletedProcess(cmd, 3, stdout="", stderr="boom")
    key = flags[len("--base"):].strip()
    train, infer = rates[key].pop(0)
    rec = {"xla_flags": flags, "examples_per_s": {"train": train, "infer": infer},
           "losses": ["1.0", "2.0" if key == "" else "2.5", "3.0"]}
    return subprocess.CompletedProcess(cmd, 0, stdout="noise\n" + json.dumps(rec) + "\n", stderr="")

  monkeypatch.setattr(xk.subprocess, "run", fake_run)
  args = xk.argparse.Namespace(batch=2, text_len=6, frames=2, minilm_layers=1, visual_dim=8, answers=64,
                               dropout=0.1, steps=1, repeats=1, unrolled_threefry=False)
  out = xk.run_flag_screen(args, ["--a", "--b"], machine.Monitor())
  assert seen == ["--base", "--base --a", "--base --b", "--base"]
  runs = out["runs"]
  assert [r["flags"] for r in runs] == ["", "--a", "--b", ""]
  assert runs[2]["error"] == "exit status 3" and runs[2]["stderr_tail"] == "boom"
  assert runs[1]["same_numerics"] is False and runs[0]["same_numerics"] is runs[3]["same_numerics"] is True
  assert runs[1]["vs_default"] == {"train": 1.5, "infer": 1.0}  # 18 / mean(10, 14), 50 / mean(40, 60)
  assert runs[0]["vs_default"] == {"train": round(10 / 12, 3), "infer": 0.8}


def test_process_log_hook_and_its_summary(tmp_path):
  """benchmarks/process_log: a process started with the hook on PYTHONPATH logs its compiles; the summary adds them
  up per script and per program (a hand-written log with known figures)."""
  sys.path.insert(0, os.path.join(REPO, "benchmarks", "process_log"))
  try:
    import analyze  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  (tmp_path / "1.log").write_text(
      "START 100.0 /repo/launch/train.py --config=c.py\n"
      "101.0 Finished tracing train_step for jit in 0.5 sec\n"
      "102.0 Finished XLA compilation of jit(train_step) in 2.25 sec\n"
      "103.0 Persistent compilation cache hit for 'jit_init'\n"
      "END 110.0 10.00\n")
  (tmp_path / "2.log").write_text(
      "START 100.0 /repo/launch/train.py --config=c.py\n"
      "101.0 Finished XLA compilation of jit(train_step) in 1.5 sec\n"
      "101.5 Finished XLA compilation of jit(_checksums) in 0.25 sec\n"
      "END 105.0 5.00\n")
  got = analyze.summarize(str(tmp_path))
  assert got["processes"] == 2 and got["compiles"] == 3 and got["compile_s"] == 4.0
  assert got["by_script"] == {"train.py": {"processes": 2, "wall_s": 15.0, "compile_s": 4.0, "cache_hits": 1}}
  assert got["top_compiles"][0] == {"program": "jit(train_step)", "count": 2, "seconds": 3.75}
  live = tmp_path / "live"
  live.mkdir()
  env = dict(os.environ, EVQA_PROCESS_LOG=str(live), PYTHONPATH=os.path.join(REPO, "benchmarks", "process_log"),
             JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda x: x * 2)(3.0)"], env=env, check=True,
                 capture_output=True, timeout=120)
  live_sum = analyze.summarize(str(live))
  assert live_sum["processes"] == 1 and live_sum["compiles"] >= 1
  assert any(r["program"] == "jit(<lambda>)" for r in live_sum["top_compiles"])
