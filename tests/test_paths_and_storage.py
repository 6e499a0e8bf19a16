"""Where a command writes and what it reads (issue 58, round 4): one object under two spellings is one object
(`io.storage_address`), training's workdir is guarded like a converter's --out (`safeguards.check_workdir_paths`),
storage that cannot be used is one line naming the flag or config key (`io.check_storage`, bounded in time), and
`--checkpoint=last` of a run still training reads a finished step even as old ones rotate away
(`checkpointing.load_checkpoint_arrays`). Every guard here fires before training, so no run is trained."""

import contextlib
import csv
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gcs_emulator
from evqa_jax import cli
from evqa_jax import io

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "evqa-paths"


def _run(main, args, capsys):
  capsys.readouterr()
  code = cli.run(main, [str(a) for a in args])
  return code, capsys.readouterr().err


def _one_line_error(code, err, *parts):
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == cli.EXIT_BAD_INPUT and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
  for part in parts:
    assert part in lines[0], (part, lines[0])
  return lines[0]


# ------------------------------------------------------------------------ 1. the same object under two spellings

def test_one_object_under_two_spellings_is_one_object(tmp_path, capsys, monkeypatch):
  from data_prep import common
  from evqa_jax.evaluate import ovqa as ovqa_eval
  # An evaluator's --out spelling its --test-csv another way: refused before anything is read or written (no
  # storage is touched: the comparison comes first).
  inputs = ["--test-csv", "gs://b/ovqa/out/test.csv", "--pred", "gs://b/ovqa/out/pred.csv"]
  for out in ("gs://b/ovqa/out/./test.csv", "gs://b//ovqa/out/test.csv", "gcs://b/ovqa/out/test.csv",
              "gs://b/ovqa/out/"):
    code, err = _run(ovqa_eval.main, inputs + ["--out", out], capsys)
    _one_line_error(code, err, f"--out {out} is or holds the input --test-csv gs://b/ovqa/out/test.csv")
  code, err = _run(ovqa_eval.main, inputs + ["--out", "gs://b/ovqa/x/../out/test.csv"], capsys)
  _one_line_error(code, err, "--out gs://b/ovqa/x/../out/test.csv: '..' in a gs:// path")
  # What the storage addresses: the guard's spelling is the one every reader and writer of evqa_jax.io uses.
  for spelling in ("gs://b/ovqa/out/./test.csv", "gs://b//ovqa/out/test.csv", "gs://b/ovqa//out/./test.csv/",
                   "gcs://b/ovqa/out/test.csv", "GS://b/ovqa/out/test.csv"):
    assert io.storage_address(spelling) == "gs://b/ovqa/out/test.csv", spelling
    assert os.fspath(io.epath_of(spelling)) == "gs://b/ovqa/out/test.csv", spelling
  with pytest.raises(ValueError, match=r"'\.\.' in a gs:// path"):
    io.storage_address("gs://b/ovqa/x/../out/test.csv")
  # A converter's gs:// --out holding its input under another spelling.
  with pytest.raises(common.OutputError, match=r"--out gs://b/ovqa/\./records is or holds the input"):
    common.check_out("gs://b/ovqa/./records", ["gs://b//ovqa/records/train.csv"])
  # Local spellings: relative vs absolute, `..`, `/./`, `//`, a symlinked folder.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "d").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "d")
  with open(tmp_path / "d" / "test.csv", "w", newline="") as f:
    csv.writer(f).writerows([["answer"], ["dog"]])
  (tmp_path / "d" / "p.csv").write_text("index,prediction\n0,dog\n")
  kept = (tmp_path / "d" / "test.csv").read_bytes()
  os.link(tmp_path / "d" / "test.csv", tmp_path / "hard.csv")  # one file, two names (so is another letter case
  # on a case-insensitive disk)
  for out in ("d/test.csv", f"{tmp_path}/d/../d/test.csv", f"{tmp_path}/./d//test.csv", "link/test.csv",
              "hard.csv"):
    code, err = _run(ovqa_eval.main, ["--test-csv", tmp_path / "d" / "test.csv", "--pred", "d/p.csv",
                                      "--out", out], capsys)
    _one_line_error(code, err, f"--out {out} is or holds the input --test-csv")
  assert (tmp_path / "d" / "test.csv").read_bytes() == kept


# ------------------------------------------------------------------------ 2. training's workdir input/output guard

def _config(**paths):
  from launch import overrides
  config = overrides.load_config(os.path.join(REPO, "configs", "ovqa_msrvtt.py") + ":demo,small")
  with config.unlocked():
    for key, value in paths.items():
      node = config
      *parents, leaf = key.split(".")
      for part in parents:
        node = node[part]
      node[leaf] = value
  return config


def test_training_workdir_is_guarded_like_an_output(tmp_path, capsys):
  from evqa_jax.train import trainer
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text('{"model_type": "bert"}')
  before = sorted(os.listdir(model))
  # --workdir is the pretrained folder, holds it, or lies inside it: refused before anything is written there.
  for workdir, words in ((model, "is or holds"), (tmp_path, "is or holds"), (model / "run", "lies inside")):
    with pytest.raises(ValueError, match=f"--workdir {workdir} {words} config.pretrained.dir {model}"):
      trainer.train_and_evaluate(_config(**{"pretrained.dir": str(model)}), str(workdir))
    assert sorted(os.listdir(model)) == before and (model / "config.json").read_text() == '{"model_type": "bert"}'
  assert not (model / "run").exists()
  # Any input path of the config: the records, init_from, evaluation (launch/evaluate.py) alike.
  data = tmp_path / "records"
  data.mkdir()
  with pytest.raises(ValueError, match="config.data.dir"):
    trainer.train_and_evaluate(_config(**{"data.dir": str(data)}), str(data))
  (tmp_path / "init.pth").write_bytes(b"weights")
  with pytest.raises(ValueError, match="config.pretrained.init_from"):
    trainer.evaluate_checkpoint(_config(**{"pretrained.init_from": str(tmp_path / "init.pth")}),
                                str(tmp_path / "init.pth"), None)
  assert (tmp_path / "init.pth").read_bytes() == b"weights"
  # The command line: one line naming the key, exit 2, nothing written.
  env = dict(os.environ, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/ovqa_msrvtt.py:demo,small",
                        f"--workdir={model}", f"--config.pretrained.dir={model}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  _one_line_error(out.returncode, out.stderr, "--workdir", "is or holds config.pretrained.dir")
  assert sorted(os.listdir(model)) == before
  # A symlink inside the workdir leading outside it (the history log, the evaluation folder): refused, not followed.
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "victim.jsonl").write_text("keep\n")
  for name, target in (("train_history.jsonl", outside / "victim.jsonl"), ("eval", outside),
                       ("final_metrics.json", outside / "missing.json")):
    workdir = tmp_path / f"run_{name.split('.')[0]}"
    workdir.mkdir()
    (workdir / name).symlink_to(target)
    with pytest.raises(ValueError, match=f"{workdir / name} is a symbolic link to {target}, outside {workdir}"):
      trainer.train_and_evaluate(_config(), str(workdir))
    assert sorted(os.listdir(workdir)) == [name]
  assert sorted(os.listdir(outside)) == ["victim.jsonl"] and (outside / "victim.jsonl").read_text() == "keep\n"


# ------------------------------------------------------------------------ 4. storage errors name the flag and path

@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator.running(BUCKET) as env, gcs_emulator.this_process_pointed_at(env):
    yield env


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]  # closed again when the block ends: connections are refused


@contextlib.contextmanager
def _no_credentials_endpoint():
  """A Cloud Storage endpoint on 127.0.0.1 that answers every request as the real one answers an anonymous caller
  (no credentials) on a private bucket: 401 with Cloud Storage's JSON error."""
  body = json.dumps({"error": {"code": 401, "message": "Anonymous caller does not have storage.objects.list access "
                               "to the Google Cloud Storage bucket. Permission 'storage.objects.list' denied on "
                               "resource (or it may not exist)."}}).encode()

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
      self.send_response(401)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield server.server_address[1]
  finally:
    server.shutdown()
    server.server_close()


def test_storage_that_cannot_be_used_is_one_line_naming_the_flag(gcs, tmp_path, capsys, monkeypatch):
  del gcs
  from evqa_jax.evaluate import ovqa as ovqa_eval
  from evqa_jax.train import trainer
  io.epath_of(f"gs://{BUCKET}/ovqa/test.csv").write_text("answer\ndog\n")
  io.epath_of(f"gs://{BUCKET}/ovqa/pred.csv").write_text("index,prediction\n0,dog\n")
  ok = ["--test-csv", f"gs://{BUCKET}/ovqa/test.csv", "--pred", f"gs://{BUCKET}/ovqa/pred.csv", "--train-csv",
        f"gs://{BUCKET}/ovqa/test.csv"]
  assert cli.run(ovqa_eval.main, ok + ["--out", str(tmp_path / "m.json")]) == 0
  # A bucket that does not exist, as an input and as the output.
  code, err = _run(ovqa_eval.main, ["--test-csv", "gs://no-such-bucket/ovqa/test.csv", *ok[2:],
                                    "--out", tmp_path / "m2.json"], capsys)
  _one_line_error(code, err, "the input --test-csv gs://no-such-bucket/ovqa/test.csv: bucket 'no-such-bucket' does "
                  "not exist")
  code, err = _run(ovqa_eval.main, ok + ["--out", "gs://no-such-bucket/m.json"], capsys)
  _one_line_error(code, err, "--out gs://no-such-bucket/m.json: bucket 'no-such-bucket' does not exist")
  assert not (tmp_path / "m2.json").exists()
  from data_prep import answer_graphs
  code, err = _run(answer_graphs.main, ["--data", "gs://no-such-bucket/ovqa"], capsys)
  _one_line_error(code, err, "--data gs://no-such-bucket/ovqa/graph_train.npz: bucket 'no-such-bucket' does not exist")
  # A name Cloud Storage refuses: said without asking the store.
  code, err = _run(ovqa_eval.main, ok + ["--out", "gs://My_Bucket!/m.json"], capsys)
  _one_line_error(code, err, "--out gs://My_Bucket!/m.json: 'My_Bucket!' is not a Cloud Storage bucket name")
  # Training: the config key that names the path.
  with pytest.raises(OSError, match="config.data.dir gs://no-such-bucket/records: bucket 'no-such-bucket' does not"):
    trainer.train_and_evaluate(_config(**{"data.dir": "gs://no-such-bucket/records"}), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  # No answer (no network, a wrong endpoint; gcsfs alone retries for about a minute): one line within the bound.
  monkeypatch.setenv(io.STORAGE_TIMEOUT_ENV, "3")
  with gcs_emulator.this_process_pointed_at(gcs_emulator.client_env(_closed_port())):
    t0 = time.time()
    code, err = _run(ovqa_eval.main, ["--test-csv", "gs://unreachable-bucket/t.csv", *ok[2:],
                                      "--out", tmp_path / "m3.json"], capsys)
    took = time.time() - t0
  _one_line_error(code, err, "the input --test-csv gs://unreachable-bucket/t.csv: Cloud Storage did not answer "
                  "within 3 s")
  assert took < 10, took
  # No credentials: Cloud Storage answers an anonymous caller 401 (gcsfs falls back to anonymous access).
  with _no_credentials_endpoint() as port, gcs_emulator.this_process_pointed_at(gcs_emulator.client_env(port)):
    code, err = _run(ovqa_eval.main, ["--test-csv", "gs://private-bucket/t.csv", *ok[2:],
                                      "--out", tmp_path / "m4.json"], capsys)
  _one_line_error(code, err, "the input --test-csv gs://private-bucket/t.csv: access to bucket 'private-bucket' "
                  "denied (", "no credentials")
  assert not any((tmp_path / f"m{i}.json").exists() for i in (2, 3, 4))


# ------------------------------------------------------------------------ 9. --checkpoint=last of a running trainer

def test_last_checkpoint_of_a_run_still_training(tmp_path, monkeypatch, capsys):
  import jax.numpy as jnp
  import ml_collections
  import orbax.checkpoint as ocp
  from evqa_jax.runs import checkpointing, safeguards
  config = ml_collections.ConfigDict({"checkpoint": {"max_to_keep": 2, "replica_parallel": None}})
  mngr = checkpointing.make_checkpoint_manager(str(tmp_path), config)

  def save(step):  # as the trainer saves: the state and its checksums; step N's weights are N * [0 .. 5]
    state = {"w": jnp.arange(6, dtype=jnp.float32) * step}
    meta = {"step": step, "checksums": safeguards.state_checksums(state)}
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()

  save(2)
  save(4)
  # The trainer writes two more checkpoints (max_to_keep=2 deletes steps 2 and 4) while step 4 is being read.
  restore = ocp.PyTreeCheckpointer.restore
  calls = []

  def trainer_rotates_meanwhile(self, path, *args, **kwargs):
    if not calls:
      save(6)
      save(8)
    calls.append(os.path.basename(os.path.dirname(os.fspath(path))))
    return restore(self, path, *args, **kwargs)

  monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", trainer_rotates_meanwhile)
  step, arrays = checkpointing.load_checkpoint_arrays(str(tmp_path))
  assert (step, calls) == (8, ["4", "8"])
  np.testing.assert_array_equal(arrays["w"], np.arange(6, dtype=np.float32) * 8)
  assert "checkpoint step 4 was deleted while it was read" in capsys.readouterr().out
  # A step asked for by number that rotates away: one error saying why.
  def rotates_again(self, path, *args, **kwargs):
    save(10)
    save(12)
    return restore(self, path, *args, **kwargs)

  monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", rotates_again)
  with pytest.raises(FileNotFoundError, match=r"checkpoints/8 was deleted while it was read .*still training"):
    checkpointing.load_checkpoint_arrays(str(tmp_path), 8)
  mngr.close()
