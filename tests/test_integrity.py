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
  from evqa_jax.train import trainer
  from evqa_jax.runs import checkpointing, safeguards
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
  # A sweep reuses a finished point only for the experiment it trained (here the point's eps changed since).
  import test_sweep
  from launch import sweeps as sweep_lib
  (tmp_path / "toy.py").write_text(test_sweep.CONFIG)
  module = sweep_lib.load_config_module(str(tmp_path / "toy.py"))
  test_sweep._write_run(str(tmp_path / "sweep" / "eps_1.0"), sweep_lib.point_config(
      module, None, {"name": "", "overrides": {"verbalizer.eps": 0.5}}), 0.5)
  with pytest.raises(ValueError, match=r"eps_1\.0 was trained with another config; it differs in verbalizer\.eps "
                                       r"\(checkpoint: 0\.5, config: 1\.0\)"):
    sweep_lib.run_sweep(str(tmp_path / "toy.py"), "eps", str(tmp_path / "sweep"))
  # What does not change a result is not identity: logging and checkpoint keeping.
  config = tiny_config(world)
  config.log_every_steps = 5
  config.checkpoint.max_to_keep = 4
  from evqa_jax.runs import workdir as workdir_lib
  assert workdir_lib.identity_diffs(workdir_lib.config_identity(config),
                                    workdir_lib.config_identity(tiny_config(world))) == []


# --------------------------------------------------------------- 2. a dataset smaller than its metadata is an error

def _split(root, n=6, shards=2):
  from data_prep import ovqa
  from evqa_jax.data import records
  spec = ovqa.record_spec(2, 4)
  exs = [{"index": np.int64(i), "id": str(i), "video_id": "v", "question": "q", "answer": "a",
          "question_type": np.int64(-1), "subtitles": "", "video": np.zeros((2, 4), np.float16),
          "video_mask": np.ones(2, np.int64)} for i in range(n)]
  records.write_split(str(root), "train", exs, spec, num_shards=shards)
  return records.split_paths(str(root), "train")


def _cut_last_record(shard):
  """Cuts the shard and its .idx at the boundary before their last record (both stay self-consistent)."""
  from evqa_jax.data import tfrecord
  offsets = tfrecord.load_index(shard)
  with open(shard, "r+b") as f:
    f.truncate(int(offsets[-1]))
  with open(shard + ".idx", "r+b") as f:
    f.truncate(8 * (len(offsets) - 1))


@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
def test_a_dataset_smaller_than_its_metadata_is_never_silent(tmp_path, on_corrupt):
  from evqa_jax.data import records, tfrecord
  from evqa_jax.data.source import TFRecordDataSource
  # (a) An .idx cut in half: an error naming it (raise), or the shard scanned instead of the index (skip): never a
  # dataset of 4 where there are 6.
  shards = _split(tmp_path / "a")
  with open(shards[1] + ".idx", "r+b") as f:
    f.truncate(8)
  if on_corrupt == "raise":
    with pytest.raises(ValueError, match=r"\.idx lists 1 records but .*metadata\.json says shard .* holds 3"):
      TFRecordDataSource.from_split(str(tmp_path / "a"), "train", on_corrupt=on_corrupt)
    # Without metadata.json at all, the index is compared with the shard it indexes.
    spec = records.load_spec(str(tmp_path / "a"), "train")
    os.remove(tmp_path / "a" / "metadata.json")
    with pytest.raises(ValueError, match=r"train-00001-of-00002\.tfrecord\.idx lists 1 records ending at byte .* "
                                         r"the index is short"):
      TFRecordDataSource(shards, spec)
  else:
    assert len(TFRecordDataSource.from_split(str(tmp_path / "a"), "train", on_corrupt=on_corrupt)) == 6
  # (b) A shard and its index both cut at a record boundary: found by shard_sizes, and without them (older
  # metadata) by the split's num_examples.
  shards = _split(tmp_path / "b")
  _cut_last_record(shards[0])
  with pytest.raises(ValueError, match=r"lists 2 records but .*says shard train-00000-of-00002\.tfrecord holds 3"):
    TFRecordDataSource.from_split(str(tmp_path / "b"), "train", on_corrupt=on_corrupt)
  meta = records.load_metadata(str(tmp_path / "b"))
  del meta["splits"]["train"]["shard_sizes"]
  (tmp_path / "b" / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=r"split 'train': its shards .* hold 5 records but .*metadata\.json says 6 "
                                       r"\(num_examples\)"):
    TFRecordDataSource.from_split(str(tmp_path / "b"), "train", on_corrupt=on_corrupt)
  # (c) Skipping a corrupt record stays possible (listed, with a warning): it is accounted for.
  shards = _split(tmp_path / "c")
  off = int(tfrecord.load_index(shards[0])[1])
  with open(shards[0], "r+b") as f:
    f.seek(off + tfrecord.HEADER_BYTES + 3)
    b = f.read(1)
    f.seek(off + tfrecord.HEADER_BYTES + 3)
    f.write(bytes([b[0] ^ 1]))
  if on_corrupt == "skip":
    src = TFRecordDataSource.from_split(str(tmp_path / "c"), "train", on_corrupt="skip")
    assert len(src) == 5 and src.num_skipped == 1 and src.skipped[0][1] == off


# -------------------------------------------------------------------- 4. a pretrained config.json must match

def _grow_layers(path):
  cfg = json.loads((path / "config.json").read_text())
  cfg["num_hidden_layers"] += 1
  (path / "config.json").write_text(json.dumps(cfg))


def test_pretrained_config_that_implies_missing_tensors_is_an_error(tmp_path):
  torch = pytest.importorskip("torch")
  import jax
  import transformers
  from evqa_jax.models import bert, clip_vision, deberta_v2
  torch.manual_seed(0)
  small = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
               max_position_embeddings=24)
  # Abstract init params (shapes only): the check comes before any parameter is filled, so nothing is compiled.
  cases = (
      ("bert", transformers.BertForMaskedLM(transformers.BertConfig(**small)), bert.BertConfig,
       lambda c, p: bert.load_hf_params(c, p, jax.eval_shape(lambda: bert.init_variables(c, jax.random.PRNGKey(0)))),
       "encoder/layer_2/"),
      ("deberta", transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
          **small, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
          position_biased_input=False, norm_rel_ebd="layer_norm", type_vocab_size=0)), deberta_v2.DebertaV2Config,
       lambda c, p: deberta_v2.load_hf_params(c, p, jax.eval_shape(
           lambda: deberta_v2.init_variables(c, jax.random.PRNGKey(0)))),
       "deberta/encoder/layer_2/"),
      ("clip", transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
          hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=8,
          patch_size=4)), clip_vision.CLIPVisionConfig,
       lambda c, p: clip_vision.load_hf_params(c, p, jax.eval_shape(
           lambda: {"params": clip_vision.init_params_boxed(c, jax.random.PRNGKey(0))})), "encoder_layers_2/"),
  )
  for name, model, cfg_cls, load, missing in cases:
    path = tmp_path / name
    model.save_pretrained(str(path))
    _grow_layers(path)  # config.json now says 3 layers beside weights of 2
    with pytest.raises(ValueError) as e:
      load(cfg_cls.from_hf_dir(str(path)), str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}/model.safetensors: ") and f"{path}/config.json implies are not in the weights" \
        in msg, msg
    assert missing in msg, (name, msg)


# ------------------------------------------------------------ 5. no command writes what it reads, or through a link

def test_no_command_writes_to_an_input_or_through_a_link(tmp_path, capsys):
  from data_prep import ovqa, st_evidence
  from evqa_jax.evaluate import ovqa as ovqa_eval
  from evqa_jax.evaluate import st_evidence as st_eval
  from evqa_jax.evaluate import st_evidence_mcq as mcq_eval
  from evqa_jax.evaluate import violin as violin_eval
  import test_hardening
  # Evaluators: --out / --plot naming the ground truth or the predictions (also through a symlink).
  (tmp_path / "ann.json").write_text('{"c0": {"split": "test", "statement": [["p", "n"]]}}')
  (tmp_path / "pred.json").write_text('{"c0": [[0.5, 0.4]]}')
  (tmp_path / "link.json").symlink_to(tmp_path / "ann.json")
  kept = {p: p.read_bytes() for p in (tmp_path / "ann.json", tmp_path / "pred.json")}
  for out in ("ann.json", "pred.json", "link.json"):
    code, err = _run(violin_eval.main, ["--gt", tmp_path / "ann.json", "--pred", tmp_path / "pred.json",
                                        "--out", tmp_path / out], capsys)
    _one_line_error(code, err, f"--out {tmp_path / out} is or holds the input")
  with open(tmp_path / "test.csv", "w", newline="") as f:
    csv.writer(f).writerows([["answer"], ["dog"]])
  (tmp_path / "p.csv").write_text("index,prediction\n0,dog\n")
  code, err = _run(ovqa_eval.main, ["--train-csv", tmp_path / "test.csv", "--test-csv", tmp_path / "test.csv",
                                    "--pred", tmp_path / "p.csv", "--out", tmp_path / "m.json",
                                    "--plot", tmp_path / "p.csv"], capsys)
  _one_line_error(code, err, "--plot", "is or holds the input --pred")
  with open(tmp_path / "gt.csv", "w", newline="") as f:
    csv.writer(f).writerows([["entry_id", "candidates", "answer", "segment"], ["e0", "['a', 'b']", "a", "[[0, 1]]"]])
  (tmp_path / "st.json").write_text("{}")
  code, err = _run(st_eval.main, ["--gt-csv", tmp_path / "gt.csv", "--pred", tmp_path / "st.json",
                                  "--per-entry", tmp_path / "gt.csv"], capsys)
  _one_line_error(code, err, "--per-entry", "is or holds the input --gt-csv")
  code, err = _run(mcq_eval.main, [tmp_path / "st.json", "--out", tmp_path / "st.json"], capsys)
  _one_line_error(code, err, "--out", "is or holds the input --results")
  assert {p: p.read_bytes() for p in kept} == kept and (tmp_path / "gt.csv").read_text().startswith("entry_id")
  # A converter's --authors-vocab inside --out (which the converter replaces as a whole).
  raw = test_hardening._ovqa_release(tmp_path / "raw")
  args = ["--csv-dir", raw, "--features", raw / "features.npz", "--feature-dim", 4, "--num-frames", 2]
  assert cli.run(ovqa.main, [str(a) for a in args + ["--out", tmp_path / "out"]]) == 0
  (tmp_path / "out" / "authors").mkdir()
  (tmp_path / "out" / "authors" / "train_vocab.json").write_text('{"dog": 0}')
  code, err = _run(ovqa.main, args + ["--out", tmp_path / "out", "--authors-vocab", tmp_path / "out" / "authors"],
                   capsys)
  _one_line_error(code, err, f"--out {tmp_path / 'out'} is or holds the input --authors-vocab")
  assert (tmp_path / "out" / "authors" / "train_vocab.json").exists()
  # A symlink inside an existing output folder that leads outside it (ST-Evidence starts from the old output).
  st_raw = test_hardening._st_release(tmp_path / "st_raw")
  st_args = ["--csv", st_raw / "test.csv", "--frames", st_raw / "frames", "--masks", st_raw / "masks",
             "--frame-size", 8, 8, "--num-frames", 2, "--out", tmp_path / "st_out"]
  assert cli.run(st_evidence.main, [str(a) for a in st_args]) == 0
  victim = tmp_path / "victim.txt"
  victim.write_text("outside")
  (tmp_path / "st_out" / "test-00000-of-00001.tfrecord.lnk").symlink_to(victim)
  code, err = _run(st_evidence.main, st_args, capsys)
  _one_line_error(code, err, "is a symbolic link to", "outside")
  assert victim.read_text() == "outside"


# --------------------------------------------------------------------- 6. one reader per file kind

def test_one_reader_per_file_kind(tmp_path, capsys):
  from data_prep import features as features_lib
  from data_prep import st_evidence, violin
  from evqa_jax.evaluate import st_evidence as st_eval
  # Mask PNGs: palette (index 0 is not black), RGBA (transparent but coloured, opaque but black) and grey masks
  # read the same in the converter and the evaluator, by the official rule convert('L') > 0.
  pal = Image.fromarray(np.array([[0, 1], [2, 0]], np.uint8), mode="P")
  pal.putpalette([200, 200, 200, 0, 0, 0, 255, 0, 0] + [0] * 759)
  rgba = Image.fromarray(np.array([[[0, 0, 0, 255], [255, 255, 255, 0]], [[0, 0, 1, 0], [9, 9, 9, 9]]], np.uint8),
                         mode="RGBA")
  for name, im in (("pal.png", pal), ("rgba.png", rgba)):
    im.save(tmp_path / name)
    want = np.asarray(Image.open(tmp_path / name).convert("L")) > 0
    conv = st_evidence.read_mask_png(str(tmp_path / name), "w")
    ev = st_eval.read_mask(str(tmp_path / name))
    np.testing.assert_array_equal(conv.astype(bool), want, err_msg=name)
    np.testing.assert_array_equal(ev, want, err_msg=name)
  # (palette index 0 is grey: object; 1 black: background; 2 red: object. The raw indices said [[0, 1], [1, 0]].)
  assert st_evidence.read_mask_png(str(tmp_path / "pal.png"), "w").tolist() == [[1, 0], [1, 1]]
  # Ids with surrounding spaces: one rule (refused, naming the row) in converter, evaluator and id check alike.
  with pytest.raises(ValueError, match="leading or trailing whitespace"):
    evqa_io.check_id(" e0", "f.csv: row 2")
  import test_hardening
  raw = test_hardening._st_release(tmp_path / "raw", entry_id="e0 ")
  code, err = _run(st_evidence.main, ["--csv", raw / "test.csv", "--frames", raw / "frames", "--masks", raw / "masks",
                                      "--frame-size", 8, 8, "--num-frames", 2, "--out", tmp_path / "o"], capsys)
  _one_line_error(code, err, "row 2", "'e0 '", "whitespace")
  with open(tmp_path / "gt.csv", "w", newline="") as f:
    csv.writer(f).writerows([["entry_id", "candidates", "answer", "segment"], ["e0 ", "['a', 'b']", "a", "[[0, 1]]"]])
  (tmp_path / "p.json").write_text("{}")
  code, err = _run(st_eval.main, ["--gt-csv", tmp_path / "gt.csv", "--pred", tmp_path / "p.json",
                                  "--out", tmp_path / "m.json"], capsys)
  _one_line_error(code, err, "gt.csv line 2", "'e0 '", "whitespace")
  # JSON: a repeated key (a VIOLIN clip id listed twice: the test entry would become the train one) is an error.
  ann = tmp_path / "ann.json"
  entry = '{"file": "f", "split": "%s", "sub": [], "statement": [["p", "n"]]}'
  ann.write_text('{"c0": %s,\n "c0": %s}' % (entry % "test", entry % "train"))
  code, err = _run(violin.main, ["--annotation", ann, "--features", tmp_path / "f.h5", "--out", tmp_path / "v"],
                   capsys)
  _one_line_error(code, err, "ann.json", "key 'c0' appears twice")
  # Features: float64 values that overflow float32 (1e200) are not finite features, in every converter.
  x = np.full((3, 4), 1e200)
  with pytest.raises(features_lib.FeatureError,
                     match=r"w: features hold non-finite values \(NaN, inf, or beyond float32: 1e\+200 at \(0, 0\)\)"):
    features_lib.check_video(x, 4, "w")
  import h5py
  with h5py.File(tmp_path / "f.h5", "w") as h5:
    h5.create_dataset("c0/resnet_features", data=x)
  with pytest.raises(violin.ConversionError, match=r"f\.h5: clip 'c0': field 'c0/resnet_features'.*beyond float32"):
    with h5py.File(tmp_path / "f.h5", "r") as h5:
      violin.load_clip_features(h5, "c0", "resnet", 4, str(tmp_path / "f.h5"))


# ----------------------------------------------------------------------------- 7. every read error names the file

def test_every_read_error_names_the_file(tmp_path, capsys):
  from data_prep import ovqa_authors, st_evidence
  from evqa_jax.data import records
  from evqa_jax.graphs import answer_graph
  # Non-UTF-8 JSON: dataset metadata, answer vocabulary, the authors' files.
  for name, read in (("metadata.json", lambda p: records.load_metadata(str(p.parent))),
                     ("vocab.json", lambda p: evqa_io.load_json(str(p), "answer vocabulary")),
                     ("ans2cat.json", lambda p: ovqa_authors._load(str(p)))):
    d = tmp_path / name.split(".")[0]
    d.mkdir()
    (d / name).write_bytes(b'{"dog": "\xff"}')
    with pytest.raises(ValueError, match=rf"{d / name}.*not UTF-8"):
      read(d / name)
  # A pickle inside an answer graph .npz: refused, naming the file.
  np.savez(tmp_path / "graph_train.npz", node_words=np.array([{"x": 1}], dtype=object))
  with pytest.raises(evqa_io.UnsafeInputError, match=rf"{tmp_path / 'graph_train.npz'}.*pickled"):
    answer_graph.load_answer_graph(str(tmp_path / "graph_train.npz"))
  # A decompression-bomb PNG: a per-item error naming the file, which --skip-bad skips.
  from PIL import Image as PILImage
  raw = tmp_path / "raw"
  import test_hardening
  test_hardening._st_release(raw)
  bomb = raw / "masks" / "e0" / "00001.png"
  PILImage.new("1", (12000, 12000)).save(bomb)  # 144 M pixels > PIL's 89 M limit; a few KiB on disk
  with pytest.raises(ValueError, match=rf"{bomb}: refused as a decompression bomb"):
    evqa_io.read_mask(str(bomb))
  with pytest.raises(st_evidence.ConversionError, match=rf"w: mask {bomb}: refused as a decompression bomb"):
    st_evidence.read_mask_png(str(bomb), "w")
  # In a conversion: a second entry whose only mask is the bomb is one bad entry, which --skip-bad skips.
  (raw / "masks" / "e1").mkdir()
  os.replace(bomb, raw / "masks" / "e1" / "00000.png")
  with open(raw / "test.csv", "a", newline="") as f:
    csv.writer(f).writerow(["e1", "vid0", "", "what?", "['a', 'b']", "a", "[[0.0, 0.2]]"])
  args = ["--csv", raw / "test.csv", "--frames", raw / "frames", "--masks", raw / "masks", "--frame-size", 8, 8,
          "--num-frames", 2, "--out", tmp_path / "out"]
  code, err = _run(st_evidence.main, args, capsys)
  _one_line_error(code, err, "e1", f"{raw / 'masks' / 'e1' / '00000.png'}: refused as a decompression bomb")
  assert cli.run(st_evidence.main, [str(a) for a in args + ["--skip-bad"]]) == 0
  assert records.load_metadata(str(tmp_path / "out"))["conversion"]["test"]["skipped"] == {"unreadable_image": 1}
