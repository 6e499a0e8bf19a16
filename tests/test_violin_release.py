"""VIOLIN from its release (data_prep/fixtures.py: violin_annotation.json + all_res101_pool5_feat.h5): the authors'
text preprocessing in the tokens and in the text-cache key; the BERT fine-tuning stage (configs/violin_bert_ft.py)
handing its encoder to the main config (config.pretrained.init_from); and end to end: convert -> fine-tune 2 steps ->
train 2 steps -> evaluate -> official predictions scored by `python -m evqa_jax.evaluate.violin`.

One tiny random BERT (the `small` variants: one layer, hidden 32, MiniLM's uncased tokenizer) and one 4 x 2 mesh of the
8 CPU devices; the converted fixture has 2 train clips (6 statement pairs), 1 validate and 1 test clip.
"""

import json
import os
import subprocess
import sys

import flax.linen as nn
from flax import traverse_util
import jax
import numpy as np
import pytest

pytest.importorskip("h5py")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from data_prep import fixtures as R  # noqa: E402  pylint: disable=g-import-not-at-top
from configs import violin as violin_config  # noqa: E402
from configs import violin_bert_ft  # noqa: E402
from data_prep import violin as prep  # noqa: E402
from evqa_jax import projects  # noqa: E402
from evqa_jax.models import bert  # noqa: E402
from evqa_jax.projects.violin import input as violin_input  # noqa: E402
from evqa_jax.projects.violin import model as violin_model  # noqa: E402
from evqa_jax.train import train_and_evaluate  # noqa: E402
from evqa_jax.runs import checkpointing  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MESH = (4, 2)  # every device: 4 rows of a batch of 4, the BERT heads and LSTM widths split in 2


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  """The release fixture converted as the README says (python -m data_prep.violin ... --feature resnet)."""
  root = tmp_path_factory.mktemp("violin_release")
  rel = R.violin_release(str(root / "feat"))
  out = str(root / "records")
  prep.convert(os.path.join(rel["dir"], "violin_annotation.json"), rel["h5"], out, verbose=False)
  return out


def _on_release(config, records, **overrides):
  """A `small` config (tiny BERT) pointed at the converted release, with the paper's text preprocessing."""
  config.data.dir = records
  config.data.synthetic = ""
  config.data.feature_dim = 2048
  config.data.text_preprocessing = "authors"
  config.mesh_shape = MESH
  config.batch_size = config.eval_batch_size = 4
  config.total_steps = 2
  for key, value in overrides.items():
    node = config
    *parts, last = key.split(".")
    for p in parts:
      node = node[p]
    node[last] = value
  return config


def _authors_ids(tokenizer, cleaned: str, max_len: int) -> list:
  """The authors' ViolinDataset.tokenize_and_pad: [CLS] + word pieces cut to max_len - 2 + [SEP], zero padded."""
  tokens = ["[CLS]"] + tokenizer.tokenize(cleaned)[:max_len - 2] + ["[SEP]"]
  ids = tokenizer.convert_tokens_to_ids(tokens)
  return ids + [0] * (max_len - len(ids))


def test_tokens_are_the_authors(records):
  inp = violin_input.Input(_on_release(violin_config.get_config("small"), records,
                                       **{"data.max_statement_tokens": 11}), online=True)
  tok = inp.tokenizer
  # clean_str + lower case worked by hand (evqa_jax/violin_text.py rules), then the authors' tokenize_and_pad.
  statement = "Statement 0.1 is true, isn't it?"
  ids, mask = inp.tokenize(statement, "statement")
  assert inp.model_text(statement, "statement") == "statement 0 . 1 is true , is n't it ?"
  assert ids.tolist() == _authors_ids(tok, "statement 0 . 1 is true , is n't it ?", 11)  # cut to 9 word pieces
  assert mask.tolist() == [1] * 11
  assert tok.convert_ids_to_tokens(ids.tolist())[-3:] == ["is", "n", "[SEP]"]  # "isn't" -> "is n't", then cut
  # Subtitles: the record joins the stripped lines with a space; the authors clean each line and join them.
  ann = json.load(open(os.path.join(records, "violin_annotation.json")))
  entry = ann["friends_s01e01_seg01_clip_00"]
  record_text = violin_input.subtitle_text(entry)
  assert record_text == "Ross: Hi, I'm Ross. Rachel: You're late!"
  authors = " ".join(violin_input.violin_text.clean_str(line[0]).lower() for line in entry["sub"])
  assert authors == "ross : hi , i 'm ross . rachel : you 're late !"
  ids, mask = inp.tokenize(record_text, "subtitle")
  assert ids.tolist() == _authors_ids(tok, authors, 24) and int(mask.sum()) == 18
  # With text_preprocessing = none the release text goes to the tokenizer as it is ("isn't" -> "isn ' t").
  raw = violin_input.Input(_on_release(violin_config.get_config("small"), records,
                                       **{"data.text_preprocessing": "none"}), online=True)
  assert raw.tokenize(statement, "statement")[0].tolist() == tok(statement, max_length=16, truncation=True,
                                                                 padding="max_length")["input_ids"]
  with pytest.raises(ValueError, match="config.data.text_preprocessing = 'lower'"):
    violin_input.Input(_on_release(violin_config.get_config("small"), records,
                                   **{"data.text_preprocessing": "lower"}), online=True)


def test_text_cache_key_names_preprocessing_lengths_and_weights(records):
  def key(kind="statement", weights="random-init:seed=0", **overrides):
    config = _on_release(violin_config.get_config("small"), records, **overrides)
    inp = violin_input.Input(config, online=False)
    inp.use_text_encoder("bert", bert.BertConfig.from_dict(dict(config.pretrained.shape)), None, weights)
    return inp.cache_key(kind, inp.texts(kind))[0]

  base = key()
  assert key() == base  # a second run finds the same cache
  assert key(**{"data.text_preprocessing": "none"}) != base
  assert key(**{"data.max_statement_tokens": 12}) != base
  assert key("subtitle") == key("subtitle", **{"data.max_statement_tokens": 12})  # statements' cap only
  assert key(weights="init_from:/runs/ft:step=2:sha1=ab") != base


@pytest.fixture(scope="module")
def fine_tuned(records, tmp_path_factory):
  """The BERT fine-tuning stage, 2 steps on the release's training texts, evaluated on validate."""
  workdir = str(tmp_path_factory.mktemp("violin_bert_ft"))
  config = _on_release(violin_bert_ft.get_config("small"), records, checkpoint_every_steps=1)  # steps 1 and 2 kept
  result = train_and_evaluate(config, workdir)
  return workdir, result


def test_bert_ft_stage_trains_the_encoder_on_the_texts(records, fine_tuned):
  workdir, result = fine_tuned
  config = _on_release(violin_bert_ft.get_config("small"), records)
  task = projects.build_task(config)
  assert type(task.model) is violin_model.BertMLM
  # The stage reads every distinct statement and the subtitles of the split, preprocessed as the main model.
  train = task.source("train")
  assert len(train) == 2 * 6 + 2 and len(task.source("validate")) == 6 + 1
  ex = task.preprocess(train[len(train) - 1], train=True)  # the last text: clip_01's subtitles
  assert task.input.tokenizer.convert_ids_to_tokens(ex["ids"][:8].tolist()) == [
      "[CLS]", "monica", ":", "let", "'", "s", "eat", "."]
  assert ex["ids"].shape == (24,) and int(ex["mask"].sum()) == 9
  # Evaluation masks max(1, round(0.15 n)) of the n word pieces of each validate text (not [CLS] / [SEP]).
  val = task.source("validate")
  n = [int(task.preprocess(val[i], train=False)["mask"].sum()) - 2 for i in range(len(val))]
  metrics = result["eval"]["validate"]
  assert metrics["num_texts"] == 7
  assert metrics["num_masked_tokens"] == sum(max(1, int(k * 0.15 + 0.5)) for k in n)
  assert 0.0 <= metrics["mlm_accuracy"] <= 100.0 and metrics["mlm_loss"] > 0
  # The second AdamW step moved the whole encoder: embeddings, layers and the MLM head.
  _, first = checkpointing.load_checkpoint_arrays(workdir, step=1)
  _, last = checkpointing.load_checkpoint_arrays(workdir)
  assert not last.get("frozen") and set(last["trainable"]) == {"text_encoder"}
  a, b = (traverse_util.flatten_dict(s["trainable"]["text_encoder"], sep="/") for s in (first, last))
  assert sorted(a) == sorted(b) and all(not np.array_equal(a[k], b[k]) for k in a)


def test_masking_hand_case_and_80_10_10():
  ids = np.array([101, 7, 8, 9, 10, 11, 102, 0, 0, 0], np.int32)  # [CLS] 5 word pieces [SEP] padding
  mask = (ids > 0).astype(np.int32)
  keys = jax.random.split(jax.random.key(0), 2000)
  corrupted, pos, labels, weights = map(np.asarray, jax.jit(jax.vmap(lambda k: violin_model.mask_tokens(
      k, ids, mask, special_ids=(0, 101, 102, 103), mask_id=103, vocab=200, probability=0.5, num_predictions=4)))(keys))
  assert np.all(weights == [1, 1, 1, 0])  # round(0.5 * 5 word pieces) = 3 (halves up), of 4 slots
  picked = pos[:, :3]
  assert np.all((picked >= 1) & (picked <= 5)) and all(len(set(row)) == 3 for row in picked.tolist())
  np.testing.assert_array_equal(labels[:, :3], ids[picked])
  for row, p in zip(corrupted[:50], picked[:50]):  # the rest of the sequence is untouched
    untouched = np.setdiff1d(np.arange(10), p)
    np.testing.assert_array_equal(row[untouched], ids[untouched])
  # Each picked word piece: 80% [MASK], 10% a random id, 10% kept (6000 draws).
  new, old = np.take_along_axis(corrupted, picked, 1), ids[picked]
  frac = [np.mean(new == 103), np.mean((new != 103) & (new != old)), np.mean(new == old)]
  # 6000 picks: standard errors 0.0052 (0.8) and 0.0039 (0.1), so the bound 0.02 is 3.9-5.1 of them; a split off by
  # 0.05 (85/10/5, 75/15/10) fails it. A random id equals the old one with p 1/200.
  np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.02)


def test_main_config_takes_the_fine_tuned_encoder_end_to_end(records, fine_tuned, tmp_path):
  """The main model with cached text features (the encoder runs once per text, outside the compiled step) on the
  stage's encoder; the online model's frozen encoder is checked to be the same weights."""
  stage, _ = fine_tuned
  workdir = str(tmp_path / "violin")
  config = _on_release(violin_config.get_config("small"), records,
                       **{"pretrained.init_from": stage, "model.text_features": "cached",
                          "data.text_cache_dir": str(tmp_path / "text_cache")})
  result = train_and_evaluate(config, workdir)
  # The encoder of the main run is exactly the stage's last checkpoint, and the text-feature cache says so.
  _, ft = checkpointing.load_checkpoint_arrays(stage)
  ft = traverse_util.flatten_dict(ft["trainable"]["text_encoder"], sep="/")
  task = projects.build_task(config)  # the caches exist: opened, not rebuilt
  cache = task.input.text_cache("statement").path
  with open(cache + ".json") as f:
    assert json.load(f)["key"]["weights"].startswith(f"init_from:{os.path.abspath(stage)}:step=2:sha1=")
  online = projects.build_task(_on_release(violin_config.get_config("small"), records,
                                           **{"pretrained.init_from": stage}))
  shapes = nn.meta.unbox(jax.eval_shape(online.init_params, jax.random.key(0)))
  loaded = online.load_pretrained(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  for ours in (task.encoder_params(), loaded["text_encoder"]):
    ours = traverse_util.flatten_dict(ours, sep="/")
    assert sorted(ours) == sorted(ft)
    for k in ft:
      np.testing.assert_array_equal(ours[k], ft[k], err_msg=k)
  # Official predictions, scored by the command-line evaluator exactly as the trainer scored them.
  pred = os.path.join(workdir, "eval", "test_step2", "predictions.json")
  preds = json.load(open(pred))
  assert list(preds) == ["desperate_housewives_s02e03_clip_07"]
  probs = np.asarray(preds["desperate_housewives_s02e03_clip_07"])
  assert probs.shape == (3, 2) and np.all((probs > 0) & (probs < 1))
  correct = int(np.sum(probs[:, 0].astype(np.float32) >= 0.5) + np.sum(probs[:, 1].astype(np.float32) < 0.5))
  out = str(tmp_path / "m.json")
  subprocess.run([sys.executable, "-m", "evqa_jax.evaluate.violin", "--gt", os.path.join(records,
                  "violin_annotation.json"), "--pred", pred, "--split", "test", "--out", out],
                 cwd=REPO, check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=REPO))
  scored = json.load(open(out))
  assert scored["num_statements"] == 6 and scored["num_correct"] == correct
  assert scored["accuracy"] == pytest.approx(100 * correct / 6)
  assert result["eval"]["test"]["accuracy"] == pytest.approx(scored["accuracy"])


def test_init_from_errors_name_the_key(records, fine_tuned, tmp_path):
  def encoder_params(init_from, **overrides):
    config = _on_release(violin_config.get_config("small"), records, **{"pretrained.init_from": init_from},
                         **overrides)
    return projects.build_task(config).encoder_params()

  with pytest.raises(FileNotFoundError, match=r"config.pretrained.init_from = '.*nowhere'.*not a workdir.*"
                                              r"configs/violin_bert_ft.py"):
    encoder_params(str(tmp_path / "nowhere"))
  other = tmp_path / "other"
  other.mkdir()
  (other / "config.json").write_text(json.dumps({"config": {"task": "violin", "model_name": "baseline"}}))
  with pytest.raises(ValueError, match="config.pretrained.init_from = .*'baseline', not the BERT fine-tuning stage"):
    encoder_params(str(other))
  with pytest.raises(ValueError, match=r"config.pretrained.init_from = .*does not fit this config's encoder.*"
                                       r"parameter\(s\) differ"):
    encoder_params(fine_tuned[0], **{"pretrained.shape.intermediate_size": 48})
  with pytest.raises(ValueError, match="config.pretrained.init_from .* baseline model only"):
    c = violin_config.get_config("small,crossmodal")
    projects.build_task(_on_release(c, records, **{"pretrained.init_from": fine_tuned[0]}))


def test_decode_positions_are_the_full_logits_at_those_positions():
  cfg = bert.BertConfig.from_dict(dict(violin_config.get_config("small").pretrained.shape, vocab_size=50))
  ids = jax.random.randint(jax.random.key(1), (2, 7), 1, 50)
  mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)
  pos = np.array([[0, 6, 3], [4, 1, 1]], np.int32)
  model = bert.BertLM(cfg)

  @jax.jit
  def both(key):
    params = model.init(key, ids, mask)["params"]
    return (model.apply({"params": params}, ids, mask, decode=True)["logits"],
            model.apply({"params": params}, ids, mask, decode_positions=pos)["logits"])

  full, picked = both(jax.random.key(0))
  np.testing.assert_allclose(np.asarray(picked), np.take_along_axis(np.asarray(full), pos[..., None], 1), atol=1e-6)
