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
from evqa_jax.runs import checkpointing
from evqa_jax.runs import safeguards


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


# --------------------------------------------------------------- class 8: predicted masks that cannot be scored


def test_unscorable_predicted_masks_are_reported(tmp_path, capsys):
  """ST-Evidence masks: a truncated predicted PNG is skipped as the official eval_st_evidence.py skips it (load_mask ->
  None -> continue) but named in a warning and in the output JSON; a predictions folder laid out like the ground
  truth (<dir>/<entry_id>/*.png, not <entry_id>/masks/) scores 0, as the official, and is reported as such."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from evqa_jax.evaluate import st_evidence as st_cli  # pylint: disable=g-import-not-at-top

  def png(path, mask):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(mask.astype(np.uint8) * 255).save(path)

  square = np.zeros((8, 8), bool)
  square[2:6, 2:6] = True
  (tmp_path / "gt.csv").write_text('entry_id,candidates,answer,segment\ne1,"[\'a\', \'b\']",a,"[[0, 1]]"\n'
                                   'e2,"[\'a\', \'b\']",b,"[[0, 1]]"\n')
  (tmp_path / "pred.json").write_text(json.dumps({e: {"parsed_response": {"answer": "A", "segments": [[0, 1]]}}
                                                  for e in ("e1", "e2")}))
  for e in ("e1", "e2"):
    for frame in ("00000", "00001"):
      png(str(tmp_path / "gt" / e / f"{frame}.png"), square)
      png(str(tmp_path / "pred" / e / "masks" / f"{frame}.png"), square)  # perfect masks
  good = (tmp_path / "pred" / "e1" / "masks" / "00001.png").read_bytes()
  (tmp_path / "pred" / "e1" / "masks" / "00001.png").write_bytes(good[:len(good) // 2])  # truncated
  args = ["--gt-csv", str(tmp_path / "gt.csv"), "--gt-masks", str(tmp_path / "gt"), "--pred",
          str(tmp_path / "pred.json"), "--pred-masks", str(tmp_path / "pred"), "--out", str(tmp_path / "m.json")]
  m = st_cli.main(args)
  bad = str(tmp_path / "pred" / "e1" / "masks" / "00001.png")
  # The official numbers: the readable frames score 1, the truncated one is skipped ...
  assert m["J"] == m["F"] == 100.0 and m["num_mask_frames"] == 3
  # ... and reported: counted, listed in the JSON and per entry, named on stderr.
  assert m["format_errors_unreadable_masks"] == 1 and m["unreadable_mask_files"] == [bad]
  assert m["per_sample_scores"]["e1"]["unreadable_masks"] == [bad]
  assert json.loads((tmp_path / "m.json").read_text())["unreadable_mask_files"] == [bad]
  err = capsys.readouterr().err
  assert f"warning: 1 predicted mask PNG(s) cannot be read (truncated or not an image) and are skipped, as the " \
         f"official evaluator skips them: {bad}" in err
  # Predictions laid out like the ground truth: every entry scores 0 (the official result), with a warning.
  args[args.index("--pred-masks") + 1] = str(tmp_path / "gt")
  m = st_cli.main(args[:-2] + ["--out", str(tmp_path / "m2.json")])
  assert m["J"] == m["F"] == 0.0 and m["num_missing_mask_folders"] == 2
  assert m["per_sample_scores"]["e2"]["mask_folder_missing"] is True
  err = capsys.readouterr().err
  assert (f"warning: 2 entries with ground-truth masks have no predicted mask folder (--pred-masks {tmp_path}/gt) and "
          f"score 0 J and F, e.g. ['e1', 'e2']: 2 of them hold PNGs directly in {tmp_path}/gt/<entry_id>/ (the "
          f"ground truth's layout), but predicted masks are read from {tmp_path}/gt/<entry_id>/masks/*.png") in err


# ------------------------------------------------------------ round 3: a split that --skip-bad left empty


def test_a_split_left_empty_by_skip_bad_is_an_error(tmp_path, capsys):
  """VIOLIN: the train clip converts, the only test clip has the wrong feature size: with --skip-bad the test split
  used to be written empty (exit 0). Now one line naming the split and why; --out is not created."""
  import h5py  # pylint: disable=g-import-not-at-top
  from data_prep import violin  # pylint: disable=g-import-not-at-top
  from evqa_jax import cli  # pylint: disable=g-import-not-at-top
  ann = {f"c{i}": {"file": f"c{i}", "split": s, "sub": [], "statement": [["p", "n"]]}
         for i, s in enumerate(["train", "test"])}
  (tmp_path / "ann.json").write_text(json.dumps(ann))
  with h5py.File(tmp_path / "f.h5", "w") as f:
    f.create_group("c0").create_dataset("resnet_features", data=np.ones((2, 4)))
    f.create_group("c1").create_dataset("resnet_features", data=np.ones((2, 5)))  # wrong size: skipped
  args = ["--annotation", str(tmp_path / "ann.json"), "--features", str(tmp_path / "f.h5"), "--feature-dim", "4",
          "--skip-bad", "--out", str(tmp_path / "out")]
  assert cli.run(violin.main, args) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'ann.json'}: split 'test': converted 0 records "
                                             "(skipped "), err
  assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------- class 5: every reader names its file


def test_every_reader_names_its_file_before_allocating(tmp_path):
  """Headers claiming terabytes (TFRecord length, .npy / .npz member shape, HDF5 dataset, safetensors offsets), JSON
  nested too deep and a record missing a field: one ValueError naming the file, never MemoryError, RecursionError or
  a bare KeyError."""
  import io as std_io  # pylint: disable=g-import-not-at-top
  import zipfile  # pylint: disable=g-import-not-at-top
  import h5py  # pylint: disable=g-import-not-at-top
  from data_prep import features as features_lib  # pylint: disable=g-import-not-at-top
  from evqa_jax import io as evqa_io  # pylint: disable=g-import-not-at-top
  from evqa_jax.data import tfrecord  # pylint: disable=g-import-not-at-top
  tb = 10**12
  # TFRecord: a well-framed header (its CRC right) claiming a terabyte.
  length = struct.pack("<Q", tb)
  rec = tmp_path / "train-00000-of-00001.tfrecord"
  rec.write_bytes(length + struct.pack("<I", tfrecord.masked_crc(length)) + b"x" * 16)
  with open(rec, "rb") as f, pytest.raises(ValueError, match=r"corrupt TFRecord in .*train-00000-of-00001\.tfrecord "
                                           r"at byte offset 0: truncated record \(its header claims 1000000000000 "
                                           r"data bytes, the file ends at byte 28\)"):
    tfrecord.read_record(f, 0, str(rec))
  # .npy and .npz members whose header claims (10^6, 10^6) float32.
  buf = std_io.BytesIO()
  np.save(buf, np.zeros((2, 3), np.float32))
  huge = buf.getvalue().replace(b"(2, 3)", b"(1000000, 1000000)")
  (tmp_path / "f.npy").write_bytes(huge)
  with pytest.raises(ValueError, match=r"f\.npy: \.npy file: its header claims shape \(1000000, 1000000\) float32 "
                     r"\(4000000000000 bytes\) but it holds \d+ bytes; refused before allocating"):
    evqa_io.load_npy(str(tmp_path / "f.npy"))
  with zipfile.ZipFile(tmp_path / "graph_train.npz", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("node_vectors.npy", huge)
  with pytest.raises(ValueError, match=r"answer graph .*graph_train\.npz: member 'node_vectors': its header claims "
                     r"shape \(1000000, 1000000\)"):
    evqa_io.load_npz(str(tmp_path / "graph_train.npz"), "answer graph")
  # HDF5 features: a dataset declared (10^6, 10^6) with no data written.
  with h5py.File(tmp_path / "f.h5", "w") as f:
    f.create_dataset("c0/resnet_features", shape=(10**6, 10**6), dtype="f4")
  with features_lib.FeatureStore(str(tmp_path / "f.h5")) as store, pytest.raises(
      features_lib.FeatureError, match=r"f\.h5: dataset '/c0/resnet_features': the HDF5 header claims shape "
      r"\(1000000, 1000000\) float32 \(4000000000000 bytes\)"):
    store["c0"]
  # safetensors: data_offsets beyond the file.
  header = json.dumps({"w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * tb]}}).encode()
  (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
  with pytest.raises(ValueError, match=r"model\.safetensors: corrupt safetensors header: tensor 'w' of shape "
                     r"\[1000000, 1000000\] F32 needs 4000000000000 bytes"):
    hf_utils.read_checkpoint(str(tmp_path / "model.safetensors"))
  # JSON nested too deep, and a record without a field.
  (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
  with pytest.raises(ValueError, match=r"annotation file .*deep\.json: JSON nested too deeply to read"):
    evqa_io.load_json(str(tmp_path / "deep.json"), "annotation file")
  (tmp_path / "vocab.json").write_text('{"vocab_train": ["a"], "categories": {"a": "base"}}')
  vocab = evqa_io.load_json(str(tmp_path / "vocab.json"), "answer vocabulary")
  assert vocab == {"vocab_train": ["a"], "categories": {"a": "base"}} and vocab.get("train_counts") is None
  with pytest.raises(KeyError) as e:
    vocab["train_counts"]  # what the OVQA input reads
  assert isinstance(e.value, ValueError) and str(e.value) == (
      f"answer vocabulary {tmp_path / 'vocab.json'}: a record has no field 'train_counts' (its fields: "
      "'vocab_train', 'categories')")


def test_a_config_the_task_refuses_leaves_no_config_json(tmp_path):
  """The task and its model check the config against the data (records, backbone limits) after the numeric rules:
  the run's config.json is written only once they accept it, so a refused config leaves no record of a run."""
  from evqa_jax.train import trainer  # pylint: disable=g-import-not-at-top
  config = dict(_shipped_configs())["ovqa_msrvtt.py:demo"].copy_and_resolve_references()
  config.data.synthetic = ""
  config.data.dir = str(tmp_path / "absent" / "records")
  workdir = tmp_path / "run"
  with pytest.raises((ValueError, FileNotFoundError), match="absent"):
    trainer.train_and_evaluate(config, str(workdir))
  assert not (workdir / "config.json").exists()
