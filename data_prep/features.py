"""Reading per-video frame-feature dicts and sampling them to a fixed number of frames.

A feature dict maps video_id -> array [T_video, dim] (OVQA: float16 CLIP ViT-L/14 embeddings at 1 fps, dim 768,
not L2-normalised). Accepted files, chosen by extension:

  .pth / .pt      `torch.save`d dict of tensors (the FrozenBiLM release's `clipvitl14.pth`); needs torch
  .npy            a pickled dict saved with `np.save(path, d)`: a pickle, so read only with trust_pickles=True
                  (`--trust-pickles`, unsafe: unpickling runs code from the file)
  .npz            `np.savez(path, **d)`: one array per video id (read lazily)
  .h5 / .hdf5     one dataset per video id at the top level, or a group per id holding one dataset (lazy)

Keys are normalised to `str` (integer keys of a torch/npy dict become "7010"), so CSV video ids read as strings
find them. Frame sampling follows REFERENCE.md: a video longer than T frames keeps frames floor(j * T_video / T),
j = 0..T-1; a shorter one is zero-padded and its mask marks the real frames.
"""

from __future__ import annotations

import os
from typing import Iterator, Mapping

import numpy as np

from evqa_jax import io as evqa_io

TORCH_EXTS = (".pth", ".pt")
NPY_EXTS = (".npy",)
NPZ_EXTS = (".npz",)
HDF5_EXTS = (".h5", ".hdf5")
ALL_EXTS = TORCH_EXTS + NPY_EXTS + NPZ_EXTS + HDF5_EXTS


class FeatureError(ValueError):
  """A feature file that cannot be read, or one video's features with the wrong shape/values."""


def _ext(path: str) -> str:
  return os.path.splitext(path)[1].lower()


def _to_numpy(value, path: str, key: str) -> np.ndarray:
  if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
    value = value.detach().cpu().numpy()
  try:
    return np.asarray(value)
  except Exception as e:
    raise FeatureError(f"{path}: value of video {key!r} is not an array ({type(value).__name__})") from e


def _str_keys(d: Mapping, path: str) -> dict:
  out = {}
  for k, v in d.items():
    key = k.decode("utf-8") if isinstance(k, bytes) else str(k)
    if key in out:
      raise FeatureError(f"{path}: two keys normalise to the same video id {key!r}")
    out[key] = v
  return out


class FeatureStore(Mapping):
  """Read-only mapping video_id (str) -> np.ndarray [T_video, dim]; lazy for .npz and HDF5.

      with FeatureStore("clipvitl14.pth") as feats:
        x = feats["video7010"]                       # np.ndarray [T_video, 768]
  """

  def __init__(self, path: str, trust_pickles: bool = False):
    self.path = str(path)
    self.trust_pickles = trust_pickles
    self._closer = None
    if not os.path.exists(self.path):
      raise FeatureError(f"feature file {self.path} does not exist")
    ext = _ext(self.path)
    if ext in TORCH_EXTS:
      self._data = self._load_torch()
      self._get = lambda key: _to_numpy(self._data[key], self.path, key)
    elif ext in NPY_EXTS:
      self._data = self._load_npy()
      self._get = lambda key: _to_numpy(self._data[key], self.path, key)
    elif ext in NPZ_EXTS:
      npz = self._read(lambda: np.load(self.path, allow_pickle=False), "read as .npz")
      self._closer = npz.close
      self._data = {k: k for k in npz.files}
      self._get = lambda key: evqa_io.npz_member(npz, self._data[key], self.path, "feature file")
    elif ext in HDF5_EXTS:
      self._open_hdf5()
    else:
      raise FeatureError(f"feature file {self.path}: unknown extension {ext!r} (expected one of {ALL_EXTS})")

  def _read(self, load, how: str):
    """`load()`; its failure is a FeatureError naming the file and `how` it was read (a pickle refused without
    trust_pickles keeps its own error, evqa_io.UnsafeInputError)."""
    try:
      return load()
    except evqa_io.UnsafeInputError:
      raise
    except Exception as e:
      raise FeatureError(f"{self.path}: cannot {how} ({e})") from e

  def _load_torch(self) -> dict:
    try:
      evqa_io.import_torch(f"{self.path} is a torch.save file: reading it")
    except ImportError as e:
      raise FeatureError(f"{e}; or convert the dict to .npz / HDF5") from e
    obj = self._read(lambda: evqa_io.torch_load(self.path, self.trust_pickles), "read with torch.load")
    if not isinstance(obj, Mapping):
      raise FeatureError(f"{self.path}: expected a dict video_id -> tensor, got {type(obj).__name__}")
    return _str_keys(obj, self.path)

  def _load_npy(self) -> dict:
    arr = self._read(lambda: evqa_io.load_npy(self.path, self.trust_pickles), "read as .npy")
    obj = arr.item() if isinstance(arr, np.ndarray) and arr.dtype == object and arr.shape == () else arr
    if not isinstance(obj, Mapping):
      raise FeatureError(
          f"{self.path}: expected a pickled dict video_id -> array (np.save(path, dict)), got an array of "
          f"shape {getattr(obj, 'shape', None)}")
    return _str_keys(obj, self.path)

  def _open_hdf5(self) -> None:
    import h5py
    f = self._read(lambda: h5py.File(self.path, "r"), "open as HDF5")
    self._closer = f.close
    self._data = {k: k for k in f.keys()}

    def get(key):
      item = f[self._data[key]]
      if isinstance(item, h5py.Group):
        datasets = [name for name, v in item.items() if isinstance(v, h5py.Dataset)]
        if len(datasets) != 1:
          raise FeatureError(
              f"{self.path}: group {key!r} must hold exactly one dataset, found {sorted(datasets)}")
        item = item[datasets[0]]
      try:
        return evqa_io.read_h5_dataset(item, f"{self.path}: dataset {item.name!r}")
      except ValueError as e:
        raise FeatureError(str(e)) from None

    self._get = get

  def __getitem__(self, key: str) -> np.ndarray:
    key = str(key)
    if key not in self._data:
      raise KeyError(key)
    return np.asarray(self._get(key))

  def __contains__(self, key) -> bool:
    return str(key) in self._data

  def __iter__(self) -> Iterator[str]:
    return iter(self._data)

  def __len__(self) -> int:
    return len(self._data)

  def close(self) -> None:
    if self._closer is not None:
      self._closer()
      self._closer = None

  def __enter__(self) -> "FeatureStore":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def check_video(x: np.ndarray, feature_dim: int, where: str) -> np.ndarray:
  """Returns `x` as a float array [T_video, feature_dim]; FeatureError naming `where` when it is not one."""
  if x.dtype.kind != "f":
    raise FeatureError(f"{where}: features have dtype {x.dtype}, expected floats")
  if x.ndim != 2 or x.shape[1] != feature_dim or x.shape[0] < 1:
    raise FeatureError(f"{where}: features have shape {tuple(x.shape)}, expected [T_video >= 1, {feature_dim}]")
  # Finite in float32, the dtype models compute in: 1e200 (float64) is finite but overflows there (and squared, in
  # an L2 norm, even in float64), so it would be stored as inf or normalised to zeros.
  with np.errstate(over="ignore", invalid="ignore"):
    finite = np.isfinite(x.astype(np.float32))
  if not np.all(finite):
    bad = tuple(int(i) for i in np.argwhere(~finite)[0])
    raise FeatureError(f"{where}: features hold non-finite values (NaN, inf, or beyond float32: {float(x[bad])!r} at "
                       f"{bad})")
  return x


FEATURE_DTYPES = ("source", "float16", "float32")


def storage_dtype(source: np.dtype) -> str:
  """The record dtype that keeps a source feature dtype exactly: float16 stays float16; float32 stays float32, and
  float64 is stored as float32, the dtype models compute in (check_video has checked that it fits there)."""
  return "float16" if np.dtype(source) == np.float16 else "float32"


def first_video_dtype(store: Mapping) -> np.dtype | None:
  """The dtype of the first video's features in `store` (None when it is empty): what "source" storage keeps."""
  for key in store:
    return np.asarray(store[key]).dtype
  return None


def frame_indices(t_video: int, num_frames: int) -> np.ndarray:
  """Frames kept from a video of `t_video` frames: floor(j * t_video / num_frames) when longer, else all."""
  if t_video > num_frames:
    return (np.arange(num_frames, dtype=np.int64) * t_video) // num_frames
  return np.arange(t_video, dtype=np.int64)


def sample_frames(x: np.ndarray, num_frames: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
  """[T_video, dim] -> (frames [num_frames, dim] of `dtype`, mask [num_frames] int64 with 1 on real frames)."""
  idx = frame_indices(x.shape[0], num_frames)
  out = np.zeros((num_frames, x.shape[1]), dtype=dtype)
  out[:len(idx)] = x[idx].astype(dtype)
  mask = np.zeros(num_frames, dtype=np.int64)
  mask[:len(idx)] = 1
  return out, mask


def save_feature_dict(path: str, features: Mapping[str, np.ndarray]) -> None:
  """Writes video_id -> array in the format of `path`'s extension (atomically); the inverse of FeatureStore."""
  ext = _ext(path)
  with evqa_io.atomic_path(path) as tmp:
    if ext in NPZ_EXTS:
      with open(tmp, "wb") as f:  # a file object keeps np.savez from appending ".npz" to the temp name
        np.savez(f, **{str(k): np.asarray(v) for k, v in features.items()})
    elif ext in NPY_EXTS:
      with open(tmp, "wb") as f:
        np.save(f, {str(k): np.asarray(v) for k, v in features.items()}, allow_pickle=True)
    elif ext in HDF5_EXTS:
      import h5py
      with h5py.File(tmp, "w") as f:
        for k, v in features.items():
          f.create_dataset(str(k), data=np.asarray(v))
    elif ext in TORCH_EXTS:
      try:
        torch = evqa_io.import_torch(f"writing {path} (a torch.save file)")
      except ImportError as e:
        raise FeatureError(f"{e}; or write .npz or .h5") from e
      torch.save({str(k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in features.items()}, tmp)
    else:
      raise FeatureError(f"cannot write {path}: unknown extension {ext!r} (expected one of {ALL_EXTS})")


def _subtitle_text(value, path: str, key: str) -> str:
  """One video's subtitles as text: a string, a list of strings / {"text": ...} items, or {"text": str | list}."""
  if isinstance(value, str):
    return value.strip()
  if isinstance(value, Mapping):
    if "text" not in value:
      raise FeatureError(f"{path}: subtitles of video {key!r} are a dict without a 'text' entry")
    return _subtitle_text(value["text"], path, key)
  if isinstance(value, (list, tuple)):
    parts = []
    for item in value:
      if isinstance(item, Mapping):
        item = item.get("text", "")
      if not isinstance(item, str):
        raise FeatureError(f"{path}: subtitles of video {key!r} hold a {type(item).__name__}, expected text")
      if item.strip():
        parts.append(item.strip())
    return " ".join(parts)
  raise FeatureError(f"{path}: subtitles of video {key!r} are a {type(value).__name__}, expected text")


def load_subtitles(path: str, trust_pickles: bool = False) -> dict[str, str]:
  """video_id -> subtitle text from a JSON file (or the FrozenBiLM-style pickle, .pkl, only with trust_pickles)."""
  if not os.path.exists(path):
    raise FeatureError(f"subtitles file {path} does not exist")
  if _ext(path) in (".pkl", ".pickle"):
    obj = evqa_io.load_pickle(path, trust_pickles)
  else:
    obj = evqa_io.load_json(path, "subtitles file")
  if not isinstance(obj, Mapping):
    raise FeatureError(f"{path}: expected a mapping video_id -> text, got {type(obj).__name__}")
  return {str(k): _subtitle_text(v, path, str(k)) for k, v in obj.items()}
