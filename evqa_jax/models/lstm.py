"""Bidirectional LSTM over right-padded sequences, with length-aware final states.

This is the `RNNEncoder` of the VIOLIN / TVQA PyTorch code (`nn.LSTM(bidirectional=True)` over a
`pack_padded_sequence`) in Flax linen: every sequence is processed as if it had been passed on its own, unpadded.

- Forward direction: runs over positions 0 .. len-1; its final state is the one at position len-1.
- Backward direction: runs from position len-1 down to 0 (padding stays at the end, `flip_sequences`); its final
  state is the one at position 0.
- Outputs at padded positions (t >= len) are exact zeros, as `pad_packed_sequence` gives, and nothing at a padded
  position can reach an output or a final state at a valid one.
- A sequence of length 0 (allowed here, refused by PyTorch) gives all-zero outputs and all-zero final states.

Parameters are initialised like `torch.nn.LSTM` (every weight and both biases U(-1/sqrt(hidden), 1/sqrt(hidden));
the single Flax bias per gate is the sum b_ih + b_hh) so that training from scratch behaves like the reference code.
Parameter layout (per direction, Flax `OptimizedLSTMCell`, gate g in {i, f, g, o}):
  `<direction>/cell/i<g>/kernel [in, hidden]` (= torch weight_ih[g].T),
  `<direction>/cell/h<g>/kernel [hidden, hidden]` (= torch weight_hh[g].T),
  `<direction>/cell/h<g>/bias [hidden]` (= torch bias_ih[g] + bias_hh[g]),
with `<direction>` in {`forward`, `backward`}; `torch_lstm_to_flax` does that conversion.
"""

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

GATES = ("i", "f", "g", "o")  # PyTorch's row-block order in weight_ih / weight_hh


def torch_uniform_init(bound: float):
  """U(-bound, bound), PyTorch's default for LSTM weights (bound = 1/sqrt(hidden))."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def torch_lstm_bias_init(bound: float):
  """b_ih + b_hh with both U(-bound, bound): the distribution of PyTorch's effective LSTM bias."""

  def init(key, shape, dtype=jnp.float32):
    # One draw of both terms (one RNG kernel per bias instead of two: XLA compiles random init slowly on CPU).
    return jnp.sum(jax.random.uniform(key, (2, *shape), dtype, -bound, bound), axis=0)

  return init


def lengths_from_mask(mask: jax.Array) -> jax.Array:
  """`[batch, length]` right-padded validity mask (bool or 0/1) -> `[batch]` int32 lengths."""
  return jnp.sum(mask.astype(jnp.int32), axis=-1)


def prefix_mask(lengths: jax.Array, max_len: int) -> jax.Array:
  """`[batch]` lengths -> `[batch, max_len]` bool mask, True at t < length."""
  return jnp.arange(max_len)[None, :] < lengths[:, None]


class BiLSTM(nn.Module):
  """One-layer bidirectional LSTM, `hidden_size` units per direction.

  Call: `(inputs [batch, length, in_dim], lengths [batch] int) ->
         (outputs [batch, length, 2 * hidden_size], last [batch, 2 * hidden_size])`
  `outputs[..., :hidden]` is the forward direction, `outputs[..., hidden:]` the backward one (PyTorch's layout);
  `last = concat(forward state at len-1, backward state at 0)`, PyTorch's `h_n` transposed and flattened.
  """
  hidden_size: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def _cell(self) -> nn.OptimizedLSTMCell:
    bound = 1.0 / float(np.sqrt(self.hidden_size))
    return nn.OptimizedLSTMCell(
        features=self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype,
        # Unparented, so that each nn.RNN adopts its own cell under `<direction>/cell`.
        parent=None,
        kernel_init=nn.with_logical_partitioning(torch_uniform_init(bound), ("embed", "mlp")),
        recurrent_kernel_init=nn.with_logical_partitioning(torch_uniform_init(bound), (None, "mlp")),
        bias_init=nn.with_logical_partitioning(torch_lstm_bias_init(bound), ("mlp",)))

  @nn.compact
  def __call__(self, inputs: jax.Array, lengths: jax.Array):
    if inputs.ndim != 3:
      raise ValueError(f"BiLSTM expects inputs [batch, length, dim], got shape {inputs.shape}")
    if lengths.shape != inputs.shape[:1]:
      raise ValueError(f"BiLSTM lengths must have shape [batch]={inputs.shape[:1]}, got {lengths.shape}")
    max_len = inputs.shape[1]
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, max_len)
    valid = prefix_mask(lengths, max_len)
    # Zeroing the padding is not needed for correctness (nothing flows from it into valid steps) but keeps
    # NaN/inf padding from leaking into gradients through the masked-out branches.
    inputs = jnp.where(valid[..., None], inputs, jnp.zeros((), inputs.dtype))
    forward = nn.RNN(self._cell(), name="forward")
    backward = nn.RNN(self._cell(), reverse=True, keep_order=True, name="backward")
    (_, h_fwd), out_fwd = forward(inputs, seq_lengths=lengths, return_carry=True)
    (_, h_bwd), out_bwd = backward(inputs, seq_lengths=lengths, return_carry=True)
    outputs = jnp.concatenate([out_fwd, out_bwd], axis=-1)
    outputs = jnp.where(valid[..., None], outputs, jnp.zeros((), outputs.dtype))
    last = jnp.concatenate([h_fwd, h_bwd], axis=-1)
    # RNN's carry selection reads index len-1, i.e. the wrong step when len == 0.
    last = jnp.where((lengths > 0)[:, None], last, jnp.zeros((), last.dtype))
    return outputs, last


def torch_lstm_to_flax(state: Mapping[str, Any], prefix: str = "") -> dict:
  """PyTorch `nn.LSTM(bidirectional=True, num_layers=1)` weights -> the params tree of one `BiLSTM`.

  `state` maps `{prefix}weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0` and the `_reverse` versions to
  arrays (numpy or torch tensors). Returns `{"forward": {"cell": ...}, "backward": {"cell": ...}}` of numpy float32.
  """

  def get(name):
    key = prefix + name
    if key not in state:
      raise KeyError(f"torch LSTM state dict has no entry {key!r} (have: {sorted(state)[:12]} ...)")
    value = state[key]
    if hasattr(value, "detach"):
      value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float32)

  out = {}
  for direction, suffix in (("forward", ""), ("backward", "_reverse")):
    w_ih, w_hh = get(f"weight_ih_l0{suffix}"), get(f"weight_hh_l0{suffix}")
    bias = get(f"bias_ih_l0{suffix}") + get(f"bias_hh_l0{suffix}")
    hidden = w_hh.shape[1]
    if w_ih.shape[0] != 4 * hidden or w_hh.shape != (4 * hidden, hidden):
      raise ValueError(f"{prefix}weight_*_l0{suffix}: shapes {w_ih.shape}, {w_hh.shape} are not an LSTM's")
    cell = {}
    for k, gate in enumerate(GATES):
      rows = slice(k * hidden, (k + 1) * hidden)
      cell[f"i{gate}"] = {"kernel": w_ih[rows].T.copy()}
      cell[f"h{gate}"] = {"kernel": w_hh[rows].T.copy(), "bias": bias[rows].copy()}
    out[direction] = {"cell": cell}
  return out
