"""JustAsk / JustAsk+ (evqa_jax/projects/ovqa/justask.py): the DistilBERT towers against Hugging Face, the whole model
(forward, loss, gradients, the MLM extra) against a PyTorch reference written from the authors' code
(github.com/antoyang/just-ask model/multimodal_transformer.py, model/language_model.py, train/train_videoqa.py; read,
not copied: their module names are kept so their state dict loads into it), weight import from their checkpoint."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = torch.nn.functional

from data_prep import fixtures  # noqa: E402
from evqa_jax.models import distilbert, hf_utils  # noqa: E402
from evqa_jax.projects.ovqa import justask  # noqa: E402

SHAPE = dict(feature_dim=12, d_model=16, n_layers=2, ff_dim=32, question_len=8, num_frames=5)
HEADS = 2


# ------------------------------------------------------------------------------------------ the PyTorch reference


class RefBlock(torch.nn.Module):
  """The authors' TransformerBlock (DistilBERT's): masked_fill(-inf) attention, post-LayerNorms, eps 1e-12."""

  def __init__(self, dim, heads, ff, p):
    super().__init__()
    self.attention = torch.nn.Module()
    for name in ("q_lin", "k_lin", "v_lin", "out_lin"):
      setattr(self.attention, name, torch.nn.Linear(dim, dim))
    self.ffn = torch.nn.Module()
    self.ffn.lin1, self.ffn.lin2 = torch.nn.Linear(dim, ff), torch.nn.Linear(ff, dim)
    self.sa_layer_norm = torch.nn.LayerNorm(dim, eps=1e-12)
    self.output_layer_norm = torch.nn.LayerNorm(dim, eps=1e-12)
    self.heads, self.drop = heads, torch.nn.Dropout(p)

  def forward(self, x, mask):
    bs, n, dim = x.shape
    dh = dim // self.heads
    split = lambda t: t.view(bs, -1, self.heads, dh).transpose(1, 2)
    a = self.attention
    q, k, v = split(a.q_lin(x)) / math.sqrt(dh), split(a.k_lin(x)), split(a.v_lin(x))
    scores = (q @ k.transpose(2, 3)).masked_fill((mask == 0).view(bs, 1, 1, n), -float("inf"))
    ctx = (self.drop(scores.softmax(-1)) @ v).transpose(1, 2).reshape(bs, n, dim)
    h = self.sa_layer_norm(a.out_lin(ctx) + x)
    return self.output_layer_norm(self.drop(self.ffn.lin2(F.gelu(self.ffn.lin1(h)))) + h)


class RefVQAT(torch.nn.Module):
  """MMT_VideoQA (mode "vqa" and "mlm") with its attribute names; both towers are HF DistilBertModel."""

  def __init__(self, text_config, feature_dim, d_model, n_layers, ff_dim, question_len, num_frames, p=0.1):
    super().__init__()
    word = text_config.dim
    self.Q, self.T = question_len, num_frames
    self.linear_video, self.norm_video = torch.nn.Linear(feature_dim, d_model), torch.nn.LayerNorm(d_model, 1e-12)
    self.linear_question, self.norm_question = torch.nn.Linear(word, d_model), torch.nn.LayerNorm(d_model, 1e-12)
    self.position = torch.nn.Module()
    self.position.position_embeddings = torch.nn.Embedding(question_len + num_frames, d_model)
    self.position.modality_embedding = torch.nn.Embedding(2, d_model)
    self.position.LayerNorm = torch.nn.LayerNorm(d_model, eps=1e-12)
    self.mmt = torch.nn.Module()
    self.mmt.layer = torch.nn.ModuleList([RefBlock(d_model, HEADS, ff_dim, p) for _ in range(n_layers)])
    self.vqproj = torch.nn.Sequential(torch.nn.Dropout(p), torch.nn.Linear(d_model, d_model))
    self.vocab_transform = torch.nn.Linear(d_model, d_model)
    self.vocab_norm = torch.nn.LayerNorm(d_model, eps=1e-12)
    self.vocab_projector = torch.nn.Linear(d_model, text_config.vocab_size)
    self.crossmodal_matching = torch.nn.Linear(d_model, 1)
    self.bert = torch.nn.Module()
    self.bert.bert = transformers.DistilBertModel(text_config)
    self.amodel = torch.nn.Module()
    self.amodel.bert = torch.nn.Module()
    self.amodel.bert.bert = transformers.DistilBertModel(text_config)
    self.amodel.linear_text = torch.nn.Linear(word, d_model)
    self.drop = torch.nn.Dropout(p)

  def encode(self, video, question, video_mask, text_mask):
    q = self.bert.bert(question, attention_mask=(question > 0).float())[0]
    q = self.norm_question(F.gelu(self.linear_question(q)))
    v = self.norm_video(F.gelu(self.linear_video(video)))
    x = torch.cat([q, v], 1)
    pos = self.position
    x = x + pos.position_embeddings(torch.arange(x.shape[1]))[None]
    x = x + pos.modality_embedding(torch.tensor([0] * self.Q + [1] * self.T))[None]
    x = self.drop(pos.LayerNorm(x))
    mask = torch.cat([text_mask, video_mask], 1)
    for block in self.mmt.layer:
      x = block(x, mask)
    return x

  def answers(self, a2v):
    return self.amodel.linear_text(self.amodel.bert.bert(a2v, attention_mask=(a2v > 0).float())[0][:, 0])

  def forward(self, video, question, video_mask, text_mask, a2v):
    fusion = self.vqproj(self.encode(video, question, video_mask, text_mask)[:, 0])
    return fusion @ self.answers(a2v).t()

  def mlm(self, video, question, labels, video_mask, text_mask):
    x = self.encode(video, question, video_mask, text_mask)[:, :self.Q]
    logits = self.vocab_projector(self.vocab_norm(F.gelu(self.vocab_transform(x))))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)), logits


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  root = tmp_path_factory.mktemp("justask")
  bert_dir = fixtures.distilbert_dir(str(root / "distilbert-base-uncased"), max_positions=16)
  ckpt = str(root / "ckpt_pt_howtovqa69m.pth")
  sd = fixtures.justask_checkpoint(ckpt, bert_dir["state_dict"], word_dim=32, **SHAPE)
  text_config = transformers.DistilBertConfig.from_pretrained(bert_dir["path"], attn_implementation="eager")
  ref = RefVQAT(text_config, **SHAPE)
  ref.load_state_dict(sd, strict=True)  # their key names, all of them
  ref.position.position_embeddings.weight.requires_grad_(False)  # frozen in their model
  model = justask.Model(text_config=distilbert.config_from_hf_dir(bert_dir["path"]), d_model=SHAPE["d_model"],
                        n_layers=SHAPE["n_layers"], n_heads=HEADS, d_ff=SHAPE["ff_dim"], mlm_prob=0.15,
                        feature_dim=SHAPE["feature_dim"], num_frames=SHAPE["num_frames"],
                        question_len=SHAPE["question_len"])
  return {"root": root, "dir": bert_dir, "ckpt": ckpt, "sd": sd, "ref": ref, "model": model}


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q_len, t = SHAPE["question_len"], SHAPE["num_frames"]
  question = np.zeros((3, q_len), np.int64)
  for i, n in enumerate((8, 5, 3)):  # [CLS] words [SEP], then padding 0
    question[i, :n] = [2] + list(rng.integers(5, 40, n - 2)) + [3]
  video = rng.normal(size=(3, t, SHAPE["feature_dim"])).astype(np.float32)
  video_mask = (np.arange(t)[None] < np.array([[5], [3], [1]])).astype(np.float32)
  a2v = np.zeros((6, 4), np.int64)
  for i, n in enumerate((3, 4, 3, 2, 4, 3)):
    a2v[i, :n] = [2] + list(rng.integers(5, 40, n - 2)) + [3]
  labels = np.array([4, 0, 2])
  return question, video, video_mask, a2v, labels


def _jax_inputs(question, video, video_mask, a2v, pad_answers=2):
  batch = {"question_ids": jnp.asarray(question, jnp.int32), "question_mask": jnp.asarray(question > 0, jnp.int32),
           "video": jnp.asarray(video), "video_mask": jnp.asarray(video_mask, jnp.int32)}
  tokens = np.concatenate([a2v, np.zeros((pad_answers, a2v.shape[1]), np.int64)])
  vocab = {"answer_tokens": jnp.asarray(tokens, jnp.int32), "answer_token_mask": jnp.asarray(tokens > 0),
           "answer_mask": jnp.asarray(np.arange(len(tokens)) < len(a2v)),
           "is_base": jnp.zeros((len(tokens),), bool)}
  return batch, vocab


def _loaded(release):
  model = release["model"]
  question, video, video_mask, a2v, _ = _inputs()
  batch, vocab = _jax_inputs(question, video, video_mask, a2v)
  params = hf_utils.params_of(model.init(jax.random.PRNGKey(0), batch, vocab))
  params, report = justask.load_checkpoint(model, release["ckpt"], params)
  return params, report


# ------------------------------------------------------------------------------------------ tests


def test_distilbert_tower_matches_hugging_face(release):
  """DistilBertModel folder -> distilbert.load_hf_params: last hidden states equal HF's at 1e-5 (fp32), padding
  included in the batch."""
  path = release["dir"]["path"]
  hf = transformers.DistilBertModel.from_pretrained(path, attn_implementation="eager").eval()
  cfg = distilbert.config_from_hf_dir(path)
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.layer_norm_eps) == (32, 2, 128, 1e-12)
  params, report = distilbert.load_hf_params(cfg, path)
  assert not report.missing and not report.unused
  question = _inputs()[0]
  with torch.no_grad():
    want = hf(torch.tensor(question), attention_mask=torch.tensor(question > 0).float())[0].numpy()
  got = distilbert.DistilBert(cfg).apply({"params": params}, jnp.asarray(question), jnp.asarray(question > 0))
  valid = question > 0
  np.testing.assert_allclose(np.asarray(got)[valid], want[valid], atol=1e-5, rtol=1e-5)


def test_bert_folder_loads_exactly(tmp_path):
  """A BERT folder (the demo's MiniLM) in the DistilBERT tower: token-type row 0 folded into the positions, so the
  hidden states equal HF BertModel's (token types 0) at 1e-5."""
  cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
                                attn_implementation="eager")
  torch.manual_seed(0)
  hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
  with torch.no_grad():
    for p in hf.parameters():
      p.add_(0.1 * torch.randn(p.shape))
  hf.save_pretrained(str(tmp_path))
  ours = distilbert.config_from_hf_dir(str(tmp_path))
  params, report = distilbert.load_hf_params(ours, str(tmp_path))
  assert not report.missing and not report.unused
  question = _inputs()[0] % 50
  question[question == 0] = 0
  mask = _inputs()[0] > 0
  with torch.no_grad():
    want = hf(torch.tensor(question), attention_mask=torch.tensor(mask).float())[0].numpy()
  got = distilbert.DistilBert(ours).apply({"params": params}, jnp.asarray(question), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got)[mask], want[mask], atol=1e-5, rtol=1e-5)


def test_checkpoint_import_report(release):
  """Every parameter comes from the authors' file; their unused keys are named (the pretraining head only)."""
  params, report = _loaded(release)
  assert not report.missing
  assert report.unused == ["crossmodal_matching.bias", "crossmodal_matching.weight"]
  flat = hf_utils.flatten_params(params)
  sd = release["sd"]
  np.testing.assert_array_equal(flat["amodel/bert/embeddings/word_embeddings/embedding"],
                                sd["amodel.bert.bert.embeddings.word_embeddings.weight"].numpy())
  np.testing.assert_array_equal(flat["vqproj/kernel"], sd["vqproj.1.weight"].numpy().T)
  np.testing.assert_array_equal(flat["mmt/layer_1/attention/q_lin/kernel"].reshape(16, 16),
                                sd["mmt.layer.1.attention.q_lin.weight"].numpy().T)


def test_forward_loss_and_gradients_match_the_authors_model(release):
  """Logits over the answer vocabulary (two padded answer slots at -inf here), the cross-entropy and the gradient of
  every parameter equal the PyTorch reference's (eval mode: no dropout), in fp32."""
  ref, model = release["ref"], release["model"]
  ref.eval()
  params, _ = _loaded(release)
  question, video, video_mask, a2v, labels = _inputs()
  batch, vocab = _jax_inputs(question, video, video_mask, a2v)

  ref.zero_grad()
  logits_t = ref(torch.tensor(video), torch.tensor(question), torch.tensor(video_mask),
                 torch.tensor(question > 0).float(), torch.tensor(a2v))
  loss_t = F.cross_entropy(logits_t, torch.tensor(labels))
  loss_t.backward()

  def loss_fn(p):
    logits = model.apply({"params": p}, batch, vocab)
    import optax
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels))), logits

  (loss_j, logits_j), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  # fp32 parity with their model: measured max |ours - theirs| 1.3e-7 on logits up to 0.105; bound 1e-6 + 1e-6 |x|
  # (8x). The DistilBERT towers above: measured <= 9.5e-7 on values up to 3.6, bound 1e-5 + 1e-5 |x| (at most 0.04
  # of it); the loss below 1.2e-7 against 2.8e-6; the gradients at most 0.11 of theirs.
  np.testing.assert_allclose(np.asarray(logits_j)[:, :6], logits_t.detach().numpy(), atol=1e-6, rtol=1e-6)
  assert np.all(np.asarray(logits_j)[:, 6:] == np.finfo(np.float32).min)
  np.testing.assert_allclose(float(loss_j), loss_t.item(), atol=1e-6, rtol=1e-6)

  rules = justask.checkpoint_rules(model)
  named = {k: p for k, p in ref.named_parameters() if p.requires_grad}  # not the frozen sinusoidal table
  flat = hf_utils.flatten_params(grads)
  checked = 0
  for path, g in flat.items():
    if path.startswith("vocab_"):  # the MLM head: not on the VideoQA loss's path
      assert not np.any(np.asarray(g))
      continue
    rule = rules[path]
    want = rule.apply([named[k].grad.numpy() for k in rule.keys])
    # Gradients that vanish analytically (amodel/linear_text/bias: softmax gradients sum to 0) are float noise.
    scale = max(1e-2, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(g), want, atol=2e-5 * scale, rtol=1e-4, err_msg=path)
    checked += 1
  assert checked == len([k for k in named if not k.startswith(("vocab_", "crossmodal"))])


def test_mlm_loss_matches_the_authors(release):
  """The auxiliary masked-LM loss (their mode "mlm") on the same masked question equals theirs, and mask_tokens
  never picks [CLS], [SEP] or padding (its 80/10/10 split: test_mask_tokens_splits_80_10_10)."""
  ref, model = release["ref"], release["model"]
  ref.eval()
  params, _ = _loaded(release)
  question, video, video_mask, a2v, _ = _inputs()
  batch, _ = _jax_inputs(question, video, video_mask, a2v)
  special = jnp.asarray(np.isin(question, (0, 2, 3)))
  ids, labels = justask.mask_tokens(jax.random.PRNGKey(3), batch["question_ids"], special, 4, 60, 0.5)
  ids, labels = np.asarray(ids), np.asarray(labels)
  assert np.all(labels[np.isin(question, (0, 2, 3))] == -100) and np.any(labels >= 0)
  assert np.all(ids[labels < 0] == question[labels < 0])
  with torch.no_grad():
    loss_t, _ = ref.mlm(torch.tensor(video), torch.tensor(ids, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64),
                        torch.tensor(video_mask), torch.tensor(question > 0).float())
  logits = model.apply({"params": params}, batch, jnp.asarray(ids), method=model.mlm_logits)
  np.testing.assert_allclose(float(justask.mlm_loss(logits, jnp.asarray(labels))), float(loss_t), rtol=1e-5)


def test_mask_tokens_splits_80_10_10():
  """mask_tokens as the authors' util.py: each non-special token picked with mlm_prob (0.15); a picked token becomes
  [MASK] with p 0.8, a random id with p 0.1 (0.2 x 0.5), stays with p 0.1; special tokens never. 200,000 tokens give
  about 30,000 picked, so each fraction has a standard error of at most 0.0023 (0.8) and 0.0017 (0.1): the bound
  0.01 is 4.3-5.8 standard errors, and a split off by 0.03 or more (85/7.5/7.5, 80/15/5, 90/5/5) fails it. A random
  id equals the old one or [MASK] with p 2/50,000."""
  n, vocab, mask_id = 200_000, 50_000, 4
  ids = jax.random.randint(jax.random.PRNGKey(0), (1, n), 5, vocab, dtype=jnp.int32)
  special = jnp.arange(n)[None, :] % 10 == 0  # every tenth token: [CLS], [SEP] or padding
  new, labels = map(np.asarray, jax.jit(justask.mask_tokens, static_argnums=(3, 4, 5))(
      jax.random.PRNGKey(1), ids, special, mask_id, vocab, 0.15))
  ids, special = np.asarray(ids), np.asarray(special)
  picked = labels >= 0
  assert not picked[special].any() and np.all(new[special] == ids[special])
  assert np.all(labels[picked] == ids[picked]) and np.all(new[~picked] == ids[~picked])
  assert abs(picked[~special].mean() - 0.15) < 0.005  # 180,000 candidates: standard error 0.0008
  was, now = ids[picked], new[picked]
  frac = [np.mean(now == mask_id), np.mean((now != mask_id) & (now != was)), np.mean(now == was)]
  np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.01)


def test_checkpoint_errors(release, tmp_path):
  model = release["model"]
  params, _ = _loaded(release)
  bad = str(tmp_path / "not_justask.pth")
  torch.save({"module.foo.weight": torch.zeros(2)}, bad)
  with pytest.raises(ValueError, match=r"not_justask.pth: not a JustAsk \(VQA-T\) checkpoint"):
    justask.load_checkpoint(model, bad, params)
  other = justask.Model(**{**{f: getattr(model, f) for f in ("text_config", "d_model", "n_layers", "n_heads", "d_ff",
                                                            "feature_dim", "num_frames")}, "question_len": 10})
  with pytest.raises(ValueError, match=r"trained with Q \+ T = 13 slots but the config has Q = 10"):
    justask.load_checkpoint(other, release["ckpt"], params)


# ------------------------------------------------------------------------------------------ training


SMALL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "synthetic_ovqa_small",
                     "records")


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
  """`:tiny,justask,baseline` (JustAsk+ without verbalizer: random 2-layer 32-wide BERT towers, MiniLM's tokenizer,
  a 32-wide transformer) trained 30 steps on the small synthetic world."""
  import json
  from configs import ovqa_msrvtt
  from evqa_jax.train import train_and_evaluate
  if not os.path.exists(os.path.join(SMALL, "metadata.json")):
    from data_prep import synthetic_ovqa
    synthetic_ovqa.ensure_world(os.path.dirname(SMALL), preset="small")
  c = ovqa_msrvtt.get_config("tiny,justask,baseline")
  c.data.dir = SMALL
  c.total_steps, c.checkpoint_every_steps, c.log_every_steps = 30, 30, 1
  c.data.eval_splits = ()
  c.optim.lr = 3e-3
  workdir = str(tmp_path_factory.mktemp("justask_stage1"))
  train_and_evaluate(c, workdir)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "train_history.jsonl"))]
  return {"workdir": workdir, "rows": rows}


def test_tiny_justask_loss_goes_down(stage1):
  """The VideoQA loss (without the MLM extra, logged beside it) falls over 30 steps of 8 on the small world: from
  about log|V_train| = log 110 = 4.7 to clearly below."""
  rows = stage1["rows"]
  assert [r["step"] for r in rows] == list(range(1, 31))
  first = np.mean([r["vqa_loss"] for r in rows[:5]])
  last = np.mean([r["vqa_loss"] for r in rows[-5:]])
  assert abs(first - np.log(110)) < 0.5, first
  assert last < first - 0.5, (first, last)
  assert all(np.isfinite(r["mlm_loss"]) and r["loss"] == pytest.approx(r["vqa_loss"] + r["mlm_loss"], rel=1e-5)
             for r in rows)


def test_zero_shot_refuses_an_untrained_gnn(stage1, tmp_path):
  """launch/evaluate.py --zero_shot on `:tiny,justask` (the GNN verbalizer) from a first-stage run, which holds no
  verbalizer: the learned GNN would score untrained, so it is refused, naming JustAsk's :baseline config."""
  from configs import ovqa_msrvtt
  from evqa_jax.train import trainer
  c = ovqa_msrvtt.get_config("tiny,justask")
  c.data.dir, c.pretrained.init_from = SMALL, stage1["workdir"]
  with pytest.raises(ValueError, match=r"--zero_shot scores untrained weights, but config.verbalizer.variant = 'E' .*"
                                       r"JustAsk\+ without a verbalizer: use --config=configs/ovqa_msrvtt.py:"
                                       r"justask,baseline"):
    trainer.evaluate_checkpoint(c, str(tmp_path / "refused"), None, ["test"])


def test_release_end_to_end(tmp_path, capsys):
  """The release-shaped files (python -m data_prep.fixtures --paper ovqa: Just Ask's s3d.pth and
  ckpt_pt_howtovqa69m.pth, a distilbert-base-uncased folder, the OVQA authors' vocabularies) -> data_prep.ovqa at
  20 S3D frames -> GloVe answer graphs -> the paper's :justask,baseline config from the authors' checkpoint (stage 1)
  -> :justask (JustAsk+ with the GNN verbalizer, stage 2) from stage 1's workdir: every parameter but the verbalizer
  comes from it, the answer encoder stays frozen (bit-equal after training) and the verbalizer trains -> its
  predictions scored by the official command with the authors' ans2cat / test_vocab. The multi-modal transformer is
  the fixture's 32 wide."""
  import json
  from configs import ovqa_msrvtt
  from data_prep import answer_graphs, ovqa as prep
  from evqa_jax.evaluate import ovqa as ovqa_eval
  from evqa_jax.train import train_and_evaluate
  from evqa_jax.runs import checkpointing
  fixtures.main(["--out", str(tmp_path / "fx"), "--paper", "ovqa"])
  root = tmp_path / "fx" / "ovqa"
  out = str(tmp_path / "records_s3d")
  prep.convert(str(root / "MSRVTT-QA"), str(root / "MSRVTT-QA" / "s3d.pth"), out, num_frames=20, feature_dim=1024,
               authors_vocab=str(root / "meta_data" / "msrvtt"), verbose=False)
  answer_graphs.main(["--data", out])

  def config(variant, init_from):
    c = ovqa_msrvtt.get_config(variant)
    c.data.dir, c.pretrained.dir, c.pretrained.init_from = out, str(root / "models" / "distilbert-base-uncased"), init_from
    c.model.d_model, c.model.d_ff, c.model.n_heads = 32, 64, 4  # fixtures.JUSTASK_FIXTURE
    c.batch_size = c.eval_batch_size = 8  # the 8 test devices (conftest)
    c.total_epochs, c.eval_every_epochs, c.checkpoint_every_epochs = None, None, None
    c.total_steps, c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 2, 2, 2, 1
    return c

  stage1, stage2 = tmp_path / "stage1", tmp_path / "stage2"
  train_and_evaluate(config("justask,baseline", str(root / "models" / "ckpt_pt_howtovqa69m.pth")), str(stage1))
  log = capsys.readouterr().out
  assert "Initialised from Just Ask checkpoint" in log and "unused checkpoint keys" not in log.split("\n")[0]
  stage2_config = config("justask", str(stage1))
  assert stage2_config.model.freeze_answer_encoder and stage2_config.verbalizer.variant == "E"
  train_and_evaluate(stage2_config, str(stage2))
  assert "Initialised from step 2 of" in capsys.readouterr().out
  _, before = checkpointing.load_checkpoint_arrays(str(stage1))
  _, after = checkpointing.load_checkpoint_arrays(str(stage2))
  assert "amodel" in after["frozen"] and "amodel" not in after["trainable"]
  for a, b in zip(jax.tree.leaves(before["trainable"]["amodel"]), jax.tree.leaves(after["frozen"]["amodel"])):
    np.testing.assert_array_equal(a, b)
  w = after["trainable"]["verbalizer"]
  assert any(not np.allclose(x, np.eye(x.shape[0])) for x in jax.tree.leaves(w) if x.ndim == 2)
  assert not np.array_equal(before["trainable"]["vqproj"]["kernel"], after["trainable"]["vqproj"]["kernel"])
  final = json.loads((stage2 / "final_metrics.json").read_text())
  official = ovqa_eval.main(["--test-csv", os.path.join(out, "test.csv"),
                             "--ans2cat", str(root / "meta_data" / "msrvtt" / "ans2cat.json"),
                             "--test-vocab", str(root / "meta_data" / "msrvtt" / "test_vocab.json"),
                             "--pred", str(stage2 / "eval" / "test_step2" / "predictions.csv"),
                             "--out", str(tmp_path / "official.json")])
  assert official["total"] == final["eval"]["test"]["total"]
