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
