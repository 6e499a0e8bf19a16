"""A readable error for a `--config=` file that does not load and for `--config.<key>=value` overrides that name no
config field, before absl parses the flags.

config_flags reports such a key with a traceback from deep inside ml_collections; `check_overrides(argv)` loads the
`--config=` file the same way and returns one line per bad key, naming the key, the config file and the closest
existing fields, so the launchers can print them and exit with status 2.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_spec(argv: Sequence[str]) -> Optional[str]:
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _override_keys(argv: Sequence[str]) -> list:
  keys = []
  for a in argv:
    for prefix in ("--config.", "--noconfig."):
      if a.startswith(prefix):
        keys.append(a[len(prefix):].split("=", 1)[0])
  return keys


def _config_error(spec: str, e: BaseException) -> ValueError:
  """One line naming the --config file (and variant) for anything loading it raised."""
  path = spec.split(":")[0]
  text = " ".join(str(e).split()) or type(e).__name__
  text = text[len(path) + 2:] if text.startswith(f"{path}: ") else text
  if not isinstance(e, (ValueError, OSError)):
    text = f"{type(e).__name__}: {text}"
  return ValueError(f"--config={spec}: {text}")


def load_config_module(spec: str, name: str = "_evqa_config"):
  """The Python module of a `--config=configs/x.py[:variant]` file (the variant is ignored here); anything that
  stops it loading (a syntax error, a failing import) is a ValueError naming the file."""
  path = spec.split(":")[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--config file {path} does not exist" if not os.path.exists(path)
                            else f"--config file {path} is not a file")
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  try:
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
      raise ValueError(f"{path}: not a Python config file (configs/<name>.py)")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 - a config file is code; whatever it raises is reported as one line
    raise _config_error(spec, e) from e
  return module


def load_config(spec: str):
  """`configs/x.py[:variant]` -> the ConfigDict its `get_config(variant)` returns (what config_flags loads); a missing
  get_config, an unknown variant or anything else get_config raises is a ValueError naming the file and variant."""
  arg = spec.partition(":")[2]
  module = load_config_module(spec)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"--config={spec}: {spec.split(':')[0]} defines no get_config()")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001
    raise _config_error(spec, e) from e


def _fields(node, prefix: str = "") -> list:
  out = []
  for k in node.keys():
    name = f"{prefix}{k}"
    child = node[k]
    if hasattr(child, "keys") and hasattr(child, "to_dict"):
      out += _fields(child, name + ".")
    else:
      out.append(name)
  return out


def check_overrides(argv: Sequence[str]) -> list:
  """Messages for a `--config=` file that does not load (missing, broken, no get_config, unknown variant: one message
  naming the file and variant) or for the `--config.` keys of `argv` that it does not define ([] if all is well or
  there is no --config flag)."""
  spec = _config_spec(argv)
  if not spec:
    return []
  try:
    config = load_config(spec)
  except ValueError as e:
    return [str(e)]
  except OSError as e:
    return [" ".join(str(e).split())]
  keys = _override_keys(argv)
  fields = _fields(config)
  errors = []
  for key in keys:
    node, ok = config, True
    for part in key.split("."):
      if hasattr(node, "keys") and part in node.keys():
        node = node[part]
      else:
        ok = False
        break
    if not ok:
      *head, leaf = key.split(".")
      parent_node, prefix = config, ""
      for part in head:  # the deepest existing parent: suggest its fields first, by the last name component
        if hasattr(parent_node, "keys") and part in parent_node.keys() and hasattr(parent_node[part], "keys"):
          parent_node, prefix = parent_node[part], prefix + part + "."
        else:
          break
      siblings = [k for k in parent_node.keys()] if prefix or not head else []
      close = [prefix + k for k in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.5)]
      if not close:
        close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
      hint = f"; did you mean {', '.join(close)}?" if close else ""
      errors.append(f"--config.{key}: {spec} has no field {key!r}{hint}")
  return errors


def exit_on_bad_overrides(argv: Sequence[str]) -> None:
  errors = check_overrides(argv)
  if errors:
    for e in errors:
      print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
