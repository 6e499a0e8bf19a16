"""Integrity (issue 39): nothing damaged is used silently, no command overwrites what it reads, one reader per file
kind. One test per class of the hostile suite, each on several instances of its class:

1. checkpoints and iterator state are verified on every restore;   2. a dataset smaller than its metadata is an error;
3. the experiment identity is the whole config;                     4. a pretrained config.json must match its weights;
5. no command writes to a path it reads, or through a link;         6. one reader per file kind (mask PNG, id, features);
7. every read error names the file.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from evqa_jax import cli
from evqa_jax import io as evqa_io

from test_hostile_input import tiny_config, train, world  # noqa: F401  (the small world and 2-layer BERT)

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(main, argv, capsys):
  code = cli.run(main, [str(a) for a in argv])
  return code, capsys.readouterr().err


def _one_line_error(code, err, *needles):
  assert code == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):  # noqa: F811
  """A finished workdir of the tiny config (1 step, checkpoint 1); tests work on copies of it."""
  work = tmp_path_factory.mktemp("integrity") / "w"
  train(tiny_config(world), work)
  return work


def _copy(trained, tmp_path, name="w"):
  work = tmp_path / name
  shutil.copytree(trained, work)
  return work


# ----------------------------------------------------------------- 1. every restore verifies everything it loads

def test_every_restore_verifies_arrays_and_iterator_state(world, trained, tmp_path, capsys):  # noqa: F811
  from evqa_jax.train import checkpointing, safeguards, trainer
  config = tiny_config(world)
  # (a) A flipped bit in the data iterator state (step 1 -> 3: still valid JSON) is a damaged checkpoint, not a
  # silently skipped batch: reported, moved aside, and the run starts again from scratch.
  work = _copy(trained, tmp_path, "iter")
  state_file = work / "checkpoints" / "1" / "data" / "process_0-of-1.json"
  text = state_file.read_text()
  assert '"step": 1' in text
  state_file.write_text(text.replace('"step": 1', '"step": 3'))
  capsys.readouterr()
  train(config, work)
  out = capsys.readouterr().out
  assert "checkpoints/1 is damaged or incomplete (ChecksumMismatchError: data iterator state" in out, out[-2000:]
  assert "Resumed from" not in out and os.listdir(work / "checkpoints_damaged")

  # (b) A checkpoint without its checksums (meta/ deleted) is refused, naming the switch; with it, it is used.
  work = _copy(trained, tmp_path, "nometa")
  shutil.rmtree(work / "checkpoints" / "1" / "meta")
  with pytest.raises(safeguards.UnverifiedCheckpointError,
                     match=r"checkpoints/1 has no checksums .*--config\.checkpoint\.allow_unverified=True"):
    train(config, work)
  with pytest.raises(safeguards.UnverifiedCheckpointError, match="allow_unverified"):
    checkpointing.load_checkpoint_arrays(str(work))  # evaluate, init_from and inspection read through this
  config.checkpoint.allow_unverified = True
  capsys.readouterr()
  train(config, work)
  assert "Resumed from" in capsys.readouterr().out
  config.checkpoint.allow_unverified = False

  # (c) A flipped byte in array data: launch/evaluate.py's loader refuses it as training does.
  work = _copy(trained, tmp_path, "flip")
  import test_hardening
  changed = test_hardening._flip_silently(str(work / "checkpoints" / "1" / "state"), str(work))
  with pytest.raises(safeguards.ChecksumMismatchError, match=r"checkpoints/1: 1 array\(s\) do not match"):
    trainer.evaluate_checkpoint(config, str(work), "last", splits=["test"])
  assert changed


# ----------------------------------------------------------------------- 3. the experiment identity is the config

def test_any_result_changing_key_is_part_of_the_identity(world, trained, tmp_path):  # noqa: F811
  work = _copy(trained, tmp_path)
  for key, value, shown in (("verbalizer.variant", "B", 'verbalizer.variant (checkpoint: "A", config: "B")'),
                            ("total_steps", 2, "total_steps (checkpoint: 1, config: 2)"),
                            ("optim.lr", 0.5, "optim.lr (checkpoint: 0.001, config: 0.5)")):
    config = tiny_config(world)
    parent = config
    *path, leaf = key.split(".")
    for part in path:
      parent = parent[part]
    parent[leaf] = value
    with pytest.raises(ValueError, match=r"holds a checkpoint of another experiment; it differs in .*"
                       + shown.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
      train(config, work)
  # The finished-run path (final metrics reused) checks it too, with the checkpoints gone.
  shutil.rmtree(work / "checkpoints")
  config = tiny_config(world)
  config.verbalizer.variant = "B"
  with pytest.raises(ValueError, match=r"holds the final metrics of another experiment.*verbalizer\.variant"):
    train(config, work)
  # What does not change a result is not identity: logging and checkpoint keeping.
  config = tiny_config(world)
  config.log_every_steps = 5
  config.checkpoint.max_to_keep = 4
  from evqa_jax.train import workdir as workdir_lib
  assert workdir_lib.identity_diffs(workdir_lib.config_identity(config),
                                    workdir_lib.config_identity(tiny_config(world))) == []
