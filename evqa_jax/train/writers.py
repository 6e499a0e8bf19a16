"""Metric logging: TensorBoard event files + the absl log, and a progress line with steps/s and ETA.

The event files are written without TensorFlow: `tf.Event` protos (tensorboard's own compiled protos) framed as
TFRecords by evqa_jax.data.tfrecord, with the scalars as `simple_value`s and the hyperparameters as the hparams
plugin's session-start summary (tensorboard's `hparams_pb`, the summary clu's writer wrote). tensorboardX would
import torch wherever torch is installed (the test extras), and clu's writer imports TensorFlow.

Only process 0 writes event files; every process logs its scalars with absl (`[step] key=value, ...`, at INFO).
On an object store (a gs://... workdir), which has no append, the events are written as a new, complete event file
at each flush (every `REMOTE_FLUSH_SECONDS` and at the end); TensorBoard reads every event file of the folder in
name order, and the names begin with the flush time.
"""

import os
import socket
import time

from absl import logging
import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2  # plain protobuf: tensorboard.compat loads TF only on use
from tensorboard.plugins.hparams import summary_v2

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax.data import tfrecord

REMOTE_FLUSH_SECONDS = 60.0


def create_writer(workdir: str, config):
  del config
  return SummaryWriter(os.path.join(workdir, "tensorboard"), write_events=jax.process_index() == 0)


class SummaryWriter:
  """Scalars and hyperparameters to `logdir/events.out.tfevents.*` (one new file per writer) and to the absl log.

  Local: the event file is an append-only log that TensorBoard reads while it grows, so it is written in place, one
  flushed record per event, not through a temporary file; TensorBoard ignores a last record torn by a kill.
  URI (gs://...): events are kept in memory and each flush uploads them as one new event file (see the module doc).
  """

  def __init__(self, logdir: str, write_events: bool = True, remote_flush_seconds: float = REMOTE_FLUSH_SECONDS):
    self.path = None
    self.logdir = logdir
    self.remote = io_lib.is_uri(logdir)
    self.remote_flush_seconds = remote_flush_seconds
    self._pending = []  # remote: framed events not uploaded yet
    self._last_upload = time.time()
    self._uploads = 0
    self._closed = False
    if write_events:
      io_lib.makedirs(logdir)
      self.path = self._new_name()
      if not self.remote:
        self._file = open(self.path, "ab")
      self._write_event(file_version="brain.Event:2")

  def _new_name(self) -> str:
    suffix = f".{self._uploads}" if self.remote else ""
    return os.path.join(self.logdir, f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
                        f"{suffix}")

  def _write_event(self, **fields) -> None:
    event = event_pb2.Event(wall_time=time.time(), **fields)
    record = tfrecord.frame(event.SerializeToString())
    if self.remote:
      self._pending.append(record)
      if time.time() - self._last_upload >= self.remote_flush_seconds:
        self._upload()
      return
    self._file.write(record)
    self._file.flush()

  def _upload(self) -> None:
    """Remote: the pending events as one new, complete event file (each file starts with the version event)."""
    self._last_upload = time.time()
    if not self._pending:
      return
    if self._uploads:
      self.path = self._new_name()
      version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
      self._pending.insert(0, tfrecord.frame(version.SerializeToString()))
    with io_lib.atomic_path(self.path) as tmp:
      with open(tmp, "wb") as f:
        f.write(b"".join(self._pending))
    self._pending = []
    self._uploads += 1

  def write_scalars(self, step: int, scalars: dict) -> None:
    values = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(scalars.items())]
    logging.info("[%d] %s", step, ", ".join(values))
    if self.path is not None:
      summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                                           for k, v in scalars.items()])
      self._write_event(step=int(step), summary=summary)

  def write_hparams(self, hparams: dict) -> None:
    logging.info("[Hyperparameters] %s", hparams)
    if self.path is not None:
      self._write_event(step=0, summary=summary_v2.hparams_pb(hparams))

  def flush(self) -> None:
    logging.flush()
    if self.path is None:
      return
    if self.remote:
      self._upload()
    else:
      self._file.flush()
      os.fsync(self._file.fileno())

  def close(self) -> None:
    if self.path is not None and not self._closed:
      self.flush()
      if not self.remote:
        self._file.close()
    self._closed = True


# Keys of an evaluator's result that count things (examples, answers, errors) rather than measure: they stay in the
# metrics JSON, and are neither TensorBoard scalars nor printed on the console.
COUNT_PREFIXES = ("num_", "format_errors_")


def is_metric(key: str, value) -> bool:
  """Whether `value` under `key` is a metric (a number that is not a count or a flag such as masks_scored)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
    return False
  return not key.startswith(COUNT_PREFIXES)


def metric_scalars(prefix: str, results: dict) -> dict:
  """{"<prefix>/<key>": value} of the metrics in an evaluator's result (counts and flags left out)."""
  return {f"{prefix}/{k}": v for k, v in results.items() if is_metric(k, v)}


def format_metrics(title: str, metrics: dict, keys=None, more_in: str = "") -> str:
  """One line `title: k=v ...` over `keys` (default: every metric); with `more_in`, the number of metrics not shown
  and the file that holds them all: `(+5 more in eval/test_step2/metrics.json)`."""
  shown = [k for k in (keys if keys is not None else metrics) if is_metric(k, metrics.get(k))]
  parts = [f"{k}={metrics[k]:.4g}" if isinstance(metrics[k], (float, np.floating)) else f"{k}={metrics[k]}"
           for k in shown]
  rest = sum(is_metric(k, v) for k, v in metrics.items()) - len(shown)
  more = f" (+{rest} more in {more_in})" if more_in and rest > 0 else ""
  return f"{title}: " + " ".join(parts) + more


class Progress:
  """Prints `step/total loss=... steps/s ETA` lines on process 0."""

  def __init__(self, total_steps: int, start_step: int):
    self.total = total_steps
    self.t0 = time.time()
    self.step0 = start_step
    self.last_t = self.t0
    self.last_step = start_step

  def report(self, step: int, metrics: dict) -> None:
    now = time.time()
    rate = (step - self.last_step) / max(now - self.last_t, 1e-9)
    overall = (step - self.step0) / max(now - self.t0, 1e-9)
    eta = (self.total - step) / max(overall, 1e-9)
    self.last_t, self.last_step = now, step
    if jax.process_index() == 0:
      log.info(f"step {step}/{self.total} loss={metrics['loss']:.4f} lr={metrics.get('lr', 0):.3g} "
               f"{rate:.2f} steps/s ETA {eta / 60:.1f} min")
