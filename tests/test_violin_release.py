"""VIOLIN from its release (tests/release_fixtures.py: violin_annotation.json + all_res101_pool5_feat.h5): the authors'
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
import jax
import numpy as np
import pytest

pytest.importorskip("h5py")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import release_fixtures as R  # noqa: E402  pylint: disable=g-import-not-at-top
from configs import violin as violin_config  # noqa: E402
from configs import violin_bert_ft  # noqa: E402
from data_prep import violin as prep  # noqa: E402
from evqa_jax import projects  # noqa: E402
from evqa_jax.models import bert  # noqa: E402
from evqa_jax.projects.violin import input as violin_input  # noqa: E402
from evqa_jax.projects.violin import model as violin_model  # noqa: E402
from evqa_jax.train import checkpointing, partition, train_and_evaluate  # noqa: E402

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
  result = train_and_evaluate(_on_release(violin_bert_ft.get_config("small"), records), workdir)
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
  # 2 steps of AdamW moved the whole encoder (the MLM head and the embeddings too).
  _, state = checkpointing.load_checkpoint_arrays(workdir)
  assert not state.get("frozen") and set(state["trainable"]) == {"text_encoder"}
  init = nn.meta.unbox(task.init_params(jax.random.key(config.seed)))
  word = state["trainable"]["text_encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert not np.array_equal(word, np.asarray(init["text_encoder"]["embeddings"]["word_embeddings"]["embedding"]))


def test_masking_hand_case_and_80_10_10():
  ids = np.array([101, 7, 8, 9, 10, 11, 102, 0, 0, 0], np.int32)  # [CLS] 5 word pieces [SEP] padding
  mask = (ids > 0).astype(np.int32)
  kw = dict(special_ids=(0, 101, 102, 103), mask_id=103, vocab=200, num_predictions=4)
  corrupted, pos, labels, weights = jax.jit(lambda k: violin_model.mask_tokens(k, ids, mask, probability=0.5, **kw))(
      jax.random.key(3))
  pos, weights, corrupted = np.asarray(pos), np.asarray(weights), np.asarray(corrupted)
  assert weights.tolist() == [1, 1, 1, 0]  # round(0.5 * 5) = 3 (halves up), of 4 slots
  picked = pos[:3]
  assert set(picked.tolist()) <= {1, 2, 3, 4, 5} and len(set(picked.tolist())) == 3
  np.testing.assert_array_equal(np.asarray(labels)[:3], ids[picked])
  untouched = np.setdiff1d(np.arange(10), picked)
  np.testing.assert_array_equal(corrupted[untouched], ids[untouched])
  # Over 4000 draws of one slot (probability 0.2 of 5 word pieces = 1): 80% [MASK], 10% random ids, 10% kept.
  keys = jax.random.split(jax.random.key(0), 4000)
  c, p, _, w = jax.jit(jax.vmap(lambda k: violin_model.mask_tokens(k, ids, mask, probability=0.2, **kw)))(keys)
  assert np.all(np.asarray(w).sum(-1) == 1)
  new = np.take_along_axis(np.asarray(c), np.asarray(p)[:, :1], 1)[:, 0]
  old = ids[np.asarray(p)[:, 0]]
  frac = [np.mean(new == 103), np.mean((new != 103) & (new != old)), np.mean(new == old)]
  np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.025)  # a random id equals the old one with p 1/200


def test_main_config_takes_the_fine_tuned_encoder_end_to_end(records, fine_tuned, tmp_path):
  stage, _ = fine_tuned
  workdir = str(tmp_path / "violin")
  config = _on_release(violin_config.get_config("small"), records, **{"pretrained.init_from": stage})
  result = train_and_evaluate(config, workdir)
  # The frozen encoder of the main run is exactly the stage's last checkpoint.
  _, ft = checkpointing.load_checkpoint_arrays(stage)
  _, main = checkpointing.load_checkpoint_arrays(workdir)
  ours = partition.merge_params(main["trainable"], main["frozen"])["text_encoder"]
  for path in (("embeddings", "word_embeddings", "embedding"), ("encoder", "layer_0", "output", "dense", "kernel")):
    a, b = ft["trainable"]["text_encoder"], ours
    for p in path:
      a, b = a[p], b[p]
    np.testing.assert_array_equal(b, a)
  assert "text_encoder" in main["frozen"] and "text_encoder" not in main["trainable"]
  # ... and what the text-feature cache key says the weights are.
  assert projects.build_task(config).weights_identity().startswith(f"init_from:{os.path.abspath(stage)}:step=2:sha1=")
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
