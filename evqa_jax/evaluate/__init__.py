"""Command-line evaluators over prediction files; by default each gives the official scoring script's numbers.

  python -m evqa_jax.evaluate.ovqa            --train-csv T | --ans2cat A [--test-vocab V]  --test-csv S --pred P
                                              [--pred P2 --label A --label B] --out metrics.json [--plot acc_vs_freq.png]
  python -m evqa_jax.evaluate.st_evidence     --gt-csv G --pred P.json [--gt-masks DIR [--pred-masks DIR]]
                                              [--out metrics.json]
  python -m evqa_jax.evaluate.st_evidence_mcq RESULTS.json | --pred P.json (--gt G.json | --mcq-csv C --temp-options T
                                              --mask-options M) [--out metrics.json]
  python -m evqa_jax.evaluate.violin          --gt violin_annotation.json --pred P.json [--split test] --out m.json

Each module exposes `main(argv=None) -> dict` (the metrics it wrote) so tests and scripts can call it in-process.
Each output starts with an "official" block (the official keys and rounding), then our unrounded values and counts.
Metrics come from `evqa_jax.metrics` (which never imports this package); file reading lives here; output files are
written atomically through `evqa_jax.io`. NaN (a metric with an empty denominator) is written as JSON null.
"""

import math
from typing import Any


def json_safe(obj: Any) -> Any:
  """Replaces NaN/inf floats by None and numpy scalars by python numbers, recursively, for strict JSON."""
  if isinstance(obj, dict):
    return {str(k): json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
    obj = obj.item()
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  return obj


def load_json_object(path: str, what: str, expected: str, finite: bool = True) -> dict:
  """Reads a JSON file that must hold an object; errors name `what`, the path and the `expected` layout.

  finite=False for prediction files: NaN / Infinity are read (and then scored and counted as malformed) as the
  official scripts' json.load reads them."""
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  raw = io.load_json(path, what, finite)  # UTF-8 (and finite 64-bit numbers); errors name the file, line, field
  if not isinstance(raw, dict):
    raise ValueError(f"{what} {path}: expected an object {expected}, got {type(raw).__name__}")
  return raw


def read_csv(path: str, what: str, columns=()):
  """A CSV file (local or gs://) as a pandas DataFrame of strings (no cell read as NaN) that has `columns`; errors
  name `what` and the path (FileNotFoundError when it is absent, ValueError when it does not parse or lacks one)."""
  import pandas as pd  # pylint: disable=g-import-not-at-top
  from evqa_jax import io  # pylint: disable=g-import-not-at-top
  if not io.epath_of(path).is_file():
    raise FileNotFoundError(f"{what} {path} does not exist")
  try:
    df = pd.read_csv(io.text_stream(path, what), dtype=str, keep_default_na=False)
  except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
    raise ValueError(f"{what} {path}: cannot parse CSV ({e})") from None
  missing = [c for c in columns if c not in df.columns]
  if missing:
    raise ValueError(f"{what} {path}: missing column(s) {missing}; found {list(df.columns)}")
  return df
