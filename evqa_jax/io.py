"""Atomic file output (write to a temporary path beside the target, then rename) and reading paths on any filesystem.

Inputs (records, their `.idx` indexes, metadata, vocabularies, graphs) are read through `etils.epath`, as Grain and
Orbax read theirs, so a data directory may be local or a URI such as gs://bucket/ovqa/records.
"""

import contextlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile

from evqa_jax import log


# The install lines that bring the optional pieces (setup.py's extras), named by every "missing" message.
TORCH_INSTALL = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
GCSFS_INSTALL = "pip install -e '.[gcs]'"


def import_torch(what: str):
  """torch, or ImportError saying that `what` needs it and the line that installs it (the README's install has
  none: torch is only for reading .pth files and the parity tests)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{what} needs torch, which is not installed: {TORCH_INSTALL} (the CPU build; "
                      f"pip install -e '.[test]' brings it too)") from e
  return torch


def _name_gcsfs_install() -> None:
  """Where gcsfs is not installed, fsspec's error for a gs:// path names the line that installs it (fsspec's own
  says only "Please install gcsfs")."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec("gcsfs") is not None or importlib.util.find_spec("fsspec") is None:
    return
  import fsspec  # pylint: disable=g-import-not-at-top
  for protocol in ("gs", "gcs"):
    fsspec.register_implementation(protocol, "gcsfs.GCSFileSystem", clobber=True,
                                   errtxt=f"gs:// paths need gcsfs, which is not installed: {GCSFS_INSTALL} (on TPU "
                                          "pods .[tpu], on GPU clusters .[gpu] bring it too)")


_name_gcsfs_install()


def epath_of(path) -> "epath.Path":
  """`path` as an `etils.epath.Path`: a local path (`~` expanded) or a gs://, s3://, ... URI, addressed as
  `storage_address` spells it (so what is read or written is what the output guard compared)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  return epath.Path(storage_address(path) if is_uri(path) else os.path.expanduser(path))


def is_uri(path) -> bool:
  """True for a non-local path such as gs://bucket/dir."""
  return "://" in os.fspath(path)


def absolute(path) -> str:
  """An absolute local path, or the URI as `storage_address` spells it (os.path.abspath would turn gs://b into
  ./gs:/b)."""
  path = os.fspath(path)
  return storage_address(path) if is_uri(path) else os.path.abspath(os.path.expanduser(path))


_SCHEME_ALIASES = {"gcs": "gs"}  # gcsfs serves both names


def storage_address(path) -> str:
  """The one spelling of the object or file that `path` addresses: what the output guard compares, and (for URIs)
  what every reader and writer of this module addresses.

  Local: the resolved absolute path (`~` expanded, relative to the working folder, every symlink, `..`, `/./` and
  `//` resolved). file:///x: the local path /x. Other URIs (gs://bucket/a/./b//c/): scheme lower-case (gcs:// is
  gs://), empty and `.` parts dropped and no trailing slash, as etils.epath (pathlib) addresses them; a `..` part is
  refused (an object store has no parent folders: it would be an object named `..`)."""
  path = os.fspath(path)
  if not is_uri(path):
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))
  scheme, rest = path.split("://", 1)
  scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
  if scheme == "file":
    return storage_address("/" + rest.lstrip("/"))
  parts = [p for p in rest.split("/") if p not in ("", ".")]
  if ".." in parts:
    raise ValueError(f"{path}: '..' in a {scheme}:// path names an object called '..', not a parent folder (an "
                     "object store has none); write the path without it")
  return f"{scheme}://" + "/".join(parts)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


@contextlib.contextmanager
def atomic_path(path: str):
  """Yields a temporary local path; on success it becomes `path`, never a half-written file.

  Local: the temporary file lies in the target's directory and is renamed onto `path`. URI (gs://...): it lies in a
  local temporary directory and is uploaded at the end; an object store shows an object only once its upload is
  complete, so readers see the old object or the whole new one."""
  if is_uri(path):
    with tempfile.TemporaryDirectory(prefix="evqa_upload_") as tmp_dir:
      tmp = os.path.join(tmp_dir, os.path.basename(os.fspath(path).rstrip("/")))
      yield tmp
      upload(tmp, path)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
  os.close(fd)
  try:
    yield tmp
    if os.path.isfile(tmp):
      os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600 files; outputs are ordinary readable files
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


# ------------------------------------------------------------------------- one filesystem layer: local or gs://

def makedirs(path) -> None:
  """Creates the folder `path` and its parents (local or URI; a no-op on object stores without folders)."""
  epath_of(path).mkdir(parents=True, exist_ok=True)


def upload(local: str, path: str) -> None:
  """Copies the local file or folder `local` to `path` (local or URI), file by file through etils.epath."""
  if os.path.isdir(local):
    for name in sorted(os.listdir(local)):
      upload(os.path.join(local, name), os.path.join(os.fspath(path), name))
    return
  target = epath_of(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  with open(local, "rb") as src, target.open("wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 22)


def copy(src: str, dst: str) -> None:
  """Copies the file or folder `src` to `dst` (each local or a URI), every file written whole (`atomic_path`)."""
  for rel in _remote_listing(src):
    source = epath_of(src) / rel if rel else epath_of(src)
    with source.open("rb") as fin, atomic_path(os.path.join(os.fspath(dst), rel) if rel else os.fspath(dst)) as tmp:
      with open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 22)


def move(src: str, dst: str) -> None:
  """Moves the file or folder `src` to `dst`: a rename on a local disk; on an object store (which has no folders to
  rename) a copy of every object, then the source's removal."""
  if not is_uri(src) and not is_uri(dst):
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    shutil.move(src, dst)
    return
  copy(src, dst)
  source = epath_of(src)
  if source.is_dir():
    source.rmtree()
  else:
    source.unlink()


def append_text(path: str, text: str) -> None:
  """Appends `text` to a log file durably. Object stores have no append: on a URI the file is rewritten whole (the
  logs appended to, such as train_history.jsonl, are small)."""
  if is_uri(path):
    file = epath_of(path)
    write_text(path, (file.read_text() if file.exists() else "") + text)
    return
  with open(path, "a") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def cache_root() -> str:
  """Where remote inputs that a library can only read from a local path are staged: $EVQA_CACHE, else
  ~/.cache/evqa_jax."""
  return os.path.expanduser(os.environ.get("EVQA_CACHE") or "~/.cache/evqa_jax")


def _remote_listing(path: str) -> dict:
  """{relative path: size} of the file at `path` ({"": size}) or of every file under the folder `path`."""
  root = epath_of(path)
  if root.is_file():
    return {"": root.stat().length}
  if not root.is_dir():
    raise FileNotFoundError(f"{path} does not exist")
  out = {}

  def walk(folder, prefix):  # not rglob: gcsfs refuses `**` patterns
    for child in sorted(folder.iterdir(), key=lambda p: p.name):
      if child.is_dir():
        walk(child, prefix + child.name + "/")
      else:
        out[prefix + child.name] = child.stat().length

  walk(root, "")
  return out


def local_copy(path: str, what: str = "input") -> str:
  """`path` as a local path: a local path unchanged (`~` expanded); a URI (a file, or a folder such as a Hugging Face
  checkpoint) staged once under `cache_root()`/staged/<scheme>/<bucket>/<path> and returned from there.

  For the readers that only take local files (Hugging Face tokenizers, torch.load, safetensors). Staging copies into
  a temporary folder, checks every file's size against the remote listing and renames it into place, so a kill
  never leaves a partial copy; a copy whose listing (names and sizes, recorded beside it) differs from the remote
  one is replaced. Processes of one host take turns (a lock file beside the copy)."""
  path = os.fspath(path)
  if not is_uri(path):
    return os.path.expanduser(path)
  path = storage_address(path)
  scheme, rest = path.split("://", 1)
  check_relpath(rest.rstrip("/"), f"{what} {path}", "location")
  target = os.path.join(cache_root(), "staged", scheme, rest.rstrip("/"))
  listing = _remote_listing(path)
  manifest = target.rstrip("/") + ".staged.json"
  with file_lock(target.rstrip("/") + ".lock"):
    if os.path.exists(manifest) and os.path.exists(target):
      with open(manifest) as f:
        if json.load(f) == listing:
          return target
    staging = tempfile.mkdtemp(prefix=".staging.", dir=os.path.dirname(target))
    try:
      for rel, size in listing.items():
        dst = os.path.join(staging, "x", rel) if rel else os.path.join(staging, "x")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        src = epath_of(path) / rel if rel else epath_of(path)
        with src.open("rb") as fin, open(dst, "wb") as fout:
          shutil.copyfileobj(fin, fout, 1 << 22)
        if os.path.getsize(dst) != size:
          raise IOError(f"{what} {os.fspath(src)}: staged {os.path.getsize(dst)} bytes of {size}")
      if os.path.exists(manifest):
        os.remove(manifest)
      if os.path.isdir(target):
        shutil.rmtree(target)
      elif os.path.exists(target):
        os.remove(target)
      os.replace(os.path.join(staging, "x"), target)
      write_json(manifest, listing)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  log.info(f"staged {what} {path} -> {target}", every_process=True)
  return target


class LockedError(RuntimeError):
  """Another process holds the lock (raised by `file_lock(..., wait=False)`)."""


@contextlib.contextmanager
def file_lock(path: str, wait: bool = True):
  """Holds an exclusive advisory lock (fcntl.flock) on `path`, created if missing, for the `with` block: several
  processes building the same world, metadata or cache take turns. With wait=False a lock held elsewhere raises
  LockedError naming the holder's pid (written into the lock file) instead of waiting."""
  import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a+") as f:
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip()[:40]
      raise LockedError(f"{path} is held by another process{f' (pid {holder})' if holder else ''}") from None
    if not wait:  # the holder's pid, for the message another process gets
      f.seek(0)
      f.truncate()
      f.write(str(os.getpid()))
      f.flush()
    try:
      yield
    finally:
      fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def write_json(path: str, obj, indent: int = 2) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      json.dump(obj, f, indent=indent, sort_keys=True)
      f.write("\n")


def write_text(path: str, text: str) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(text)


# ------------------------------------------------------------------------------------ hostile input: one mechanism
# Input files are data, never code: pickles (np.load(allow_pickle=True), pickle.load, torch.load without
# weights_only) can run arbitrary code while loading, so they are refused unless the caller opted in with the one
# trust switch (`--trust-pickles` on the converters, `config.trust_pickles` for training).

TRUST_SWITCH = "--trust-pickles (config: trust_pickles=True)"


class UnsafeInputError(ValueError):
  """An input file that would need unpickling (which can run code) and was not trusted explicitly."""


def _untrusted(path: str, what: str, detail: str = "") -> UnsafeInputError:
  return UnsafeInputError(
      f"{path}: {what} holds pickled Python objects, which can run code when loaded{detail}; refused. Convert it to "
      f"a plain format (.npz, .h5, JSON, safetensors), or, only for a file you trust, pass {TRUST_SWITCH} (unsafe)")


def load_npy(path: str, trust_pickles: bool = False, mmap_mode=None):
  """np.load of a .npy file: plain arrays only unless `trust_pickles` (object arrays are pickles)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    with open(path, "rb") as f:
      check_npy_header(f, os.fstat(f.fileno()).st_size, f"{path}: .npy file")
    return np.load(path, allow_pickle=trust_pickles, mmap_mode=mmap_mode)
  except ValueError as e:
    if str(e).startswith(f"{path}: .npy file"):
      raise
    if not trust_pickles and "allow_pickle" in str(e):
      raise _untrusted(path, "the .npy file") from None
    raise ValueError(f"{path}: cannot read as .npy ({e})") from e


def load_pickle(path: str, trust_pickles: bool = False):
  """pickle.load of a whole file, only when `trust_pickles`; UnsafeInputError otherwise."""
  if not trust_pickles:
    raise _untrusted(path, "the pickle file")
  import pickle  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    return pickle.load(f)


def torch_load(path: str, trust_pickles: bool = False, safe_globals=()):
  """torch.load on CPU with `weights_only=True` (tensors, containers, numbers, strings and the classes in
  `safe_globals`, e.g. argparse.Namespace) unless `trust_pickles`; UnsafeInputError naming the refused object."""
  torch = import_torch(f"reading {path} (a PyTorch file)")
  if trust_pickles:
    return torch.load(path, map_location="cpu", weights_only=False)
  allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5; older ones allow no extra class
  try:
    with (allow(list(safe_globals)) if allow and safe_globals else contextlib.nullcontext()):
      return torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises pickle.UnpicklingError (or RuntimeError in old versions) for refused globals
    if "weights_only" in str(e) or "Unsupported global" in str(e) or "Unsupported operand" in str(e):
      detail = str(e).split("\n")
      found = [line.strip() for line in detail if "Unsupported" in line or "GLOBAL" in line][:1]
      raise _untrusted(path, "the PyTorch checkpoint", f" ({found[0]})" if found else "") from None
    raise


# --------------------------------------------------------------------------------------------- ids used as paths

def check_id(value, where: str, what: str = "id") -> str:
  """`value` when it is safe as one file or folder name; ValueError naming `where` (file and row) otherwise.

  Ids from input files (entry ids, video ids) become path components: a separator, "..", an absolute path or a NUL
  would read or write outside the folder they are joined to.
  """
  text = value if isinstance(value, str) else None
  bad = None
  if text is None:
    bad = f"is a {type(value).__name__}, not text"
  elif not text or text.strip() in ("", ".", ".."):
    bad = "is empty or a dot name"
  elif "\0" in text:
    bad = "contains a NUL byte"
  elif text != text.strip():  # one rule for every reader: never stripped in one place and kept in another
    bad = "has leading or trailing whitespace"
  elif "/" in text or "\\" in text or (os.sep in text) or (os.altsep and os.altsep in text):
    bad = "contains a path separator"
  elif os.path.isabs(text):
    bad = "is an absolute path"
  if bad:
    raise ValueError(f"{where}: {what} {value!r} {bad}, so it cannot name a file or folder")
  return text


def check_relpath(value, where: str, what: str = "path") -> str:
  """`value` when it is a relative path that stays inside the folder it is joined to (each part a `check_id`)."""
  if not isinstance(value, str):
    raise ValueError(f"{where}: {what} {value!r} is a {type(value).__name__}, not a path")
  parts = [p for p in value.replace("\\", "/").split("/") if p]
  if value.startswith(("/", "\\")) or os.path.isabs(value) or not parts:
    raise ValueError(f"{where}: {what} {value!r} must be a non-empty relative path")
  for p in parts:
    check_id(p, where, f"{what} {value!r}: part")
  return value


# ---------------------------------------------------------------------------- reading text input with named errors

def read_text(path: str, what: str = "file") -> str:
  """The file as UTF-8 text; ValueError naming the file and line of the first byte that is not UTF-8."""
  try:
    with epath_of(path).open("rb") as f:  # local, or gs://... next to the records
      data = f.read()
  except FileNotFoundError:
    raise FileNotFoundError(f"{what} {path} does not exist") from None
  except IsADirectoryError:
    raise ValueError(f"{what} {path} is a folder, expected a file") from None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{what} {path}: line {line}, byte {e.start}: not UTF-8 text ({e.reason}, byte "
                     f"{data[e.start:e.start + 1]!r})") from None


def _json_number_error(text: str, literal: str, path: str, what: str) -> ValueError:
  pos = max(text.find(literal), 0)
  line = text.count("\n", 0, pos) + 1
  key = re.findall(r'"((?:[^"\\]|\\.)*)"\s*:\s*[^"]*$', text[max(0, pos - 200):pos])
  field = f", field {key[-1]!r}" if key else ""
  return ValueError(f"{what} {path}: line {line}{field}: number {literal} does not fit a 64-bit value "
                    "(overflow, NaN or infinity)")


class MissingFieldError(KeyError, ValueError):
  """A field that a record read from a file lacks; its message names the file (a KeyError for code that expects one,
  a ValueError for the one-line CLI error)."""

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


class JsonObject(dict):
  """A JSON object read by `loads_json`: a missing field (`obj["x"]`) raises MissingFieldError naming the file and
  the keys the object has, instead of a bare KeyError that names nothing. Otherwise a plain dict."""

  source = "JSON"

  def __missing__(self, key):
    have = ", ".join(repr(k) for k in list(self)[:8]) + (", ..." if len(self) > 8 else "")
    raise MissingFieldError(f"{self.source}: a record has no field {key!r} (its fields: {have or 'none'})")


def loads_json(text: str, path: str, what: str = "file", finite: bool = True):
  """json.loads refusing NaN/Infinity and numbers that overflow float64 / int64, with file, line and field.

  finite=False reads numbers as Python's json does (NaN, Infinity, 1e999 -> inf): for prediction files, whose
  non-finite scores the evaluators count and score as the official scripts do, instead of refusing the file.
  """
  def no_duplicates(pairs):
    # json keeps the last of two equal keys: a repeated id would silently replace the first (a test clip's entry
    # turning into a train clip's)
    out = JsonObject()
    out.source = f"{what} {path}"
    for key, value in pairs:
      if key in out:
        pos = max(text.find(json.dumps(key)), 0)
        raise ValueError(f"{what} {path}: key {key!r} appears twice in one object (first at line "
                         f"{text.count(chr(10), 0, pos) + 1}); the second would silently replace the first")
      out[key] = value
    return out

  if not finite:
    try:
      return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
      raise ValueError(f"{what} {path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    except RecursionError:
      raise _too_deep(path, what) from None

  def parse_float(s):
    v = float(s)
    if not math.isfinite(v):
      raise _json_number_error(text, s, path, what)
    return v

  def parse_int(s):
    v = int(s)
    if not -2**63 <= v < 2**63:
      raise _json_number_error(text, s, path, what)
    return v

  def parse_constant(s):
    raise _json_number_error(text, s, path, what)

  try:
    return json.loads(text, parse_float=parse_float, parse_int=parse_int, parse_constant=parse_constant,
                      object_pairs_hook=no_duplicates)
  except json.JSONDecodeError as e:
    raise ValueError(f"{what} {path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
  except RecursionError:
    raise _too_deep(path, what) from None


def _too_deep(path: str, what: str) -> ValueError:
  # json's C decoder stops at Python's recursion limit; no input of this project nests anywhere near it.
  return ValueError(f"{what} {path}: JSON nested too deeply to read (arrays / objects more than about "
                    f"{sys.getrecursionlimit()} levels deep); refused")


def load_json(path: str, what: str = "file", finite: bool = True):
  """A JSON input file: UTF-8, strict numbers (unless finite=False, see loads_json); every error names the file (and
  line, field where known)."""
  return loads_json(read_text(path, what), path, what, finite)


def text_stream(path: str, what: str = "file"):
  """The file as a text stream for csv / pandas readers (UTF-8 checked by `read_text`, newlines kept as written)."""
  import io as std_io  # pylint: disable=g-import-not-at-top
  return std_io.StringIO(read_text(path, what), newline="")


# ------------------------------------------------------------------------ outputs never touch inputs, never escape

class StorageError(OSError):
  """A storage location that cannot be used (no such bucket, a bucket name the store refuses, no access, no answer),
  named by the flag or config key that gave it."""


STORAGE_TIMEOUT_ENV = "EVQA_STORAGE_TIMEOUT"  # seconds a bucket check waits for Cloud Storage (default 20)


def _bucket_name_problem(bucket: str) -> str | None:
  """Why Cloud Storage would refuse `bucket` as a bucket name (its naming rules), or None."""
  parts = bucket.split(".")
  if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", bucket):
    return ("may hold only lower-case letters, digits, '-', '_' and '.', and must start and end with a letter or "
            "digit")
  if not 3 <= len(bucket) <= (222 if len(parts) > 1 else 63) or any(len(p) > 63 for p in parts):
    return "must be 3 to 63 characters long (222 with dots, at most 63 between two dots)"
  if bucket.startswith("goog") or "google" in bucket or re.fullmatch(r"[0-9.]+", bucket):
    return "may not start with 'goog', contain 'google' or be an IP address"
  return None


class _LastMessage(logging.Handler):
  """Keeps the last reason gcsfs / google.auth logged (a retry's exception), for the one-line message."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.last = ""

  def emit(self, record):
    text = record.getMessage().strip()
    if "exception:" in text:
      text = text.split("exception:", 1)[-1].strip()
    if text and ("exception" in record.getMessage() or record.levelno >= logging.WARNING):
      self.last = text.splitlines()[0][:200]


_PROBE_LOGGERS = ("gcsfs", "google.auth")


def _probe_bucket(bucket: str) -> str | None:
  """Why the gs:// bucket `bucket` cannot be used (missing, no access, no answer within $EVQA_STORAGE_TIMEOUT s), or
  None. One object listing; the credential lookup and the request (gcsfs alone retries with backoff for about a
  minute) run in a thread waited for at most that long. Their log lines are kept for the message, not printed."""
  import threading  # pylint: disable=g-import-not-at-top
  timeout = float(os.environ.get(STORAGE_TIMEOUT_ENV) or 20)
  seen = _LastMessage()
  saved = {}
  for name in _PROBE_LOGGERS:
    log = logging.getLogger(name)
    saved[name] = log.level, log.propagate
    log.setLevel(logging.DEBUG)
    log.propagate = False
    log.addHandler(seen)
  outcome = []

  def list_one_object():
    import fsspec  # pylint: disable=g-import-not-at-top
    try:
      fs = fsspec.filesystem("gs")
      fs.call("GET", "b/{}/o", bucket, maxResults=1, json_out=True)  # gcsfs's request call, sync
      outcome.append(None)
    except Exception as e:  # pylint: disable=broad-except  (gcsfs, aiohttp and google.auth errors alike)
      outcome.append(e)

  worker = threading.Thread(target=list_one_object, name="evqa-bucket-check", daemon=True)
  try:
    worker.start()
    worker.join(timeout)
  finally:
    for name in _PROBE_LOGGERS:
      log = logging.getLogger(name)
      log.removeHandler(seen)
      log.setLevel(saved[name][0])
      log.propagate = saved[name][1]
  if not outcome:
    last = f" (last error: {seen.last})" if seen.last else ""
    return (f"Cloud Storage did not answer within {timeout:g} s{last}: no network, no credentials found in time, "
            f"or a wrong endpoint (${STORAGE_TIMEOUT_ENV} sets the wait)")
  e = outcome[0]
  if e is None:
    return None
  if isinstance(e, FileNotFoundError):
    return f"bucket {bucket!r} does not exist"
  text = " ".join(str(e).split())[:300] or type(e).__name__
  if getattr(e, "code", None) in (401, 403) or "Forbidden" in text or "credentials" in text.lower():
    return (f"access to bucket {bucket!r} denied ({text}): no credentials, or credentials without access "
            "(gcloud auth application-default login)")
  return f"bucket {bucket!r} cannot be reached ({type(e).__name__}: {text})"


_REACHABLE = set()  # buckets checked by this process


def check_storage(paths) -> None:
  """Refuses, in one line naming the flag or config key and the path, a gs:// path whose bucket cannot be used: a
  name Cloud Storage refuses, a bucket that does not exist, no access (no credentials), no answer within
  $EVQA_STORAGE_TIMEOUT seconds. `paths`: {name: path, list of paths or None}. Local paths and other schemes pass."""
  for name, path in _named_paths(paths):
    if not is_uri(path):
      continue
    address = storage_address(path)
    scheme, rest = address.split("://", 1)
    bucket = rest.split("/", 1)[0]
    if scheme != "gs" or bucket in _REACHABLE:
      continue
    problem = _bucket_name_problem(bucket)
    if problem:
      raise StorageError(f"{name} {path}: {bucket!r} is not a Cloud Storage bucket name: it {problem}")
    problem = _probe_bucket(bucket)
    if problem:
      raise StorageError(f"{name} {path}: {problem}")
    _REACHABLE.add(bucket)


def _same_file(a: str, b: str) -> bool:
  """Two existing local paths naming one file (device and inode): a hard link, or another letter case on a
  case-insensitive disk, which no spelling rule sees."""
  try:
    return not is_uri(a) and not is_uri(b) and os.path.samefile(a, b)
  except OSError:
    return False


def _within(path: str, folder: str) -> bool:
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _named_paths(paths) -> list:
  """[(name, path)] of a {name: path, list of paths or None} mapping."""
  out = []
  for name, value in paths.items():
    for p in (value if isinstance(value, (list, tuple)) else [value]):
      if p not in (None, "") and isinstance(p, (str, os.PathLike)):
        out.append((name, os.fspath(p)))
  return out


def check_outputs(inputs, outputs, inside_inputs: bool = False) -> None:
  """Refuses to write an output that is an input, holds one, or replaces a file inside an input folder, compared by
  `storage_address` (what the storage addresses: a symlink, `..`, `/./`, `//` or a relative path cannot disguise a
  local file, nor `/./`, `//` or a trailing slash an object). `inputs`: {what it is (e.g. "the input --gt"): path,
  list of paths or None}; `outputs`: {argument (e.g. "--out"): path or None}. The one guard every command runs before
  it writes anything; then the buckets of every gs:// path are checked (`check_storage`). `inside_inputs`: an output
  folder inside an input folder is refused too (training writes files into its workdir)."""
  def address(name, path):
    try:
      return storage_address(path)
    except ValueError as e:
      raise ValueError(f"{name} {e}") from None

  ins = [(n, p, address(n, p)) for n, p in _named_paths(inputs) if is_uri(p) or os.path.lexists(p)]
  for out_name, out in _named_paths(outputs):
    real_out = address(out_name, out)
    for in_name, path, real_in in ins:
      if _within(real_in, real_out) or _same_file(real_in, real_out):
        raise ValueError(f"{out_name} {out} is or holds {in_name} {path}: writing it would destroy the input. "
                         f"Choose another {out_name}")
      if os.path.isdir(real_in) and _within(real_out, real_in) and os.path.isfile(real_out):
        raise ValueError(f"{out_name} {out} is a file inside {in_name} folder {path}: writing it would replace "
                         f"an input. Choose another {out_name}")
      if inside_inputs and _within(real_out, real_in):
        raise ValueError(f"{out_name} {out} lies inside {in_name} {path}: its files would be written into the "
                         f"input. Choose another {out_name}")
  check_storage({**inputs, **outputs})


def check_args(args, outputs) -> None:
  """`check_outputs` for a parsed argparse namespace: the arguments named in `outputs` (dest names such as "out",
  "plot", or {dest: computed path} for defaults worked out after parsing) are outputs; every other argument whose
  value names an existing path is an input."""
  values = vars(args)
  outputs = dict(outputs) if isinstance(outputs, dict) else {k: values.get(k) for k in outputs}
  flag = lambda dest: "--" + dest.replace("_", "-")  # noqa: E731
  inputs = {f"the input {flag(k)}": v for k, v in values.items() if k not in outputs}
  check_outputs(inputs, {flag(k): v for k, v in outputs.items()})


def check_links_inside(root: str) -> None:
  """Refuses a folder holding a symlink whose target leaves it: a writer that follows it would write outside."""
  real_root = storage_address(root)
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      path = os.path.join(dirpath, name)
      if os.path.islink(path) and not _within(storage_address(path), real_root):
        raise ValueError(f"{path} is a symbolic link to {os.readlink(path)}, outside {root}: writing through it "
                         "would change files outside the output folder; remove the link")


# --------------------------------------------------------------------------- one reader per binary input kind

# Deflate's largest expansion is about 1032:1: a zip member claiming more than this times its compressed size lies.
MAX_DEFLATE_RATIO = 1100


def check_npy_header(f, available: int, where: str) -> None:
  """Refuses a .npy payload (open binary `f` at its start, `available` bytes long) whose header claims more data than
  it holds, before numpy allocates what the header says (a shape of terabytes: MemoryError naming nothing)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
      shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
      shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
      return  # numpy's own reader checks the rest (version 3.0 headers are rare)
  except (ValueError, OSError, EOFError, SyntaxError) as e:
    raise ValueError(f"{where}: not a .npy payload ({e})") from None
  if dtype.hasobject:
    return  # pickled objects: refused or trusted by the caller
  needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
  holds = available - f.tell()
  if needed > holds:
    raise ValueError(f"{where}: its header claims shape {tuple(shape)} {dtype} ({needed} bytes) but it holds {holds} "
                     "bytes; refused before allocating")


def _check_npz_member(z, key: str, where: str) -> None:
  import zipfile  # pylint: disable=g-import-not-at-top
  names = z.zip.namelist()
  name = key if key in names else f"{key}.npy"
  if name not in names:
    return  # numpy raises KeyError naming the member
  info = z.zip.getinfo(name)
  if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
    raise ValueError(f"{where}: the zip header claims {info.file_size} bytes from {info.compress_size} compressed "
                     "(more than deflate can expand); refused before allocating")
  with z.zip.open(name) as f:
    check_npy_header(f, info.file_size, where)


def read_h5_dataset(ds, where: str):
  """`ds[()]` of an h5py Dataset, after checking that the size its header claims fits the file (times deflate's
  largest expansion when the dataset is compressed): a header claiming terabytes is an error naming `where`, not a
  MemoryError."""
  claimed = int(ds.size) * ds.dtype.itemsize
  filtered = ds.id.get_create_plist().get_nfilters() > 0
  file_bytes = os.path.getsize(ds.file.filename)
  if claimed > file_bytes * (MAX_DEFLATE_RATIO if filtered else 1) + 4096:
    raise ValueError(f"{where}: the HDF5 header claims shape {ds.shape} {ds.dtype} ({claimed} bytes) but the file "
                     f"has {file_bytes} bytes; refused before allocating")
  return ds[()]


def npz_member(z, key: str, path: str, what: str = "file", trust_pickles: bool = False):
  """Member `key` of an open np.load(.npz) `z`: a pickled member is refused (UnsafeInputError), a header claiming
  more than the member holds too (`check_npy_header`), and any other error names the file and member (numpy reads
  members lazily, so this is where a pickle or damage shows)."""
  if hasattr(z, "zip"):
    _check_npz_member(z, key, f"{what} {path}: member {key!r}")
  try:
    return z[key]
  except ValueError as e:
    if not trust_pickles and "allow_pickle" in str(e):
      raise _untrusted(path, f"{what} (.npz, member {key!r})") from None
    raise ValueError(f"{what} {path}: member {key!r} cannot be read ({e})") from None
  except (OSError, EOFError, KeyError) as e:
    raise ValueError(f"{what} {path}: member {key!r} cannot be read ({type(e).__name__}: {e})") from None


def load_npz(path: str, what: str = "file", trust_pickles: bool = False) -> dict:
  """{name: array} of a .npz file (local or a URI), read whole (`npz_member` for each); errors name the file."""
  import zipfile  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    with epath_of(path).open("rb") as f, np.load(f, allow_pickle=trust_pickles) as z:
      return {k: npz_member(z, k, path, what, trust_pickles) for k in z.files}
  except FileNotFoundError:
    raise FileNotFoundError(f"{what} {path} does not exist") from None
  except (OSError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(f"{what} {path}: cannot read as .npz ({type(e).__name__}: {e})") from None
  except ValueError as e:
    if isinstance(e, UnsafeInputError) or str(e).startswith(f"{what} {path}"):
      raise
    raise ValueError(f"{what} {path}: cannot read as .npz ({e})") from None


def check_finite_weights(tensors, source: str) -> None:
  """ValueError naming the first tensor of `tensors` ({name: array}) that holds a NaN or an infinity, and `source`
  (the file or checkpoint it came from). Every weight import goes through it (`hf_utils.read_checkpoint`: Hugging
  Face folders, CLIP, FrozenBiLM, the authors' GNN, JustAsk; `checkpointing.load_checkpoint_arrays`: an earlier
  run's params; word vectors), so a damaged weight is never loaded and scored silently."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  for name, value in tensors.items():
    arr = np.asarray(value)
    floating = arr.dtype.kind in "fc" or arr.dtype.name.startswith(("bfloat", "float"))  # ml_dtypes' bf16 too
    if not floating:  # integer buffers, bools, text: always finite
      continue
    finite = np.isfinite(arr)
    if not finite.all():
      at = tuple(int(i) for i in np.argwhere(~finite)[0])
      raise ValueError(f"{source}: tensor {name!r} {tuple(arr.shape)} holds {int(arr.size - finite.sum())} "
                       f"non-finite value(s) (first: {float(arr[at])} at {at}); the weights are damaged, refused")


def read_image(path: str, mode: str, what: str = "image"):
  """The image at `path` as a numpy array in PIL `mode` ("RGB", "L", ...). ValueError naming the file for anything
  PIL cannot or will not read, a decompression bomb included (PIL's size limit: a warning above it, an error above
  twice it; both refused), so a caller that skips bad items can skip it."""
  import warnings  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error", Image.DecompressionBombWarning)
      with (epath_of(path).open("rb") if is_uri(path) else open(path, "rb")) as f, Image.open(f) as im:  # gs:// too
        im.load()
        return np.asarray(im.convert(mode))
  except FileNotFoundError:
    raise FileNotFoundError(f"{what} {path} does not exist") from None
  except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
    raise ValueError(f"{what} {path}: refused as a decompression bomb ({e})") from None
  except (OSError, ValueError, SyntaxError, EOFError) as e:  # PIL raises these for truncated / non-image files
    raise ValueError(f"{what} {path}: cannot read as an image ({e})") from None


def read_mask(path: str, what: str = "mask"):
  """A mask PNG as bool [H, W]: PIL `convert("L") > 0`, the official ST-Evidence rule (palette, RGB(A) and grey
  masks alike: a pixel whose luminance rounds to 0 is background). Errors as `read_image`."""
  return read_image(path, "L", what) > 0
