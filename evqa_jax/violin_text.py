"""VIOLIN text preprocessing as the authors' code does it (jimmy646/violin violin_dataset.py).

Their dataset runs every subtitle line and every statement through `clean_str` (the Kim CNN-sentence cleaner) and
lower-cases the result before BERT tokenization (max 256 tokens with [CLS] and [SEP], `--max_sub_l`):
  subtitles  " ".join(clean_str(line).lower() for each [text, start, end] line of the clip)
  statement  clean_str(statement).lower()
`clean_str` (in this order): every character outside A-Z a-z 0-9 ( ) , ! ? : . ' ` becomes a space; the
contractions 's 've n't 're 'd 'll 'm are split off with a space before them; ":" "," "!" get spaces around them;
"..." becomes " . ", then every "." gets spaces around it; "(" and ")" become spaces; "?" gets spaces around it;
runs of two or more whitespace characters become one space; the ends are stripped.
"""

import re
from typing import Iterable

# (pattern, replacement) applied in order; see the module docstring.
_STEPS = tuple((re.compile(p), r) for p, r in (
    (r"[^A-Za-z0-9(),!?:.'`]", " "),
    (r"'s", " 's"), (r"'ve", " 've"), (r"n't", " n't"), (r"'re", " 're"), (r"'d", " 'd"), (r"'ll", " 'll"),
    (r"'m", " 'm"),
    (r":", " : "), (r",", " , "), (r"!", " ! "),
    (r"\.\.\.", " . "), (r"\.", " . "),
    (r"\(", " "), (r"\)", " "),
    (r"\?", " ? "),
    (r"\s{2,}", " "),
))


def clean_str(text: str) -> str:
  """The authors' `clean_str` (module docstring); case is kept."""
  for pattern, repl in _STEPS:
    text = pattern.sub(repl, text)
  return text.strip()


def statement_text(statement: str) -> str:
  """A statement as the authors feed it to BERT: clean_str, then lower case."""
  return clean_str(statement).lower()


def subtitles_text(lines: Iterable[str]) -> str:
  """A clip's subtitles as the authors feed them to BERT: each line clean_str'ed and lower-cased, joined by " ".

  Lines that clean to nothing leave a double space, as in their join; BERT tokenization ignores it.
  """
  return " ".join(clean_str(line).lower() for line in lines)
