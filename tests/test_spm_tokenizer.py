"""Token ids of a released DeBERTa-v2 directory (spm.model) equal the slow DebertaV2Tokenizer's, which FrozenBiLM and
OVQA use, on the prompts OVQA builds; the SentencePiece model is trained by the test (data_prep/fixtures.py)."""

import numpy as np
import pytest

spm = pytest.importorskip("sentencepiece")
pytest.importorskip("torch")

from data_prep import fixtures as R  # pylint: disable=g-import-not-at-top
from evqa_jax import spm_tokenizer  # pylint: disable=g-import-not-at-top
from evqa_jax.projects.ovqa.backbones import frozenbilm as ovqa  # pylint: disable=g-import-not-at-top

QUESTIONS = [q for rows in R.MSRVTT_ROWS.values() for q, _, _ in rows] + [
    "  what is the MAN doing  ", "who's there?", "what does the ﬁrst sign say", "ＷＨＡＴ is it",
    "what happens next…", "where is the café", "how many   people\tare there",
]
SUBTITLES = ["", "he plays the guitar", "I can't... ok", "ﬁne. Thanks!"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return R.deberta_v2_dir(str(tmp_path_factory.mktemp("tok") / "deberta-v2-xlarge"))


def slow_reference(sp, text, mask_id, add_special_tokens=True):
  """transformers 4.x slow DebertaV2Tokenizer on text whose only special token is [MASK]: the text around each
  [MASK] is whitespace-stripped towards it and SentencePiece-encoded on its own; [CLS] ... [SEP] around all."""
  chunks = text.split("[MASK]")
  ids = []
  for i, chunk in enumerate(chunks):
    chunk = chunk.lstrip() if i > 0 else chunk
    chunk = chunk.rstrip() if i < len(chunks) - 1 else chunk
    if chunk:
      ids += sp.encode(chunk)
    if i < len(chunks) - 1:
      ids.append(mask_id)
  return [1] + ids + [2] if add_special_tokens else ids


def test_prompt_ids_equal_slow_tokenizer(model_dir):
  sp = spm.SentencePieceProcessor(model_file=f"{model_dir['path']}/spm.model")
  tok = spm_tokenizer.load_tokenizer(model_dir["path"])
  assert isinstance(tok, spm_tokenizer.DebertaV2SpmTokenizer)
  assert (tok.mask_token, tok.mask_token_id, tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (
      "[MASK]", model_dir["spm_pieces"], 0, 1, 2)
  for q in QUESTIONS:
    for sub in SUBTITLES:
      text = ovqa.build_prompt(q, sub, tok.mask_token)
      assert tok(text)["input_ids"] == slow_reference(sp, text, tok.mask_token_id), text
  # Hand-checked: "Answer: [MASK]." -> ... "Answer:" [MASK] "▁." [SEP], the dot encoded on its own.
  ids = tok("Question: Who? Answer: [MASK].")["input_ids"]
  assert ids[-3:] == [tok.mask_token_id, sp.piece_to_id("▁."), 2] or ids[-4:] == [
      tok.mask_token_id, sp.piece_to_id("▁"), sp.piece_to_id("."), 2]
  assert tok.convert_ids_to_tokens(ids)[:1] == ["[CLS]"]


def test_autotokenizer_conversion_against_the_slow_tokenizer(model_dir):
  """Why spm directories get DebertaV2SpmTokenizer: the tokenizer transformers 5.0-5.24 converts from spm.model does
  not apply SentencePiece's NFKC normalisation, so on such text ("ﬁ") its ids differ from the slow tokenizer's.
  transformers 5.25's conversion does normalise: its ids then equal ours on every prompt of the test. Ours equal the
  slow reference under either (test_prompt_ids_equal_slow_tokenizer), so the choice stays version-independent."""
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  fast = AutoTokenizer.from_pretrained(model_dir["path"])
  tok = spm_tokenizer.load_tokenizer(model_dir["path"])
  plain = ovqa.build_prompt("what is the man doing", "", tok.mask_token)
  assert fast(plain)["input_ids"] == tok(plain)["input_ids"]
  odd = ovqa.build_prompt("what does the ﬁrst sign say", "", tok.mask_token)
  normalises = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 25)
  assert (fast(odd)["input_ids"] == tok(odd)["input_ids"]) == normalises, transformers.__version__
  if normalises:
    for q in QUESTIONS:
      for sub in SUBTITLES:
        text = ovqa.build_prompt(q, sub, tok.mask_token)
        assert fast(text)["input_ids"] == tok(text)["input_ids"], text


def test_padding_truncation_and_answers(model_dir):
  tok = spm_tokenizer.load_tokenizer(model_dir["path"])
  text = ovqa.build_prompt("what is a man playing", "he plays the guitar", tok.mask_token)
  full = tok(text)["input_ids"]
  enc = tok(text, max_length=len(full) + 3, truncation=True, padding="max_length")
  assert enc["input_ids"] == full + [0, 0, 0] and enc["attention_mask"] == [1] * len(full) + [0, 0, 0]
  short = tok(text, max_length=6, truncation=True, padding="max_length")["input_ids"]
  assert short == full[:5] + [2]
  ids, mask = ovqa.tokenize_answers(tok, ["guitar", "two dogs"], max_subwords=5, pad_to=3)
  sp = spm.SentencePieceProcessor(model_file=f"{model_dir['path']}/spm.model")
  assert ids[0, :mask[0].sum()].tolist() == sp.encode("guitar")[:5]
  assert ids[1, :mask[1].sum()].tolist() == sp.encode("two dogs")[:5]
  assert not mask[2].any() and np.all(ids[2] == 0)


def test_non_spm_directory_and_bad_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.model.tokenizer / config.model.pretrained = .* is not a directory"):
    spm_tokenizer.load_tokenizer(str(tmp_path / "missing"))
  from evqa_jax import pretrained
  try:
    minilm = pretrained.minilm_dir()
  except ImportError:
    pytest.skip("MiniLM not installed")
  assert not isinstance(spm_tokenizer.load_tokenizer(minilm), spm_tokenizer.DebertaV2SpmTokenizer)
