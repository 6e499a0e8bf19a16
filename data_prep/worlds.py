"""The built-in synthetic worlds, built from a config before its task is: `config.data.synthetic` names the preset,
`config.data.dir` (WORLD/records) where it goes.

  python -m data_prep.worlds --config=configs/ovqa_msrvtt.py:demo      # build the world of a config, nothing else

launch/train.py, launch/aot_check.py, the benchmarks and the tests call `ensure_synthetic_world(config)` before
`train_and_evaluate`; the library (evqa_jax) never generates data, it raises when config.data.dir holds no records.
"""

import os
import sys

from evqa_jax import io as evqa_io


def _world_root(config) -> str:
  data_dir = os.path.expanduser(config.data.dir)
  if os.path.basename(os.path.normpath(data_dir)) != "records":
    raise ValueError(f"config.data.dir = {config.data.dir!r}: the synthetic world writes WORLD/raw and WORLD/records, "
                     "so the directory must be named 'records'")
  return os.path.dirname(os.path.abspath(os.path.normpath(data_dir)))


def ensure_synthetic_world(config) -> None:
  """Builds the synthetic world of `config.data.synthetic` for `config.task` unless config.data.dir already holds it
  (a no-op when config.data.synthetic is empty). Safe to call from several processes at once."""
  preset = config.data.get("synthetic", "")
  if not preset:
    return
  has_records = (evqa_io.epath_of(config.data.dir) / "metadata.json").exists()  # local or gs://...
  if not has_records and evqa_io.is_uri(config.data.dir):
    raise FileNotFoundError(
        f"config.data.dir = {config.data.dir!r} holds no records, and synthetic worlds are built on a local disk: "
        "build it locally (the same command with a local --config.data.dir), copy the folder to the bucket "
        "(gcloud storage cp -r), or pass --config.data.synthetic=''")
  if config.task == "ovqa":
    if not has_records:
      from data_prep import synthetic_ovqa
      synthetic_ovqa.ensure_world(_world_root(config), preset=preset)
  elif config.task == "violin":
    from data_prep import synthetic_violin
    if preset not in synthetic_violin.PRESETS:
      raise ValueError(f"config.data.synthetic = {preset!r}: expected '' or one of {list(synthetic_violin.PRESETS)}")
    # Always: ensure_world also checks that a world already there was built by this generator version and preset.
    synthetic_violin.ensure_world(_world_root(config), preset)
  elif config.task == "evqa":
    if not has_records:
      if preset not in ("default", "small"):
        raise ValueError(f"config.data.synthetic = {preset!r}: expected 'default' or 'small'")
      from data_prep import synthetic_evqa
      root = _world_root(config)
      os.makedirs(root, exist_ok=True)
      # Several processes (parallel test workers, hosts sharing a disk) may ask at once: one builds, the others
      # wait and then find the records.
      with evqa_io.file_lock(os.path.join(root, ".build.lock")):
        if not os.path.exists(os.path.join(os.path.expanduser(config.data.dir), "metadata.json")):
          print(f"Generating the synthetic E-VQA world ({preset}) in {root} ...", flush=True)
          synthetic_evqa.generate(root, small=preset == "small", verbose=False)
  else:
    raise ValueError(f"config.task = {config.task!r}: no built-in synthetic world (config.data.synthetic = "
                     f"{preset!r})")


def main(argv) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  ensure_synthetic_world(flags.FLAGS.config)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from evqa_jax import cli  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<name>.py[:variant]).")
  sys.exit(cli.run_absl(main))
