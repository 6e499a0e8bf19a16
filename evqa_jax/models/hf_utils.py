"""Reading Hugging Face / PyTorch checkpoints into Flax parameter trees (shared by the encoder importers).

The encoders (`bert.py`, `deberta_v2.py`) name their parameters after the Hugging Face modules, so importing a
checkpoint is a renaming plus a few reshapes. This module holds everything that is not model specific:

Reading (checkpoint -> flat numpy dict keyed by the PyTorch state-dict name):
  `read_checkpoint(path, state_dict_key=None, trust_pickles=False, safe_globals=()) -> dict[str, np.ndarray]`
      `path` is a directory (looks for model.safetensors, model.safetensors.index.json, pytorch_model.bin,
      pytorch_model.bin.index.json, in that order) or a file (*.safetensors, or anything torch.load reads:
      *.bin / *.pt / *.pth). A tensor holding a NaN or an infinity is an error naming it and its file
      (`evqa_io.check_finite_weights`). Floating tensors come back as float32 numpy arrays (bf16/fp16 are upcast), integer
      buffers keep their dtype. safetensors files are parsed directly (no torch needed, bf16 supported).
      PyTorch pickles need torch; they are loaded with `weights_only=True` (tensors, containers, numbers, strings,
      plus the classes in `safe_globals`, e.g. argparse.Namespace for FrozenBiLM's training checkpoints) through
      `evqa_jax.io.torch_load`; anything else is refused unless `trust_pickles=True` (unsafe: runs code).
      `state_dict_key`: for training checkpoints that nest the weights ({"model": state_dict, "optimizer": ...});
      by default a top-level "model" / "state_dict" / "module" entry holding a dict of tensors is unwrapped.
  `strip_prefix(ckpt, prefix)`: drops a prefix such as "bert." / "deberta." from the keys that carry it.
  `rename_legacy_layernorm(ckpt)`: old TF-converted checkpoints name LayerNorm params gamma/beta.

Param trees:
  `unbox(tree)`: removes flax `nn.Partitioned` / `LogicallyPartitioned` boxes (returns plain arrays).
  `params_of(variables)`: accepts a `{"params": ...}` variables dict or a params tree, boxed or not; returns the
      unboxed params tree.
  `flatten_params(tree, sep="/") -> dict[str, array]`, `unflatten_params(flat, sep="/") -> nested dict`.

Assembling (the model specific importer supplies a mapping):
  `Rule(keys, fn=None)`: how one of our parameters is computed from checkpoint tensors `keys` (`fn(*arrays)`;
      default: the single array unchanged). E.g. a PyTorch Linear weight [out, in] -> `Rule((k,), transpose)`.
  `assemble(expected, ckpt, rules, source, init=None, ignore=()) -> (flat_params, LoadReport)`
      `expected`: flat {our_path: array or ShapeDtypeStruct} (from `flatten_params(params_of(init))`).
      For each of our parameters: if its rule's checkpoint keys are all present, the converted tensor is
      shape-checked (ValueError naming our parameter, the checkpoint key(s), their shapes and the file) and cast to
      the expected dtype; otherwise it is taken from `init` (its path is listed in `report.missing`; if `init` is
      None a ValueError lists every missing parameter). Checkpoint keys that no rule consumed are listed in
      `report.unused`, except those matching a regex in `ignore` (buffers such as position_ids).
  `LoadReport`: dataclass with `source`, `loaded` (our paths filled from the checkpoint), `missing` (our paths
      filled from init), `unused` (checkpoint keys not used), `notes`; `str(report)` is a readable summary and
      `report.to_dict()` a JSON-able dict.
"""

import dataclasses
import os
import re
import struct
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from evqa_jax import io as evqa_io

SAFETENSORS_NAMES = ("model.safetensors", "model.safetensors.index.json")
TORCH_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "U16": np.uint16, "U32": np.uint32,
    "U64": np.uint64,
}


# ----------------------------------------------------------------------------------------------- reading


def _read_safetensors(path: str) -> Dict[str, np.ndarray]:
  """Parses a .safetensors file: 8-byte little-endian header size, JSON header, raw little-endian data."""
  with open(path, "rb") as f:
    # One writable buffer: the tensors below are views into it (no per-tensor copy on little-endian hosts).
    raw = bytearray(os.fstat(f.fileno()).st_size)
    got = f.readinto(raw)
  if got != len(raw):
    raise ValueError(f"{path}: short read ({got} of {len(raw)} bytes)")
  if len(raw) < 8:
    raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
  (header_size,) = struct.unpack("<Q", raw[:8])
  if 8 + header_size > len(raw):
    raise ValueError(f"{path}: corrupt safetensors header (size {header_size} exceeds the file)")
  try:
    header = evqa_io.loads_json(bytes(raw[8:8 + header_size]).decode("utf-8"), path, "safetensors header")
  except (UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{path}: corrupt safetensors header: {e}") from e
  if not isinstance(header, dict):
    raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
  data = memoryview(raw)[8 + header_size:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    dtype, shape, offsets = _tensor_entry(path, name, info, len(data))
    start, end = offsets
    buf = data[start:end]
    if dtype == "BF16":
      bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
      arr = bits.view(np.float32)
    elif dtype in _ST_DTYPES:
      arr = np.frombuffer(buf, dtype=np.dtype(_ST_DTYPES[dtype]).newbyteorder("<"))
    else:
      raise ValueError(f"{path}: tensor {name!r} has unsupported safetensors dtype {dtype}")
    arr = arr.reshape(shape)
    if arr.dtype in (np.float16, np.float64):
      arr = arr.astype(np.float32)
    elif not arr.dtype.isnative:
      arr = arr.astype(arr.dtype.newbyteorder("="))  # big-endian host: native order
    out[name] = arr
  evqa_io.check_finite_weights(out, path)
  return out


def _tensor_entry(path: str, name: str, info, data_bytes: int):
  """(dtype, shape, (start, end)) of one safetensors header entry, checked against the data the file holds before
  anything is allocated: a header claiming more bytes than the file has is an error naming file and tensor."""
  ok = (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
        and all(isinstance(d, int) and d >= 0 for d in info["shape"]) and isinstance(info.get("data_offsets"), list)
        and len(info["data_offsets"]) == 2 and all(isinstance(o, int) for o in info["data_offsets"]))
  if not ok:
    raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} needs dtype, shape and data_offsets, "
                     f"got {str(info)[:120]}")
  dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
  itemsize = 2 if dtype == "BF16" else np.dtype(_ST_DTYPES[dtype]).itemsize if dtype in _ST_DTYPES else None
  if itemsize is None:
    raise ValueError(f"{path}: tensor {name!r} has unsupported safetensors dtype {dtype}")
  claimed = int(np.prod(shape, dtype=object)) * itemsize
  if not 0 <= start <= end <= data_bytes or end - start != claimed:
    raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} of shape {list(shape)} {dtype} needs "
                     f"{claimed} bytes, its data_offsets [{start}, {end}] do not fit the {data_bytes} data bytes of the "
                     "file")
  return dtype, shape, (start, end)


def _torch_to_numpy(value, path: str, name: str) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  t = value.detach().cpu()
  if t.is_floating_point():
    t = t.float()
  try:
    return t.numpy().copy()
  except (TypeError, RuntimeError) as e:
    raise ValueError(f"{path}: tensor {name!r} of dtype {value.dtype} cannot be converted to numpy") from e


def _read_torch(path: str, state_dict_key: Optional[str], trust_pickles: bool,
                safe_globals=()) -> Dict[str, np.ndarray]:
  torch = evqa_io.import_torch(f"{path}: reading a PyTorch checkpoint")
  try:
    obj = evqa_io.torch_load(path, trust_pickles, safe_globals)
  except evqa_io.UnsafeInputError:
    raise
  except Exception as e:  # torch raises a zoo of types for unreadable files
    raise ValueError(f"{path}: cannot load PyTorch checkpoint: {e}") from e
  if state_dict_key is not None:
    if not isinstance(obj, Mapping) or state_dict_key not in obj:
      keys = list(obj)[:20] if isinstance(obj, Mapping) else type(obj).__name__
      raise ValueError(f"{path}: no entry {state_dict_key!r} in the checkpoint (top level: {keys})")
    obj = obj[state_dict_key]
  elif isinstance(obj, Mapping):
    if trust_pickles and isinstance(obj.get("model"), torch.nn.Module):  # a pickled model (OVQA's train.py)
      obj = dict(obj, model=obj["model"].state_dict())
    for k in ("model", "state_dict", "module"):
      if k in obj and isinstance(obj[k], Mapping) and not isinstance(obj.get(k), torch.Tensor):
        obj = obj[k]
        break
  if not isinstance(obj, Mapping):
    raise ValueError(f"{path}: expected a state dict (name -> tensor), got {type(obj).__name__}")
  out = {}
  for name, value in obj.items():
    if isinstance(value, torch.Tensor):
      out[name] = _torch_to_numpy(value, path, name)
  if not out:
    raise ValueError(f"{path}: the state dict holds no tensors (top-level keys: {list(obj)[:20]})")
  evqa_io.check_finite_weights(out, path)
  return out


def _read_index(path: str, reader: Callable[[str], Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
  index = evqa_io.load_json(path, "sharded-checkpoint index")
  if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
    raise ValueError(f"{path}: not a sharded-checkpoint index (needs a 'weight_map')")
  weight_map = index["weight_map"]
  directory = os.path.dirname(path)
  out = {}
  for shard in sorted(set(weight_map.values())):
    shard_path = os.path.join(directory, shard)
    if not os.path.exists(shard_path):
      raise FileNotFoundError(f"{path}: shard {shard} listed in the index does not exist")
    out.update(reader(shard_path))
  return out


def read_hf_config(path: str) -> Tuple[str, Dict[str, Any]]:
  """(file, dict) of a Hugging Face config: `path`/config.json, or `path` itself when it is a file."""
  path = os.path.expanduser(path)
  file = path if os.path.isfile(path) else os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise FileNotFoundError(f"{file}: Hugging Face config.json not found")
  return file, evqa_io.load_json(file, "Hugging Face config")


def config_from_dict(cls, d: Dict[str, Any], overrides: Dict[str, Any]):
  """`cls(**fields of d, **overrides)` for a config dataclass: keys of `d` that are not fields are ignored (a Hugging
  Face config.json also holds `architectures` etc.); an override that is not a field is a ValueError naming them."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown override(s) {unknown}; fields are {sorted(names)}")
  kwargs = {k: v for k, v in d.items() if k in names}
  kwargs.update(overrides)
  return cls(**kwargs)


def config_from_hf_dir(cls, path: str, **overrides):
  """`cls.from_dict(config.json of path, **overrides)`; a bad field or override is reported with the file's name."""
  file, d = read_hf_config(path)
  try:
    return cls.from_dict(d, **overrides)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{file}: {e}") from e


def resolve_checkpoint_file(path: str) -> str:
  """The weights file inside a checkpoint directory (or `path` itself when it is a file)."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    for name in SAFETENSORS_NAMES + TORCH_NAMES:
      candidate = os.path.join(path, name)
      if os.path.exists(candidate):
        return candidate
    raise FileNotFoundError(
        f"{path}: no checkpoint found (looked for {', '.join(SAFETENSORS_NAMES + TORCH_NAMES)})")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: checkpoint does not exist")
  return path


def read_checkpoint(path: str, state_dict_key: Optional[str] = None, trust_pickles: bool = False,
                    safe_globals=()) -> Dict[str, np.ndarray]:
  """Reads a checkpoint directory or file into {state-dict name: numpy array}; see the module docstring."""
  file = resolve_checkpoint_file(path)
  torch_reader = lambda p: _read_torch(p, state_dict_key, trust_pickles, safe_globals)
  if file.endswith(".safetensors"):
    return _read_safetensors(file)
  if file.endswith(".safetensors.index.json"):
    return _read_index(file, _read_safetensors)
  if file.endswith(".index.json"):
    return _read_index(file, torch_reader)
  return torch_reader(file)


def strip_prefix(ckpt: Dict[str, np.ndarray], prefix: str) -> Dict[str, np.ndarray]:
  """Removes `prefix` from the keys that start with it; other keys are kept unchanged."""
  return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in ckpt.items()}


def rename_legacy_layernorm(ckpt: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """LayerNorm.gamma / LayerNorm.beta (TF-converted checkpoints) -> LayerNorm.weight / LayerNorm.bias."""
  out = {}
  for k, v in ckpt.items():
    if "LayerNorm" in k:
      k = re.sub(r"\.gamma$", ".weight", k)
      k = re.sub(r"\.beta$", ".bias", k)
    out[k] = v
  return out


# ----------------------------------------------------------------------------------------------- trees


def unbox(tree):
  """Removes flax metadata boxes (nn.Partitioned / LogicallyPartitioned) from a tree."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(tree)


def params_of(variables):
  """The unboxed params tree from `{"params": ...}` (model.init output) or from a params tree itself."""
  if variables is None:
    return None
  tree = unbox(variables)
  if isinstance(tree, Mapping) and set(tree.keys()) >= {"params"} and all(
      isinstance(v, Mapping) for v in tree.values()):
    tree = tree["params"]
  return tree


def flatten_params(tree, sep: str = "/") -> Dict[str, Any]:
  """{"a": {"b": x}} -> {"a/b": x} (leaves are whatever is not a mapping)."""
  out = {}

  def rec(prefix, node):
    if isinstance(node, Mapping):
      for k, v in node.items():
        rec(f"{prefix}{sep}{k}" if prefix else str(k), v)
    else:
      out[prefix] = node

  rec("", tree)
  return out


def unflatten_params(flat: Mapping[str, Any], sep: str = "/") -> Dict[str, Any]:
  """{"a/b": x} -> {"a": {"b": x}}."""
  out: Dict[str, Any] = {}
  for path, value in flat.items():
    node = out
    parts = path.split(sep)
    for p in parts[:-1]:
      node = node.setdefault(p, {})
      if not isinstance(node, dict):
        raise ValueError(f"unflatten_params: {path!r} nests under a leaf")
    node[parts[-1]] = value
  return out


# ----------------------------------------------------------------------------------------------- assembling


@dataclasses.dataclass(frozen=True)
class Rule:
  """Our parameter = fn(*[ckpt[k] for k in keys]); fn defaults to the identity on a single key."""
  keys: Tuple[str, ...]
  fn: Optional[Callable[..., np.ndarray]] = None

  def apply(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
    if self.fn is None:
      if len(arrays) != 1:
        raise ValueError(f"Rule {self.keys}: several keys need a combining fn")
      return arrays[0]
    return self.fn(*arrays)


def linear_kernel(w: np.ndarray) -> np.ndarray:
  """PyTorch nn.Linear weight [out, in] -> flax kernel [in, out]."""
  return np.ascontiguousarray(w.T)


@dataclasses.dataclass
class LoadReport:
  """What a checkpoint import did. Paths in `loaded`/`missing` are ours ('a/b/kernel'); `unused` are checkpoint keys."""
  source: str
  loaded: List[str] = dataclasses.field(default_factory=list)
  missing: List[str] = dataclasses.field(default_factory=list)
  unused: List[str] = dataclasses.field(default_factory=list)
  notes: List[str] = dataclasses.field(default_factory=list)

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  def summary(self) -> str:
    """One line for the console: how many parameters came from the checkpoint, what the new ones are (our modules
    the checkpoint does not have, initialised here) and what the unused checkpoint keys are, e.g.
    `101 loaded; 55 initialised here, not in the checkpoint (48 adapters, 5 MLM head, 2 visual projection); 2 checkpoint
    keys unused (pooler.*: no pooled output)`."""
    out = f"{len(self.loaded)} loaded"
    if self.missing:
      out += f"; {len(self.missing)} initialised here, not in the checkpoint ({_count_kinds(self.missing, _NEW_KINDS)})"
    if self.unused:
      out += f"; {len(self.unused)} checkpoint keys unused ({_unused_groups(self.unused)})"
    return out

  def __str__(self) -> str:
    lines = [f"checkpoint {self.source}: {len(self.loaded)} parameters loaded, "
             f"{len(self.missing)} taken from init, {len(self.unused)} checkpoint keys unused"]
    if self.missing:
      lines.append("  from init (absent in checkpoint): " + ", ".join(self.missing))
    if self.unused:
      lines.append("  unused checkpoint keys: " + ", ".join(self.unused))
    lines.extend("  note: " + n for n in self.notes)
    return "\n".join(lines)


# What our parameters that a checkpoint lacks are (first match on the path wins); anything else is named by its module.
_NEW_KINDS = (("adapter", "adapters"), ("visual_proj", "visual projection"), ("cls/", "MLM head"),
              ("lm_predictions", "MLM head"), ("rel_embeddings", "relative position embeddings"))
# Why a checkpoint's keys go unused, by their group (`_unused_groups`).
_UNUSED_REASONS = {"pooler": "no pooled output", "cls.seq_relationship": "no next-sentence head",
                   "encoder.layer": "layers past num_hidden_layers", "vision_model.post_layernorm": "no pooled output"}


def _count_kinds(paths: Sequence[str], kinds) -> str:
  """"48 adapters, 5 MLM head, 2 visual projection": `paths` counted by the first kind whose marker they contain
  (else by their first path component), most first."""
  counts: Dict[str, int] = {}
  for path in paths:
    kind = next((name for marker, name in kinds if marker in path), path.split("/")[0])
    counts[kind] = counts.get(kind, 0) + 1
  return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _unused_groups(keys: Sequence[str]) -> str:
  """"encoder.layer.2-5.*: layers past num_hidden_layers, pooler.*: no pooled output": checkpoint keys grouped by
  their prefix up to the first layer index (or their first two components, for a known group such as
  cls.seq_relationship, else the first), with the indices as a range and the reason where known."""
  groups: Dict[str, set] = {}
  for key in keys:
    parts = key.split(".")
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if index is not None:
      groups.setdefault(".".join(parts[:index]), set()).add(int(parts[index]))
    else:
      two = ".".join(parts[:2])
      groups.setdefault(two if two in _UNUSED_REASONS else parts[0], set())
  out = []
  for prefix, indices in sorted(groups.items()):
    if indices:
      lo, hi = min(indices), max(indices)
      contiguous = len(indices) == hi - lo + 1
      span = str(lo) if lo == hi else f"{lo}-{hi}" if contiguous else ",".join(map(str, sorted(indices)))
      name = f"{prefix}.{span}.*"
    else:
      name = f"{prefix}.*"
    reason = _UNUSED_REASONS.get(prefix)
    out.append(f"{name}: {reason}" if reason else name)
  return ", ".join(out)


def check_shape(our_path: str, keys: Iterable[str], value: np.ndarray, expected_shape, source: str,
                ckpt: Optional[Mapping[str, np.ndarray]] = None) -> None:
  """Raises ValueError naming the parameter and checkpoint key(s) when `value.shape != expected_shape`."""
  expected_shape = tuple(expected_shape)
  if tuple(value.shape) != expected_shape:
    src = ", ".join(f"{k} {tuple(ckpt[k].shape)}" if ckpt is not None and k in ckpt else k for k in keys)
    raise ValueError(f"{source}: shape mismatch for parameter {our_path!r}: the model expects {expected_shape}, "
                     f"the checkpoint gives {tuple(value.shape)} (from {src}); does the config match the checkpoint?")


def config_file_of(path: str) -> str:
  """The config.json beside a checkpoint `path` (a directory, or a file in one), for errors naming both files."""
  path = os.path.expanduser(path)
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  file = os.path.join(directory, "config.json")
  return file if os.path.exists(file) else "the encoder config (config.pretrained.dir / config.pretrained.shape)"


def assemble(expected: Mapping[str, Any], ckpt: Mapping[str, np.ndarray], rules: Mapping[str, Rule],
             source: str, init: Optional[Mapping[str, Any]] = None,
             ignore: Sequence[str] = (), required: Sequence[str] = (),
             config_source: str = "the config") -> Tuple[Dict[str, Any], LoadReport]:
  """Builds a flat params dict for every path of `expected`; see the module docstring.

  `required`: regexes over our paths of the tensors the config implies (the transformer's own layers: a config.json
  saying 8 layers beside weights holding 6 must not train with 2 random layers). A matching parameter whose
  checkpoint tensors are absent is a ValueError naming `source` (the weights) and `config_source` (the config),
  never filled from init; parameters the checkpoint need not hold (adapters, visual projections, a head the release
  lacks) match none."""
  needed = [re.compile(p) for p in required]
  absent = [p for p in expected if any(r.search(p) for r in needed)
            and not (p in rules and all(k in ckpt for k in rules[p].keys))]
  if absent:
    weights = resolve_checkpoint_file(source) if os.path.isdir(source) else source
    keys = ", ".join(f"{p} <- {'/'.join(rules[p].keys) if p in rules else '?'}" for p in absent[:3])
    raise ValueError(f"{weights}: {len(absent)} tensor(s) that {config_source} implies are not in the weights "
                     f"(e.g. {keys}): the config and the weights do not match (layer count or sizes?)")
  report = LoadReport(source=source)
  used = set()
  out = {}
  for path, ref in expected.items():
    rule = rules.get(path)
    if rule is not None and all(k in ckpt for k in rule.keys):
      arrays = [ckpt[k] for k in rule.keys]
      try:
        value = np.asarray(rule.apply(arrays))
      except ValueError as e:
        raise ValueError(f"{source}: cannot convert {list(rule.keys)} into parameter {path!r}: {e}") from e
      check_shape(path, rule.keys, value, ref.shape, source, ckpt)
      out[path] = value.astype(np.dtype(ref.dtype), copy=False)
      used.update(rule.keys)
      report.loaded.append(path)
    else:
      report.missing.append(path)
      if init is not None:
        if path not in init:
          raise ValueError(f"{source}: parameter {path!r} is neither in the checkpoint nor in init_params")
        out[path] = init[path]
  if init is None and report.missing:
    raise ValueError(f"{source}: parameters absent from the checkpoint and no init_params given to fill them: "
                     + ", ".join(report.missing))
  patterns = [re.compile(p) for p in ignore]
  report.unused = sorted(k for k in ckpt if k not in used and not any(p.search(k) for p in patterns))
  return out, report
