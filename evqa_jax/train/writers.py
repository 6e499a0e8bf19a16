"""Metric logging: clu metric writers (TensorBoard event files + console) and a progress line with steps/s and ETA.

Only process 0 writes summaries; other processes get a logging-only writer.
"""

import os
import time

import jax
import numpy as np


def create_writer(workdir: str, config):
  del config
  from clu import metric_writers  # imports TensorFlow for the summary writer: keep it out of module import time
  return metric_writers.create_default_writer(
      os.path.join(workdir, "tensorboard"), just_logging=jax.process_index() > 0, asynchronous=False)


def format_metrics(title: str, metrics: dict, keys=None) -> str:
  """One line `title: k=v ...` over `keys` (default: every scalar that is not a count)."""
  if keys is None:
    keys = [k for k in metrics if not k.startswith("num_")]
  parts = []
  for k in keys:
    v = metrics.get(k)
    if isinstance(v, (float, np.floating)):
      parts.append(f"{k}={v:.4g}")
    elif isinstance(v, (int, np.integer)):
      parts.append(f"{k}={v}")
  return f"{title}: " + " ".join(parts)


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
      print(f"step {step}/{self.total} loss={metrics['loss']:.4f} lr={metrics.get('lr', 0):.3g} "
            f"{rate:.2f} steps/s ETA {eta / 60:.1f} min", flush=True)
