"""Issue #58 (round 4), classes 3, 5, 7 and 8: damaged weights, readers whose errors named no file, settings checked
late, and predicted masks that could not be scored. Each test fails on the code before it and names the thing at
fault in one line."""

import json
import os
import struct

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from evqa_jax.graphs import word_vectors
from evqa_jax.models import hf_utils
from evqa_jax.train import checkpointing
from evqa_jax.train import safeguards


# ------------------------------------------------------------------------------- class 3: non-finite weights


def _write_safetensors(path, tensors):
  header, blobs, offset = {}, [], 0
  for name, arr in tensors.items():
    arr = np.ascontiguousarray(arr, np.float32)
    header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
    blobs.append(arr.tobytes())
    offset += arr.nbytes
  head = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_non_finite_weights_are_refused_naming_tensor_and_file(tmp_path):
  """One NaN or infinity in any weight file a loader reads (safetensors folder, torch .bin / FrozenBiLM / JustAsk /
  the authors' GNN, an earlier run's Orbax params, word vectors) stops with the tensor and the file."""
  good = np.arange(6, dtype=np.float32).reshape(2, 3)
  bad = good.copy()
  bad[1, 2] = np.nan
  # Hugging Face folder (safetensors): BERT, DeBERTa, DistilBERT, CLIP read it through hf_utils.read_checkpoint.
  hf = tmp_path / "hf"
  hf.mkdir()
  _write_safetensors(hf / "model.safetensors", {"a.weight": good, "b.weight": bad})
  with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'b\.weight' \(2, 3\) holds 1 non-finite value"
                     r"\(s\) \(first: nan at \(1, 2\)\)"):
    hf_utils.read_checkpoint(str(hf))
  _write_safetensors(hf / "model.safetensors", {"a.weight": good})
  np.testing.assert_array_equal(hf_utils.read_checkpoint(str(hf))["a.weight"], good)  # finite: read as before
  # torch checkpoints (FrozenBiLM, the authors' OVQA GNN, JustAsk): an infinity in the GNN's weight.
  torch = pytest.importorskip("torch")
  gnn = torch.zeros(4, 4)
  gnn[0, 3] = float("inf")
  pth = tmp_path / "best_model_state_dict.pth"
  torch.save({"model": {"lm_predictions.lm_head.gnn1.lin_src.weight": gnn}}, str(pth))
  with pytest.raises(ValueError, match=r"best_model_state_dict\.pth: tensor 'lm_predictions\.lm_head\.gnn1\.lin_src"
                     r"\.weight' \(4, 4\) holds 1 non-finite value\(s\) \(first: inf at \(0, 3\)\)"):
    hf_utils.read_checkpoint(str(pth))
  # An earlier run's Orbax params (init_from of VIOLIN's BERT stage or a JustAsk run, launch/evaluate.py): the
  # checksums match (the NaN was saved), so only the finiteness check stops it.
  state = {"trainable": {"head": {"kernel": bad}}, "frozen": {"lm": {"kernel": good}}}
  mngr = checkpointing.make_checkpoint_manager(str(tmp_path / "run"), _ckpt_config())
  meta = {"step": 7, "checksums": safeguards.state_checksums(state)}
  mngr.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
  mngr.wait_until_finished()
  mngr.close()
  with pytest.raises(ValueError, match=r"checkpoint .*checkpoints/7: tensor \"\['trainable'\]\['head'\]\['kernel'\]\""
                     r" \(2, 3\) holds 1 non-finite"):
    checkpointing.load_checkpoint_arrays(str(tmp_path / "run"))
  # GloVe / word2vec text (answer graphs, VIOLIN's GloVe encoder): the line and the word.
  glove = tmp_path / "glove.txt"
  glove.write_text("the 0.1 0.2\ncat nan 0.5\n")
  for read in (lambda: word_vectors.load_word_vectors(str(glove)),
               lambda: word_vectors.lookup_vectors(str(glove), ["cat"], 2)):
    with pytest.raises(ValueError, match=r"glove\.txt: tensor \"vector of word 'cat' \(line 2\)\" \(2,\) holds 1 "
                       r"non-finite value\(s\) \(first: nan at \(0,\)\)"):
      read()


def _ckpt_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict({"checkpoint": {"max_to_keep": 2, "replica_parallel": None}})


# ------------------------------------------------------------------------ class 7: numeric settings, checked first


def _shipped_configs():
  import importlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import common  # pylint: disable=g-import-not-at-top
  for name in common.config_files():
    module = importlib.import_module(f"configs.{name[:-3]}")
    for variant in [None] + sorted(module.VARIANTS):
      try:
        yield f"{name}:{variant}", module.get_config(variant)
      except ValueError:  # a variant that needs another (e.g. a size that only combines with a dataset)
        continue


def test_every_numeric_setting_is_checked_before_anything_runs(tmp_path, capsys):
  """One table (evqa_jax/settings.py) holds every numeric key's range: a bad value stops train_and_evaluate and
  launch/evaluate.py before anything is written, naming the key; the converters' numeric flags use the same rules."""
  from evqa_jax import settings  # pylint: disable=g-import-not-at-top
  from evqa_jax.train import trainer  # pylint: disable=g-import-not-at-top
  # Every numeric key of every shipped config variant has a rule, and the shipped values keep it.
  seen = 0
  for name, config in _shipped_configs():
    for key, value in settings.leaves(config):
      if settings.is_number(value):
        assert settings.rule_of(key) is not None, f"{name}: config.{key} has no rule in evqa_jax/settings.py"
        seen += 1
    settings.check_config(config)
  assert seen > 1000
  config = dict(_shipped_configs())["ovqa_msrvtt.py:demo"]
  cases = {"verbalizer.eps": (1.5, r"config\.verbalizer\.eps = 1\.5: expected a number in \[0, 1\]"),
           "checkpoint.max_to_keep": (0, r"config\.checkpoint\.max_to_keep = 0: expected an integer >= 1"),
           "eval_batch_size": (0, r"config\.eval_batch_size = 0: expected an integer >= 1"),
           "data.cvqa_topk": (-5, r"config\.data\.cvqa_topk = -5: expected an integer >= 0"),
           "optim.lr": (float("nan"), r"config\.optim\.lr = nan: expected a number > 0")}
  for key, (value, message) in cases.items():
    bad = config.copy_and_resolve_references()
    group, _, leaf = key.rpartition(".")
    (bad[group] if group else bad)[leaf] = value
    workdir = tmp_path / key
    for run in (lambda: trainer.train_and_evaluate(bad, str(workdir)),
                lambda: trainer.evaluate_checkpoint(bad, str(workdir), "last")):
      with pytest.raises(ValueError, match=message):
        run()
      assert not workdir.exists()  # nothing written, nothing compiled
  # The converters' flags: a negative --cvqa-topk would have kept all but the last train answers.
  from data_prep import ovqa  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    ovqa.main(["--csv-dir", str(tmp_path), "--features", str(tmp_path / "f.npz"), "--out", str(tmp_path / "o"),
               "--cvqa-topk", "-1"])
  assert e.value.code == 2
  assert "argument --cvqa-topk: --cvqa-topk = -1: expected an integer >= 0" in capsys.readouterr().err
