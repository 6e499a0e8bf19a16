"""Compiles a config's train step for a target mesh without data or weights; prints memory and FLOPs as JSON.

  python launch/aot_check.py --config=configs/ovqa_msrvtt.py:demo --mesh=4x2 --fake_cpu_devices=8
  python launch/aot_check.py --config=configs/ovqa_msrvtt.py:demo,bf16 --mesh=16x4 --topology=v5e:8x8  # needs libtpu

--mesh is data x model (config.mesh_axes); it must use all devices. With --fake_cpu_devices=N the check runs on N
simulated CPU devices (any mesh that fits). Input shapes come from one record of the config's data and the
batch size; `--config.field=value` overrides work as in launch/train.py.
"""

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<name>.py[:variant]).",
                                lock_config=True)
flags.DEFINE_string("mesh", None, "Mesh shape, e.g. 4x2 (data x model); default: config.mesh_shape.")
flags.DEFINE_string("topology", None, "Target TPU topology, e.g. v5e:2x4 (compiles for devices not present).")
flags.DEFINE_integer("fake_cpu_devices", None, "Simulate this many CPU devices (sets XLA_FLAGS before JAX starts).")
flags.DEFINE_integer("deberta_max_gathered_run", None,
                     "Diagnostic: evqa_jax.models.relative_gather.MAX_GATHERED_RUN for this compile (0: the relative "
                     "gather's backward as the segmented scan it used before the per-position gathers).")
flags.DEFINE_bool("model_flops", False,
                  "Also compile the step without remat to report its FLOPs as model_flops (rows with remat: the "
                  "compile table's mfu_ceiling_model; a step without remat reports its own FLOPs).")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS


def parse_mesh(text: str) -> tuple:
  try:
    shape = tuple(int(x) for x in text.lower().split("x"))
  except ValueError as e:
    raise app.UsageError(f"--mesh={text!r}: expected sizes joined by 'x', e.g. 4x2") from e
  if any(s == 0 or s < -1 for s in shape):
    raise app.UsageError(f"--mesh={text!r}: sizes must be positive (or one -1)")
  return shape


def main(argv):
  del argv
  if FLAGS.deberta_max_gathered_run is not None and FLAGS.deberta_max_gathered_run < 0:
    raise app.UsageError(f"--deberta_max_gathered_run={FLAGS.deberta_max_gathered_run}: must be >= 0")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if FLAGS.fake_cpu_devices:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={FLAGS.fake_cpu_devices}").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
  from data_prep import worlds
  worlds.ensure_synthetic_world(FLAGS.config)  # the AOT check reads one record of the config's data
  if FLAGS.topology:
    # Compiling for a TPU topology needs libtpu, not a TPU: waive its host-wide lock (other JAX jobs may hold it).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from evqa_jax.train import aot
  if FLAGS.deberta_max_gathered_run is not None:
    from evqa_jax.models import relative_gather
    relative_gather.MAX_GATHERED_RUN = FLAGS.deberta_max_gathered_run  # read when the backward is traced
  mesh = parse_mesh(FLAGS.mesh) if FLAGS.mesh else None
  report = aot.compile_train_step(FLAGS.config, mesh_shape=mesh, topology=FLAGS.topology)
  if FLAGS.model_flops and "model_flops" not in report:
    report["model_flops"] = aot.model_flops(FLAGS.config, mesh_shape=mesh, topology=FLAGS.topology)
  print(json.dumps(report, sort_keys=True), flush=True)


if __name__ == "__main__":
  from launch import overrides
  overrides.exit_on_bad_overrides(sys.argv[1:])
  from evqa_jax import cli
  sys.exit(cli.run_absl(main))
