"""launch/sweep.py's engine (launch.sweeps): resumable points, reuse of identical finished runs, the tables and
the plot. Training itself is replaced by a fake `_run_point` that writes what launch/train.py writes."""

import csv
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from launch import sweeps as sweep_lib
from evqa_jax.runs import workdir as workdir_lib

CONFIG = textwrap.dedent('''
    import ml_collections

    def get_config(arg=None):
      return ml_collections.ConfigDict(dict(seed=0, verbalizer=dict(variant="E", eps=0.7), tag=arg or ""))

    def get_sweep(name, arg=None):
      points = [{"name": f"eps_{e:.1f}", "overrides": {"verbalizer.eps": e}, "x": e} for e in (1.0, 0.7, 0.0)]
      return {"points": points, "columns": [("base", "B"), ("mAcc", "M")], "split": "test", "x_label": "eps"}
''')


def _metrics(eps):
  # A made-up but eps-dependent result, so each table row can be checked against the point that produced it.
  return {"eval": {"test": {"base": 90.0 + eps, "mAcc": 50.0 - 10.0 * eps, "total": 1.0}}}


CODE = {"evqa_jax": "0.1.0", "sources_sha256": "c0ffee"}  # the code version the tests pretend to run


def _write_run(run_dir, config, eps, code=CODE):
  os.makedirs(os.path.join(run_dir, "eval"), exist_ok=True)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump({"identity": workdir_lib.config_identity(config),
               "config": json.loads(config.to_json()) if hasattr(config, "to_json") else config,
               **({"code": code} if code is not None else {})}, f)
  with open(os.path.join(run_dir, "train_history.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "loss": eps}) + "\n")
  with open(os.path.join(run_dir, "final_metrics.json"), "w") as f:
    json.dump(_metrics(eps), f)


@pytest.fixture
def config_path(tmp_path):
  path = tmp_path / "toy_config.py"
  path.write_text(CONFIG)
  return str(path)


class FakeTrain:
  """Stands in for running `[python, launch/train.py, --config=..., --workdir=..., --config.k=v ...]`."""

  def __init__(self, module, arg):
    self.module, self.arg, self.calls, self.envs = module, arg, [], []

  def __call__(self, cmd, env=None):
    workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    self.envs.append(env)
    eps = float(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.verbalizer.eps=")))
    self.calls.append(os.path.basename(workdir))
    config = sweep_lib.point_config(self.module, self.arg, {"name": "", "overrides": {"verbalizer.eps": eps}})
    _write_run(workdir, config, eps)
    return subprocess.CompletedProcess(cmd, 0)


def test_runs_missing_points_only_and_writes_tables_and_plot(tmp_path, config_path, monkeypatch):
  module = sweep_lib.load_config_module(config_path + ":demo")
  fake = FakeTrain(module, "demo")
  monkeypatch.setattr(sweep_lib, "_run_point", fake)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  workdir = str(tmp_path / "sweep")
  # eps_0.7 finished in an earlier (interrupted) sweep; eps_0.0 was interrupted before finishing.
  _write_run(os.path.join(workdir, "eps_0.7"),
             sweep_lib.point_config(module, "demo", {"name": "", "overrides": {"verbalizer.eps": 0.7}}), 0.7)
  os.makedirs(os.path.join(workdir, "eps_0.0", "checkpoints"))

  table = sweep_lib.run_sweep(config_path + ":demo", "eps", workdir)
  assert fake.calls == ["eps_1.0", "eps_0.0"]
  # The points share a persistent compilation cache in the sweep's workdir (unless the user set one).
  assert [e["JAX_COMPILATION_CACHE_DIR"] for e in fake.envs] == [os.path.join(workdir, ".xla_cache")] * 2
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
  assert sweep_lib.point_env(workdir) is None and sweep_lib.point_env("gs://b/sweep") is None
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert [r["name"] for r in table["rows"]] == ["eps_1.0", "eps_0.7", "eps_0.0"]
  with open(os.path.join(workdir, "eps.csv")) as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["point", "B", "M"]
  assert rows[1:] == [["eps_1.0", "91.00", "40.00"], ["eps_0.7", "90.70", "43.00"], ["eps_0.0", "90.00", "50.00"]]
  md = open(os.path.join(workdir, "eps.md")).read().splitlines()
  assert md[0] == "| point | B | M |" and md[3] == "| eps_0.7 | 90.70 | 43.00 |"
  png = np.asarray(Image.open(os.path.join(workdir, "eps.png")))
  assert png.ndim == 3 and png.shape[0] > 100 and png.std() > 0  # a real, non-blank image

  # A second call trains nothing.
  fake.calls.clear()
  sweep_lib.run_sweep(config_path + ":demo", "eps", workdir)
  assert fake.calls == []


def test_reuse_copies_only_runs_with_exactly_the_same_config(tmp_path, config_path, monkeypatch):
  module = sweep_lib.load_config_module(config_path + ":demo")
  fake = FakeTrain(module, "demo")
  monkeypatch.setattr(sweep_lib, "_run_point", fake)
  monkeypatch.setattr(sweep_lib.workdir_lib, "code_version", lambda: dict(CODE))
  other = str(tmp_path / "heads")
  same = sweep_lib.point_config(module, "demo", {"name": "", "overrides": {"verbalizer.eps": 0.7}})
  # Same config but other or unrecorded code (or the git record of older versions): never reused.
  _write_run(os.path.join(other, "a_gnn_old_code"), same, 0.0, code=dict(CODE, sources_sha256="0000000"))
  _write_run(os.path.join(other, "b_gnn_unrecorded"), same, 0.0, code=None)
  _write_run(os.path.join(other, "c_gnn_git_record"), same, 0.0, code={"commit": "c0ffee", "dirty": False})
  _write_run(os.path.join(other, "gnn"), same, 0.7)
  differs = dict(same, tag="not-demo")  # same eps, another config: must not be reused
  _write_run(os.path.join(other, "gnn_other"), differs, 1.0)
  os.makedirs(os.path.join(other, "unfinished"))

  workdir = str(tmp_path / "sweep")
  table = sweep_lib.run_sweep(config_path + ":demo", "eps", workdir, reuse_dirs=[other])
  assert fake.calls == ["eps_1.0", "eps_0.0"]
  reused = os.path.join(workdir, "eps_0.7")
  with open(os.path.join(reused, "reused_from.json")) as f:
    assert json.load(f)["source"] == os.path.abspath(os.path.join(other, "gnn"))
  assert os.path.exists(os.path.join(reused, "train_history.jsonl"))
  assert table["rows"][1]["M"] == pytest.approx(43.0)

  with pytest.raises(ValueError, match="--reuse cannot be combined"):
    sweep_lib.run_sweep(config_path + ":demo", "eps", str(tmp_path / "x"), extra_args=["--config.seed=1"],
                        reuse_dirs=[other])


def test_print_mode_prints_one_command_per_point(tmp_path, config_path, capsys):
  assert sweep_lib.run_sweep(config_path + ":demo", "eps", str(tmp_path / "p"), mode="print") == {}
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 3
  assert lines[1].startswith("python launch/train.py --config=") and "--config.verbalizer.eps=0.7" in lines[1]
  assert f"--workdir={tmp_path / 'p' / 'eps_0.7'}" in lines[1]


def test_print_mode_commands_run_on_any_host(capsys):
  """Commands for a cluster: `python` and the repository's relative paths, never this host's interpreter or checkout;
  a gs:// workdir stays a URI."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sweep_lib.run_sweep(os.path.join(root, "configs", "ovqa_msrvtt.py") + ":demo", "eps", "gs://bucket/sweeps/eps",
                      mode="print")
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0] == ("python launch/train.py --config=configs/ovqa_msrvtt.py:demo "
                      "--workdir=gs://bucket/sweeps/eps/eps_1.0 --config.verbalizer.variant=E "
                      "--config.verbalizer.eps=1.0")
  assert len(lines) == 11 and not any(sys.executable in l or root in l for l in lines)


def test_progress_prints_point_k_of_n_and_total_eta(tmp_path, config_path, monkeypatch, capsys):
  module = sweep_lib.load_config_module(config_path)
  monkeypatch.setattr(sweep_lib, "_run_point", FakeTrain(module, "demo"))
  point = next(p for p in module.get_sweep("eps", "demo")["points"] if p["name"] == "eps_0.7")
  # Finished already (by the same experiment): skipped, takes no time.
  _write_run(str(tmp_path / "s" / "eps_0.7"), sweep_lib.point_config_dict(module, "demo", point), 0.7)
  ticks = iter([0.0, 120.0, 120.0, 120.0, 200.0])  # point 1 trains 120 s, point 2 is skipped, point 3 trains 80 s
  progress = sweep_lib.SweepProgress
  monkeypatch.setattr(sweep_lib, "SweepProgress", lambda n: progress(n, clock=lambda: next(ticks)))
  sweep_lib.run_sweep(config_path + ":demo", "eps", str(tmp_path / "s"))
  out = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[sweep]")]
  assert out[0].startswith("[sweep] point 1 of 3: eps_1.0: ")
  assert out[1] == "[sweep] point 1 of 3 (eps_1.0) done in 2.0 min; 1 point(s) to go, ETA 2.0 min"
  assert out[2] == "[sweep] point 2 of 3: eps_0.7: done already, skipped"
  assert out[3].startswith("[sweep] point 3 of 3: eps_0.0: ")
  assert out[4] == "[sweep] point 3 of 3 (eps_0.0) done in 1.3 min; 0 point(s) to go, ETA 0.0 min"


def test_command_line_config_overrides_reach_every_point(tmp_path, config_path):
  """`--config.key=value` on launch/sweep.py is a train.py override for every point (no `--` needed)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, os.path.join(root, "launch", "sweep.py"), f"--config={config_path}",
                         "--sweep=eps", f"--workdir={tmp_path / 'p'}", "--mode=print", "--config.seed=7",
                         "--config.tag", "x y", "--", "--config.verbalizer.variant=D"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 3
  for line in lines:
    assert line.endswith("--config.seed=7 --config.tag 'x y' --config.verbalizer.variant=D"), line
  # A value-less `--config.flag` (a boolean) does not swallow the next flag. (In a subprocess: importing
  # launch/sweep.py defines absl flags process-wide.)
  code = ("import sys; sys.path.insert(0, 'launch'); import sweep; "
          "print(sweep.split_point_overrides(['s.py', '--config.x.flag', '--sweep=eps', '--config.y', '3']))")
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "(['s.py', '--sweep=eps'], ['--config.x.flag', '--config.y', '3'])", out.stderr[-2000:]


def test_missing_point_and_bad_override_are_named(tmp_path, config_path):
  module = sweep_lib.load_config_module(config_path)
  with pytest.raises(KeyError, match="verbalizer.nope"):
    sweep_lib.point_config(module, None, {"name": "p", "overrides": {"verbalizer.nope": 1}})
  sweep = module.get_sweep("eps")
  with pytest.raises(FileNotFoundError, match="eps_1.0"):
    sweep_lib.write_table(sweep, "eps", str(tmp_path / "empty"))


def test_seeds_and_only_give_mean_and_std(tmp_path, config_path, monkeypatch):
  module = sweep_lib.load_config_module(config_path)
  calls = []

  def fake_run(cmd, env=None):
    workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    eps = float(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.verbalizer.eps=")))
    seed = int(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.seed=")))
    calls.append(os.path.basename(workdir))
    overrides = {"verbalizer.eps": eps, "seed": seed}
    _write_run(workdir, sweep_lib.point_config(module, None, {"name": "", "overrides": overrides}), eps)
    # Make the result seed-dependent: base = 90 + eps + (seed - 1).
    with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
      json.dump({"eval": {"test": {"base": 90.0 + eps + seed - 1, "mAcc": 50.0 - 10.0 * eps}}}, f)
    return subprocess.CompletedProcess(cmd, 0)

  monkeypatch.setattr(sweep_lib, "_run_point", fake_run)
  workdir = str(tmp_path / "seeds")
  table = sweep_lib.run_sweep(config_path, "eps", workdir, only=["eps_1.0", "eps_0.0"], seeds=[1, 3, 4])
  assert calls == [f"eps_{e}_seed{s}" for e in ("1.0", "0.0") for s in (1, 3, 4)]
  (r1, r0) = table["rows"]
  # eps 1.0: base 91, 93, 94 -> mean 92.667; squared deviations 25/9 + 1/9 + 16/9 = 42/9; sample std
  # sqrt(42/9 / 2) = sqrt(7/3) = 1.5275 (the population std, sqrt(42/9 / 3) = 1.2472, would print 1.25).
  assert (r1["name"], r1["n"], r1["M_std"]) == ("eps_1.0", 3, 0.0)
  assert r1["B"] == pytest.approx(278 / 3) and r1["B_std"] == pytest.approx((7 / 3) ** 0.5)
  assert (r0["name"], r0["B"], r0["B_std"]) == ("eps_0.0", pytest.approx(275 / 3), pytest.approx((7 / 3) ** 0.5))
  with open(os.path.join(workdir, "eps.csv")) as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["point", "seeds", "B", "B_std", "M", "M_std"]
  assert rows[1] == ["eps_1.0", "3", "92.67", "1.53", "40.00", "0.00"]
  md = open(os.path.join(workdir, "eps.md")).read()
  assert md.startswith("test split, mean ± sample std (ddof 1) over seeds\n")
  assert "| eps_0.0 | 3 | 91.67 ± 1.53 | 50.00 ± 0.00 |" in md
  assert os.path.exists(os.path.join(workdir, "eps.png"))
  with pytest.raises(ValueError, match=r"unknown sweep points \['eps_0.5'\]"):
    sweep_lib.run_sweep(config_path, "eps", workdir, only=["eps_0.5"])


def test_code_version_is_a_digest_of_the_code_paths(tmp_path, monkeypatch):
  """config.json's "code": the package version and a digest of the Python sources under evqa_jax/, configs/,
  data_prep/ and launch/ (no git): an edit there changes it, README, tests and caches do not."""
  from evqa_jax.runs import workdir
  for rel in ("evqa_jax/a.py", "configs/c.py", "tests/t.py", "README.md"):
    os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
    (tmp_path / rel).write_text("x = 1\n")
  monkeypatch.setattr(workdir, "REPO", str(tmp_path))
  first = workdir.code_version()
  assert first["evqa_jax"] == "0.1.0" and len(first["sources_sha256"]) == 64
  (tmp_path / "tests" / "t.py").write_text("x = 2\n")
  (tmp_path / "README.md").write_text("changed\n")
  os.makedirs(tmp_path / "evqa_jax" / "__pycache__")
  (tmp_path / "evqa_jax" / "__pycache__" / "a.py").write_text("cache\n")
  assert workdir.code_version() == first
  (tmp_path / "configs" / "c.py").write_text("x = 2\n")
  assert workdir.code_version()["sources_sha256"] != first["sources_sha256"]
  (tmp_path / "configs" / "c.py").write_text("x = 1\n")
  (tmp_path / "configs" / "d.py").write_text("x = 1\n")  # a new file counts, under its name
  assert workdir.code_version()["sources_sha256"] != first["sources_sha256"]


def test_per_seed_table_and_order_count():
  """Under a multi-seed table: the sweep's `per_seed` column at each seed, and at how many seeds its `order` holds
  strictly (hand-made values: the order fails at seed 43, where b ties c)."""
  vals = {"a": {42: 10.0, 43: 11.0, 44: 12.0}, "b": {42: 20.0, 43: 30.0, 44: 21.0}, "c": {42: 25.0, 43: 30.0, 44: 22.5}}
  rows = [{"name": n, "per_seed": {s: {"M": v, "B": 0.0} for s, v in per.items()}} for n, per in vals.items()]
  lines = sweep_lib.per_seed_lines({"per_seed": "M", "order": ["a", "b", "c"]}, rows)
  assert lines[1] == "M per seed"
  assert lines[3] == "| point | seed 42 | seed 43 | seed 44 |"
  assert lines[5] == "| a | 10.00 | 11.00 | 12.00 |" and lines[7] == "| c | 25.00 | 30.00 | 22.50 |"
  assert lines[-1] == "M: a < b < c at 2 of 3 seeds (not at 43)"
  assert sweep_lib.per_seed_lines({"per_seed": "M", "order": ["a", "c"]}, rows)[-1] == "M: a < c at 3 of 3 seeds"
  assert sweep_lib.per_seed_lines({"columns": []}, rows) == []


STAGED = textwrap.dedent('''
    import ml_collections

    def get_config(arg=None):
      return ml_collections.ConfigDict(dict(seed=0, verbalizer=dict(variant="A", eps=0.7),
                                            pretrained=dict(init_from="")))

    def get_sweep(name, arg=None):
      stage1 = {"name": "stage1", "overrides": {"verbalizer.eps": 1.0}, "x": None}
      stage2 = {"name": "stage2", "overrides": {"verbalizer.eps": 0.7, "verbalizer.variant": "E"},
                "from_points": {"pretrained.init_from": "stage1"}, "x": None}
      points = [stage1, stage2] if name == "staged" else [stage2, stage1]
      return {"points": points, "columns": [("base", "B"), ("mAcc", "M")], "split": "test", "x_label": None}
''')


def test_from_points_start_a_point_from_the_same_seeds_earlier_run(tmp_path, monkeypatch, capsys):
  """A second-stage point (JustAsk+ w/ GNN from JustAsk+) gets the first stage's run directory of its own seed."""
  path = tmp_path / "staged.py"
  path.write_text(STAGED)
  module = sweep_lib.load_config_module(str(path))
  calls = []

  def fake_run(cmd, env=None):
    args = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)
    workdir = args["workdir"]
    calls.append((os.path.basename(workdir), args.get("config.pretrained.init_from")))
    if args.get("config.pretrained.init_from"):  # stage 2 reads stage 1's run: it must be there, finished
      assert os.path.exists(os.path.join(args["config.pretrained.init_from"], "final_metrics.json"))
    overrides = {k[len("config."):]: v for k, v in args.items() if k.startswith("config.")}
    overrides["seed"] = int(overrides["seed"])
    overrides["verbalizer.eps"] = float(overrides["verbalizer.eps"])
    _write_run(workdir, sweep_lib.point_config(module, None, {"name": "", "overrides": overrides}),
               overrides["verbalizer.eps"])
    return subprocess.CompletedProcess(cmd, 0)

  monkeypatch.setattr(sweep_lib, "_run_point", fake_run)
  workdir = str(tmp_path / "runs")
  with pytest.raises(ValueError, match=r"stage2_seed7 starts from point stage1_seed7's run \(pretrained.init_from\), which "
                                       r"has not finished"):
    sweep_lib.run_sweep(str(path), "staged", workdir, only=["stage2"], seeds=[7])
  assert calls == []
  sweep_lib.run_sweep(str(path), "staged", workdir, only=["stage1"], seeds=[7, 8])
  table = sweep_lib.run_sweep(str(path), "staged", workdir, seeds=[7, 8])  # stage 1 done: skipped
  root = os.path.abspath(workdir)
  assert calls == [("stage1_seed7", None), ("stage1_seed8", None),
                   ("stage2_seed7", os.path.join(root, "stage1_seed7")),
                   ("stage2_seed8", os.path.join(root, "stage1_seed8"))]
  assert [(r["name"], r["n"], r["B"]) for r in table["rows"]] == [("stage1", 2, 91.0), ("stage2", 2, 90.7)]
  # Rerun: every point is finished and its recorded config (stage 1's path included) is the one it would train.
  sweep_lib.run_sweep(str(path), "staged", workdir, seeds=[7, 8])
  assert len(calls) == 4
  # A finished second stage keeps its row after its first stage's run is deleted; an unfinished one is refused.
  import shutil
  shutil.rmtree(os.path.join(workdir, "stage1_seed8"))
  assert [r["B"] for r in sweep_lib.run_sweep(str(path), "staged", workdir, only=["stage2"], seeds=[7, 8])["rows"]] \
      == [90.7]
  shutil.rmtree(os.path.join(workdir, "stage2_seed8"))
  with pytest.raises(ValueError, match="stage2_seed8 starts from point stage1_seed8's run"):
    sweep_lib.run_sweep(str(path), "staged", workdir, only=["stage2"], seeds=[7, 8])
  assert len(calls) == 4
  capsys.readouterr()
  sweep_lib.run_sweep(str(path), "staged", "gs://bucket/runs", mode="print")
  lines = capsys.readouterr().out.splitlines()
  assert "--workdir=gs://bucket/runs/stage1" in lines[0] and "init_from" not in lines[0]
  assert "--config.pretrained.init_from=gs://bucket/runs/stage1" in lines[1]
  # A checkpoint given to every point (real data: the pretrained model) starts stage 1; stage 2 still starts from
  # stage 1's run, whichever form the argument takes.
  for extra in (["--config.pretrained.init_from=/m/ckpt.pth"], ["--config.pretrained.init_from", "/m/ckpt.pth"]):
    lines = [sweep_lib.point_command(str(path), f"/r/{p['name']}", sweep_lib.resolve_from_points(p, "/r", check=False),
                                     extra + ["--config.total_steps=5"])
             for p in sweep_lib.select_points(module.get_sweep("staged"), seeds=[7])["points"]]
    assert lines[0][-len(extra) - 1:] == extra + ["--config.total_steps=5"]
    assert "/m/ckpt.pth" not in " ".join(lines[1])
    assert lines[1][-2:] == ["--config.pretrained.init_from=/r/stage1_seed7", "--config.total_steps=5"]
  with pytest.raises(ValueError, match=r"stage2: from_points pretrained.init_from = 'stage1' names a later point"):
    sweep_lib.run_sweep(str(path), "reversed", workdir)


def test_justask_gnn_point_is_the_second_stage_of_the_same_seeds_justask_plus(capsys):
  """heads_justask's + GNN point starts from the same seed's JustAsk+ run (the paper's two stages), in order."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sweep_lib.run_sweep(os.path.join(root, "configs", "ovqa_msrvtt.py") + ":demo,justask", "heads_justask",
                      "gs://b/hj", mode="print", seeds=[42, 43])
  lines = capsys.readouterr().out.strip().splitlines()
  names = [l.split("--workdir=gs://b/hj/")[1].split()[0] for l in lines]
  assert names == ["justask_cvqa_seed42", "justask_cvqa_seed43", "justask_plus_seed42", "justask_plus_seed43",
                   "justask_plus_gnn_seed42", "justask_plus_gnn_seed43"]
  for line, seed in zip(lines[4:], (42, 43)):
    assert f"--config.pretrained.init_from=gs://b/hj/justask_plus_seed{seed}" in line
    assert "--config.model.freeze_answer_encoder=true" in line and "--config.verbalizer.variant=E" in line
  assert not any("init_from" in l for l in lines[:4])


def test_justask_stages_share_heads_justask_runs_and_add_a_second_stage_without_the_gnn(capsys):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  config = os.path.join(root, "configs", "ovqa_msrvtt.py") + ":demo,justask"
  module = sweep_lib.load_config_module(config)
  heads = {p["name"]: p for p in module.get_sweep("heads_justask", "demo,justask")["points"]}
  stages = {p["name"]: p for p in module.get_sweep("justask_stages", "demo,justask")["points"]}
  assert list(stages) == ["justask_plus", "justask_plus_stage2", "justask_plus_gnn"]
  for name in ("justask_plus", "justask_plus_gnn"):  # the same runs, so one workdir serves both sweeps
    assert stages[name] == heads[name]
  control = sweep_lib.point_config_dict(module, "demo,justask", stages["justask_plus_stage2"])
  gnn = sweep_lib.point_config_dict(module, "demo,justask", stages["justask_plus_gnn"])
  assert (control.verbalizer.variant, control.model.freeze_answer_encoder) == ("A", True)
  assert (gnn.verbalizer.variant, gnn.model.freeze_answer_encoder) == ("E", True)
  assert stages["justask_plus_stage2"]["from_points"] == {"pretrained.init_from": "justask_plus"}
