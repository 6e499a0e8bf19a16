"""One run on 1 device beside the same run on the 8 simulated devices of the test process: the loss curves must agree.

The 1-device run is `launch/train.py` in a subprocess with its own XLA_FLAGS (the device count is fixed when JAX
starts), started first so that it runs while the test process trains its 8-device run.
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_one_device_run(config: str, workdir: str, *flags: str) -> subprocess.Popen:
  """config: `path.py[:variant]` as launch/train.py takes it; flags: extra `--config.field=value` arguments."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=REPO)
  return subprocess.Popen([sys.executable, os.path.join(REPO, "launch/train.py"), f"--config={config}",
                           f"--workdir={workdir}", *flags], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
  """Waits for the run; -> its console output (which names the mesh). Fails with the output's tail."""
  out = proc.communicate(timeout=timeout)[0]
  assert proc.returncode == 0, out[-4000:]
  assert "{'data': 1, 'model': 1}" in out, out[-4000:]
  return out


def history(workdir: str) -> list:
  with open(os.path.join(workdir, "train_history.jsonl")) as f:
    return [json.loads(line) for line in f]


def assert_same_loss_curve(one: str, eight: str, steps: int, keys=("loss", "grad_norm")) -> None:
  """Every logged step's `keys` agree to 1e-5 (relative above 1); the parameters moved between the first and last."""
  h1, h8 = history(one), history(eight)
  assert [r["step"] for r in h1] == [r["step"] for r in h8] == list(range(1, steps + 1))
  for a, b in zip(h1, h8):
    for key in keys:
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
  assert h1[0]["loss"] != h1[-1]["loss"]
