"""Every number of a docs/ table that comes from a recorded run equals its committed record (docs/results/), and a
change of one printed digit on either side, or a new table, column or row no record maps, fails the check
(tests/docs_tables.py)."""

import json
import os
import shutil

import pytest

import docs_tables

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_tables_equal_their_records():
  assert docs_tables.mismatches(REPO) == []


def test_every_mapped_cell_is_compared():
  """The check reads numbers from every mapped table: at least the cells counted here by hand from the docs."""
  found = {}
  for path in docs_tables.doc_files(REPO):
    rel = os.path.relpath(path, REPO)
    for t in docs_tables.parse(path, rel)[0]:
      found[(rel, t.section, t.index)] = t
  cells = 0
  for spec in docs_tables.TABLES:
    t = found[(spec.doc, spec.section, spec.index)]
    for row in t.rows:
      label = docs_tables._label(dict(zip(t.header, row)).get(spec.label, ""))
      if spec.rows is not None and spec.rows.get(label) is None:
        continue
      cells += sum(1 for h, c in zip(t.header, row) if spec.columns.get(h) and docs_tables.numbers(c))
  # results.md 3x7 + 8x7 + 2x8 + 6x4 + 2x2 + 2x4 + 3x8 + 3x4 + 2x4 + 7x8 + 3x8 + 5x7 + 5x6 + 2x9 + 2x3 + 1x4;
  # evqa.md 2x9; violin.md 5x6; justask.md 7x7 + 7x3 + 3x3
  assert cells == 21 + 56 + 16 + 24 + 4 + 8 + 24 + 12 + 8 + 56 + 24 + 35 + 30 + 18 + 6 + 4 + 18 + 30 + 49 + 21 + 9


def test_parser_reads_compound_cells():
  assert docs_tables.numbers("**84.0**") == ["84.0"]
  assert docs_tables.numbers("27.70 / 12.64 / 0") == ["27.70", "12.64", "0"]
  assert docs_tables.numbers("65.22 ± 12.64 -> 76.29 ± 23.24") == ["65.22", "12.64", "76.29", "23.24"]
  assert docs_tables.numbers("defaults (`docs/results/ovqa_heads_seeds_4ep/`)") == []
  assert docs_tables.split_row("| a | `x \\| y` | 3 |") == ["a", "`x | y`", "3"]


@pytest.fixture
def copy(tmp_path):
  """README.md and docs/ (without images) copied to a scratch repository."""
  shutil.copy(os.path.join(REPO, "README.md"), tmp_path / "README.md")
  shutil.copytree(os.path.join(REPO, "docs"), tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
  return tmp_path


def _edit(path, old, new):
  text = path.read_text()
  assert text.count(old) == 1, old
  path.write_text(text.replace(old, new))


def _bump(path, dotted, delta):
  data = json.loads(path.read_text())
  obj = data
  *parents, last = dotted.split(".")
  for p in parents:
    obj = obj[p]
  obj[last] += delta
  path.write_text(json.dumps(data))


@pytest.mark.parametrize("doc,old,new,where", [
    ("docs/results.md", "| cvqa | 100.00 | 97.95 | 13.00 |", "| cvqa | 100.00 | 97.96 | 13.00 |",
     "row 'cvqa' column 'C'"),  # one run, last printed digit
    ("docs/justask.md", "27.51 ± 0.29", "27.51 ± 0.30", "row 'justask_cvqa' column 'M'"),  # a std over seeds
    ("docs/results.md", "| 63.97 / 64.98 / 24 |", "| 63.97 / 64.98 / 25 |", "column 'seed 42'"),  # in a compound
    ("docs/evqa.md", "| **84.0** | **94.18** |", "| **84.0** | **94.19** |", "column 'mIoU'"),
])
def test_a_changed_docs_cell_fails(copy, doc, old, new, where):
  _edit(copy / doc, old, new)
  bad = docs_tables.mismatches(str(copy))
  assert len(bad) == 1 and doc in bad[0] and where in bad[0], bad


@pytest.mark.parametrize("run,key,delta,cells", [
    ("ovqa_heads_minilm/frozenbilm_plus_gnn/final_metrics.json", "eval.test.mAcc", 0.01, 2),  # heads + other CPUs
    ("violin_inputs/video/final_metrics.json", "eval.test.accuracy_visual", -0.01, 2),  # results.md + violin.md
    ("ovqa_heads_justask_seeds/justask_plus_seed43/final_metrics.json", "eval.test.rare", 0.03, 3),  # mean of 3
    ("evqa_demo/eval/test_step100/metrics.json", "mcq_qa", 0.1, 2),
])
def test_a_changed_record_value_fails(copy, run, key, delta, cells):
  _bump(copy / "docs" / "results" / run, key, delta)
  bad = docs_tables.mismatches(str(copy))
  assert len(bad) == cells and all(f"docs/results/{run.split('/')[0]}/" in b for b in bad), bad


def test_an_unmapped_table_column_or_row_fails(copy):
  results = copy / "docs" / "results.md"
  _edit(results, "| point | B | C | R | U | T | M | BNG |\n|---|---|---|---|---|---|---|---|\n| cvqa | 100.00 | 97.95",
        "| point | B | C | R | U | T | M | BNG |\n|---|---|---|---|---|---|---|---|\n| cvqa2 | 1.00 | 1 | 1 | 1 | 1 "
        "| 1 | 1 |\n| cvqa | 100.00 | 97.95")
  _edit(results, "| predictions | answer acc |", "| predictions | answer accuracy |")
  _edit(copy / "docs" / "violin.md", "Test split, 300 clips",
        "A new table (`docs/results/violin_inputs/`):\n\n| point | acc |\n|---|---|\n| both | 95.33 |\n\nTest split, 300 clips")
  bad = "\n".join(docs_tables.mismatches(str(copy)))
  assert "row 'cvqa2' column 'B'" in bad and "is not a printed figure" in bad  # a point its record does not hold
  assert "column 'answer accuracy' is not mapped" in bad
  assert "docs/violin.md" in bad and "is not mapped to its record" in bad


def test_a_section_must_name_its_records_cpu(copy):
  _edit(copy / "docs" / "justask.md", "**Seeds 42-44** (AMD EPYC with AVX-512,", "**Seeds 42-44** (AVX-512,")
  bad = docs_tables.mismatches(str(copy))
  assert len(bad) == 3 and all("does not name the CPU 'AMD EPYC'" in b for b in bad), bad  # its 3 records
