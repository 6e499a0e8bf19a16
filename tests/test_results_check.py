"""The demo-result checker (launch/check_results.py) on a recorded 2-step `:tiny` run:
a rerun matches to the printed digits, a changed printed digit is caught and named, digits past the printed ones
are not compared. The demo tables themselves are rechecked only on request: `pytest -m demo`
(tests/test_demo_results.py)."""

import glob
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import check_results as results  # noqa: E402  (launch/check_results.py)

COMMAND = ["python", "launch/train.py", "--config=configs/ovqa_msrvtt.py:tiny", "--workdir={workdir}",
           "--config.total_steps=2", "--config.checkpoint_every_steps=2"]
PRINTED = {"final_metrics.json": {"eval.test.mAcc": 2, "eval.test.total": 2, "eval.test.BNG": 2, "train.loss": 4}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Both trainings share a persistent XLA cache (the run-wide one of conftest.py when there is one, so other modules'
  `:tiny` trainings count too): the rerun computes every number anew but compiles nothing."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("xla_cache"))
  return dict(os.environ, PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, env):
  folder = tmp_path_factory.mktemp("results") / "tiny"
  out = subprocess.run([sys.executable, "launch/check_results.py", str(folder), "--record",
                        f"--printed={json.dumps(PRINTED)}", "--", *COMMAND], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return folder


def test_record_holds_command_commit_and_printed_files(recorded):
  rec = json.loads((recorded / "record.json").read_text())
  assert rec["command"] == COMMAND and rec["printed"] == PRINTED
  assert "commit" in rec and "dirty" in rec  # the checkout's code version (a git checkout runs the tests)
  assert rec["cpu"] == results.cpu_model() and rec["machine"] == results.machine()  # XLA's code differs by CPU
  final = json.loads((recorded / "final_metrics.json").read_text())
  assert final["step"] == 2 and 0.0 <= final["eval"]["test"]["mAcc"] <= 100.0


def test_check_compares_with_the_record_of_this_cpu_class(recorded, tmp_path, capsys):
  rec = json.loads((recorded / "record.json").read_text())
  assert results.check(str(recorded), workdir=str(recorded)) == []
  assert f"comparing every printed number with {recorded}, recorded on your CPU's class" in capsys.readouterr().out
  # The same table recorded on another class of CPU, without stated ranges: compared, the CPU named as a cause.
  folder = tmp_path / "other_cpu"
  folder.mkdir()
  for name in rec["printed"]:
    (folder / name).write_text((recorded / name).read_text())
  other = {"vendor": "GenuineIntel" if results.machine().get("vendor") != "GenuineIntel" else "AuthenticAMD",
           "simd": "avx2", "cpu_family": 6, "model": "Some Other CPU"}
  (folder / "record.json").write_text(json.dumps(dict(rec, machine=other)))
  assert results.check(str(folder), workdir=str(recorded)) == []
  out = capsys.readouterr().out
  assert "no record of this table was made on your CPU's class" in out and "a difference may come from the CPU" in out


def test_rerun_matches_and_a_changed_digit_is_named(recorded, env, tmp_path):
  # The command line reruns the recorded command into a temporary workdir: a second, independent training.
  out = subprocess.run([sys.executable, "launch/check_results.py", str(recorded)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.strip().endswith(f"{recorded}: OK")

  # Compare against the committed copy itself, changed in and beyond the printed digits.
  rerun = tmp_path / "rerun"
  rerun.mkdir()
  (rerun / "final_metrics.json").write_text((recorded / "final_metrics.json").read_text())
  final = json.loads((recorded / "final_metrics.json").read_text())
  assert results.compare(str(recorded), str(rerun)) == []
  test = final["eval"]["test"]
  test["total"] = float(f"{test['total']:.2f}")  # the digits past the printed two change: still equal
  test["mAcc"] += 0.01  # the last printed digit changes
  (rerun / "final_metrics.json").write_text(json.dumps(final))
  bad = results.compare(str(recorded), str(rerun))
  a, b = f"{test['mAcc'] - 0.01:.2f}", f"{test['mAcc']:.2f}"
  assert bad == [f"final_metrics.json eval.test.mAcc: committed {a}, rerun {b}"]
  out = subprocess.run([sys.executable, "launch/check_results.py", str(recorded), f"--workdir={rerun}"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and f"MISMATCH {bad[0]}" in out.stdout, out.stdout + out.stderr


def test_record_refuses_what_it_could_not_check(tmp_path):
  with pytest.raises(ValueError, match="no '{workdir}' argument"):
    results.record(str(tmp_path / "r"), ["python", "launch/train.py", "--workdir=runs/x"], PRINTED)
  work = tmp_path / "w"
  work.mkdir()
  (work / "final_metrics.json").write_text(json.dumps({"eval": {"test": {"mAcc": "n/a"}}}))
  with pytest.raises(KeyError, match="no key 'train.loss'"):
    results.record(str(tmp_path / "r"), COMMAND, {"final_metrics.json": {"train.loss": 4}}, workdir=str(work))
  with pytest.raises(TypeError, match="'eval.test.mAcc' is 'n/a', not a number"):
    results.record(str(tmp_path / "r"), COMMAND, {"final_metrics.json": {"eval.test.mAcc": 2}}, workdir=str(work))


def test_same_code_compares_code_paths_of_commits():
  version = results.code_version()
  if not version:
    pytest.skip("not a git checkout")
  head = {"commit": version["commit"], "dirty": False}
  assert results.same_code(head, dict(head))
  assert not results.same_code(head, dict(head, dirty=True))
  assert not results.same_code(head, {})
  assert not results.same_code(head, {"commit": "0" * 40, "dirty": False})


# ------------------------------------ the README's check (docs/results/ovqa_demo_heads) on runs of the main command

HEADS = os.path.join(REPO, "docs", "results", "ovqa_demo_heads")  # the main command: three heads x seeds 42-44
MINILM = os.path.join(REPO, "docs", "results", "ovqa_heads_minilm")  # the MiniLM heads (:demo, one seed), two CPUs
POINTS = ("cvqa", "frozenbilm_plus", "frozenbilm_plus_gnn")
SEEDS = (42, 43, 44)


def _run_folder(tmp_path, source, name="run", **changes):
  """A run folder holding the committed final metrics of every run of `source`'s record, with `changes`
  ({run: {metric: value}}, run as "cvqa_seed42") applied to eval.test."""
  run = tmp_path / name
  printed = json.loads(open(os.path.join(source, "record.json")).read())["printed"]
  for rel in printed:
    final = json.loads(open(os.path.join(source, rel)).read())
    final["eval"]["test"].update(changes.get(os.path.dirname(rel), {}))
    (run / os.path.dirname(rel)).mkdir(parents=True)
    (run / rel).write_text(json.dumps(final))
  return str(run)


def _readme_main(run, folder=HEADS):
  """The README's command, `python launch/check_results.py docs/results/ovqa_demo_heads --workdir=RUN`, in-process."""
  return results.main([folder, f"--workdir={run}"])


@pytest.mark.parametrize("folder,count", [(HEADS, 1), (MINILM, 2)], ids=["main", "minilm"])
def test_readme_check_passes_a_run_equal_to_the_record_of_its_cpu_class(tmp_path, monkeypatch, capsys, folder, count):
  tables = results.table_records(folder)
  assert len(tables) == count  # main: the AMD EPYC record; MiniLM: the Intel Xeon one and the AMD one
  for i, table in enumerate(tables):
    m = json.loads(open(os.path.join(table, "record.json")).read())["machine"]
    monkeypatch.setattr(results, "machine", lambda m=m: dict(m, model="x"))
    run = _run_folder(tmp_path, table, f"run{i}")
    assert _readme_main(run, folder) == 0, capsys.readouterr().out
    assert f"comparing every printed number with {table}" in capsys.readouterr().out
    # A run that differs from its class's record in one printed digit is named, even where it is in the ranges.
    gnn = "frozenbilm_plus_gnn_seed43" if folder == HEADS else "frozenbilm_plus_gnn"
    macc = json.loads(open(os.path.join(run, gnn, "final_metrics.json")).read())["eval"]["test"]["mAcc"]
    bad = results.check(folder, _run_folder(tmp_path, table, f"bad{i}", **{gnn: {"mAcc": macc + 0.01}}))
    assert bad == [f"MISMATCH {gnn}/final_metrics.json eval.test.mAcc: committed {macc:.2f}, rerun {macc + 0.01:.2f}"]


def test_readme_check_on_a_cpu_without_a_record_holds_the_run_to_the_stated_ranges(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(results, "machine", lambda: {"vendor": "GenuineIntel", "simd": "avx2", "model": "Intel Core"})
  assert _readme_main(_run_folder(tmp_path, HEADS, "recorded")) == 0  # the recorded seeds are within what it states
  assert "checking the ranges and orderings the docs state for every CPU" in capsys.readouterr().out
  # Seed 42 at the bounds of the README's ranges (20.0-26.0 / 50.0-75.0 / 55.0-80.0 at one decimal): a pass.
  edge = {"cvqa_seed42": {"mAcc": 25.99, "unseen": 0.0}, "frozenbilm_plus_seed42": {"mAcc": 50.04, "unseen": 30.0},
          "frozenbilm_plus_gnn_seed42": {"mAcc": 79.96, "unseen": 60.0}}
  assert results.check(HEADS, _run_folder(tmp_path, HEADS, "edge", **edge)) == []
  # Recorded: seed 42 FrozenBiLM+ 68.75, seed 43 FrozenBiLM+ 59.36 and + GNN 67.52.
  bad = results.check(HEADS, _run_folder(tmp_path, HEADS, "bad", cvqa_seed43={"unseen": 1.0, "mAcc": 60.0},
                                         frozenbilm_plus_seed44={"mAcc": 49.94},
                                         frozenbilm_plus_gnn_seed42={"mAcc": 68.70}))
  assert bad == [
      "BROKEN cvqa_seed43/final_metrics.json eval.test.mAcc: 60.0, outside the range 20.0-26.0 the docs state",
      "BROKEN cvqa_seed43/final_metrics.json eval.test.unseen: 1, outside the range 0-0 the docs state",
      "BROKEN frozenbilm_plus_seed44/final_metrics.json eval.test.mAcc: 49.9, outside the range 50.0-75.0 the docs "
      "state",
      "BROKEN frozenbilm_plus_seed42/final_metrics.json eval.test.mAcc 68.75 is not 0 or more below "
      "frozenbilm_plus_gnn_seed42/final_metrics.json's 68.70",
      "BROKEN cvqa_seed43/final_metrics.json eval.test.mAcc 60.00 is not 20 or more below "
      "frozenbilm_plus_seed43/final_metrics.json's 59.36",
      "BROKEN cvqa_seed43/final_metrics.json eval.test.mAcc 60.00 is not 20 or more below "
      "frozenbilm_plus_gnn_seed43/final_metrics.json's 67.52"]
  os.remove(os.path.join(tmp_path, "recorded", "cvqa_seed44", "final_metrics.json"))
  assert _readme_main(str(tmp_path / "recorded")) == 1
  assert "BROKEN cvqa_seed44/final_metrics.json: not written by the run" in capsys.readouterr().out
  # The MiniLM record keeps its own ranges: the Zen 3 (AVX2) figures docs/results.md gives, at their bounds, pass.
  zen3 = {"cvqa": {"mAcc": 28.15, "unseen": 0.0}, "frozenbilm_plus": {"mAcc": 84.49, "unseen": 50.0},
          "frozenbilm_plus_gnn": {"mAcc": 71.34, "unseen": 30.0}}
  assert results.check(MINILM, _run_folder(tmp_path, MINILM, "zen3", **zen3)) == []
  assert results.check(MINILM, _run_folder(tmp_path, MINILM, "zen3_bad", frozenbilm_plus={"mAcc": 63.94})) == [
      "BROKEN frozenbilm_plus/final_metrics.json eval.test.mAcc: 63.9, outside the range 64.0-84.5 the docs state"]


def test_the_stated_ranges_are_the_readmes_table():
  """The record's "expect" is the README's "What to expect on your CPU" table, row by row, at every seed, with the
  orderings the README states: CVQA 20 points or more below both open heads, FrozenBiLM+ below + GNN."""
  readme = open(os.path.join(REPO, "README.md")).read()
  rows = {}
  for line in readme.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 3 and cells[0] in POINTS:
      rows[cells[0]] = [tuple(float(x) for x in c.split("-")) if "-" in c else (float(c), float(c)) for c in cells[1:]]
  expect = json.loads(open(os.path.join(HEADS, "record.json")).read())["expect"]
  ranges = {(r["file"].split("/")[0], r["key"]): (r["min"], r["max"]) for r in expect["ranges"]}
  assert ranges == {(f"{p}_seed{s}", k): rows[p][i] for p in POINTS for s in SEEDS
                    for i, k in enumerate(("eval.test.mAcc", "eval.test.unseen"))}
  f = lambda p, s: f"{p}_seed{s}/final_metrics.json"  # noqa: E731
  assert [(b["file"], b["above_file"], b["by"]) for b in expect["below"]] == [
      pair for s in SEEDS for pair in ((f("cvqa", s), f("frozenbilm_plus", s), 20),
                                       (f("cvqa", s), f("frozenbilm_plus_gnn", s), 20),
                                       (f("frozenbilm_plus", s), f("frozenbilm_plus_gnn", s), 0))]
  assert "CVQA 20 points or more below both open heads" in " ".join(readme.split())


# --------------------------------------------------- a record chooses nothing to run but this project's launchers

@pytest.mark.parametrize("command", [
    ["sh", "-c", "touch {workdir}/MARKER"],
    ["python", "-c", "open('MARKER', 'w')", "--workdir={workdir}"],
    ["python", "data_prep/fixtures.py", "--config=configs/violin.py", "--workdir={workdir}"],
    ["python", "launch/train.py", "--config=/tmp/evil.py", "--workdir={workdir}"],
    ["python", "launch/train.py", "--config=configs/../tests/conftest.py", "--workdir={workdir}"],
    ["python", "launch/train.py", "--config=configs/violin.py:demo", "--workdir={workdir}", "extra.py"],
    ["python", "launch/train.py", "--config=configs/violin.py:demo", "--workdir={workdir}",
     "--config.trust_pickles=True"],
    ["python", "launch/sweep.py", "--config=configs/violin.py:demo", "--workdir={workdir}", "--flagfile=f.txt"],
    ["python", "launch/train.py", "--config=configs/violin.py:demo", "--workdir=/tmp/elsewhere"],
    "python launch/train.py --config=configs/violin.py:demo --workdir={workdir}",
], ids=lambda c: " ".join(c)[:60] if isinstance(c, list) else "a string")
def test_a_record_that_names_another_program_is_refused_unrun(tmp_path, command):
  folder = tmp_path / "downloaded"
  folder.mkdir()
  (folder / "record.json").write_text(json.dumps({"command": command, "printed": {}}))
  with pytest.raises(ValueError, match=r"record.json: refusing to run"):
    results.check(str(folder))
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_results.py"), str(folder)], cwd=str(tmp_path),
                       env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert f"{folder}/record.json: refusing to run" in out.stderr
  assert not any(p.name == "MARKER" for p in tmp_path.rglob("*")) and not os.path.exists(os.path.join(REPO, "MARKER"))


def test_the_shipped_records_are_launch_commands():
  for table in sorted(glob.glob(os.path.join(REPO, "docs", "results", "*", "record.json"))):
    command = json.loads(open(table).read())["command"]
    assert results.checked_command(command, table) == command
