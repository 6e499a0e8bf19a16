"""A Google Cloud Storage API on 127.0.0.1 for tests: `gcp-storage-emulator` (PyPI) in a subprocess, with gcsfs
(etils.epath, Grain) and tensorstore (Orbax) pointed at it. Nothing leaves the machine.

  with gcs_emulator.running(bucket="evqa-test") as env:   # env: the variables a subprocess needs
    subprocess.run([...], env=dict(os.environ, **env))

Run as a script it serves until killed (`python tests/gcs_emulator.py PORT BUCKET`), adding one thing the emulator
omits and the real service sends: the `x-goog-generation` header on object downloads. Tensorstore reads an object's
generation from that header to make its conditional writes (OCDBT's manifest), and fails with "Malformed
StorageGeneration" without it.
"""

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time

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
def running(bucket: str = "evqa-test", timeout: float = 30.0):
  """Starts the emulator (in memory, bucket `bucket` created), yields `client_env(port)`, stops it on exit."""
  port = _free_port()
  # Its log goes to a file: a pipe nobody reads would fill up and stall the server mid-request.
  log = tempfile.TemporaryFile(mode="w+")
  proc = subprocess.Popen([sys.executable, os.path.join(HERE, "gcs_emulator.py"), str(port), bucket],
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


def _serve(port: int, bucket: str) -> None:
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top

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
  for _, handlers in server.HANDLERS:
    for method, handler in list(handlers.items()):
      if handler is original:
        handlers[method] = download
  logging.getLogger().setLevel(logging.WARNING)  # not a line per request
  server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2])
