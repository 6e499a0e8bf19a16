"""What a new user meets before the first result (issue 61): every "missing dependency" message names the install
line that brings it, and the third-party libraries' known notes (libtpu's INVALID_ARGUMENT lines on a host without
TPU, transformers' "PyTorch was not found", gcsfs's bucket-type probe) are settled where they start: the settings
evqa_jax sets before those libraries load."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, **env):
  return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=REPO, **env))


def test_gs_paths_without_gcsfs_name_the_install_line():
  out = _python("import sys; sys.modules['gcsfs'] = None\n"
                "from evqa_jax import io\n"
                "try:\n  io.epath_of('gs://bucket/run/x.json').exists()\n"
                "except ImportError as e:\n  print(e)")
  assert out.stdout.strip() == ("gs:// paths need gcsfs, which is not installed: pip install -e '.[gcs]' (on TPU pods "
                                ".[tpu], on GPU clusters .[gpu] bring it too)"), out.stderr[-2000:]
  setup = open(os.path.join(REPO, "setup.py")).read()
  assert '"gcs": [*GCS]' in setup and 'GCS = ["gcsfs==' in setup  # the extra the message names brings gcsfs


def test_pytorch_files_without_torch_name_the_install_line(tmp_path):
  from evqa_jax import io as evqa_io
  (tmp_path / "pytorch_model.bin").write_bytes(b"PK")
  code = ("import sys; sys.modules['torch'] = None\n"
          "from evqa_jax.models import hf_utils; from data_prep import features\n"
          f"for f in (lambda: hf_utils.read_checkpoint({str(tmp_path)!r}),\n"
          f"          lambda: features.FeatureStore({str(tmp_path / 'clip.pth')!r})):\n"
          "  try:\n    f()\n  except Exception as e:\n    print(type(e).__name__, e)")
  (tmp_path / "clip.pth").write_bytes(b"PK")
  out = _python(code)
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 2, out.stdout + out.stderr[-2000:]
  assert lines[0] == (f"ImportError {tmp_path}/pytorch_model.bin: reading a PyTorch checkpoint needs torch, which is "
                      f"not installed: {evqa_io.TORCH_INSTALL} (the CPU build; pip install -e '.[test]' brings it too)")
  assert lines[1].startswith(f"FeatureError {tmp_path}/clip.pth is a torch.save file: reading it needs torch, which "
                             f"is not installed: {evqa_io.TORCH_INSTALL}")


def test_third_party_settings_are_set_before_those_libraries_load():
  keys = ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "TPU_SKIP_MDS_QUERY")
  clean = {k: v for k, v in os.environ.items() if k not in keys}
  out = subprocess.run([sys.executable, "-c", "import os, evqa_jax; print([os.environ.get(k) for k in %r])" % (keys,)],
                       cwd=REPO, capture_output=True, text=True, timeout=60, env=dict(clean, PYTHONPATH=REPO))
  tpu_host = any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0"))
  assert out.stdout.strip() == str(["1", "false", None if tpu_host else "1"]), out.stderr
  # A user's own setting wins.
  out = subprocess.run([sys.executable, "-c", "import os, evqa_jax; print(os.environ['GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'])"],
                       cwd=REPO, capture_output=True, text=True, timeout=60,
                       env=dict(clean, PYTHONPATH=REPO, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="true"))
  assert out.stdout.strip() == "true"


def test_a_topology_compile_on_a_host_without_tpu_prints_no_libtpu_error():
  """libtpu, loaded to describe a TPU topology on this CPU host (launch/aot_check.py --topology), prints nothing;
  the topology is the one asked for."""
  pytest.importorskip("libtpu")
  if any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")):
    pytest.skip("a TPU host: libtpu asks its metadata server")
  clean = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  out = subprocess.run([sys.executable, "-c", "from evqa_jax.train import aot; d = aot.topology_devices('v5e:2x4'); "
                        "print(len(d), d[0].device_kind, max(tuple(x.coords) for x in d))"],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(clean, PYTHONPATH=REPO))
  assert out.returncode == 0 and out.stdout.strip() == "8 TPU v5 lite (1, 3, 0)", out.stdout + out.stderr[-2000:]
  assert out.stderr == "", out.stderr[-2000:]
