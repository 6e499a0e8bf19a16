"""VIOLIN baseline (Liu et al., CVPR 2020, section 4): statement-centred attention fusion of video and subtitles.

Follows the authors' public code (github.com/jimmy646/violin, `model/ViolinBase.py`, `model/bidaf.py`,
`model/rnn.py`, `config.py`: hsize1=150, hsize2=300, embed_size=768) with BERT text features:

  S   = text_fc(statement)                      text_fc = Dropout(0.5) -> Linear(text_dim, 2*150) -> Tanh
  Sub = text_fc(subtitles)                      the same module (shared weights, independent dropout masks)
  V   = video_lstm(video_fc(video))             video_fc = Dropout(0.5) -> Linear(D_v, 768) -> Tanh;
                                                video_lstm = BiLSTM(150 per direction) -> 300 per step
  u_v = attend(S, V), u_s = attend(S, Sub)      each statement word attends over the context steps (dot product)
  x   = concat[S, u_v, u_s, S*u_v, S*u_s]       only the enabled modalities: 3 * 300 with one, 5 * 300 with both
  h   = fusion_lstm(x)                          BiLSTM(300 per direction) over the statement; length-aware last
                                                states of both directions -> 600
  logit = final_fc2(Dropout(0.5)(ReLU(final_fc1(h))))    Linear(600, 300), Linear(300, 1); sigmoid left to the loss
  Statement only: h = max over the valid statement steps of S (300-d) -> Linear(300, 300) -> ReLU -> Dropout ->
  Linear(300, 1), as the authors' `final_fc` for empty `input_streams`.

Choices, stated exactly:
- Subtitles are NOT passed through an LSTM by default: with BERT features both the paper ("the output of BERT ... is
  then projected to 2d dimensions, also denoted as H and S") and the authors' code (`sub_encoded = self.bert_fc(sub)`)
  use the shared 768 -> 300 projection directly, which already gives 300-d like the video BiLSTM (2 x 150).
  `subtitle_lstm=True` adds a BiLSTM(150 per direction) on the projected subtitles (the LSTM-encoder flavour of the
  paper's text encoder), still 300-d.
- The authors build separate fusion LSTMs per input combination (`vid_ctx_rnn`, `sub_ctx_rnn`, `lstm_mature_vid`)
  and, with both streams, run the single-stream ones without using their output; here there is exactly one
  `fusion_lstm` whose input width follows the enabled modalities (same function, no dead parameters).
- Attention masks both the statement word and the context step; a statement row with no valid context step (or a
  padded statement row) gets u = 0, exactly as `masked_fill(s_mask, 0)` after softmax in the authors' BidafAttn, but
  without ever forming NaN (values and gradients stay finite).
- single_frame=True keeps one valid frame per clip before anything else, as a length-1 video (the authors slice the
  HDF5 feature array the same way). `middle_frame="lower"` picks index (len-1)//2 (the project's definition);
  `middle_frame="authors"` picks len//2 (`int(len(tt)/2)` in the authors' violin_dataset.py); they differ only for
  an even number of frames. A clip with no valid frame stays empty (u_v = 0).
- Masks are right-padded validity masks (bool or 0/1): lengths = mask.sum(-1), valid steps are 0 .. len-1.
- Several statements per clip: `statement [batch, S, Ls, text_dim]` (e.g. S = 2, the positive and negative of a
  pair) scores each of them against the SAME clip, whose video and subtitles are encoded once (`[batch, S]` logits).
  Deterministically this equals calling the model with the clip repeated S times; under dropout the S statements
  share the clip's dropout masks (one clip, one draw), where the repeated call would draw S independent masks.
- Widths: `hsize1`, `hsize2`, `embed_size` default to the authors' 150, 300, 768; smaller values are for tests and
  CPU demos only (the converter `params_from_authors_state_dict` reads whatever widths the state dict has).
- Frame L2 normalisation and the frozen BERT encoder are the caller's (data / task) business.
- Linear and LSTM parameters are initialised like PyTorch's defaults (U(+-1/sqrt(fan_in))), as in the reference.

Text encoder (`text_encoder`):
- "projection" (default, BERT features): S = text_fc(statement) as above.
- "lstm" (the paper's "LSTM encoder" over GloVe word vectors, Table 3's GloVe rows): the statement and subtitle word
  vectors `[.., L, word_dim]` go through ONE BiLSTM(hsize1 per direction) -> 2 * hsize1 per word, the same LSTM that
  encodes the projected video (`raw_lstm`; video_fc then projects to embed_size = word_dim). The authors' VIOLIN
  release has no GloVe code; this is the text path of the TVQA code it is built on (jayleicn/TVQA
  `model/tvqa_abc.py`: `embedding` -> `lstm_raw` = RNNEncoder(300, hsz1=150, bidirectional), shared by every text
  stream and by `video_fc(vid)`; no dropout on the word vectors), which ViolinBase keeps for its video
  (`lstm_raw = RNNEncoder(embed_size, hsize1)`, embed_size documented as "word embedding dim"). Everything after
  the encoders (attention, fusion LSTM, final MLP, statement-only max-pool) is unchanged.

`params_from_authors_state_dict` converts a checkpoint of the authors' `ViolinBase` into this module's params.
"""

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models.lstm import BiLSTM, lengths_from_mask, prefix_mask, torch_lstm_to_flax

# Hidden sizes of the authors' config.py.
HSIZE1 = 150   # video (and optional subtitle) LSTM, per direction; text projection is 2 * HSIZE1
HSIZE2 = 300   # fusion LSTM per direction; hidden width of the final MLP
EMBED_SIZE = 768  # video projection width (the authors' embed_size)


def torch_linear_kernel_init():
  """PyTorch nn.Linear default weight init: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_linear_bias_init(fan_in: int):
  """PyTorch nn.Linear default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / float(np.sqrt(fan_in))

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def _dense(features: int, fan_in: int, axes: tuple, name: str, dtype, param_dtype) -> nn.Dense:
  return nn.Dense(features, dtype=dtype, param_dtype=param_dtype, name=name,
                  kernel_init=nn.with_logical_partitioning(torch_linear_kernel_init(), axes),
                  bias_init=nn.with_logical_partitioning(torch_linear_bias_init(fan_in), axes[-1:]))


def masked_dot_attention(query: jax.Array, query_mask: jax.Array, context: jax.Array,
                         context_mask: jax.Array) -> jax.Array:
  """Each query step attends over the valid context steps by dot product.

  query `[batch, Lq, dim]`, query_mask `[batch, Lq]`, context `[batch, Lc, dim]`, context_mask `[batch, Lc]`
  -> `[batch, Lq, dim]`: sum_j softmax_j(q_i . c_j) c_j over valid j; rows that are padded or have no valid context
  step are exact zeros. Computed in float32.
  """
  q_valid = query_mask.astype(bool)
  c_valid = context_mask.astype(bool)
  query = query.astype(jnp.float32)
  context = jnp.where(c_valid[..., None], context.astype(jnp.float32), 0.0)
  scores = jnp.einsum("bqd,bcd->bqc", query, context)
  pair_valid = q_valid[:, :, None] & c_valid[:, None, :]
  # A finite fill (not -inf) keeps all-masked rows NaN-free in the forward and backward pass; their weights are
  # then zeroed by the multiplication below. exp(-1e30 - max) underflows to exactly 0 in any valid row.
  scores = jnp.where(pair_valid, scores, -1e30)
  weights = jax.nn.softmax(scores, axis=-1) * pair_valid.astype(jnp.float32)
  return jnp.einsum("bqc,bcd->bqd", weights, context)


def masked_max_over_time(x: jax.Array, mask: jax.Array) -> jax.Array:
  """`[batch, length, dim]`, `[batch, length]` -> `[batch, dim]` max over the valid steps (0 for an empty row)."""
  valid = mask.astype(bool)
  very_negative = jnp.finfo(x.dtype).min
  out = jnp.max(jnp.where(valid[..., None], x, very_negative), axis=1)
  return jnp.where(jnp.any(valid, axis=1)[:, None], out, jnp.zeros((), x.dtype))


def middle_frame_index(lengths: jax.Array, rule: str = "lower") -> jax.Array:
  """`[batch]` frame counts -> `[batch]` index of the middle valid frame (0 for an empty clip)."""
  if rule == "lower":
    idx = (lengths - 1) // 2
  elif rule == "authors":
    idx = lengths // 2
  else:
    raise ValueError(f"ViolinBaseline.middle_frame must be 'lower' or 'authors', got {rule!r}")
  return jnp.clip(idx, 0, None)


class ViolinBaseline(nn.Module):
  """VIOLIN baseline classifier; returns pre-sigmoid logits `[batch]`.

  Attributes:
    feature_dim: frame feature size D_v (2048 ResNet-101, 4096 C3D).
    text_dim: hidden size of the frozen text encoder whose last-layer states are given (768 for BERT-base).
    use_video / use_subtitles: the input streams (Table 3 ablations); both False = statement only.
    single_frame: keep only the middle valid frame of the video (Table 3 "SglFrm"); needs use_video.
    dropout: rate of every Dropout (0.5 in the authors' code).
    middle_frame: "lower" = index (len-1)//2, "authors" = len//2.
    subtitle_lstm: also run a BiLSTM(150 per direction) over the projected subtitles (off in the authors' code).
    hsize1 / hsize2 / embed_size: the authors' widths (150, 300, 768); tests and CPU demos may shrink them.
    text_encoder: "projection" (BERT features, text_fc) or "lstm" (word vectors through the BiLSTM shared with the
      video, `raw_lstm`; needs embed_size == text_dim): see the module docstring.
  """
  feature_dim: int
  text_dim: int = 768
  use_video: bool = True
  use_subtitles: bool = True
  single_frame: bool = False
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  middle_frame: str = "lower"
  subtitle_lstm: bool = False
  hsize1: int = HSIZE1
  hsize2: int = HSIZE2
  embed_size: int = EMBED_SIZE
  text_encoder: str = "projection"

  def _check(self, name: str, x, rank: int, last_dim: int | None, batch: int):
    if x is None:
      raise ValueError(f"ViolinBaseline: input {name!r} is required by this configuration "
                       f"(use_video={self.use_video}, use_subtitles={self.use_subtitles}) but is None")
    if x.ndim != rank or x.shape[0] != batch or (last_dim is not None and x.shape[-1] != last_dim):
      want = f"[{batch}, length" + (f", {last_dim}]" if last_dim is not None else "]")
      raise ValueError(f"ViolinBaseline: input {name!r} must have shape {want}, got {tuple(x.shape)}")

  @nn.compact
  def __call__(self, statement, statement_mask, subtitles=None, subtitle_mask=None, video=None, video_mask=None,
               deterministic: bool = True):
    """statement `[batch, Ls, text_dim]` or `[batch, S, Ls, text_dim]` (S statements about the same clip),
    statement_mask `[batch, Ls]` / `[batch, S, Ls]`, subtitles `[batch, Lu, text_dim]`, subtitle_mask `[batch, Lu]`,
    video `[batch, T, feature_dim]`, video_mask `[batch, T]` -> logits `[batch]` / `[batch, S]`.

    The clip (video, subtitles) is encoded once per batch row, whatever S. Inputs of a disabled modality are ignored
    (may be None). Dropout draws from the 'dropout' RNG collection.
    """
    if self.single_frame and not self.use_video:
      raise ValueError("ViolinBaseline: single_frame=True needs use_video=True")
    if self.text_encoder not in ("projection", "lstm"):
      raise ValueError(f"ViolinBaseline: text_encoder must be 'projection' or 'lstm', got {self.text_encoder!r}")
    if self.text_encoder == "lstm" and self.use_video and self.embed_size != self.text_dim:
      raise ValueError(f"ViolinBaseline: text_encoder='lstm' shares one BiLSTM between words and the projected "
                       f"video, so embed_size ({self.embed_size}) must equal the word-vector size text_dim "
                       f"({self.text_dim})")
    if statement.ndim == 4:  # [b, S, Ls, D]: several statements per clip
      batch, per_clip = statement.shape[:2]
      if statement_mask.shape != statement.shape[:3]:
        raise ValueError(f"ViolinBaseline: statement_mask shape {tuple(statement_mask.shape)} does not match "
                         f"statement {tuple(statement.shape[:3])}")
      statement = statement.reshape((batch * per_clip,) + statement.shape[2:])
      statement_mask = statement_mask.reshape((batch * per_clip,) + statement_mask.shape[2:])
    else:
      batch, per_clip = statement.shape[0], None
    rows = statement.shape[0]
    self._check("statement", statement, 3, self.text_dim, rows)
    self._check("statement_mask", statement_mask, 2, None, rows)
    if statement_mask.shape != statement.shape[:2]:
      raise ValueError(f"ViolinBaseline: statement_mask shape {tuple(statement_mask.shape)} does not match "
                       f"statement {tuple(statement.shape[:2])}")
    if self.use_video:
      self._check("video", video, 3, self.feature_dim, batch)
      self._check("video_mask", video_mask, 2, None, batch)
    if self.use_subtitles:
      self._check("subtitles", subtitles, 3, self.text_dim, batch)
      self._check("subtitle_mask", subtitle_mask, 2, None, batch)
    dense = lambda features, fan_in, axes, name: _dense(features, fan_in, axes, name, self.dtype, self.param_dtype)
    drop = lambda x: nn.Dropout(self.dropout)(x, deterministic=deterministic)
    # Clip-level tensors [b, ...] -> one copy per statement [b * S, ...] (row b*S + j is statement j of clip b, so
    # the copies stay on their clip's batch shard).
    per_statement = (lambda x: x) if per_clip is None else (lambda x: jnp.repeat(x, per_clip, axis=0))
    text_width = 2 * self.hsize1

    s_len = lengths_from_mask(statement_mask)
    s_valid = prefix_mask(s_len, statement.shape[1])
    lstm = self.text_encoder == "lstm"
    if lstm:  # TVQA's lstm_raw: one BiLSTM for the words of every text stream and for the projected video
      raw_lstm = BiLSTM(self.hsize1, dtype=self.dtype, param_dtype=self.param_dtype, name="raw_lstm")
      encode_text = lambda x, length: raw_lstm(x.astype(self.dtype), length)[0]
    else:
      text_fc = dense(text_width, self.text_dim, ("embed", "mlp"), "text_fc")
      encode_text = lambda x, length: jnp.tanh(text_fc(drop(x)))
    s_enc = encode_text(statement, s_len)
    s_enc = nn.with_logical_constraint(s_enc, ("batch", "length", "mlp"))

    attended = []
    if self.use_video:
      v_len = lengths_from_mask(video_mask)
      if self.single_frame:
        idx = middle_frame_index(v_len, self.middle_frame)
        video = jnp.take_along_axis(video, idx[:, None, None], axis=1)
        v_len = jnp.minimum(v_len, 1)
      v_proj = jnp.tanh(dense(self.embed_size, self.feature_dim, ("embed", "mlp"), "video_fc")(drop(video)))
      video_lstm = raw_lstm if lstm else BiLSTM(self.hsize1, dtype=self.dtype, param_dtype=self.param_dtype,
                                                name="video_lstm")
      v_enc, _ = video_lstm(v_proj, v_len)
      v_len = per_statement(v_len)
      attended.append(masked_dot_attention(s_enc, s_valid, per_statement(v_enc), prefix_mask(v_len, video.shape[1])))
    if self.use_subtitles:
      u_len = lengths_from_mask(subtitle_mask)
      u_enc = encode_text(subtitles, u_len)
      if self.subtitle_lstm:
        u_enc, _ = BiLSTM(self.hsize1, dtype=self.dtype, param_dtype=self.param_dtype, name="subtitle_lstm")(
            u_enc, u_len)
      u_len = per_statement(u_len)
      attended.append(masked_dot_attention(s_enc, s_valid, per_statement(u_enc),
                                           prefix_mask(u_len, subtitles.shape[1])))

    if attended:
      s32 = s_enc.astype(jnp.float32)
      stream = jnp.concatenate([s32] + attended + [s32 * u for u in attended], axis=-1).astype(self.dtype)
      _, pooled = BiLSTM(self.hsize2, dtype=self.dtype, param_dtype=self.param_dtype, name="fusion_lstm")(
          stream, s_len)
      pooled_dim = 2 * self.hsize2
    else:
      pooled = masked_max_over_time(s_enc, s_valid)
      pooled_dim = text_width

    h = nn.relu(dense(self.hsize2, pooled_dim, (None, "mlp"), "final_fc1")(pooled))
    h = drop(h)
    logits = dense(1, self.hsize2, ("mlp", None), "final_fc2")(h)[:, 0].astype(jnp.float32)
    return logits if per_clip is None else logits.reshape(batch, per_clip)


def paired_loss(logits_pos: jax.Array, logits_neg: jax.Array) -> jax.Array:
  """mean over pairs of -log p(pos) - log(1 - p(neg)), p = sigmoid(logit); `[batch]`, `[batch]` -> scalar.

  The authors' training loss (main.py), written with log_sigmoid so that saturated logits stay finite.
  """
  logits_pos = logits_pos.astype(jnp.float32)
  logits_neg = logits_neg.astype(jnp.float32)
  return jnp.mean(-jax.nn.log_sigmoid(logits_pos) - jax.nn.log_sigmoid(-logits_neg))


def violin_accuracy(logits_pos: jax.Array, logits_neg: jax.Array):
  """(number of correctly classified statements, number of statements) over `[batch]` positive / negative logits.

  A positive statement is correct when p >= 0.5, a negative one when p < 0.5 (authors' threshold on the sigmoid).
  """
  p_pos = jax.nn.sigmoid(logits_pos.astype(jnp.float32))
  p_neg = jax.nn.sigmoid(logits_neg.astype(jnp.float32))
  correct = jnp.sum(p_pos >= 0.5) + jnp.sum(p_neg < 0.5)
  return correct.astype(jnp.int32), jnp.asarray(p_pos.shape[0] + p_neg.shape[0], jnp.int32)


def params_from_authors_state_dict(state: Mapping[str, Any], *, use_video: bool, use_subtitles: bool) -> dict:
  """A `ViolinBase` state dict of the authors' PyTorch code -> `{"params": ...}` for `ViolinBaseline`.

  `state` maps the authors' names (bert_fc.1.*, video_fc.1.*, lstm_raw.rnn.*, vid_ctx_rnn.rnn.*, sub_ctx_rnn.rnn.*,
  lstm_mature_vid.rnn.*, final_fc.0.*, final_fc.3.*) to numpy arrays or torch tensors. The fusion LSTM is taken from
  the one the authors' forward pass uses for the given streams; their unused parameters are ignored. The result
  matches `subtitle_lstm=False` (the authors' model has no subtitle LSTM).
  """

  def get(name):
    if name not in state:
      raise KeyError(f"authors' ViolinBase state dict has no entry {name!r}")
    value = state[name]
    if hasattr(value, "detach"):
      value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float32)

  def linear(prefix):
    return {"kernel": get(prefix + ".weight").T.copy(), "bias": get(prefix + ".bias")}

  params = {"text_fc": linear("bert_fc.1"), "final_fc1": linear("final_fc.0"), "final_fc2": linear("final_fc.3")}
  if use_video:
    params["video_fc"] = linear("video_fc.1")
    params["video_lstm"] = torch_lstm_to_flax(state, "lstm_raw.rnn.")
  if use_video and use_subtitles:
    params["fusion_lstm"] = torch_lstm_to_flax(state, "lstm_mature_vid.rnn.")
  elif use_video:
    params["fusion_lstm"] = torch_lstm_to_flax(state, "vid_ctx_rnn.rnn.")
  elif use_subtitles:
    params["fusion_lstm"] = torch_lstm_to_flax(state, "sub_ctx_rnn.rnn.")
  return {"params": params}
