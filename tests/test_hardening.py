"""Issue 14 hardening: no code runs from input files, no id escapes its folder, converters never destroy or mix
data, training never reports success with something missing or wrong, and every CLI ends bad input in one line.

Small worlds (a few rows, 4-dim features) and in-process entry points (`cli.run(main, argv)`, the code path of
`python -m ...`) keep this fast; the kill -9 test runs launch/train.py as a subprocess.
"""

import csv
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from data_prep import features as features_lib
from data_prep import ovqa, st_evidence, violin
from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax.data import records
from evqa_jax.data.source import TFRecordDataSource

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 4


class _Payload:
  """Unpickling this creates the marker file: the stand-in for arbitrary code in a hostile pickle."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (open, (self.marker, "w"))


def _ovqa_release(root, n_train=3, n_test=2, features=None):
  """train/test CSVs over videos v0..v2 and their features as .npz (video v_i: [3, DIM] of value i + 1)."""
  root.mkdir(parents=True, exist_ok=True)
  for split, n in (("train", n_train), ("test", n_test)):
    with open(root / f"{split}.csv", "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["question", "answer", "video_id"])
      for i in range(n):
        w.writerow([f"what is {i}", ["dog", "cat"][i % 2], f"v{i % 3}"])
  feats = features or {f"v{i}": np.full((3, DIM), i + 1, np.float32) for i in range(3)}
  np.savez(root / "features.npz", **feats)
  return root


def _run(main, argv, capsys):
  code = cli.run(main, [str(a) for a in argv])
  err = capsys.readouterr().err
  return code, err


def _one_line_error(code, err, *needles):
  assert code == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------- 1. input files that run code

def test_pickled_npy_features_never_run_code(tmp_path, capsys):
  raw = _ovqa_release(tmp_path / "raw")
  marker = tmp_path / "PWNED"
  with open(raw / "evil.npy", "wb") as f:
    np.save(f, np.array({"v0": _Payload(marker)}, dtype=object), allow_pickle=True)
  code, err = _run(ovqa.main, ["--csv-dir", raw, "--features", raw / "evil.npy", "--out", tmp_path / "out",
                               "--feature-dim", DIM, "--num-frames", 2], capsys)
  _one_line_error(code, err, "evil.npy", "pickled", "--trust-pickles")
  assert not marker.exists() and not (tmp_path / "out").exists()


def test_pickled_subtitles_never_run_code(tmp_path, capsys):
  raw = _ovqa_release(tmp_path / "raw")
  marker = tmp_path / "PWNED"
  with open(raw / "subs.pkl", "wb") as f:
    pickle.dump({"v0": _Payload(marker)}, f)
  code, err = _run(ovqa.main, ["--csv-dir", raw, "--features", raw / "features.npz", "--subtitles", raw / "subs.pkl",
                               "--out", tmp_path / "out", "--feature-dim", DIM, "--num-frames", 2], capsys)
  _one_line_error(code, err, "subs.pkl", "pickled")
  assert not marker.exists()
  # The switch is explicit and reads a legacy (harmless) pickle.
  with open(raw / "ok.pkl", "wb") as f:
    pickle.dump({"v0": "hello"}, f)
  assert features_lib.load_subtitles(str(raw / "ok.pkl"), trust_pickles=True) == {"v0": "hello"}


def test_torch_checkpoints_never_run_code(tmp_path, capsys):
  torch = pytest.importorskip("torch")
  import argparse
  from evqa_jax.models import hf_utils
  marker = tmp_path / "PWNED"
  evil = tmp_path / "clipvitl14.pth"
  torch.save({"v0": torch.zeros(3, DIM), "x": _Payload(marker)}, evil)
  raw = _ovqa_release(tmp_path / "raw")
  code, err = _run(ovqa.main, ["--csv-dir", raw, "--features", evil, "--out", tmp_path / "out", "--feature-dim", DIM,
                               "--num-frames", 2], capsys)
  _one_line_error(code, err, "clipvitl14.pth", "pickled")
  from evqa_jax.models import deberta_v2
  ckpt = tmp_path / "frozenbilm.pth"
  torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=1.0), "evil": _Payload(marker)}, ckpt)
  with pytest.raises(evqa_io.UnsafeInputError, match="frozenbilm.pth"):  # what config.model.init_from calls
    deberta_v2.load_frozenbilm_checkpoint(deberta_v2.DebertaV2Config(), str(ckpt))
  assert not marker.exists()
  # FrozenBiLM's layout (tensors + an argparse Namespace) loads without the trust switch.
  torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=1.0)}, ckpt)
  np.testing.assert_array_equal(hf_utils.read_checkpoint(str(ckpt), safe_globals=(argparse.Namespace,))["w"],
                                np.ones(2, np.float32))


# ------------------------------------------------------------------------------------------ 2. ids used as paths

def _st_release(root, entry_id="e0", video_id="vid0", options_dir=None):
  """One ST-Evidence row: 2 frames of 8x8, a PNG mask folder, optionally an MCQ entry."""
  (root / "frames" / "vid0").mkdir(parents=True)
  for k in range(2):
    Image.fromarray(np.full((8, 8, 3), 40 * k, np.uint8)).save(root / "frames" / "vid0" / f"{k:05d}.png")
  (root / "masks" / "e0").mkdir(parents=True)
  Image.fromarray(np.full((8, 8), 255, np.uint8)).save(root / "masks" / "e0" / "00000.png")
  with open(root / "test.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(st_evidence.CSV_COLUMNS)
    w.writerow([entry_id, video_id, "", "what?", "['a', 'b']", "a", "[[0.0, 0.2]]"])
  return root


@pytest.mark.parametrize("field,bad", [("entry_id", "../../../x"), ("entry_id", "/etc"), ("video_id", "..")])
def test_st_evidence_converter_refuses_ids_that_leave_their_folder(tmp_path, capsys, field, bad):
  raw = _st_release(tmp_path / "raw", **{field: bad})
  # What ../../../x would have read / written: a mask folder outside --masks.
  (tmp_path / "raw" / "masks" / bad.lstrip("/")).mkdir(parents=True, exist_ok=True) if bad.startswith("..") else None
  out = tmp_path / "out"
  code, err = _run(st_evidence.main, ["--csv", raw / "test.csv", "--frames", raw / "frames", "--masks",
                                      raw / "masks", "--frame-size", 8, 8, "--num-frames", 2, "--out", out], capsys)
  _one_line_error(code, err, "test.csv", "row 2", repr(bad), field)
  assert not out.exists() and not (tmp_path / "x").exists()


def test_evaluators_and_visualiser_refuse_ids_that_leave_their_folder(tmp_path, capsys):
  from evqa_jax.evaluate import st_evidence as st_eval
  from evqa_jax.evaluate import visualize_evidence
  gt = tmp_path / "gt.csv"
  with open(gt, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["entry_id", "candidates", "answer", "segment"])
    w.writerow(["../../../x", "['a', 'b']", "a", "[[0, 1]]"])
  (tmp_path / "pred.json").write_text(json.dumps({}))
  for d in ("gtm", "pm"):
    (tmp_path / d).mkdir()
  code, err = _run(st_eval.main, ["--gt-csv", gt, "--gt-masks", tmp_path / "gtm", "--pred", tmp_path / "pred.json",
                                  "--pred-masks", tmp_path / "pm", "--out", tmp_path / "m.json"], capsys)
  _one_line_error(code, err, "gt.csv", "line 2", "'../../../x'")
  code, err = _run(visualize_evidence.main, ["--records", tmp_path, "--pred", tmp_path / "pred.json", "--pred-masks",
                                             tmp_path / "pm", "--entries", "ok,../../x", "--out", tmp_path / "v.png"],
                   capsys)
  _one_line_error(code, err, "--entries item 1", "'../../x'")
  from evqa_jax.projects.evqa import evaluator as evqa_task
  with pytest.raises(ValueError, match="separator"):
    evqa_task.write_gen_predictions([{"entry_id": "../x", "video_id": "v", "answer": "A", "segments": [],
                                      "masks": {}}], str(tmp_path / "preds"))
  assert not (tmp_path / "x").exists()


def test_mcq_options_dir_cannot_leave_the_mcq_folder(tmp_path):
  with pytest.raises(ValueError, match="options_dir"):
    evqa_io.check_relpath("mcq_masks/../../../etc/", "MCQ entry e0, field 'spatial.options_dir'", "options_dir")
  assert evqa_io.check_relpath("mcq_masks/e0/", "w") == "mcq_masks/e0/"
  for bad in ("", "a/b", "..", "/abs", "a\0b", 7):
    with pytest.raises(ValueError, match="row 3"):
      evqa_io.check_id(bad, "f.csv: row 3")


# ----------------------------------------------------------------------- 3. converters that destroy or mix data

def test_out_that_holds_the_inputs_or_foreign_files_is_refused(tmp_path, capsys):
  raw = _ovqa_release(tmp_path / "raw")
  (raw / "unrelated.txt").write_text("keep me")
  args = ["--features", raw / "features.npz", "--feature-dim", DIM, "--num-frames", 2, "--csv-dir", raw]
  code, err = _run(ovqa.main, args + ["--out", raw], capsys)
  _one_line_error(code, err, "holds the input")
  code, err = _run(ovqa.main, args + ["--out", tmp_path], capsys)  # contains the input folder
  _one_line_error(code, err, "holds the input")
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  code, err = _run(ovqa.main, args + ["--out", foreign], capsys)
  _one_line_error(code, err, "no converter of this project wrote")
  assert sorted(os.listdir(raw)) == ["features.npz", "test.csv", "train.csv", "unrelated.txt"]
  assert (foreign / "notes.txt").read_text() == "mine"
  # An earlier output of a converter is replaced as a whole.
  assert cli.run(ovqa.main, [str(a) for a in args + ["--out", tmp_path / "out"]]) == 0
  assert records.load_metadata(str(tmp_path / "out"))["converter"] == "data_prep.ovqa"
  assert cli.run(ovqa.main, [str(a) for a in args + ["--out", tmp_path / "out"]]) == 0


def test_values_that_do_not_survive_float16_name_the_row(tmp_path, capsys):
  feats = {f"v{i}": np.full((3, DIM), 1.0, np.float32) for i in range(3)}
  feats["v1"][1, 2] = 1e6  # finite in float32, inf in float16
  raw = _ovqa_release(tmp_path / "raw", features=feats)
  args = ["--csv-dir", raw, "--features", raw / "features.npz", "--feature-dim", DIM, "--num-frames", 3]
  assert cli.run(ovqa.main, [str(a) for a in args + ["--out", tmp_path / "kept"]]) == 0  # float32 kept: fine
  args += ["--feature-dtype", "float16", "--out", tmp_path / "out"]  # float16 storage asked for
  code, err = _run(ovqa.main, args, capsys)
  _one_line_error(code, err, "train.csv", "row 1", "'video'", "float16")
  assert not (tmp_path / "out").exists()
  assert cli.run(ovqa.main, [str(a) for a in args + ["--skip-bad"]]) == 0
  assert records.load_metadata(str(tmp_path / "out"))["conversion"]["train"]["skipped"] == {"bad_values": 1}


def test_skip_bad_that_converts_nothing_is_an_error(tmp_path, capsys):
  import h5py
  ann = {f"c{i}": {"file": f"c{i}", "split": "train", "sub": [], "statement": [["p", "n"]]} for i in range(2)}
  (tmp_path / "ann.json").write_text(json.dumps(ann))
  with h5py.File(tmp_path / "f.h5", "w") as f:
    f.create_group("c0").create_dataset("resnet_features", data=np.ones((2, DIM + 1)))  # wrong dim: skipped
  code, err = _run(violin.main, ["--annotation", tmp_path / "ann.json", "--features", tmp_path / "f.h5",
                                 "--feature-dim", DIM, "--skip-bad", "--out", tmp_path / "out"], capsys)
  _one_line_error(code, err, "converted 0 records")
  assert not (tmp_path / "out").exists()


def test_violin_failure_half_way_leaves_the_old_output_untouched(tmp_path, capsys):
  import h5py
  ann = {f"c{i}": {"file": f"c{i}", "split": s, "sub": [], "statement": [["p", "n"]]}  # file: the HDF5 key
         for i, s in enumerate(["train", "test"])}
  (tmp_path / "ann.json").write_text(json.dumps(ann))
  with h5py.File(tmp_path / "f.h5", "w") as f:
    for c in ann:
      f.create_group(c).create_dataset("resnet_features", data=np.ones((2, DIM)))
  args = ["--annotation", tmp_path / "ann.json", "--features", tmp_path / "f.h5", "--feature-dim", DIM,
          "--out", tmp_path / "out"]
  assert cli.run(violin.main, [str(a) for a in args]) == 0
  before = {n: (tmp_path / "out" / n).read_bytes() for n in os.listdir(tmp_path / "out")}
  with h5py.File(tmp_path / "f.h5", "a") as f:  # the test clip (converted after train) now fails
    del f["c1/resnet_features"]
    f["c1"].create_dataset("resnet_features", data=np.full((2, DIM), np.nan))
  code, err = _run(violin.main, args, capsys)
  _one_line_error(code, err, "'c1'", "non-finite")
  after = {n: (tmp_path / "out" / n).read_bytes() for n in os.listdir(tmp_path / "out")}
  assert after == before
  assert [n for n in os.listdir(tmp_path) if n.startswith(".out")] == []


# --------------------------------------------------------------------------------------------------- 5. messages

def test_non_utf8_and_overflowing_numbers_end_in_one_line(tmp_path, capsys):
  from evqa_jax.evaluate import violin as violin_eval
  raw = _ovqa_release(tmp_path / "raw")
  data = (raw / "train.csv").read_bytes().replace(b"what is 1", b"what \xff is 1")
  (raw / "train.csv").write_bytes(data)
  code, err = _run(ovqa.main, ["--csv-dir", raw, "--features", raw / "features.npz", "--out", tmp_path / "o"], capsys)
  _one_line_error(code, err, "train.csv", "line 3", "not UTF-8")
  # A number that overflows in a ground-truth file (prediction files read non-finite scores as the official
  # json.load does, and the evaluator counts them: tests/test_evaluate_cli.py).
  (tmp_path / "bad_ann.json").write_text('{"c0": {"split": "test", "statement": [["p", "n"]],\n "duration": 1e999}}')
  (tmp_path / "ann.json").write_text('{"c0": {"split": "test", "statement": [["p", "n"]]}}')
  (tmp_path / "pred.json").write_text('{"c0": [[0.5, 0.4]]}')
  code, err = _run(violin_eval.main, ["--gt", tmp_path / "bad_ann.json", "--pred", tmp_path / "pred.json",
                                      "--out", tmp_path / "m.json"], capsys)
  _one_line_error(code, err, "bad_ann.json", "line 2", "field 'duration'", "1e999")
  (tmp_path / "pred.json").write_bytes(b'{"c0": [[0.5, 0.5]], "\xc3\x28": 1}')
  code, err = _run(violin_eval.main, ["--gt", tmp_path / "ann.json", "--pred", tmp_path / "pred.json",
                                      "--out", tmp_path / "m.json"], capsys)
  _one_line_error(code, err, "pred.json", "line 1", "not UTF-8")
  from evqa_jax.evaluate import st_evidence as st_eval
  with open(tmp_path / "gt.csv", "w", newline="") as f:  # an integer beyond float range in a CSV cell
    csv.writer(f).writerows([["entry_id", "candidates", "answer", "segment"], ["e0", "['a', 'b']", "a",
                                                                             "[[0, 1" + "0" * 400 + "]]"]])
  (tmp_path / "p.json").write_text("{}")
  code, err = _run(st_eval.main, ["--gt-csv", tmp_path / "gt.csv", "--gt-masks", tmp_path, "--pred",
                                  tmp_path / "p.json", "--pred-masks", tmp_path, "--out", tmp_path / "m.json"], capsys)
  _one_line_error(code, err, "gt.csv line 2", "non-finite")
  with pytest.raises(ValueError, match="1e999"):  # --verbose: the exception itself, with its traceback
    cli.run(violin_eval.main, ["--gt", str(tmp_path / "bad_ann.json"), "--pred", str(tmp_path / "pred.json"),
                               "--out", str(tmp_path / "m.json"), "--verbose"])


def test_every_cli_goes_through_the_wrapper():
  """Each `python -m` / launch entry point ends in cli.run (or cli.run_absl): one line, exit 2, on bad input."""
  mains = [os.path.join("data_prep", n) for n in os.listdir(os.path.join(REPO, "data_prep"))
           if n.endswith(".py") and n not in ("__init__.py", "common.py", "features.py")]
  mains += [os.path.join("evqa_jax", "evaluate", n) for n in os.listdir(os.path.join(REPO, "evqa_jax", "evaluate"))
            if n.endswith(".py") and n != "__init__.py"]
  mains += [os.path.join("launch", n) for n in os.listdir(os.path.join(REPO, "launch")) if n.endswith(".py")]
  missing = []
  for path in mains:
    text = open(os.path.join(REPO, path)).read()
    if 'if __name__ == "__main__":' not in text:
      continue  # a library module of the package, not an entry point
    tail = text[text.index('if __name__ == "__main__":'):]
    if "cli.run" not in tail:
      missing.append(path)
  assert not missing, missing
  out = subprocess.run([sys.executable, "-m", "evqa_jax.evaluate.violin", "--gt", "/nonexistent.json", "--pred",
                        "/nonexistent.json", "--out", "/tmp/never.json"], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "/nonexistent.json" in out.stderr, out.stderr


# -------------------------------------------------------------------------------- 4d. damaged or short .idx files

def test_short_index_is_an_error_naming_the_file(tmp_path):
  spec = ovqa.record_spec(2, DIM)
  exs = [{"index": np.int64(i), "id": str(i), "video_id": "v", "question": "q", "answer": "a",
          "question_type": np.int64(-1), "subtitles": "", "video": np.zeros((2, DIM), np.float16),
          "video_mask": np.ones(2, np.int64)} for i in range(6)]
  records.write_split(str(tmp_path), "train", exs, spec, num_shards=2)
  shard = records.split_paths(str(tmp_path), "train")[1]
  assert len(TFRecordDataSource.from_split(str(tmp_path), "train")) == 6
  idx = shard + ".idx"
  with open(idx, "r+b") as f:
    f.truncate(8)  # one record of three
  with pytest.raises(ValueError, match=r"\.idx lists 1 records but .*metadata\.json says shard .* holds 3"):
    TFRecordDataSource.from_split(str(tmp_path), "train")


# ------------------------------------------------------------------------------------ 4abc. training safeguards

from test_hostile_input import tiny_config, train, world  # noqa: E402,F401  (the small world and 2-layer BERT)
import test_resume  # noqa: E402


def test_second_run_in_a_workdir_is_refused(world, tmp_path):
  from evqa_jax.runs import safeguards
  with safeguards.workdir_lock(str(tmp_path)):  # a run in progress
    with pytest.raises(RuntimeError, match=f"workdir {tmp_path} is in use by another training run .*pid {os.getpid()}"):
      train(tiny_config(world), tmp_path)
  assert not os.path.exists(tmp_path / "checkpoints")


def _flip_silently(ckpt_state_dir, workdir):
  """Flips one byte inside the array data of a checkpoint at a place where Orbax still reads it back (the data
  is compressed: most flips break decompression, which was already detected); returns the array path it changed."""
  import glob
  import jax
  from evqa_jax.runs.checkpointing import load_checkpoint_arrays
  from evqa_jax.runs.safeguards import ChecksumMismatchError
  _, before = load_checkpoint_arrays(workdir)
  before = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(before)}
  data = max(glob.glob(os.path.join(ckpt_state_dir, "ocdbt.process_0", "d", "*")), key=os.path.getsize)
  size = os.path.getsize(data)
  for pos in range(size // 2, size, 997):
    with open(data, "r+b") as f:
      f.seek(pos)
      byte = f.read(1)
      f.seek(pos)
      f.write(bytes([byte[0] ^ 0x40]))
    try:
      _, after = load_checkpoint_arrays(workdir)
    except ChecksumMismatchError as e:  # read back, but changed: load_checkpoint_arrays verifies the checksums
      return str(e).split("(first: ")[1].split(")")[0]
    except Exception:  # pylint: disable=broad-except  (this flip is caught by decompression: try another)
      after = None
    if after is not None:
      changed = [jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_leaves_with_path(after)
                 if not np.array_equal(np.asarray(v), before[jax.tree_util.keystr(p)], equal_nan=True)]
      if changed:
        return changed[0]
    with open(data, "r+b") as f:
      f.seek(pos)
      f.write(byte)
  raise AssertionError(f"no silent flip found in {data}")


def test_flipped_byte_in_checkpoint_array_data_is_a_damaged_checkpoint(world, tmp_path, capsys):
  c = tiny_config(world)
  ref = tmp_path / "ref"
  train(c, ref)
  work = tmp_path / "work"
  import shutil
  shutil.copytree(ref, work)
  changed = _flip_silently(str(work / "checkpoints" / "1" / "state"), str(work))
  capsys.readouterr()
  train(c, work)
  out = capsys.readouterr().out
  assert "checkpoints/1 is damaged or incomplete (ChecksumMismatchError" in out and changed in out, out[-3000:]
  assert "Resumed from" not in out  # no older checkpoint: trained again from scratch, to the same weights
  assert [n.split(".")[0] for n in os.listdir(work / "checkpoints_damaged")] == ["1"]
  a, b = test_resume._final_state(str(ref)), test_resume._final_state(str(work))
  for k in a[1]:
    np.testing.assert_array_equal(b[1][k], a[1][k], err_msg=k)


EVAL_CONFIG = test_resume.TINY_CONFIG.replace("c.data.eval_splits = ()", 'c.data.eval_splits = ("test",)')


def test_kill_during_final_evaluation_then_rerun_gives_the_uninterrupted_metrics(tmp_path):
  import signal
  import time
  assert EVAL_CONFIG != test_resume.TINY_CONFIG
  cfg = tmp_path / "tiny_eval.py"
  cfg.write_text(EVAL_CONFIG)
  ref, work = str(tmp_path / "ref"), str(tmp_path / "killed")
  ref_proc = test_resume._start(str(cfg), ref)
  proc = test_resume._start(str(cfg), work)
  last = os.path.join(work, "checkpoints", str(test_resume.TOTAL_STEPS))
  deadline = time.monotonic() + 400
  while not os.path.isdir(last) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)
  assert proc.poll() is None, proc.communicate()[0][-3000:]
  os.kill(proc.pid, signal.SIGKILL)  # the final checkpoint is written; the final evaluation is under way
  proc.communicate(timeout=60)
  assert not os.path.exists(os.path.join(work, "eval", "test_metrics.json"))
  rerun = test_resume._start(str(cfg), work)
  test_resume._finish(ref_proc, "the uninterrupted run")
  expected = test_resume._read(os.path.join(ref, "final_metrics.json"))
  final = json.loads(expected)
  assert final["eval"]["test"] and final["train"]["step"] == test_resume.TOTAL_STEPS
  finished_rerun = test_resume._start(str(cfg), ref)  # rerunning a finished workdir keeps its results
  test_resume._finish(rerun, "the rerun after the kill")
  assert test_resume._read(os.path.join(work, "final_metrics.json")) == expected
  out = test_resume._finish(finished_rerun, "the rerun of the finished workdir")
  assert test_resume._read(os.path.join(ref, "final_metrics.json")) == expected, out[-2000:]
