"""DeBERTa-v2 tokenization as FrozenBiLM and OVQA ran it: the slow `DebertaV2Tokenizer` of transformers 4.x.

microsoft/deberta-v2-xlarge ships `spm.model` (SentencePiece, pieces [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3) and no
tokenizer.json; the authors load it with the slow `DebertaV2Tokenizer.from_pretrained`. transformers 5 only has the
fast tokenizer converted from `spm.model`, and up to transformers 5.24 that one differs from the slow one on text
that SentencePiece normalises (NFKC: ligatures, full-width letters, "..." as one character; 5.25's conversion agrees
on the test's prompts; see tests/test_spm_tokenizer.py), so a DeBERTa-v2 directory with `spm.model` is tokenized here
with the `sentencepiece` package, as the slow tokenizer did, whichever transformers 5.x is installed:

  1. split the text on the special tokens ([CLS] [SEP] [PAD] [UNK] [MASK]) and strip the whitespace on both sides
     of each (the slow tokenizers' default for special tokens that are plain strings);
  2. lower-case the other pieces when tokenizer_config.json says do_lower_case;
  3. encode each piece of text with SentencePiece (`encode(text)`: a "▁" dummy prefix per piece);
  4. [MASK] is the id after the last SentencePiece piece when the model has no "[MASK]" piece (the slow tokenizer
     appended it as an added token: 128000 for DeBERTa-v2-xlarge);
  5. with special tokens: [CLS] ids [SEP]; truncation keeps the first max_length - 2 ids; padding with [PAD] (0).

`load_tokenizer(path)` picks this tokenizer for such a directory and transformers' AutoTokenizer otherwise (for a BERT
directory, the class AutoTokenizer would pick, imported on its own: see `_bert_tokenizer_class`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Sequence

from evqa_jax import io as io_lib

SPM_FILE = "spm.model"


class DebertaV2SpmTokenizer:
  """The subset of the Hugging Face tokenizer API the tasks use, with the slow DeBERTa-v2 tokenizer's ids."""

  def __init__(self, spm_file: str, do_lower_case: bool = False):
    try:
      import sentencepiece
    except ImportError as e:
      raise ImportError(f"{spm_file} is a SentencePiece model: `pip install sentencepiece`") from e
    self.spm_file = spm_file
    self.sp = sentencepiece.SentencePieceProcessor(model_file=spm_file)
    self.do_lower_case = do_lower_case
    n = self.sp.get_piece_size()
    ids = {}
    for name, piece in (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"), ("unk", "[UNK]")):
      i = self.sp.piece_to_id(piece)
      if self.sp.id_to_piece(i) != piece:
        raise ValueError(f"{spm_file}: no {piece} piece; not a DeBERTa-v2 SentencePiece model")
      ids[name] = i
    mask = self.sp.piece_to_id("[MASK]")
    ids["mask"] = mask if self.sp.id_to_piece(mask) == "[MASK]" else n
    self.pad_token_id, self.cls_token_id, self.sep_token_id = ids["pad"], ids["cls"], ids["sep"]
    self.unk_token_id, self.mask_token_id = ids["unk"], ids["mask"]
    self.pad_token, self.cls_token, self.sep_token, self.unk_token, self.mask_token = (
        "[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")
    self._special = {"[PAD]": self.pad_token_id, "[CLS]": self.cls_token_id, "[SEP]": self.sep_token_id,
                     "[UNK]": self.unk_token_id, "[MASK]": self.mask_token_id}
    self._split = re.compile("(" + "|".join(re.escape(t) for t in self._special) + ")")
    self.vocab_size = n + (1 if ids["mask"] == n else 0)

  def __len__(self) -> int:
    return self.vocab_size

  def encode_plain(self, text: str) -> list[int]:
    """Token ids of `text` without [CLS]/[SEP] (steps 1-4 of the module docstring)."""
    parts = self._split.split(text)
    for i, part in enumerate(parts):
      if part in self._special:
        if i > 0:
          parts[i - 1] = parts[i - 1].rstrip()
        if i + 1 < len(parts):
          parts[i + 1] = parts[i + 1].lstrip()
    ids = []
    for part in parts:
      if part in self._special:
        ids.append(self._special[part])
      elif part:
        ids.extend(self.sp.encode(part.lower() if self.do_lower_case else part))
    return ids

  def __call__(self, text: str, add_special_tokens: bool = True, max_length: int | None = None,
               truncation: bool = False, padding: bool | str = False) -> dict:
    """{"input_ids": [...], "attention_mask": [...]} for one text, as the slow tokenizer's __call__."""
    if not isinstance(text, str):
      raise TypeError(f"DebertaV2SpmTokenizer takes one string, got {type(text).__name__}")
    ids = self.encode_plain(text)
    extra = 2 if add_special_tokens else 0
    if truncation and max_length is not None:
      if max_length < extra:
        raise ValueError(f"max_length={max_length} leaves no room for [CLS] and [SEP]")
      ids = ids[:max_length - extra]
    if add_special_tokens:
      ids = [self.cls_token_id] + ids + [self.sep_token_id]
    mask = [1] * len(ids)
    if padding == "max_length":
      if max_length is None:
        raise ValueError("padding='max_length' needs max_length")
      pad = max(0, max_length - len(ids))
      ids, mask = ids + [self.pad_token_id] * pad, mask + [0] * pad
    elif padding not in (False, "do_not_pad", "longest", True):
      raise ValueError(f"unsupported padding={padding!r}")
    return {"input_ids": ids, "attention_mask": mask}

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    n = self.sp.get_piece_size()
    return [self.mask_token if i == self.mask_token_id else self.sp.id_to_piece(int(i)) if 0 <= i < n else None
            for i in ids]

  def __repr__(self) -> str:
    return f"DebertaV2SpmTokenizer({self.spm_file!r}, do_lower_case={self.do_lower_case})"


def is_spm_deberta_dir(path: str) -> bool:
  """A DeBERTa-v2 checkpoint directory as Microsoft released it: spm.model and no tokenizer.json."""
  return (os.path.isfile(os.path.join(path, SPM_FILE))
          and not os.path.isfile(os.path.join(path, "tokenizer.json")))


def load_tokenizer(path: str, config_key: str = "config.model.tokenizer / config.model.pretrained"):
  """The tokenizer of a local checkpoint directory: DebertaV2SpmTokenizer for a DeBERTa-v2 `spm.model` directory
  (module docstring), else transformers' AutoTokenizer (tokenizer.json / vocab.txt). Nothing is downloaded."""
  if not os.path.isdir(path):
    raise FileNotFoundError(
        f"{config_key} = {path!r} is not a directory: point it at a local Hugging Face checkpoint directory "
        "(config.json, weights, tokenizer files); nothing is downloaded at run time")
  if is_spm_deberta_dir(path):
    cfg = {}
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(cfg_path):
      from evqa_jax import io as io_lib  # pylint: disable=g-import-not-at-top
      cfg = io_lib.load_json(cfg_path, "tokenizer config")
    if cfg.get("split_by_punct"):
      raise ValueError(f"{cfg_path}: split_by_punct is set; only the DeBERTa-v2 releases without it (xlarge, "
                       "xxlarge) are supported")
    return DebertaV2SpmTokenizer(os.path.join(path, SPM_FILE), do_lower_case=bool(cfg.get("do_lower_case", False)))
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  direct = _bert_tokenizer_class(path)
  if direct is not None:
    return direct.from_pretrained(path)
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(path)


def _json_object(path: str) -> dict:
  """A tokenizer or model JSON file of a checkpoint directory ({} when it is absent); a malformed one is a
  ValueError naming the file."""
  if not os.path.isfile(path):
    return {}
  data = io_lib.load_json(path, what="checkpoint file", finite=False)
  return data if isinstance(data, dict) else {}


def _bert_tokenizer_class(path: str):
  """transformers' BertTokenizer when AutoTokenizer would pick it for `path` (tokenizer_config.json names
  BertTokenizer[Fast] and config.json is a "bert" model: AutoTokenizer then calls that class's
  from_pretrained), else None. Imported on its own it takes a second where AutoTokenizer's import takes two or
  more: AutoTokenizer imports transformers' configuration modules, which import torch where it is installed, in
  every launch/train.py process (tests/test_bert.py checks that both give the same tokenizer)."""
  named = str(_json_object(os.path.join(path, "tokenizer_config.json")).get("tokenizer_class") or "")
  model_type = _json_object(os.path.join(path, "config.json")).get("model_type")
  if named.removesuffix("Fast") != "BertTokenizer" or model_type != "bert":
    return None
  from transformers.models.bert.tokenization_bert import BertTokenizer  # pylint: disable=import-outside-toplevel
  return BertTokenizer
