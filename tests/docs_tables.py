"""Every number of a docs/ table that comes from a recorded run, compared with the committed record
(docs/results/<record>/): a generic Markdown table parser, and TABLES, the map from each such table to its records.

A cell is read as its numbers in order ("27.70 / 12.64 / 0", "99.88 ± 0.21", "65.22 ± 12.64 -> 76.29 ± 23.24"); a
column maps to the record values that give them, formatted to the decimals the record's `printed` says the docs
print (or a column's own, e.g. unseen accuracy printed as a whole number inside a compound cell). A section that
cites a record (`docs/results/` in its text) may hold only mapped tables or tables listed in NOT_FROM_A_RECORD, and a
mapped table only mapped columns and rows, so a new table, column or row is checked or fails until it is classified.

  mismatches(repo)   -> one line per docs cell that differs from its record (or per unmapped table, column, row)
"""

import dataclasses
import glob
import json
import os
import re

HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
CITES = "docs/results/"
# A section cites a record when it names a record folder (`docs/results/<name>`), not the folder in general.
CITES_RECORD = re.compile(r"docs/results/[A-Za-z0-9_.-]+")


# ------------------------------------------------------------------------------------------------------ the parser

@dataclasses.dataclass
class MdTable:
  doc: str  # path relative to the repository
  section: str  # the heading above it
  index: int  # its position among the section's tables
  line: int  # 1-based line of its header
  header: list
  rows: list  # [[cell, ...], ...] (the separator line dropped)


def split_row(line: str) -> list:
  """The cells of a Markdown table line (an escaped `\\|` stays in its cell)."""
  body = line.strip()
  body = body[1:] if body.startswith("|") else body
  body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
  return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def parse(path: str, rel: str) -> tuple:
  """-> ([MdTable], {section: its text}) of one Markdown file (fenced code skipped)."""
  tables, sections, section, in_fence, block = [], {}, "", False, []
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()

  def flush():
    if len(block) >= 2 and re.fullmatch(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?", block[1][1].strip()):
      index = sum(t.section == section for t in tables)
      tables.append(MdTable(rel, section, index, block[0][0], split_row(block[0][1]),
                            [split_row(l) for _, l in block[2:]]))
    block.clear()

  for n, line in enumerate(lines, 1):
    if FENCE.match(line):
      in_fence = not in_fence
    if not in_fence and line.lstrip().startswith("|"):
      block.append((n, line))
      sections[section] = sections.get(section, "") + line + "\n"
      continue
    flush()
    m = None if in_fence else HEADING.match(line)
    if m:
      section = m.group(2)
    sections[section] = sections.get(section, "") + line + "\n"
  flush()
  return tables, sections


def numbers(cell: str) -> list:
  """The numbers of a cell as printed ("**84.0**" -> ["84.0"])."""
  return NUMBER.findall(cell.replace("**", ""))


# -------------------------------------------------------------------------------------------------- the mapping

@dataclasses.dataclass(frozen=True)
class V:
  """One printed figure: `key` of the row's point (or `point`), at the row's seed (or `seed`); `agg` "val" (one run),
  "meanstd" (mean and sample std, ddof 1, over every `<point>_seed*` run of the record, as launch/sweep.py prints
  them; a zero mean and std may be printed as a bare "0") or "count" (the number of seed runs); `dec` overrides the
  record's printed decimals."""
  key: str
  agg: str = "val"
  point: str | None = None
  seed: int | None = None
  dec: int | None = None


@dataclasses.dataclass(frozen=True)
class Row:
  """Where a row's figures are: `record`, its `points` (the cell gives each point's figures in turn, "a -> b"),
  `seed`, and the metrics `file` with the dotted `prefix` of its keys."""
  record: str | None = None
  points: tuple = ()
  seed: int | None = None
  file: str = "final_metrics.json"
  prefix: str = "eval.test."


@dataclasses.dataclass(frozen=True)
class Table:
  """A docs table: `doc`, `section` (its heading), `index` among that section's tables. `label`: the column naming
  the row (its first word is the point unless `rows` maps the label); `columns`: header -> [V, ...], None for a
  column that is not a record's figure; `record`: the rows' record, or `record_column`, a column whose
  `docs/results/<name>/` names the record of its row and the blank-labelled rows below; `records`: several records,
  each row's point checked in every one that holds it; `rows`: label -> Row, or None for a row not from a record."""
  doc: str
  section: str
  columns: dict
  index: int = 0
  label: str = "point"
  record: str | None = None
  records: tuple = ()
  record_column: str | None = None
  rows: dict | None = None


OVQA = {"B": "base", "C": "common", "R": "rare", "U": "unseen", "T": "total", "M": "mAcc", "BNG": "BNG"}
ONE_RUN = {h: [V(k)] for h, k in OVQA.items()}
OVER_SEEDS = {"seeds": [V("mAcc", "count")], **{h: [V(k, "meanstd")] for h, k in OVQA.items()}}


def _m_r_u(seed):  # "mAcc / rare / unseen" at one seed, unseen printed as a whole number
  return [V("mAcc", seed=seed), V("rare", seed=seed), V("unseen", seed=seed, dec=0)]


def _all7(seed):  # "B / C / R / U / T / M / BNG" at one seed
  return [V(k, seed=seed) for k in OVQA.values()]


PER_SEED_M_R_U = {"seed 42": _m_r_u(42), "seed 43": _m_r_u(43), "seed 44": _m_r_u(44),
                  "mean M ± std": [V("mAcc", "meanstd")]}
JUSTASK_RECORDS = ("ovqa_heads_justask_seeds", "ovqa_justask_stages_seeds", "ovqa_heads_seeds_4ep")
VIOLIN = {"test acc": [V("accuracy")], "visual": [V("accuracy_visual")], "dialogue": [V("accuracy_dialogue")],
          "combined": [V("accuracy_combined")], "edit neg": [V("accuracy_neg_edit")],
          "adversarial neg": [V("accuracy_neg_adversarial")]}
EVQA = {"answer acc": [V("accuracy")], "mIoU": [V("mIoU")], "mIoP": [V("mIoP")], "t-mean": [V("t_mean")],
        "J&F (evidence frames)": [V("JF")], "MCQ qa": [V("mcq_qa")], "MCQ temporal": [V("mcq_temporal")],
        "MCQ spatial": [V("mcq_spatial")], "MCQ pooled": [V("mcq_pooled")],
        "J&F (every frame)": None}  # `--rescore` of the run's predictions: not in the record
EVQA_ROWS = {"demo, step 100": Row("evqa_demo", file="eval/test_step100/metrics.json", prefix=""),
             "demo, step 200 (final)": Row("evqa_demo"),
             # benchmarks/evqa_trivial_baselines.py (deterministic, no training): not a recorded run
             "whole video + empty masks, answer \"A\"": None, "whole video + centred box, answer \"A\"": None,
             "whole video + full-frame mask, answer \"A\"": None, "MCQ: always the first option": None}

R = "docs/results.md"
TABLES = [
    Table(R, "OVQA: the heads on MiniLM-L6", ONE_RUN, record="ovqa_heads_minilm"),
    Table(R, "OVQA: Table 8, the eps sweep", ONE_RUN, record="ovqa_eps_4ep"),
    Table(R, "OVQA: the seed study", OVER_SEEDS, record="ovqa_eps_seeds_4ep"),
    Table(R, "OVQA: the heads over three seeds (the ordering per seed)", dict(PER_SEED_M_R_U, **{"wall time": None}),
          record_column="run"),
    Table(R, "OVQA: the heads in the neighbours world (seeds 42 and 43)",
          {"seed 42": _all7(42), "seed 43": _all7(43)}, record="ovqa_nbrworld_heads"),
    Table(R, "OVQA: the heads in the neighbours world (seeds 42 and 43)", PER_SEED_M_R_U, index=1,
          record="ovqa_nbrworld_heads_lr2e-3"),
    Table(R, "OVQA: the heads with the LM's MLM head frozen (the README's main command)", OVER_SEEDS,
          record="ovqa_demo_heads"),
    Table(R, "OVQA: the heads with the LM's MLM head frozen (the README's main command)", PER_SEED_M_R_U, index=1,
          record="ovqa_demo_heads"),
    Table(R, "OVQA: the heads with the LM's MLM head frozen (the README's main command)", PER_SEED_M_R_U, index=2,
          record="ovqa_heads_mlmhead_trained_seeds"),
    Table(R, "OVQA: the JustAsk rows (seeds 42-44)", OVER_SEEDS, records=JUSTASK_RECORDS),
    Table(R, "OVQA: the All-in-one rows (frames world, seeds 42-44)", OVER_SEEDS, record="ovqa_heads_allinone_seeds"),
    Table(R, "OVQA: Table 5, the verbalizer variants", ONE_RUN, record="ovqa_variants_4ep"),
    Table(R, "VIOLIN: Table 3, the input ablation", VIOLIN, record="violin_inputs"),
    Table(R, "E-VQA: the demo", EVQA, label="predictions", rows=EVQA_ROWS),
    Table(R, "The same commands on other CPUs", {
        f"{p} M / U": [V("mAcc", point=p), V("unseen", point=p, dec=0)]
        for p in ("cvqa", "frozenbilm_plus", "frozenbilm_plus_gnn")}, label="machine", rows={
        "Intel Xeon, AVX-512 (recorded)": Row("ovqa_heads_minilm"),
        "AMD EPYC Zen 4, AVX-512 (= docs/results/ovqa_heads_seeds_4ep/, seed 42)": Row("ovqa_heads_seeds_4ep", seed=42),
        "AMD EPYC Zen 3, AVX2": None}),  # from that run's log: not recorded
    Table(R, "The same commands on other CPUs", {
        "eps_1.0 M": [V("mAcc", "meanstd", point="eps_1.0")], "eps_0.7 M": [V("mAcc", "meanstd", point="eps_0.7")],
        "eps_1.0 U": [V("unseen", "meanstd", point="eps_1.0")], "eps_0.7 U": [V("unseen", "meanstd", point="eps_0.7")],
        "eps 0.7 better at": None}, index=1, label="machine", rows={
        "Intel Xeon, AVX-512 (recorded)": Row("ovqa_eps_seeds_4ep"),
        "AMD EPYC Zen 3, AVX2": None}),  # from that run's logs: not recorded
    Table("docs/evqa.md", "Demo: the synthetic world", EVQA, label="predictions", rows=EVQA_ROWS),
    Table("docs/violin.md", "Built-in demo: Table 3's input ablation on the synthetic world", VIOLIN,
          record="violin_inputs"),
    Table("docs/justask.md", "The demo (built-in synthetic world, CPU)", {h: v for h, v in OVER_SEEDS.items()
                                                                          if h != "seeds"}, records=JUSTASK_RECORDS),
    Table("docs/justask.md", "The demo (built-in synthetic world, CPU)",
          {f"seed {s}": [V("mAcc", seed=s)] for s in (42, 43, 44)}, index=1, records=JUSTASK_RECORDS),
    Table("docs/justask.md", "The demo (built-in synthetic world, CPU)", {
        "rare": [V("rare", "meanstd")], "unseen": [V("unseen", "meanstd")], "mAcc": [V("mAcc", "meanstd")]},
        index=2, label="backbone", rows={
        "FrozenBiLM+": Row("ovqa_heads_seeds_4ep", ("frozenbilm_plus", "frozenbilm_plus_gnn")),
        "JustAsk+, stage 1 -> two stages with GNN": Row("ovqa_heads_justask_seeds",
                                                       ("justask_plus", "justask_plus_gnn")),
        "JustAsk+, second stage without -> with GNN": Row("ovqa_justask_stages_seeds",
                                                         ("justask_plus_stage2", "justask_plus_gnn"))}),
]

# Tables in a section that cites a record whose numbers are not a record's, with the reason.
NOT_FROM_A_RECORD = {
    ("docs/evqa.md", "Demo: the synthetic world", 1): "per question kind: `--rescore` output, not recorded",
    ("docs/justask.md", "The demo (built-in synthetic world, CPU)", 3): "seconds per step of 20-step timing runs",
    ("README.md", "What the main command prints", 0): "ranges over three CPUs, one of them (Zen 3) not recorded",
}


# ---------------------------------------------------------------------------------------------------- the check

def _lookup(obj, dotted: str, where: str):
  for part in dotted.split("."):
    if not isinstance(obj, dict) or part not in obj:
      raise KeyError(f"{where}: no key {dotted!r}")
    obj = obj[part]
  return float(obj)


class Records:
  """The committed records under `root` (docs/results/), read once."""

  def __init__(self, root: str):
    self.root, self._json = root, {}

  def json(self, *parts):
    path = os.path.join(self.root, *parts)
    if path not in self._json:
      with open(path) as f:
        self._json[path] = json.load(f)
    return self._json[path]

  def has(self, record: str, point: str) -> bool:
    return bool(glob.glob(os.path.join(self.root, record, point))
                + glob.glob(os.path.join(self.root, record, point + "_seed*")))

  def seeds(self, record: str, point: str) -> list:
    found = glob.glob(os.path.join(self.root, record, point + "_seed*"))
    return sorted(int(p.rsplit("_seed", 1)[1]) for p in found)

  def value(self, record: str, run: str, row: Row, key: str):
    """-> (value, the decimals its record says the docs print)."""
    rel = os.path.join(run, row.file) if run else row.file
    printed = self.json(record, "record.json")["printed"]
    if rel not in printed or row.prefix + key not in printed[rel]:
      raise KeyError(f"docs/results/{record}/record.json: {rel} {row.prefix + key} is not a printed figure")
    where = f"docs/results/{record}/{rel}"
    return _lookup(self.json(record, rel), row.prefix + key, where), printed[rel][row.prefix + key]


def expected(records: Records, record: str, point: str | None, row: Row, v: V) -> list:
  """-> the cell's numbers for `v`: a list of alternatives, each a list of number strings."""
  point = v.point or point
  seed = v.seed if v.seed is not None else row.seed
  if v.agg == "count":
    return [[str(len(records.seeds(record, point)))]]
  if v.agg == "meanstd":
    seeds = records.seeds(record, point)
    if len(seeds) < 2:
      raise KeyError(f"docs/results/{record}: fewer than 2 seed runs of {point!r}")
    got = [records.value(record, f"{point}_seed{s}", row, v.key) for s in seeds]
    vals, dec = [g[0] for g in got], v.dec if v.dec is not None else got[0][1]
    mean = sum(vals) / len(vals)
    std = (sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)) ** 0.5
    out = [[f"{mean:.{dec}f}", f"{std:.{dec}f}"]]
    return out + ([["0"]] if float(out[0][0]) == 0 == float(out[0][1]) else [])
  run = (f"{point}_seed{seed}" if seed is not None else point) if point else ""
  value, dec = records.value(record, run, row, v.key)
  return [[f"{value:.{v.dec if v.dec is not None else dec}f}"]]


def _label(cell: str) -> str:
  return cell.replace("**", "").replace("`", "").strip()


def check_table(spec: Table, table: MdTable, records: Records, used: set) -> list:
  """-> the differences between `table` and its records; adds the records it read to `used`."""
  bad, where = [], f"{table.doc}:{table.line} ({spec.section!r} table {spec.index})"
  for h in table.header:
    if h not in spec.columns and h not in (spec.label, spec.record_column):
      bad.append(f"{where}: column {h!r} is not mapped to a record (tests/docs_tables.py TABLES)")
  record = spec.record
  for cells in table.rows:
    row_cells = dict(zip(table.header, cells))
    label = _label(row_cells.get(spec.label, ""))
    if spec.record_column:
      m = re.search(r"docs/results/([^/`]+)/", row_cells.get(spec.record_column, ""))
      record = m.group(1) if m else record
    if spec.rows is not None:
      if label not in spec.rows:
        bad.append(f"{where}: row {label!r} is not mapped to a record (tests/docs_tables.py TABLES)")
        continue
      if spec.rows[label] is None:
        continue  # not from a record
      row = spec.rows[label]
      targets = [(row.record, p) for p in (row.points or (None,))]
    else:
      row, point = Row(), label.split(" ")[0]
      if spec.records:
        targets = [(r, point) for r in spec.records if records.has(r, point)]
        if not targets:
          bad.append(f"{where}: row {label!r}: no record of {spec.records} holds point {point!r}")
          continue
      else:
        targets = [(record, point)]
    for h, terms in spec.columns.items():
      if terms is None or h not in row_cells:
        continue
      got = numbers(row_cells[h])
      for rec, point in targets:  # every record holding the point gives the same figures
        used.add(rec)
        try:
          want = [alts for p in (row.points or (point,)) for v in terms for alts in [expected(records, rec, p, row, v)]]
        except (KeyError, OSError, ValueError) as e:
          bad.append(f"{where}: row {label!r} column {h!r}: {e}")
          break
        if not _matches(got, want):
          bad.append(f"{where}: row {label!r} column {h!r}: docs {row_cells[h]!r}, "
                     f"docs/results/{rec}/ gives {' '.join('/'.join(' '.join(a) for a in w) for w in want)!r}")
        if row.points:
          break  # the row's points name their record
  return bad


def _matches(got: list, want: list) -> bool:
  """Whether the cell's numbers `got` are the figures `want` (each a list of alternatives) in order."""
  if not want:
    return not got
  return any(got[:len(alt)] == alt and _matches(got[len(alt):], want[1:]) for alt in want[0])


def doc_files(repo: str) -> list:
  return [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "**", "*.md"),
                                                              recursive=True))


def mismatches(repo: str, results_root: str | None = None) -> list:
  """Every docs table of `repo` that cites a record, against the records under `results_root` (default
  `repo`/docs/results): -> one line per difference, unmapped table, column or row, or stale mapping."""
  records = Records(results_root or os.path.join(repo, "docs", "results"))
  bad, found, named = [], {}, set()
  for path in doc_files(repo):
    rel = os.path.relpath(path, repo)
    tables, sections = parse(path, rel)
    for t in tables:
      found[(rel, t.section, t.index)] = t
      spec = [s for s in TABLES if (s.doc, s.section, s.index) == (rel, t.section, t.index)]
      if spec:
        used = set()
        bad += check_table(spec[0], t, records, used)
        for record in sorted(used):  # the section names the machine each record was made on
          cpu = records.json(record, "record.json").get("cpu")
          if cpu and cpu not in sections.get(t.section, "") and (rel, t.section, record) not in named:
            named.add((rel, t.section, record))
            bad.append(f"{rel}: section {t.section!r} does not name the CPU {cpu!r} that docs/results/{record}/ "
                       f"was made on")
      elif CITES_RECORD.search(sections.get(t.section, "")) and (rel, t.section, t.index) not in NOT_FROM_A_RECORD:
        bad.append(f"{rel}:{t.line}: a table in a section that cites {CITES} is not mapped to its record "
                   f"(tests/docs_tables.py TABLES or NOT_FROM_A_RECORD)")
  for key in [(s.doc, s.section, s.index) for s in TABLES] + list(NOT_FROM_A_RECORD):
    if key not in found:
      bad.append(f"tests/docs_tables.py: no table {key} in the docs (a stale mapping)")
  return bad
