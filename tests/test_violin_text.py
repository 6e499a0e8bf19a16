"""VIOLIN's clean_str + lower case (evqa_jax/violin_text.py) on hand-worked cases of the authors' rules."""

import pytest

from evqa_jax import violin_text


@pytest.mark.parametrize("raw, cleaned", [
    ("Ross: Hi, I'm Ross.", "Ross : Hi , I 'm Ross ."),
    ("(whispering) Don't move...", "whispering Do n't move ."),
    ("You're late!", "You 're late !"),
    ("She'd've gone, hadn't she?", "She 'd 've gone , had n't she ?"),
    ("café — 100% sure?\n\tOK", "caf 100 sure ? OK"),
    ("We'll see... I've got it", "We 'll see . I 've got it"),
    ("a..b", "a . . b"),
    ("it's `quoted` & 'single'", "it 's `quoted` 'single'"),
    ("   ", ""),
])
def test_clean_str(raw, cleaned):
  assert violin_text.clean_str(raw) == cleaned


def test_statement_and_subtitles_lower_case():
  assert violin_text.statement_text("Rachel says she's LATE.") == "rachel says she 's late ."
  lines = ["Ross: Hi!", "%%%", "Monica: Let's eat."]
  assert violin_text.subtitles_text(lines) == "ross : hi !  monica : let 's eat ."
