"""Data on any filesystem: records, `.idx` indexes, metadata, vocabularies, graphs and split CSVs are read through
etils.epath, so `config.data.dir = gs://bucket/...` works.

The non-local filesystem is fsspec's in-memory one, mounted under gs:// for the test (the data lives in no local
file, so any plain `open()` / `os.path` on a data path fails); every record, index, graph and vocabulary read from it
must equal the local copy's.
"""

import json
import os
import pickle
import shutil
import sys
from unittest import mock

from fsspec.implementations.memory import MemoryFileSystem
import numpy as np
import pytest
from etils import epath
from etils.epath import backend as epath_backend
from etils.epath import gpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from evqa_jax.data import records, tfrecord  # noqa: E402
from evqa_jax.data.example import Feature  # noqa: E402
from evqa_jax.data.source import TFRecordDataSource  # noqa: E402
from evqa_jax.evaluate import ovqa as ovqa_cli  # noqa: E402
from evqa_jax.graphs import answer_graph  # noqa: E402

SPEC = {"video": Feature("float32", (None, 4)), "question": Feature("string", ()), "label": Feature("int64", ())}
BUCKET = "gs://evqa-test-bucket/records"


class _InMemoryGCS(epath_backend._FileSystemSpecBackend):  # pylint: disable=protected-access
  """gs:// paths served by fsspec's in-memory filesystem: not local, no network."""

  def __init__(self):
    self.memfs = MemoryFileSystem()
    self.memfs.store.clear()
    self.memfs.pseudo_dirs.clear()
    self.memfs.pseudo_dirs.append("")

  def fs(self, path):
    return self.memfs


@pytest.fixture
def gcs():
  """An in-memory gs:// for the test (epath would route gs:// to TensorFlow's gfile, which needs the network)."""
  backend = _InMemoryGCS()
  with mock.patch.object(gpath, "_PREFIX_TO_BACKEND", dict(gpath._PREFIX_TO_BACKEND, gs=backend)), \
       mock.patch.object(gpath, "_is_tf_installed", lambda: False):
    yield backend


def _upload(local_dir: str, uri: str, skip=()) -> None:
  for name in sorted(os.listdir(local_dir)):
    if os.path.isfile(os.path.join(local_dir, name)) and name not in skip:
      target = epath.Path(uri) / name
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(open(os.path.join(local_dir, name), "rb").read())


def _examples(n):
  r = np.random.RandomState(0)
  return [{"video": r.normal(size=(1 + i % 3, 4)).astype(np.float32), "question": f"question {i} ü",
           "label": np.int64(i * 7)} for i in range(n)]


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_records_and_indexes_read_from_gs_equal_the_local_ones(tmp_path, gcs):
  local = str(tmp_path / "records")
  examples = _examples(11)
  assert records.write_split(local, "train", examples, SPEC, num_shards=3) == 11
  # Shard 1 goes up without its .idx: its offsets are rebuilt by scanning the gs:// file.
  missing_idx = records.load_metadata(local)["splits"]["train"]["shards"][1] + ".idx"
  _upload(local, BUCKET, skip=(missing_idx,))
  assert not os.path.exists(BUCKET) and not (epath.Path(BUCKET) / missing_idx).exists()

  assert records.load_metadata(BUCKET) == records.load_metadata(local)
  assert records.load_spec(BUCKET, "train") == records.load_spec(local, "train")
  paths = records.split_paths(BUCKET, "train")
  assert paths == [f"{BUCKET}/train-0000{i}-of-00003.tfrecord" for i in range(3)]
  np.testing.assert_array_equal(tfrecord.load_index(paths[1]), tfrecord.build_index(
      os.path.join(local, os.path.basename(paths[1]))))

  src = TFRecordDataSource.from_split(BUCKET, "train")
  ref = TFRecordDataSource.from_split(local, "train")
  assert len(src) == len(ref) == 11
  for i in range(11):
    _assert_same(src[i], ref[i])
  assert src[4]["question"] == "question 4 ü" and int(src[4]["label"]) == 28
  # Grain workers get a pickled copy: it reopens the gs:// files itself.
  copy = pickle.loads(pickle.dumps(src))
  _assert_same(copy[10], ref[10])
  # on_corrupt="skip" checks every record of every gs:// file up front (the CRC scan path).
  assert len(TFRecordDataSource.from_split(BUCKET, "train", on_corrupt="skip")) == 11

  # Without metadata.json's shard list, shards are found by name in the gs:// directory.
  meta = records.load_metadata(local)
  del meta["splits"]
  (epath.Path(BUCKET) / "metadata.json").write_text(json.dumps(meta))
  assert records.split_paths(BUCKET, "train") == paths

  with pytest.raises(FileNotFoundError, match=r"gs://evqa-test-bucket/records: no TFRecord shards for split 'val'"):
    records.split_paths(BUCKET, "val")


def test_answer_graph_vocabulary_and_split_csv_read_from_gs(tmp_path, gcs):
  graph = answer_graph.AnswerGraph(node_words=["dog", "cat", "pet", "animal"], senders=np.array([0, 1, 2, 3, 0, 1]),
                                   receivers=np.array([2, 2, 3, 3, 0, 1]), num_answers=2, info={"hops": 2})
  local = tmp_path / "graph_train.npz"
  graph.save(str(local))
  _upload(str(tmp_path), BUCKET)
  loaded = answer_graph.load_answer_graph(f"{BUCKET}/graph_train.npz")
  assert loaded.node_words == graph.node_words and loaded.num_answers == 2 and loaded.info == {"hops": 2}
  np.testing.assert_array_equal(loaded.senders, graph.senders)
  np.testing.assert_array_equal(loaded.receivers, graph.receivers)

  (epath.Path(BUCKET) / "test.csv").write_text("index,question,answer\n0,what?,dog\n1,who?,a cat\n")
  assert ovqa_cli.read_answers(f"{BUCKET}/test.csv") == ["dog", "a cat"]
  with pytest.raises(FileNotFoundError, match=r"gs://evqa-test-bucket/records/val.csv does not exist"):
    ovqa_cli.read_answers(f"{BUCKET}/val.csv")


def test_ovqa_task_reads_its_whole_data_dir_from_gs(gcs, monkeypatch):
  """The OVQA task on the small synthetic world, uploaded to gs://: metadata, vocab.json, both graphs and every
  record equal the local directory's."""
  from configs import ovqa_msrvtt
  from data_prep import worlds
  from evqa_jax.projects.ovqa import evaluator as ovqa_evaluator
  from evqa_jax.projects.ovqa.task import Task
  monkeypatch.chdir(REPO)
  config = ovqa_msrvtt.get_config("demo,small")
  worlds.ensure_synthetic_world(config)  # the small world, generated on first use
  local_task = Task(config)
  _upload(os.path.abspath(config.data.dir), BUCKET)
  config.data.dir = BUCKET
  task = Task(config)
  assert task.input.vocab == local_task.input.vocab and task.input.metadata == local_task.input.metadata
  for split in ("train", "eval"):
    assert task.input.graphs[split].node_words == local_task.input.graphs[split].node_words
    np.testing.assert_array_equal(task.input.graphs[split].senders, local_task.input.graphs[split].senders)
  src, ref = task.source("test"), local_task.source("test")
  assert len(src) == len(ref) > 0
  for i in (0, len(ref) // 2, len(ref) - 1):
    _assert_same(task.preprocess(src[i], train=False), local_task.preprocess(ref[i], train=False))
  assert (ovqa_cli.read_answers(ovqa_evaluator.split_csv(BUCKET, "test"))
          == ovqa_cli.read_answers(ovqa_evaluator.split_csv(local_task.input.data_dir, "test")))
