"""Feature specs and tf.train.Example encoding/decoding, without TensorFlow.

A spec is a dict name -> `Feature(dtype, shape)`. `shape` is a tuple in which None marks a variable
dimension, e.g. `(None, 768)`; `()` is a scalar. How each dtype is stored in the Example proto (chosen so
that `tf.io.parse_single_example` reads the records too):

  float32, float16   float_list (float16 values are exact in float32)
  int64, int32, bool int64_list (bool as 0/1)
  uint8              bytes_list holding ONE raw byte string (C order); in TF: `tf.io.decode_raw(x, tf.uint8)`
  string             bytes_list of UTF-8 strings, one per element

Fixed dimensions and at most one variable dimension are recovered from the element count. A feature with
more than one variable dimension also stores its shape in an int64_list feature named `<name>/shape`.

Decoded strings come back as python `str` (scalar) or an np.ndarray of `str` objects (dtype object).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np
from tensorflow_datasets.proto import tf_example_pb2

DTYPES = ("float32", "float16", "int64", "int32", "uint8", "bool", "string")
SHAPE_SUFFIX = "/shape"

# numpy dtype kinds accepted on encode for each spec dtype; a float array is never silently truncated to
# an integer feature, and strings are never coerced to numbers.
_ACCEPTED_KINDS = {
    "float32": "fiu",
    "float16": "fiu",
    "int64": "iu",
    "int32": "iu",
    "uint8": "iu",
    "bool": "b",
}
_INT_RANGES = {
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint8": (0, 255),
}


@dataclasses.dataclass(frozen=True)
class Feature:
  """One field of an example: dtype name and shape (None = variable dimension)."""

  dtype: str
  shape: tuple = ()

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"Feature dtype {self.dtype!r} is not one of {DTYPES}")
    shape = tuple(self.shape)
    for d in shape:
      if d is not None and (not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0):
        raise ValueError(f"Feature shape {self.shape!r}: dimensions must be non-negative ints or None")
    object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in shape))

  @property
  def num_variable_dims(self) -> int:
    return sum(d is None for d in self.shape)

  def to_json(self) -> dict:
    return {"dtype": self.dtype, "shape": list(self.shape)}

  @classmethod
  def from_json(cls, obj: Mapping[str, Any]) -> "Feature":
    try:
      return cls(obj["dtype"], tuple(obj["shape"]))
    except (KeyError, TypeError) as e:
      raise ValueError(f"Feature JSON {obj!r} needs keys 'dtype' and 'shape'") from e


def spec_to_json(spec: Mapping[str, Feature]) -> dict:
  return {name: f.to_json() for name, f in sorted(spec.items())}


def spec_from_json(obj: Mapping[str, Any]) -> dict[str, Feature]:
  return {name: Feature.from_json(f) for name, f in obj.items()}


def _ctx(name: str, where: str | None) -> str:
  return f"field {name!r}" + (f" of {where}" if where else "")


def _check_shape(name: str, feature: Feature, shape: tuple, where: str | None) -> None:
  if len(shape) != len(feature.shape) or any(
      want is not None and want != got for want, got in zip(feature.shape, shape)):
    raise ValueError(f"{_ctx(name, where)}: shape {tuple(shape)} does not match spec shape {feature.shape}")


def _as_string_array(name: str, value: Any, where: str | None) -> np.ndarray:
  if isinstance(value, (str, bytes)):
    arr = np.empty((), dtype=object)
    arr[()] = value
  else:
    arr = np.asarray(value, dtype=object) if not isinstance(value, np.ndarray) else value
    if arr.dtype.kind not in "USO":
      raise ValueError(f"{_ctx(name, where)}: expected strings, got array of dtype {arr.dtype}")
  out = []
  for v in arr.reshape(-1).tolist():
    if isinstance(v, str):
      out.append(v.encode("utf-8"))
    elif isinstance(v, bytes):
      try:
        v.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{_ctx(name, where)}: bytes value is not valid UTF-8 text") from e
      out.append(v)
    else:
      raise ValueError(f"{_ctx(name, where)}: expected str elements, got {type(v).__name__}")
  result = np.empty(len(out), dtype=object)
  result[:] = out
  return result.reshape(arr.shape)


def _validate_numeric(name: str, feature: Feature, value: Any, where: str | None) -> np.ndarray:
  if isinstance(value, (str, bytes)):
    raise ValueError(f"{_ctx(name, where)}: expected {feature.dtype} values, got a string")
  arr = np.asarray(value)
  if arr.dtype.kind not in _ACCEPTED_KINDS[feature.dtype]:
    raise ValueError(f"{_ctx(name, where)}: dtype {arr.dtype} cannot be stored as {feature.dtype}")
  if feature.dtype in _INT_RANGES and arr.size:
    lo, hi = _INT_RANGES[feature.dtype]
    if int(arr.min()) < lo or int(arr.max()) > hi:
      raise ValueError(f"{_ctx(name, where)}: values outside the {feature.dtype} range [{lo}, {hi}]")
  if feature.dtype in ("float32", "float16") and arr.size:
    # Checked after the cast to the storage dtype: 1e6 is finite in float32 but inf in float16.
    cast = arr.astype(feature.dtype)
    if not np.all(np.isfinite(cast)):
      bad = np.argwhere(~np.isfinite(cast))[0]
      raise ValueError(f"{_ctx(name, where)}: value {arr[tuple(bad)]!r} at {tuple(int(i) for i in bad)} is not "
                       f"finite as {feature.dtype} (NaN, inf, or beyond the dtype's range)")
  return arr


def _check_fields(example: Mapping[str, Any], spec: Mapping[str, Feature], where: str | None) -> None:
  """ValueError naming the first spec field missing from `example`, or the first field the spec does not have."""
  missing = sorted(set(spec) - set(example))
  extra = sorted(set(example) - set(spec))
  if missing:
    raise ValueError(f"{_ctx(missing[0], where)}: missing (spec fields missing from example: {missing})")
  if extra:
    raise ValueError(f"{_ctx(extra[0], where)}: not in the spec (extra fields: {extra})")


def validate_example(example: Mapping[str, Any], spec: Mapping[str, Feature], where: str | None = None) -> None:
  """The checks of `encode_example` without serializing: fields, dtype kinds, values after the cast to the storage
  dtype (finite floats, ints in range) and shapes. ValueError naming the field and `where`."""
  _check_fields(example, spec, where)
  for name in sorted(spec):
    feature = spec[name]
    if feature.dtype == "string":
      _check_shape(name, feature, _as_string_array(name, example[name], where).shape, where)
    else:
      _check_shape(name, feature, _validate_numeric(name, feature, example[name], where).shape, where)


def encode_example(example: Mapping[str, Any], spec: Mapping[str, Feature], where: str | None = None) -> bytes:
  """Validates `example` against `spec` and serializes it as a tf.train.Example.

  Raises ValueError naming the field (and `where`, e.g. "record 12 of train.csv") on a missing or extra
  field, a wrong dtype kind, out-of-range integers, or a shape that does not match the spec.
  """
  _check_fields(example, spec, where)
  proto = tf_example_pb2.Example()
  fmap = proto.features.feature
  for name in sorted(spec):
    feature = spec[name]
    if name.endswith(SHAPE_SUFFIX):
      raise ValueError(f"{_ctx(name, where)}: names ending in {SHAPE_SUFFIX!r} are reserved")
    value = example[name]
    if feature.dtype == "string":
      arr = _as_string_array(name, value, where)
      _check_shape(name, feature, arr.shape, where)
      fmap[name].bytes_list.value.extend(arr.reshape(-1).tolist())
    else:
      arr = _validate_numeric(name, feature, value, where)
      _check_shape(name, feature, arr.shape, where)
      flat = arr.reshape(-1)
      if feature.dtype in ("float32", "float16"):
        fmap[name].float_list.value.extend(flat.astype(np.float32).tolist())
      elif feature.dtype == "uint8":
        fmap[name].bytes_list.value.append(flat.astype(np.uint8).tobytes())
      else:
        fmap[name].int64_list.value.extend(flat.astype(np.int64).tolist())
    if feature.num_variable_dims > 1:
      fmap[name + SHAPE_SUFFIX].int64_list.value.extend(list(arr.shape))
  return proto.SerializeToString(deterministic=True)


def _resolve_shape(name: str, feature: Feature, count: int, fmap, where: str | None) -> tuple:
  if feature.num_variable_dims > 1:
    if (name + SHAPE_SUFFIX) not in fmap:
      raise ValueError(f"{_ctx(name, where)}: record lacks {name + SHAPE_SUFFIX!r} for its variable shape")
    shape = tuple(int(d) for d in fmap[name + SHAPE_SUFFIX].int64_list.value)
    _check_shape(name, feature, shape, where)
  elif feature.num_variable_dims == 1:
    known = math.prod(d for d in feature.shape if d is not None)
    if known == 0:
      if count:
        raise ValueError(f"{_ctx(name, where)}: {count} values for spec shape {feature.shape}")
      missing_dim = 0
    elif count % known:
      raise ValueError(f"{_ctx(name, where)}: {count} values do not fit spec shape {feature.shape}")
    else:
      missing_dim = count // known
    shape = tuple(missing_dim if d is None else d for d in feature.shape)
  else:
    shape = feature.shape
  if math.prod(shape) != count:
    raise ValueError(f"{_ctx(name, where)}: {count} values stored, spec shape {shape} needs {math.prod(shape)}")
  return shape


def decode_example(data: bytes, spec: Mapping[str, Feature], where: str | None = None) -> dict[str, Any]:
  """Parses a serialized tf.train.Example into numpy arrays following `spec`.

  Returns name -> np.ndarray of the spec dtype and shape; string scalars come back as `str` and string
  arrays as np.ndarray of `str` objects. Raises ValueError naming the field (and `where`) on a missing or
  extra field, a value list of the wrong kind, or a count that does not fit the spec shape.
  """
  proto = tf_example_pb2.Example()
  try:
    proto.ParseFromString(data)
  except Exception as e:  # protobuf raises its own DecodeError type
    raise ValueError(f"{where or 'record'}: not a serialized tf.train.Example ({e})") from e
  fmap = proto.features.feature
  stored = set(fmap.keys())
  shape_keys = {n + SHAPE_SUFFIX for n, f in spec.items() if f.num_variable_dims > 1}
  missing = sorted(set(spec) - stored)
  extra = sorted(stored - set(spec) - shape_keys)
  if missing:
    raise ValueError(f"{_ctx(missing[0], where)}: missing from record (missing fields: {missing})")
  if extra:
    raise ValueError(f"{_ctx(extra[0], where)}: in record but not in the spec (extra fields: {extra})")
  out: dict[str, Any] = {}
  for name, feature in spec.items():
    f = fmap[name]
    kind = f.WhichOneof("kind")
    if feature.dtype in ("float32", "float16"):
      want = "float_list"
    elif feature.dtype in ("string", "uint8"):
      want = "bytes_list"
    else:
      want = "int64_list"
    # An empty list of any kind is stored with no kind set; that is fine when the shape allows zero elements.
    if kind is not None and kind != want:
      raise ValueError(f"{_ctx(name, where)}: stored as {kind}, spec dtype {feature.dtype} needs {want}")
    if feature.dtype == "string":
      values = [v.decode("utf-8") for v in f.bytes_list.value]
      shape = _resolve_shape(name, feature, len(values), fmap, where)
      if shape == ():
        out[name] = values[0]
      else:
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        out[name] = arr.reshape(shape)
    elif feature.dtype == "uint8":
      chunks = list(f.bytes_list.value)
      if len(chunks) > 1:
        raise ValueError(f"{_ctx(name, where)}: uint8 feature must hold one byte string, found {len(chunks)}")
      arr = np.frombuffer(chunks[0], dtype=np.uint8) if chunks else np.zeros(0, np.uint8)
      shape = _resolve_shape(name, feature, arr.size, fmap, where)
      out[name] = arr.reshape(shape).copy()
    elif want == "float_list":
      arr = np.array(f.float_list.value, dtype=np.float32)
      shape = _resolve_shape(name, feature, arr.size, fmap, where)
      out[name] = arr.reshape(shape).astype(feature.dtype, copy=False)
    else:
      arr = np.array(f.int64_list.value, dtype=np.int64)
      shape = _resolve_shape(name, feature, arr.size, fmap, where)
      if feature.dtype == "bool":
        if arr.size and (arr.min() < 0 or arr.max() > 1):
          raise ValueError(f"{_ctx(name, where)}: bool feature holds values other than 0/1")
        out[name] = arr.reshape(shape).astype(bool)
      else:
        out[name] = arr.reshape(shape).astype(feature.dtype, copy=False)
  return out
