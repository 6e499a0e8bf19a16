"""Opt-in (`python -m pytest -m demo tests/test_demo_results.py`): reruns every recorded README table under
docs/results/ and compares each printed number with the committed files. Each table is a full demo training (tens of
minutes to an hour on 2 CPU cores), so the default `pytest tests` skips these (tests/conftest.py)."""

import glob
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import check_results as results  # noqa: E402  (launch/check_results.py)

TABLES = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(REPO, "docs", "results", "*", results.RECORD)))


@pytest.mark.demo
@pytest.mark.parametrize("folder", TABLES or [None], ids=lambda p: os.path.basename(p) if p else "none")
def test_demo_table_reruns_to_the_printed_digits(folder):
  if folder is None:
    pytest.skip("docs/results/ holds no recorded table yet")
  assert results.check(folder) == []
