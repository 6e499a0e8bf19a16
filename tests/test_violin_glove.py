"""VIOLIN's GloVe + LSTM text encoder (Table 3's GloVe rows): TVQA's words and vocabulary by hand, the GloVe table
(found rows exact, the others the seeded N(0, 0.4^2) draw), the whole baseline against a hand-built PyTorch model
with the same weights (embedding -> one BiLSTM for words and video -> attention -> fusion LSTM -> MLP), and the
`small,glove` config learning on the synthetic world through the task's own loss."""

import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from configs import violin as violin_config  # noqa: E402
from data_prep import worlds  # noqa: E402
from evqa_jax.data import pipeline  # noqa: E402
from evqa_jax.graphs import word_vectors  # noqa: E402
from evqa_jax.models.lstm import torch_lstm_to_flax  # noqa: E402
from evqa_jax.projects.violin import input as violin_input  # noqa: E402
from evqa_jax.projects.violin import task as violin_task  # noqa: E402
from evqa_jax.projects.violin.model import BaselineModel  # noqa: E402
from evqa_jax.train import partition  # noqa: E402


def test_words_vocabulary_and_ids_by_hand():
  assert violin_input.glove_words("the man , he runs") == ["the", "man", "he", "runs", "<eos>"]
  texts = ["The man runs .", "the dog runs", "a cat"]
  vocab = violin_input.build_vocabulary(texts, min_count=2)
  # <pad> <unk> <eos> first, then words seen twice in first-seen order ("the", "runs"; "." "man" "dog" once).
  assert vocab == ["<pad>", "<unk>", "<eos>", "the", "runs"]
  table = violin_input.WordTable(vocab, "unused", 4, 0, "unused")
  ids, mask = table.ids("the cat runs", 6)
  np.testing.assert_array_equal(ids, [3, 1, 4, 2, 0, 0])
  np.testing.assert_array_equal(mask, [1, 1, 1, 1, 0, 0])
  ids, mask = table.ids("the cat runs", 2)  # cut at max_len: <eos> falls off, as TVQA's clip to max length
  np.testing.assert_array_equal(ids, [3, 1])


def test_word_table_rows_from_a_glove_text_file(tmp_path):
  glove = tmp_path / "glove.tiny.3d.txt"
  glove.write_text("the 0.5 -1 2\n, 1 1 1\nruns 0.25 0 -0.5\nThe 9 9 9\n")
  words = ["<pad>", "<unk>", "<eos>", "the", "runs", "zebra"]
  table = violin_input.WordTable(words, str(glove), 3, 7, str(tmp_path / "cache")).matrix()
  np.testing.assert_array_equal(table[3], [0.5, -1, 2])     # exact, case-sensitive ("The" is another word)
  np.testing.assert_array_equal(table[4], [0.25, 0, -0.5])
  want = (np.random.default_rng(7).standard_normal((6, 3)) * 0.4).astype(np.float32)
  for i in (0, 1, 2, 5):  # TVQA: words GloVe lacks (the specials included) get N(0, 0.4^2)
    np.testing.assert_array_equal(table[i], want[i])
  # Cached: a second table reads the file written by the first.
  assert len(list((tmp_path / "cache").glob("glove-*.npy"))) == 1
  again = violin_input.WordTable(words, str(glove), 3, 7, str(tmp_path / "cache")).matrix()
  np.testing.assert_array_equal(again, table)
  with pytest.raises(ValueError, match=r"glove.tiny.3d.txt:1: 3 values for word 'the', expected 50"):
    word_vectors.lookup_vectors(str(glove), ["the"], 50)


# ------------------------------------------------------------------------------------------ parity with torch

V, E, F, H1, H2 = 11, 6, 7, 3, 5  # vocabulary, word size (= video projection), frame features, LSTM widths


def _torch_bilstm(lstm, x, lengths):
  packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=True, enforce_sorted=False)
  out, (h, _) = lstm(packed)
  out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
  return out, torch.cat([h[0], h[1]], dim=-1)


class _TorchGloveViolin(torch.nn.Module):
  """The VIOLIN baseline with TVQA's text path, written out in PyTorch: embedding -> lstm_raw (shared with
  video_fc's output) -> dot attention of each statement word over video / subtitles -> fusion BiLSTM -> final MLP;
  statement only: max over time -> final MLP."""

  def __init__(self, streams):
    super().__init__()
    self.streams = streams
    self.embedding = torch.nn.Embedding(V, E)
    self.lstm_raw = torch.nn.LSTM(E, H1, batch_first=True, bidirectional=True)
    self.video_fc = torch.nn.Linear(F, E)
    n_in = 2 * H1 * (1 + 2 * len(streams))
    self.fusion = torch.nn.LSTM(n_in, H2, batch_first=True, bidirectional=True)
    self.fc1 = torch.nn.Linear(2 * H2 if streams else 2 * H1, H2)
    self.fc2 = torch.nn.Linear(H2, 1)

  @staticmethod
  def attend(s, s_len, c, c_len):
    scores = torch.bmm(s, c.transpose(1, 2))
    masked = torch.ones_like(scores, dtype=torch.bool)
    for i, (a, b) in enumerate(zip(s_len, c_len)):
      masked[i, :a, :b] = False
    return torch.bmm(torch.softmax(scores.masked_fill(masked, -float("inf")), 2).masked_fill(masked, 0), c)

  def forward(self, st_ids, s_len, sub_ids, u_len, vid, v_len):
    s = _torch_bilstm(self.lstm_raw, self.embedding(st_ids), s_len)[0]
    parts = []
    if "vid" in self.streams:
      v = _torch_bilstm(self.lstm_raw, torch.tanh(self.video_fc(vid)), v_len)[0]
      parts.append(self.attend(s, s_len, v, v_len))
    if "sub" in self.streams:
      u = _torch_bilstm(self.lstm_raw, self.embedding(sub_ids), u_len)[0]
      parts.append(self.attend(s, s_len, u, u_len))
    if parts:
      pooled = _torch_bilstm(self.fusion, torch.cat([s] + parts + [s * p for p in parts], -1), s_len)[1]
    else:
      pooled = torch.stack([s[i, :n].max(0)[0] for i, n in enumerate(s_len)])
    return self.fc2(torch.relu(self.fc1(pooled)))[:, 0]


def _linear(m):
  return {"kernel": m.weight.detach().numpy().T, "bias": m.bias.detach().numpy()}


def _mask(lengths, n):
  return (np.arange(n)[None] < np.asarray(lengths)[:, None]).astype(np.int32)


@pytest.mark.parametrize("streams", [("vid", "sub"), ()], ids=["video+subtitles", "statement_only"])
def test_glove_baseline_matches_torch(streams):
  torch.manual_seed(3)
  ref = _TorchGloveViolin(streams).eval()
  r = np.random.RandomState(5)
  b, ls, lu, t = 2, 5, 6, 4
  s_len = np.array([[5, 2], [3, 4]])  # [b, 2]: positive and negative statement of each pair
  u_len, v_len = np.array([6, 3]), np.array([4, 1])
  st_ids = r.randint(1, V, (b, 2, ls)) * _mask(s_len.ravel(), ls).reshape(b, 2, ls)
  sub_ids = r.randint(1, V, (b, lu)) * _mask(u_len, lu)
  video = r.randn(b, t, F).astype(np.float32)
  with torch.no_grad():
    want = np.stack([ref(torch.tensor(st_ids[:, j]), s_len[:, j], torch.tensor(sub_ids), u_len,
                         torch.tensor(video), v_len).numpy() for j in range(2)], axis=1)
  use_video, use_sub = "vid" in streams, "sub" in streams
  model = BaselineModel(encoder="glove", use_video=use_video, use_subtitles=use_sub, hsize1=H1, hsize2=H2,
                        embed_size=E, dropout=0.5, vocab_size=V, word_dim=E, feature_dim=F)
  sd = ref.state_dict()
  base = {"final_fc1": _linear(ref.fc1), "final_fc2": _linear(ref.fc2),
          "raw_lstm": torch_lstm_to_flax({k[len("lstm_raw."):]: v for k, v in sd.items() if k.startswith("lstm_raw.")})}
  if streams:
    base["fusion_lstm"] = torch_lstm_to_flax({k[len("fusion."):]: v for k, v in sd.items() if k.startswith("fusion.")})
  if use_video:
    base["video_fc"] = _linear(ref.video_fc)
  params = {"word_embeddings": {"embedding": ref.embedding.weight.detach().numpy()}, "baseline": base}
  batch = {"statement_ids": jnp.asarray(st_ids), "statement_mask": jnp.asarray(_mask(s_len.ravel(), ls).reshape(b, 2, ls)),
           "subtitle_ids": jnp.asarray(sub_ids), "subtitle_mask": jnp.asarray(_mask(u_len, lu)),
           "video": jnp.asarray(video), "video_mask": jnp.asarray(_mask(v_len, t))}
  shapes = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch)))["params"]
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, shapes)  # no parameter more, none less
  got = jax.jit(model.apply)({"params": params}, batch)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ training

def test_glove_small_config_learns_on_the_synthetic_world(tmp_path):
  """configs/violin.py:small,glove: the GloVe 6B 50d table is loaded into `word_embeddings`, which trains (with the
  baseline); Adam on one repeated batch lowers the task's paired loss."""
  c = violin_config.get_config("small,glove")
  c.data.dir = str(tmp_path / "records")
  worlds.ensure_synthetic_world(c)
  task = violin_task.Task(c)
  assert task.trainable_patterns == ("^baseline/", "^word_embeddings/")
  words = task.input.words
  assert words.words[:3] == ["<pad>", "<unk>", "<eos>"] and len(words) > 10
  params = nn.meta.unbox(task.init_params(jax.random.key(0)))
  params = task.load_pretrained(jax.tree.map(np.asarray, params))
  glove = word_vectors.load_word_vectors("pkg:glove-6b-50d")
  known = [w for w in words.words if w in glove.index][:5]
  assert known
  for w in known:  # rows of GloVe words are GloVe's vectors
    np.testing.assert_array_equal(params["word_embeddings"]["embedding"][words.index[w]],
                                  glove.vectors[glove.index[w]])
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  assert set(trainable) == {"baseline", "word_embeddings"} and not frozen
  src = task.source("train")
  batch = jax.tree.map(jnp.asarray, pipeline.stack_examples([task.preprocess(src[i], train=True) for i in range(8)]))
  assert batch["statement_ids"].shape == (8, 2, c.data.max_statement_tokens)
  tx = optax.adam(1e-2)
  opt = tx.init(trainable)

  @jax.jit
  def step(trainable, opt, i):
    loss, g = jax.value_and_grad(lambda p: task.loss(p, batch, {}, jax.random.key(i), train=True)[0])(trainable)
    updates, opt = tx.update(g, opt, trainable)
    emb_grad = jnp.sum(jnp.abs(g["word_embeddings"]["embedding"]))
    return optax.apply_updates(trainable, updates), opt, loss, emb_grad

  losses = []
  for i in range(25):
    trainable, opt, loss, emb_grad = step(trainable, opt, i)
    assert float(emb_grad) > 0.0  # the table trains, as in TVQA
    losses.append(float(loss))
  assert all(math.isfinite(x) for x in losses)
  assert abs(losses[0] - 2 * math.log(2)) < 0.3  # untrained: p ~ 0.5 for both statements
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses
