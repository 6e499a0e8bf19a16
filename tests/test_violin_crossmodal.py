"""VIOLIN cross-modal encoder: sequence packing (parity with the Hugging Face pair encoding), shapes, visual padding,
input ablations and a short training run of the trainable part on a tiny random BERT."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from evqa_jax import pretrained
from evqa_jax.models.bert import BertConfig
from evqa_jax.projects.violin.baseline import paired_loss, violin_accuracy
from evqa_jax.projects.violin.crossmodal import TRAINABLE_PATTERNS, ViolinCrossModal, pack_statement_subtitles
from evqa_jax.train import partition
from scan_training import scan_train

VOCAB, T, FEAT = 40, 5, 12
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            num_visual_tokens=T, visual_dim=16, use_adapters=True, adapter_reduction=4)


def _pad(rows, width):
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


def test_packing_matches_hugging_face_pair_encoding():
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(pretrained.minilm_dir())
  pairs = [("a man walks into the kitchen", "he is at home today. so am i."), ("she laughs", "no"),
           ("the dog is barking loudly at the door", "")]
  s_ids, s_mask = _pad([tok(s)["input_ids"] for s, _ in pairs], 12)
  u_ids, u_mask = _pad([tok(u)["input_ids"] for _, u in pairs], 14)
  ids, mask, types = (np.asarray(a) for a in pack_statement_subtitles(*(jnp.asarray(a) for a in
                                                                        (s_ids, s_mask, u_ids, u_mask))))
  assert ids.shape == (3, 12 + 14 - 1)
  for i, (s, u) in enumerate(pairs):
    want = tok(s, u) if u else tok(s)
    n = len(want["input_ids"])
    if not u:  # an empty subtitle line tokenises to "[CLS] [SEP]": the pair keeps the statement and a bare [SEP]
      want = {"input_ids": want["input_ids"] + [tok.sep_token_id], "token_type_ids": want["token_type_ids"] + [1]}
      n += 1
    np.testing.assert_array_equal(ids[i, :n], want["input_ids"])
    np.testing.assert_array_equal(types[i, :n], want["token_type_ids"])
    assert mask[i, :n].all() and not mask[i, n:].any() and not ids[i, n:].any() and not types[i, n:].any()
  ids1, mask1, types1 = pack_statement_subtitles(jnp.asarray(s_ids), jnp.asarray(s_mask))
  np.testing.assert_array_equal(ids1, s_ids)
  np.testing.assert_array_equal(mask1, s_mask)
  assert not np.asarray(types1).any()


def _batch(seed=0, b=3, ls=6, lu=7, frames=T, feat=FEAT, v_len=(5, 3, 1)):
  r = np.random.RandomState(seed)
  s_rows = [[[1] + list(r.randint(3, VOCAB, n)) + [2] for n in r.randint(1, ls - 1, 2)] for _ in range(b)]
  s_ids = np.stack([_pad(rows, ls)[0] for rows in s_rows])
  s_mask = np.stack([_pad(rows, ls)[1] for rows in s_rows])
  u_ids, u_mask = _pad([[1] + list(r.randint(3, VOCAB, n)) + [2] for n in r.randint(0, lu - 1, b)], lu)
  video = r.randn(b, frames, feat).astype(np.float32)
  v_mask = (np.arange(frames)[None] < np.asarray(v_len)[:, None]).astype(np.int32)
  return {k: jnp.asarray(v) for k, v in dict(statement_ids=s_ids, statement_mask=s_mask, subtitle_ids=u_ids,
                                             subtitle_mask=u_mask, video=video, video_mask=v_mask).items()}


def _model(**kw):
  cfg = BertConfig(**{**TINY, **kw.pop("cfg", {})})
  return ViolinCrossModal(encoder="bert", encoder_config=cfg, **kw)


@pytest.fixture(scope="module")
def base():
  """(model, variables, jitted apply) of the default tiny model, shared so that its init and apply compile once."""
  model = _model()
  return model, jax.jit(model.init)(jax.random.key(0), _batch()), jax.jit(model.apply)


def test_shapes_pairs_and_parameter_names(base):
  model, variables, apply = base
  batch = _batch()
  pair_logits = np.asarray(apply(variables, batch))
  assert pair_logits.shape == (3, 2) and np.all(np.isfinite(pair_logits))
  # A pair scores like its two statements given one at a time: measured 0; bound 1e-7 (1e-5 of the ~0.01 logits:
  # other CPUs may block a batch of pairs and one of singles differently).
  for j in range(2):
    single = {**batch, "statement_ids": batch["statement_ids"][:, j], "statement_mask": batch["statement_mask"][:, j]}
    np.testing.assert_allclose(np.asarray(jax.jit(model.apply)(variables, single)), pair_logits[:, j],
                               rtol=0, atol=1e-7)
  params = variables["params"]
  assert set(params) == {"text_encoder", "visual_in", "cls_head"}
  assert params["visual_in"]["kernel"].value.shape == (FEAT, 16)
  assert params["cls_head"]["dense"]["kernel"].value.shape == (32, 32)
  assert params["cls_head"]["out"]["kernel"].value.shape == (32, 1)
  for leaf in jax.tree.leaves(variables, is_leaf=lambda v: isinstance(v, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  trainable, frozen = partition.split_params(nn.meta.unbox(params), TRAINABLE_PATTERNS)
  assert set(trainable) == {"text_encoder", "visual_in", "cls_head"}
  assert "word_embeddings" in frozen["text_encoder"]["embeddings"]
  assert "visual_proj" in trainable["text_encoder"] and "visual_proj" not in frozen.get("text_encoder", {})
  # Frames already of the LM's visual width need no visual_in.
  same = _model()
  shapes = jax.eval_shape(lambda: same.init(jax.random.key(0), _batch(feat=16)))
  assert "visual_in" not in shapes["params"]


def test_visual_padding_and_ablations_change_nothing_they_should_not(base):
  r = np.random.RandomState(1)
  batch = _batch(seed=2, frames=T, v_len=(5, 3, 1))
  noisy = np.asarray(batch["video"]).copy()
  noisy[np.asarray(batch["video_mask"]) == 0] = 1e4 * r.randn(*noisy[np.asarray(batch["video_mask"]) == 0].shape)

  _, variables, apply = base
  base = np.asarray(apply(variables, batch))
  # The bounds in this module: measured 0; bound 3e-9, 3 float32 ulps of the ~0.01 logits of this tiny model, whose
  # frames count little: scaled by 0.999 they move the logits by 1.2e-8, and that is asserted to fail the bound.
  np.testing.assert_allclose(np.asarray(apply(variables, {**batch, "video": jnp.asarray(noisy)})), base,
                             rtol=0, atol=3e-9)
  # Fewer frames than visual slots: padded up to num_visual_tokens with masked slots.
  short = {**batch, "video": batch["video"][:, :4], "video_mask": batch["video_mask"][:, :4]}
  short["video_mask"] = short["video_mask"].at[0, 3].set(1)
  full = {**batch, "video_mask": batch["video_mask"].at[0, 4].set(0)}
  np.testing.assert_allclose(np.asarray(apply(variables, short)), np.asarray(apply(variables, full)),
                             rtol=0, atol=3e-9)
  moved = np.abs(np.asarray(apply(variables, {**batch, "video": batch["video"] * 0.999})) - base).max()
  assert moved > 2 * 3e-9  # measured 1.2e-8

  # use_video=False: the frames do not matter at all.
  no_video = _model(use_video=False)
  assert "visual_in" not in jax.eval_shape(lambda: no_video.init(jax.random.key(0), batch))["params"]
  a = jax.jit(no_video.apply)   # the unused visual_in parameters are simply not read
  np.testing.assert_array_equal(a(variables, {**batch, "video": batch["video"] + 3.0}), a(variables, batch))

  # single_frame: only the middle valid frame ((len-1)//2 = 2, 1, 0) counts.
  single = _model(single_frame=True)
  a = jax.jit(single.apply)
  other = np.asarray(batch["video"]).copy()
  idx = np.array([2, 1, 0])
  keep = other[np.arange(3), idx].copy()
  other[:] = -7.0
  other[np.arange(3), idx] = keep
  np.testing.assert_allclose(a(variables, {**batch, "video": jnp.asarray(other)}), a(variables, batch),
                             rtol=0, atol=3e-9)

  # use_subtitles=False: the subtitles do not matter.
  no_sub = _model(use_subtitles=False)
  a = jax.jit(no_sub.apply)
  changed = {**batch, "subtitle_ids": (batch["subtitle_ids"] + 5) % VOCAB}
  np.testing.assert_array_equal(a(variables, changed), a(variables, batch))
  assert np.any(np.asarray(apply(variables, changed)) != base)


def test_bad_inputs_raise():
  model = _model()
  batch = _batch()
  with pytest.raises(ValueError, match="'subtitle_ids'"):
    model.init(jax.random.key(0), {k: v for k, v in batch.items() if k != "subtitle_ids"})
  with pytest.raises(ValueError, match="num_visual_tokens"):
    model.init(jax.random.key(0), _batch(frames=T + 2, v_len=(1, 1, 1)))
  with pytest.raises(ValueError, match="num_visual_tokens is 0"):
    _model(cfg=dict(num_visual_tokens=0)).init(jax.random.key(0), batch)


def test_short_training_of_trainable_part_lowers_paired_loss():
  """Positives share tokens with their subtitles, negatives do not; only visual_in / visual_proj / adapters /
  LayerNorms / cls_head train, the rest of the random LM stays frozen."""
  r = np.random.RandomState(3)
  b = 8
  topics = r.randint(3, VOCAB, size=(b, 3))
  other = topics[(np.arange(b) + 1) % b]
  s_ids = np.stack([[[1, *topics[i], 2, 0], [1, *other[i], 2, 0]] for i in range(b)]).astype(np.int32)
  s_mask = (s_ids > 0).astype(np.int32)
  u_ids = np.stack([[1, *topics[i], 2, 0] for i in range(b)]).astype(np.int32)
  batch = {"statement_ids": jnp.asarray(s_ids), "statement_mask": jnp.asarray(s_mask),
           "subtitle_ids": jnp.asarray(u_ids), "subtitle_mask": jnp.asarray((u_ids > 0).astype(np.int32)),
           "video": jnp.asarray(r.randn(b, T, FEAT).astype(np.float32)), "video_mask": jnp.ones((b, T), jnp.int32)}
  # A larger init range than BERT's 0.02 so that the frozen random LM actually mixes tokens into [CLS].
  model = _model(dropout=0.0, cfg=dict(initializer_range=0.2))
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])
  trainable, frozen = partition.split_params(params, TRAINABLE_PATTERNS)
  tx = optax.adam(1e-2)
  steps = 60

  def loss_fn(trainable):
    logits = model.apply({"params": partition.merge_params(trainable, frozen)}, batch)
    return paired_loss(logits[:, 0], logits[:, 1]), logits

  losses, logits = scan_train(loss_fn, trainable, tx, steps)
  losses = [float(x) for x in losses]
  correct, total = violin_accuracy(logits[:, 0], logits[:, 1])
  assert abs(losses[0] - 2 * np.log(2)) < 0.05   # untrained: p ~ 0.5 for every statement
  assert losses[-1] < 0.1 * losses[0], losses
  assert int(correct) == int(total) == 2 * b
