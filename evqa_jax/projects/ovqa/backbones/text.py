"""Token arrays the backbones' input pieces share (`Backbone.text_inputs`, `Backbone.answer_tokens`)."""

import numpy as np


def padded_tokens(tokenizer, text, max_length: int):
  """`text` (a string, or a list of them) through a Hugging Face tokenizer, truncated and padded to `max_length`:
  (ids, attention mask), int32 arrays `[max_length]` (`[len(text), max_length]` for a list)."""
  enc = tokenizer(text, max_length=max_length, truncation=True, padding="max_length")
  return np.asarray(enc["input_ids"], np.int32), np.asarray(enc["attention_mask"], np.int32)
