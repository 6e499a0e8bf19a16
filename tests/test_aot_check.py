"""launch/aot_check.py: the AOT example of docs/benchmarks.md, run as printed; its JSON report against the figures
the page quotes and against the config it was given."""

import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = "python launch/aot_check.py --config=configs/ovqa_msrvtt.py:tiny --mesh=4x2 --fake_cpu_devices=8"


def _readme_example():
  """-> the AOT command of docs/benchmarks.md and the report fields it prints after it."""
  with open(os.path.join(REPO, "docs", "benchmarks.md")) as f:
    text = " ".join(f.read().split())  # one line: the example wraps
  m = re.search(r"AOT check example \(.*?\): `(python launch/aot_check\.py [^`]*)` printed `([^`]*)`", text)
  assert m, "docs/benchmarks.md: the AOT check example is missing"
  return m.group(1), json.loads("{" + m.group(2) + "}")


def test_readme_aot_example_reruns_to_the_printed_figures():
  command, printed = _readme_example()
  assert command == COMMAND
  env = dict(os.environ, PYTHONPATH=REPO)
  env.pop("XLA_FLAGS", None)  # the command itself asks for its 8 CPU devices
  out = subprocess.run([sys.executable, *command.split()[1:]], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-4000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert report["mesh"] == {"data": 4, "model": 2} and report["devices"] == 8 and report["platform"] == "cpu"
  assert report["task"] == "ovqa" and report["global_batch_size"] == 8
  # Input shapes from one record of the small world: 10 frames of 768-d CLIP-like features, 32 prompt tokens.
  assert report["batch"]["video"] == [[8, 10, 768], "float32"]
  assert report["batch"]["input_ids"] == [[8, 32], "int32"]
  assert 0 < report["trainable_params"] < report["frozen_params"]
  # Donated state aliases its outputs: the peak counts those bytes once.
  assert report["peak_estimate_bytes"] == (report["argument_size_in_bytes"] + report["output_size_in_bytes"]
                                           + report["temp_size_in_bytes"] - report["alias_size_in_bytes"])
  # The parameters and Adam state are sharded over the mesh: per device, far less than 3 full fp32 copies.
  assert report["argument_size_in_bytes"] < 3 * 4 * (report["trainable_params"] + report["frozen_params"])
  for key, value in printed.items():
    if key == "flops":  # printed to 3 significant digits
      assert f"{report[key]:.2e}" == f"{value:.2e}", (key, report[key], value)
    else:
      assert report[key] == value, (key, report[key], value)
