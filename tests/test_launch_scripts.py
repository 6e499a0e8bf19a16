"""launch/tpu_pod.sh and launch/slurm_gpu.sh under DRY_RUN=1: the commands every host / process would run, with the
process id and coordinator jax.distributed.initialize() resolves there, and the user's flags passed through intact."""

import os
import re
import shlex
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A flag whose value holds shell metacharacters and one with a space: both must reach train.py as one argument.
FLAGS = ["--config.batch_size=64", "--config.data.eval_splits=('test',)", "--config.name=two words"]


def _run(script, env, *args):
  # The scripts must never reach gcloud / srun in a dry run: PATH holds neither here.
  env = dict(env, PATH="/usr/bin:/bin", DRY_RUN="1")
  out = subprocess.run(["bash", os.path.join(REPO, "launch", script), *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  return out.stdout.splitlines()


def _train_argv(command: str) -> list:
  """The argv of `python launch/train.py ...` inside a shell command line."""
  words = shlex.split(command)
  start = words.index("python")
  end = words.index("2>&1") if "2>&1" in words else len(words)
  return words[start:end]


@pytest.mark.parametrize("hosts", [2, 4, 32])  # 32: a v4-32 slice has 4 hosts, a v5e-32 8; 32 hosts = v5e-128
def test_tpu_pod_dry_run(hosts):
  env = dict(TPU_NAME="my-v5e", ZONE="us-west4-a", PROJECT="proj", CONFIG="configs/ovqa_msrvtt.py",
             WORKDIR="gs://bucket/runs/x", NUM_WORKERS=str(hosts), HOME="/nonexistent")
  lines = _run("tpu_pod.sh", env, *FLAGS)
  local = [l for l in lines if l.startswith("local: ")]
  workers = [l for l in lines if l.startswith("worker ")]
  assert len(local) == 1 and len(workers) == hosts and len(lines) == hosts + 1
  gcloud = shlex.split(local[0][len("local: "):])
  assert gcloud[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v5e", "--zone=us-west4-a"]
  assert gcloud[7:9] == ["--project=proj", "--worker=all"] and gcloud[9].startswith("--command=")
  remote = gcloud[9][len("--command="):]
  expect = ["python", "launch/train.py", "--distributed", "--config=configs/ovqa_msrvtt.py",
            "--workdir=gs://bucket/runs/x", *FLAGS]
  assert _train_argv(remote) == expect
  for w, line in enumerate(workers):
    m = re.fullmatch(r"worker (\d+): process_id=(\d+) num_processes=(\d+) coordinator=(.+?): (.*)", line)
    assert m, line
    assert m.group(1, 2, 3) == (str(w), str(w), str(hosts))
    assert m.group(4) == "<ip of my-v5e worker 0>:8482"
    assert m.group(5) == remote  # the same command on every worker
    assert _train_argv(m.group(5)) == expect


def test_tpu_pod_dry_run_with_setup_and_missing_count():
  """SETUP=1 ships the code only (a git archive of the tracked files, not the checkout with its venv and runs) and
  installs the pinned `.[tpu]` extra, never an unpinned jax[tpu]."""
  env = dict(TPU_NAME="t", ZONE="z", CONFIG="c.py", WORKDIR="gs://b/w", NUM_WORKERS="2", SETUP="1")
  lines = _run("tpu_pod.sh", env)
  local = [shlex.split(l[len("local: "):]) for l in lines if l.startswith("local: ")]
  assert [c[0] for c in local] == ["git", "gcloud", "gcloud", "gcloud"]
  archive, scp, install, train = local
  assert archive[:4] == ["git", "-C", REPO, "archive"] and "--format=tar.gz" in archive
  tarball = archive[archive.index("-o") + 1]
  assert scp[4] == "scp" and "--recurse" not in scp and scp[5] == tarball and "--worker=all" in scp
  command = install[-1][len("--command="):]
  assert f"tar -xzf ~/evqa-jax-code.tar.gz -C ~/evqa-jax" in command
  assert "pip install -q -e '.[tpu]'" in command and "'jax[tpu]'" not in command
  assert train[4] == "ssh" and "python launch/train.py --distributed" in train[-1]
  env = {k: v for k, v in env.items() if k != "NUM_WORKERS"} | {"DRY_RUN": "1", "PATH": "/usr/bin:/bin"}
  out = subprocess.run(["bash", "launch/tpu_pod.sh"], cwd=REPO, capture_output=True, text=True, env=env)
  assert out.returncode != 0 and "NUM_WORKERS" in out.stderr


def test_tpu_extra_is_pinned_and_brings_gcsfs():
  """What SETUP=1 installs: setup.py's `tpu` extra pins jax[tpu] and libtpu, and brings gcsfs for gs:// paths."""
  import ast  # pylint: disable=g-import-not-at-top
  tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
  values = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      values[node.targets[0].id] = node.value
  gcs = ast.literal_eval(values["GCS"])
  extras = {ast.literal_eval(k): v for k, v in zip(values["EXTRAS"].keys, values["EXTRAS"].values)}

  def reqs(name):
    out = []
    for elt in extras[name].elts:
      out += gcs if isinstance(elt, ast.Starred) else [ast.literal_eval(elt)]
    return out

  assert "jax[tpu]==0.10.2" in reqs("tpu") and any(r.startswith("gcsfs==") for r in reqs("tpu"))
  assert "jax[cuda12]==0.10.2" in reqs("gpu") and any(r.startswith("gcsfs==") for r in reqs("gpu"))
  assert any(r.startswith("gcp-storage-emulator==") for r in reqs("test"))


@pytest.mark.parametrize("nodes", [2, 4, 32])
def test_slurm_dry_run(nodes):
  names = [f"gpu{i:02d}" for i in range(1, nodes + 1)]
  env = dict(DRY_RUN_NODES=",".join(names), SLURM_JOB_ID="1234", REPO_DIR=REPO)
  lines = _run("slurm_gpu.sh", env, "configs/evqa_gen.py", "/shared/runs/evqa", *FLAGS)
  expect = ["python", "launch/train.py", "--distributed", "--config=configs/evqa_gen.py",
            "--workdir=/shared/runs/evqa", *FLAGS]
  assert lines[0].startswith("local: srun --kill-on-bad-exit=1 --cpu-bind=none ")
  assert _train_argv(lines[0][len("local: "):]) == expect
  procs = lines[1:]
  assert len(procs) == 8 * nodes  # 8 GPUs, one process each, per node (#SBATCH --ntasks-per-node=8)
  for i, line in enumerate(procs):
    m = re.fullmatch(r"node (\S+): SLURM_PROCID=(\d+) SLURM_LOCALID=(\d+) SLURM_NTASKS=(\d+) coordinator=(\S+): (.*)",
                     line)
    assert m, line
    assert m.group(1, 2, 3, 4) == (names[i // 8], str(i), str(i % 8), str(8 * nodes))
    assert m.group(5) == "gpu01:62674"  # JAX's SLURM rule: first node, port 61440 + 1234 % 4096
    assert _train_argv(m.group(6)) == expect


def test_evaluate_runs_through_both_launchers():
  """SCRIPT=launch/evaluate.py: the evaluate-only entry on every worker / process, with --distributed."""
  env = dict(TPU_NAME="t", ZONE="z", CONFIG="configs/ovqa_msrvtt.py", WORKDIR="gs://b/w", NUM_WORKERS="8",
             SCRIPT="launch/evaluate.py")
  workers = [l for l in _run("tpu_pod.sh", env, "--checkpoint=best") if l.startswith("worker ")]
  assert len(workers) == 8
  argv = shlex.split(workers[0].split(": ", 2)[2])
  assert argv[argv.index("python"):argv.index("2>&1")] == [
      "python", "launch/evaluate.py", "--distributed", "--config=configs/ovqa_msrvtt.py", "--workdir=gs://b/w",
      "--checkpoint=best"]
  lines = _run("slurm_gpu.sh", dict(DRY_RUN_NODES="gpu01", SLURM_JOB_ID="7", REPO_DIR=REPO, SCRIPT="launch/evaluate.py"),
               "configs/ovqa_msrvtt.py", "gs://b/w", "--checkpoint=last")
  assert _train_argv(lines[0][len("local: "):]) == [
      "python", "launch/evaluate.py", "--distributed", "--config=configs/ovqa_msrvtt.py", "--workdir=gs://b/w",
      "--checkpoint=last"]
