"""The gather of DeBERTa-v2's relative rows along their last axis, with a scatter-free backward.

Shared by the XLA attention path (`deberta_v2`) and the fused Pallas kernel's wrapper (`deberta_pallas`), which
both gather the relative-position rows at the static diagonal of a Toeplitz index.
"""

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np


def _runs_of(diag: Tuple[int, ...], rows: int):
  """Static layout of `diag`'s runs of equal values: (run starts, run ends + 1, run of each row or K if none)."""
  diag = np.asarray(diag)
  starts = np.flatnonzero(np.r_[True, diag[1:] != diag[:-1]])
  ends = np.r_[starts[1:], len(diag)]
  values = diag[starts]
  if len(set(values.tolist())) != len(values):
    raise ValueError(f"toeplitz_gather: equal values of the diagonal must be contiguous, got {diag.tolist()}")
  run_of = np.full(rows, len(starts))
  run_of[values] = np.arange(len(starts))
  return starts, ends, run_of


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def gather_along_last(x, diag: Tuple[int, ...], rows: int):
  """x [..., rows] -> x[..., diag] [..., len(diag)] whose backward is a float32 segment sum over the runs of equal
  `diag` values (contiguous: checked), gathered back to rows: gathers and adds, no scatter (`_segment_sums`)."""
  del rows  # only the backward needs it
  return jnp.take(x, np.asarray(diag, np.int32), axis=-1)


def gather_along_last_fwd(x, diag, rows):
  return gather_along_last(x, diag, rows), None


# Longest run of equal diagonal values summed by one gather per position (`_segment_sums`); longer runs use a scan.
# DeBERTa-v2's log buckets (256, max position 512) give runs of at most 3 values at 266 tokens and 6 at 512.
MAX_GATHERED_RUN = 8


def _segment_sums(g, starts, ends):
  """g [..., n] float32, contiguous runs [starts, ends) covering 0..n-1 -> [..., runs]: each run's sum.

  Short runs (the usual case): the sum of k-th elements of every run, k = 0 .. longest run - 1, each one static
  gather of g padded with a zero column: as many gathers as the longest run, each the size of the output, summed
  left to right in float32. Runs longer than MAX_GATHERED_RUN (e.g. distances clipped at a small span): a scan that
  restarts at each run start, read at the run ends (log-depth passes over the whole of g; on CPU ~3.6x slower
  than the gathers at DeBERTa-v3-xsmall's shapes)."""
  lengths = ends - starts
  longest = int(lengths.max())
  if longest <= MAX_GATHERED_RUN:
    zero = g.shape[-1]  # index of the zero column that pads the runs shorter than k + 1
    if longest > 1:
      g = jnp.concatenate([g, jnp.zeros_like(g[..., :1])], axis=-1)
    sums = jnp.take(g, starts, axis=-1)
    for k in range(1, longest):
      sums = sums + jnp.take(g, np.where(k < lengths, starts + k, zero), axis=-1)
    return sums
  first = np.zeros(g.shape[-1], bool)
  first[starts] = True

  def add_within_runs(a, b):  # (partial sum, run starts inside) pairs: a sum restarts at each run start
    return jnp.where(b[1], b[0], a[0] + b[0]), a[1] | b[1]

  first = jnp.broadcast_to(jnp.asarray(first), g.shape)
  c, _ = jax.lax.associative_scan(add_within_runs, (g, first), axis=g.ndim - 1)
  return jnp.take(c, ends - 1, axis=-1)


def gather_along_last_bwd(diag, rows, _, g):
  starts, ends, run_of = _runs_of(diag, rows)
  sums = _segment_sums(g.astype(jnp.float32), starts, ends)  # [..., runs]
  sums = jnp.concatenate([sums, jnp.zeros_like(sums[..., :1])], axis=-1)  # rows no run reaches get 0
  return (jnp.take(sums, run_of, axis=-1).astype(g.dtype),)


gather_along_last.defvjp(gather_along_last_fwd, gather_along_last_bwd)
