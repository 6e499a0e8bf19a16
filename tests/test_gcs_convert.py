"""The converters write their records straight to gs:// (data_prep/common.py: build_remote_output, publish), against a
Cloud Storage API served on 127.0.0.1 (tests/gcs_emulator.py): OVQA, VIOLIN and ST-Evidence (two splits, one per
run) from the release-shaped fixtures (data_prep/fixtures.py), and the OVQA answer graphs, give the same files as
the local conversion, read back by the trainer's readers; a publication cut half way leaves no record set (never a
mixed one) and the next run replaces it; a second converter is kept out; no converter writes over its gs:// input.
"""

import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("av")

import gcs_emulator  # noqa: E402
from gcs_runs import files as _files  # noqa: E402

from data_prep import answer_graphs, common, ovqa, st_evidence, violin  # noqa: E402
from data_prep import fixtures as R  # noqa: E402
from evqa_jax import io  # noqa: E402
from evqa_jax.data import records  # noqa: E402
from evqa_jax.data.source import TFRecordDataSource  # noqa: E402

BUCKET = "evqa-convert"
ROOT = f"gs://{BUCKET}"


@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator.running(BUCKET) as env, gcs_emulator.this_process_pointed_at(env):
    yield env


@pytest.fixture(scope="module")
def violin_release(tmp_path_factory):
  rel = R.violin_release(str(tmp_path_factory.mktemp("violin_release") / "feat"))
  return ["--annotation", os.path.join(rel["dir"], "violin_annotation.json"), "--features", rel["h5"]]


def _assert_same_files(remote, local):
  got, want = _files(remote), _files(local)
  assert sorted(got) == sorted(want)
  for rel in want:
    if rel.endswith(".json"):
      assert json.loads(got[rel]) == json.loads(want[rel]), rel
    else:
      assert got[rel] == want[rel], rel


def _assert_same_records(remote, local):
  """Every split read back by the trainer's record reader (shards from metadata.json, counts checked) is equal."""
  splits = records.load_metadata(local)["splits"]
  assert sorted(records.load_metadata(remote)["splits"]) == sorted(splits)
  for split in splits:
    a, b = TFRecordDataSource.from_split(remote, split), TFRecordDataSource.from_split(local, split)
    assert len(a) == len(b) == splits[split]["num_examples"] > 0
    for i in range(len(b)):
      x, y = a[i], b[i]
      assert x.keys() == y.keys()
      for k in y:
        np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]), err_msg=f"{split} {i} {k}")


def test_ovqa_converter_and_answer_graphs_write_to_gcs_as_to_a_folder(gcs, tmp_path):
  rel = R.msrvtt_qa(str(tmp_path / "MSRVTT-QA"))
  args = ["--csv-dir", rel["dir"], "--features", os.path.join(rel["dir"], "clipvitl14.pth"), "--subtitles",
          os.path.join(rel["dir"], "subtitles.pkl"), "--trust-pickles", "--cvqa-topk", "3"]
  local, remote = str(tmp_path / "records"), f"{ROOT}/ovqa/msrvtt/records"
  assert ovqa.main([*args, "--out", local]) == 0
  assert ovqa.main([*args, "--out", remote]) == 0
  for data in (local, remote):
    answer_graphs.main(["--data", data, "--k", "3"])
  graphs = {f"graph_{s}.npz" for s in ("train", "test")}
  got, want = _files(remote), _files(local)
  assert sorted(got) == sorted(want) and graphs <= set(want)
  for rel_path in set(want) - graphs:  # .npz members carry their write time: compared by content below
    assert (json.loads(got[rel_path]) == json.loads(want[rel_path]) if rel_path.endswith(".json")
            else got[rel_path] == want[rel_path]), rel_path
  assert not io.epath_of(f"{remote}/{common.UPLOAD_MARKER}").exists()
  assert not io.epath_of(f"{remote}/{common.OUT_LOCK}").exists()

  # The OVQA task (the trainer's reader: metadata, vocab.json, both graphs, records, split CSVs) on both.
  from configs import ovqa_msrvtt  # pylint: disable=g-import-not-at-top
  from evqa_jax.projects.ovqa.task import Task  # pylint: disable=g-import-not-at-top
  tasks = []
  for data in (remote, local):
    config = ovqa_msrvtt.get_config("tiny")
    config.data.dir, config.data.synthetic, config.verbalizer.variant = data, "", "B"
    config.graph.k = 3  # as built above
    tasks.append(Task(config))
  a, b = tasks
  assert a.input.vocab == b.input.vocab and a.input.metadata == b.input.metadata
  for split in ("train", "eval"):
    assert a.input.graphs[split].node_words == b.input.graphs[split].node_words
    np.testing.assert_array_equal(a.input.graphs[split].senders, b.input.graphs[split].senders)
  for split in ("train", "test"):
    src, ref = a.source(split), b.source(split)
    assert len(src) == len(ref) > 0
    for i in range(len(ref)):
      x, y = a.preprocess(src[i], train=False), b.preprocess(ref[i], train=False)
      for k in y:
        np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]), err_msg=f"{split} {i} {k}")


def test_violin_converter_writes_to_gcs_as_to_a_folder(gcs, tmp_path, violin_release):
  local, remote = str(tmp_path / "records"), f"{ROOT}/violin/records"
  assert violin.main([*violin_release, "--out", local]) == 0
  assert violin.main([*violin_release, "--out", remote + "/"]) == 0  # a trailing slash names the same prefix
  _assert_same_files(remote, local)
  _assert_same_records(remote, local)
  # Converted again with another shard count: the old shards are gone, the set equals the local one again.
  assert violin.main([*violin_release, "--num-shards", "2", "--out", local]) == 0
  assert violin.main([*violin_release, "--num-shards", "2", "--out", remote]) == 0
  _assert_same_files(remote, local)
  assert records.load_metadata(remote)["splits"]["train"]["shards"] == ["train-00000-of-00002.tfrecord",
                                                                      "train-00001-of-00002.tfrecord"]


def test_st_evidence_converter_adds_splits_on_gcs_as_in_a_folder(gcs, tmp_path):
  """One split per run (keep_existing): the second run keeps the first's split, in the bucket as on disk."""
  rel = R.evqa_release(str(tmp_path / "st"), height=24, width=32)
  gen = os.path.join(rel["dir"], "st_evidence_gen")
  args = ["--csv", os.path.join(gen, "st_evidence_gen.csv"), "--videos", os.path.join(gen, "videos_6fps"),
          "--masks", os.path.join(gen, "masks"), "--num-frames", "8", "--frame-size", "24", "32"]
  local, remote = str(tmp_path / "records"), f"{ROOT}/evqa/records"
  for out in (local, remote):
    assert st_evidence.main([*args, "--split", "test", "--out", out]) == 0
    assert st_evidence.main([*args, "--split", "val", "--out", out]) == 0
  assert sorted(records.load_metadata(remote)["splits"]) == ["test", "val"]
  _assert_same_files(remote, local)
  _assert_same_records(remote, local)


def test_publication_cut_half_way_leaves_no_record_set(gcs, tmp_path, violin_release, monkeypatch):
  """The upload fails after the first object: the prefix then has no metadata.json (the readers see no records,
  never the old metadata over new shards) and the marker; the next run replaces it and equals the local set."""
  local, remote = str(tmp_path / "records"), f"{ROOT}/violin_cut/records"
  assert violin.main([*violin_release, "--out", local]) == 0
  assert violin.main([*violin_release, "--out", remote]) == 0
  old_meta = records.load_metadata(remote)
  upload = common._upload_files  # pylint: disable=protected-access

  def cut(fs, local_paths, keys):
    half = len(keys) // 2
    upload(fs, local_paths[:half], keys[:half])
    raise ConnectionResetError("connection reset by peer (test)")

  monkeypatch.setattr(common, "_upload_files", cut)
  with pytest.raises(ConnectionResetError):
    violin.main([*violin_release, "--num-shards", "3", "--out", remote])
  monkeypatch.setattr(common, "_upload_files", upload)
  left = {p.name for p in io.epath_of(remote).iterdir()}
  assert any(name.endswith("-of-00003.tfrecord") for name in left), left  # half of the new set went up ...
  assert not any("-of-00001." in name for name in left), left  # ... after the old set's shards were removed
  assert records.METADATA_FILE not in left
  marker = json.loads(io.epath_of(f"{remote}/{common.UPLOAD_MARKER}").read_text())
  assert marker["converter"] == "data_prep.violin" and marker["previous_metadata"] == old_meta
  assert not io.epath_of(f"{remote}/{common.OUT_LOCK}").exists()  # the lock was released
  from configs import violin as violin_config  # pylint: disable=g-import-not-at-top
  config = violin_config.get_config("small")
  config.data.dir, config.data.synthetic = remote, ""
  with pytest.raises(FileNotFoundError, match="holds no converted"):
    records.require_records(config, "VIOLIN", "python -m data_prep.violin ...", "configs/violin.py:demo")
  with pytest.raises(ValueError, match="split 'train' not in metadata.json"):  # the half-uploaded shards: refused
    TFRecordDataSource.from_split(remote, "train")

  assert violin.main([*violin_release, "--out", remote]) == 0  # the marked prefix is ours: replaced
  _assert_same_files(remote, local)
  _assert_same_records(remote, local)


def test_gcs_out_guards(gcs, tmp_path, violin_release):
  """A prefix holding others' objects is refused; an input inside OUT is refused before anything is read; a second
  converter is kept out while one holds OUT's lease; the fixtures refuse a gs:// --out."""
  io.epath_of(f"{ROOT}/theirs/notes.txt").write_text("not ours")
  with pytest.raises(common.OutputError, match="holds objects that no converter of this project wrote"):
    violin.main([*violin_release, "--out", f"{ROOT}/theirs"])
  assert io.epath_of(f"{ROOT}/theirs/notes.txt").read_text() == "not ours"

  ann = f"{ROOT}/guard/records/violin_annotation.json"
  io.upload(violin_release[1], ann)
  for out in (f"{ROOT}/guard/records", f"{ROOT}/guard/records/", f"{ROOT}/guard"):
    with pytest.raises(ValueError, match="would destroy the input"):
      violin.main(["--annotation", ann, "--features", violin_release[3], "--out", out])
  assert [p.name for p in io.epath_of(f"{ROOT}/guard/records").iterdir()] == ["violin_annotation.json"]

  import threading  # pylint: disable=g-import-not-at-top
  from evqa_jax.runs import safeguards  # pylint: disable=g-import-not-at-top
  out = f"{ROOT}/busy/records"
  held, release = threading.Event(), threading.Event()

  def hold():
    with safeguards.remote_lock(f"{out}/{common.OUT_LOCK}", lease=30.0, heartbeat=0.3):
      held.set()
      release.wait(60)

  holder = threading.Thread(target=hold)
  holder.start()
  try:
    assert held.wait(30)
    with pytest.raises(common.OutputError, match=f"--out {out} is being written by another converter"):
      violin.main([*violin_release, "--out", out])
  finally:
    release.set()
    holder.join()
  assert not io.epath_of(out).exists()  # nothing written

  with pytest.raises(SystemExit):
    R.main(["--out", f"{ROOT}/fixtures"])
  assert not os.path.exists("gs:") and not io.epath_of(f"{ROOT}/fixtures").exists()
