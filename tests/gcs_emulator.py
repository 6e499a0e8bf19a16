"""A Google Cloud Storage API on 127.0.0.1 for tests: `gcp-storage-emulator` (PyPI) in a subprocess, with gcsfs
(etils.epath, Grain) and tensorstore (Orbax) pointed at it. Nothing leaves the machine.

  with gcs_emulator.running(bucket="evqa-test") as env:   # env: the variables a subprocess needs
    subprocess.run([...], env=dict(os.environ, **env))

  with gcs_emulator.running(bucket="evqa-test", request_log=path) as env:   # one JSON line per request served

Run as a script it serves until killed (`python tests/gcs_emulator.py PORT BUCKET [REQUEST_LOG]`), adding what the
emulator omits and the real service does:

- the `x-goog-generation` header on object downloads. Tensorstore reads an object's generation from that header to
  make its conditional writes (OCDBT's manifest), and fails with "Malformed StorageGeneration" without it.
- the generation preconditions `ifGenerationMatch` / `ifGenerationNotMatch` on object writes (simple, multipart and
  resumable uploads: checked when the upload starts and on each of its chunks) and deletes, as Cloud Storage
  documents them (https://cloud.google.com/storage/docs/request-preconditions): the request applies only when the
  live object's generation matches (0: no live object); otherwise nothing changes and the answer is 412
  Precondition Failed. The emulator itself ignores them, so a create-only write (the workdir lock's
  `ifGenerationMatch=0`) would silently overwrite. It serves one request at a time, so check and write are atomic.

With REQUEST_LOG every request served is appended to that file as {"method", "path" (with the query), "status",
and for writes and deletes "object" (the name written or deleted, which a multipart upload carries in its body)}.
"""

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from http import HTTPStatus

HERE = os.path.dirname(os.path.abspath(__file__))


def client_env(port: int) -> dict:
  """Environment for a process that talks to the emulator on `port`, and to no other Google endpoint."""
  url = f"http://127.0.0.1:{port}"
  return {
      "STORAGE_EMULATOR_HOST": url,  # gcsfs (and google-cloud-storage): anonymous requests to the emulator
      "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore's GCS endpoint (Orbax's checkpoint arrays)
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore: a fixed bearer token, no credential lookup
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no gRPC probe of the bucket type
      "NO_GCE_CHECK": "true",  # gcsfs: no metadata-server probe
      "GCE_METADATA_HOST": "127.0.0.1:9",  # google.auth: a metadata lookup, if any, stays on this machine
      "GCE_METADATA_IP": "127.0.0.1:9",
  }


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def running(bucket: str = "evqa-test", timeout: float = 30.0, request_log: str | None = None):
  """Starts the emulator (in memory, bucket `bucket` created), yields `client_env(port)`, stops it on exit.
  `request_log`: a file that gets one JSON line per request served (`read_requests`)."""
  port = _free_port()
  # Its log goes to a file: a pipe nobody reads would fill up and stall the server mid-request.
  log = tempfile.TemporaryFile(mode="w+")
  proc = subprocess.Popen([sys.executable, os.path.join(HERE, "gcs_emulator.py"), str(port), bucket,
                           *([request_log] if request_log else [])],
                          stdout=log, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + timeout
    while True:
      if proc.poll() is not None:
        log.seek(0)
        raise RuntimeError(f"gcp-storage-emulator exited ({proc.returncode}): {log.read()[-2000:]}")
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
      except OSError:
        if time.time() > deadline:
          raise TimeoutError(f"gcp-storage-emulator did not listen on 127.0.0.1:{port} within {timeout} s") from None
        time.sleep(0.1)
    yield client_env(port)
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()


@contextlib.contextmanager
def this_process_pointed_at(env: dict):
  """Sets `env` (from `running`) in this process's environment for the block, so that gcsfs, made afresh, talks to
  the emulator; restores the environment after."""
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.get_filesystem_class("gs").clear_instance_cache()  # none made before the emulator's variables were set
  try:
    yield env
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    fsspec.get_filesystem_class("gs").clear_instance_cache()


def read_requests(path: str) -> list:
  """The requests a `running(..., request_log=path)` emulator served: [{"method", "path", "status"[, "object"]}]."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


PRECONDITION_FAILED = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not "
                                 "hold.", "errors": [{"domain": "global", "reason": "conditionNotMet",
                                                      "message": "Precondition Failed"}]}}


def _live_generation(storage, bucket_name: str, name) -> str:
  """The generation of the live object `name`, "0" when there is none (GCS: ifGenerationMatch=0 = does not exist)."""
  from gcp_storage_emulator.exceptions import NotFound  # pylint: disable=g-import-not-at-top
  if not name:
    return "0"
  try:
    return str(storage.get_file_obj(bucket_name, name)["generation"])
  except NotFound:
    return "0"


def _preconditions_hold(request, storage, bucket_name: str, name) -> bool:
  """Cloud Storage's generation preconditions of `request` on object `name`: ifGenerationMatch=G holds when the live
  generation is G (G=0: no live object), ifGenerationNotMatch=G when it is not."""
  live = _live_generation(storage, bucket_name, name)
  match, not_match = request.query.get("ifGenerationMatch"), request.query.get("ifGenerationNotMatch")
  if match is not None and str(int(match[0])) != live:
    return False
  if not_match is not None and str(int(not_match[0])) == live:
    return False
  return True


def _upload_name(request, storage):
  """The object an upload request writes: `name` in the query, else the JSON metadata's (multipart: its "meta"
  part), else (a resumable upload's chunk) the name its session was opened with."""
  if "upload_id" in request.query:
    try:
      return storage.get_resumable_file_obj(request.query["upload_id"][0])["name"]
    except Exception:  # pylint: disable=broad-except  (an unknown session: the handler answers 404)
      return None
  if "name" in request.query:
    return request.query["name"][0]
  data = request.data
  if isinstance(data, dict):
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
    return meta.get("name")
  return None


_SERVING = {}  # the object the request being served writes or deletes, for the request log (one request at a time)


def _with_preconditions(handler, object_name):
  """`handler` answering 412 Precondition Failed, and changing nothing, when the request's preconditions fail."""
  def checked(request, response, storage, *args, **kwargs):
    name = _SERVING["object"] = object_name(request, storage)
    if "ifGenerationMatch" in request.query or "ifGenerationNotMatch" in request.query:
      bucket_name = request.params["bucket_name"]
      if not _preconditions_hold(request, storage, bucket_name, name):
        response.status = HTTPStatus.PRECONDITION_FAILED
        response.json(PRECONDITION_FAILED)
        return None
    return handler(request, response, storage, *args, **kwargs)
  return checked


def _serve(port: int, bucket: str, request_log: str | None = None) -> None:
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top

  def replace(original, new):
    for _, handlers in server.HANDLERS:
      for method, handler in list(handlers.items()):
        if handler is original:
          handlers[method] = new

  # Preconditions on writes and deletes. `insert` also serves resumable chunks POSTed with upload_id.
  for name in ("insert", "upload_partial"):
    original = getattr(objects, name)
    checked = _with_preconditions(original, _upload_name)
    setattr(objects, name, checked)  # the router's fallback for uploads without the /upload prefix calls it too
    replace(original, checked)
  original_delete = objects.delete
  checked_delete = _with_preconditions(original_delete, lambda request, storage: request.params["object_id"])
  objects.delete = checked_delete
  replace(original_delete, checked_delete)

  if request_log:
    close = server.Response.close
    log = open(request_log, "a", buffering=1)  # pylint: disable=consider-using-with  (open while serving)

    def logged_close(self):
      handler = self._handler  # pylint: disable=protected-access
      entry = {"method": handler.command, "path": handler.path, "status": int(self.status)}
      if "object" in _SERVING:
        entry["object"] = _SERVING.pop("object")
      log.write(json.dumps(entry) + "\n")
      close(self)

    server.Response.close = logged_close

  original = objects.download

  def download(request, response, storage, *args, **kwargs):
    original(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # pylint: disable=broad-except  (a 404 stays a 404)
      return
    response["x-goog-generation"] = obj["generation"]
    response["x-goog-metageneration"] = obj["metageneration"]

  objects.download = download  # objects.get (GET ...?alt=media) calls it too
  replace(original, download)
  logging.getLogger().setLevel(logging.WARNING)  # not a line per request
  server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
