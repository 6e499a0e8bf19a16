"""OVQA train-step and inference throughput: evqa_jax (the real trainer step) against Hugging Face PyTorch and a
plain-Flax model of the same shape, on CPU.

  python benchmarks/ovqa_vs_torch.py [--models minilm,deberta --batch 32 --text-len 64 --frames 10 --answers 500
                                      --threads 2 --warmup 2 --steps 5 --repeats 3 --out bench.json]
  python benchmarks/ovqa_vs_torch.py --quick      # smoke run: 1 warm-up step, 1 block of 1 step per side

Two models, each built once with the SAME weights on every side:
- minilm: the demo model (configs/ovqa_*.py:demo): MiniLM-L6 (BERT, hidden 384, pretrained weights from
  evqa_jax.pretrained.minilm_dir(); its missing MLM transform randomly initialised), T visual tokens, adapters,
  trainable = visual_proj|adapter|LayerNorm|verbalizer|cvqa_head|predictions/transform, the demo optimiser.
- deberta: DeBERTa-v2 with deberta-v3-xsmall shapes (hidden 384, 12 layers, 6 heads, FFN 1536, vocab 128100,
  relative attention with 256 buckets, p2c|c2p, share_att_key, norm_rel_ebd layer_norm, position_biased_input False,
  no conv), random weights, the enhanced mask decoder, the paper's trainable set and optimiser.
The head is the open-vocabulary one: [MASK] feature . mean frozen word embeddings of each answer's <= 5 sub-words
(`--answers` answers padded to a multiple of 64, as the demo config pads), softmax cross-entropy.

Three sides (columns):
- jax: `evqa_jax.train.steps.StepFns` (the jitted `train_step` the trainer runs: gradients for the trainable
  subtree only, Adam state only for it, donated state; `eval_step` = predict = top-5) with the OVQA task's own
  `loss` / `predict` / `_logits` (evqa_jax.projects.ovqa.task.Task), dropout on in training.
- torch: `BertForMaskedLM` / `DebertaV2ForMaskedLM` (transformers, default attention implementation) +
  adapters as forward hooks adding x + up(dropout(relu(down(x)))) after attention.output.dense and output.dense,
  visual prefix through `inputs_embeds = concat(visual_proj(video), word_embeddings(ids))`, the same freezing
  (the same regexes over the parameter names, requires_grad False elsewhere), the same head and loss, Adam
  (betas from the config, foreach) with the same global-norm clip and schedule shape; `model.train()` (dropout 0.1
  everywhere) for training, `eval()` + `inference_mode()` for inference. DeBERTa's EMD in torch runs the last layer
  twice over the whole sequence (transformers' DisentangledSelfAttention cannot take one query row per example; this
  is how FrozenBiLM and tests/test_deberta_v2.py compute it), evqa_jax runs it on the [MASK] row only.
- flax (minilm only): a straightforward Flax linen model written here (`plain_flax_model`: nn.MultiHeadDotProduct-
  Attention, nn.Dense, every layer over the whole sequence), the same adapters, freezing (gradients and Adam state
  for the trainable subtree only, donated), dropout, head, loss and optimiser, weights copied from the torch model.
  It is the yardstick for what plain JAX reaches on the machine at hand; the product should be at least as fast.

Before timing, a parity check runs every side deterministically on the benchmark batch and reports the largest
logit difference against PyTorch (proof that all compute the same function). Timing: `--warmup` steps are excluded
(the JAX compile happens there and is reported separately as compile_s = first call - one steady step); then
`--repeats` rounds of one block of `--steps` steps per side, the side order rotated every round so that load
changes on a shared machine hit every side alike; the reported figure is the median block.

Every block is watched by benchmarks/machine.py (load average before/after, CPU used by other processes during
it); the JSON carries `machine` (CPU model and flags, cores, library versions), `load` (per block) and `usable`:
false when the machine was busy (more than --max-foreign-cores of foreign CPU in any block, or a 1-minute load
above --max-load-per-core per core). Only a usable run may be quoted. Prints one JSON line (and writes it to --out).
"""

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402  pylint: disable=wrong-import-position
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEBERTA_XSMALL = dict(
    vocab_size=128100, hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
    hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True,
    max_relative_positions=-1, position_buckets=256, pos_att_type=["p2c", "c2p"], share_att_key=True,
    norm_rel_ebd="layer_norm", position_biased_input=False, pad_token_id=0)


def deberta_shape(args) -> dict:
  return dict(DEBERTA_XSMALL, num_hidden_layers=args.deberta_layers)


ANSWER_PAD = 64  # the demo config's graph.pad_multiple, which also pads the answer vocabulary
MAX_SUBWORDS = 5
TOTAL_STEPS = 1000  # only shapes the LR schedule


# ------------------------------------------------------------------------------------------------ inputs


def make_inputs(args, vocab_size: int, seed: int = 0):
  """Numpy batch + answer vocabulary, shared by both sides. Text lengths vary (padding), one [MASK] per prompt."""
  import numpy as np

  rng = np.random.default_rng(seed)
  b, L, T = args.batch, args.text_len, args.frames
  lengths = rng.integers(L * 5 // 8, L + 1, size=b)
  ids = rng.integers(1000, vocab_size, size=(b, L)).astype(np.int32)
  mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
  ids[mask == 0] = 0
  mask_pos = rng.integers(4, lengths - 2)  # [MASK] within the valid text, as `Question: ... Answer: [MASK].`
  ids[np.arange(b), mask_pos] = 103
  video = rng.standard_normal((b, T, args.visual_dim)).astype(np.float32)
  video_mask = np.ones((b, T), np.int32)
  n_ans = -(-args.answers // ANSWER_PAD) * ANSWER_PAD
  ans_len = rng.integers(1, MAX_SUBWORDS + 1, size=n_ans)
  answer_tokens = rng.integers(1000, vocab_size, size=(n_ans, MAX_SUBWORDS)).astype(np.int32)
  answer_token_mask = np.arange(MAX_SUBWORDS)[None] < ans_len[:, None]
  answer_mask = np.arange(n_ans) < args.answers
  answer_token_mask &= answer_mask[:, None]
  answer_tokens[~answer_token_mask] = 0
  batch = {"input_ids": ids, "attention_mask": mask, "mask_index": (mask_pos + T).astype(np.int32),
           "video": video, "video_mask": video_mask, "label": rng.integers(0, args.answers, size=b).astype(np.int32),
           "index": np.arange(b, dtype=np.int32), "_valid": np.ones((b,), np.int32)}
  aux = {"answer_tokens": answer_tokens, "answer_token_mask": answer_token_mask, "answer_mask": answer_mask,
         "is_base": np.zeros((n_ans,), bool)}
  return batch, aux


# ------------------------------------------------------------------------------------------------ configs


def experiment_config(model: str):
  """The real OVQA config (demo variant for minilm, the paper's for deberta): optimiser, trainable regexes, seed."""
  from configs import ovqa_common

  return ovqa_common.ovqa_config("msrvtt", "demo" if model == "minilm" else None, cvqa_topk=4000)


# ------------------------------------------------------------------------------------------------ torch side


def build_torch(model: str, args, workdir: str):
  """-> (HF MLM with adapters registered but not yet hooked, hf checkpoint dir for the JAX importer)."""
  import torch
  import transformers
  from evqa_jax import pretrained

  torch.manual_seed(0)
  if model == "minilm":
    # Its first --minilm-layers layers (all 6 by default); the saved checkpoint, which the JAX side imports, too.
    mlm = transformers.BertForMaskedLM.from_pretrained(pretrained.minilm_dir(), num_hidden_layers=args.minilm_layers)
  else:
    mlm = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(legacy=False, **deberta_shape(args)))
  mlm.config.hidden_dropout_prob = mlm.config.attention_probs_dropout_prob = args.dropout
  for m in mlm.modules():
    if isinstance(m, torch.nn.Dropout):
      m.p = args.dropout
  hf_dir = os.path.join(workdir, model)
  mlm.save_pretrained(hf_dir)
  return mlm, hf_dir


def make_torch_ovqa(model: str, mlm, jax_lm_params, args):
  """Wraps the MLM into the OVQA model, its adapters / visual projection / (DeBERTa) absolute positions copied from
  the JAX parameters so both sides hold identical weights."""
  import numpy as np
  import torch

  hidden = mlm.config.hidden_size

  class Adapter(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.down = torch.nn.Linear(hidden, hidden // 8)
      self.up = torch.nn.Linear(hidden // 8, hidden)
      self.dropout = torch.nn.Dropout(args.dropout)

    def forward(self, x):
      return x + self.up(self.dropout(torch.relu(self.down(x))))

  def copy_dense(linear, tree):
    with torch.no_grad():
      linear.weight.copy_(torch.from_numpy(np.asarray(tree["kernel"]).T.copy()))
      linear.bias.copy_(torch.from_numpy(np.asarray(tree["bias"]).copy()))

  class TorchOVQA(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.mlm = mlm
      self.visual_proj = torch.nn.Linear(args.visual_dim, hidden)
      if model == "minilm":
        self.base, layers = mlm.bert, mlm.bert.encoder.layer
        jl, jenc = jax_lm_params, jax_lm_params["encoder"]
      else:
        self.base, layers = mlm.deberta, mlm.deberta.encoder.layer
        jl, jenc = jax_lm_params["deberta"]["embeddings"], jax_lm_params["deberta"]["encoder"]
        # transformers drops the absolute positions when position_biased_input is false; the EMD needs them.
        self.pos_emb = torch.nn.Embedding(mlm.config.max_position_embeddings, hidden)
        with torch.no_grad():
          self.pos_emb.weight.copy_(torch.from_numpy(np.asarray(jl["position_embeddings"]["embedding"]).copy()))
      copy_dense(self.visual_proj, jl["visual_proj"]["dense"])
      self.adapters = torch.nn.ModuleList()
      for i, layer in enumerate(layers):
        a_attn, a_ffn = Adapter(), Adapter()
        ours = jenc[f"layer_{i}"]
        for a, tree in ((a_attn, ours["attention"]["output"]["adapter_attn"]), (a_ffn, ours["output"]["adapter_ffn"])):
          copy_dense(a.down, tree["down"])
          copy_dense(a.up, tree["up"])
        layer.attention.output.dense.register_forward_hook(lambda m, i, o, a=a_attn: a(o))
        layer.output.dense.register_forward_hook(lambda m, i, o, a=a_ffn: a(o))
        self.adapters.extend([a_attn, a_ffn])

    def mask_feature(self, b):
      words = self.base.embeddings.word_embeddings(b["input_ids"])
      x = torch.cat([self.visual_proj(b["video"]), words], 1)
      mask = torch.cat([b["video_mask"], b["attention_mask"]], 1)
      rows = torch.arange(x.shape[0])
      if model == "minilm":
        hidden_states = self.base(inputs_embeds=x, attention_mask=mask).last_hidden_state
        return self.mlm.cls.predictions.transform(hidden_states[rows, b["mask_index"]])
      out = self.base(inputs_embeds=x, attention_mask=mask, output_hidden_states=True)
      enc = self.base.encoder
      prev = out.hidden_states[-2]
      att, rel = enc.get_attention_mask(mask), enc.get_rel_embedding()
      q = prev + self.pos_emb.weight[:prev.shape[1]][None]
      for _ in range(2):  # the enhanced mask decoder (FrozenBiLM's emd_context_layer), whole sequence
        q = enc.layer[-1](prev, att, query_states=q, rel_embeddings=rel)[0]
      head = self.mlm.lm_predictions.lm_head
      return head.LayerNorm(head.transform_act_fn(head.dense(q[rows, b["mask_index"]])))

    def forward(self, b, aux):
      feature = self.mask_feature(b)
      emb = self.base.embeddings.word_embeddings.weight[aux["answer_tokens"]]
      m = aux["answer_token_mask"].to(emb.dtype)[..., None]
      answers = (emb * m).sum(1) / m.sum(1).clamp(min=1.0)
      logits = feature @ answers.T
      return logits.masked_fill(~aux["answer_mask"][None], torch.finfo(logits.dtype).min)

  return TorchOVQA()


def torch_freeze(module, patterns):
  """requires_grad only where a trainable regex searches the 'a/b/c' name (the JAX side's rule) -> trainable list."""
  regex = re.compile("|".join(f"(?:{p})" for p in patterns))
  trainable = []
  for name, p in module.named_parameters():
    path = name.replace(".", "/")
    path = path.replace("mlm/bert/", "").replace("mlm/", "")
    p.requires_grad_(bool(regex.search(path)))
    if p.requires_grad:
      trainable.append(p)
  return trainable


class TorchRunner:
  def __init__(self, ovqa, batch, aux, config):
    import torch

    self.torch = torch
    self.model = ovqa
    self.b = {k: torch.from_numpy(v.astype("int64") if v.dtype.kind in "iu" and k in ("input_ids", "mask_index",
                                                                                     "label") else v)
              for k, v in batch.items()}
    self.aux = {k: torch.from_numpy(v.astype("int64") if v.dtype.kind in "iu" else v) for k, v in aux.items()}
    self.params = torch_freeze(ovqa, config.trainable)
    oc = config.optim
    self.clip = oc.grad_clip
    self.opt = torch.optim.Adam(self.params, lr=oc.lr, betas=(oc.b1, oc.b2), eps=oc.eps, foreach=True)
    warm = max(int(round(oc.warmup_fraction * TOTAL_STEPS)), 1)
    self.sched = torch.optim.lr_scheduler.LambdaLR(
        self.opt, lambda s: min((s + 1) / warm, max(0.0, (TOTAL_STEPS - s) / (TOTAL_STEPS - warm))))

  @property
  def num_trainable(self) -> int:
    return sum(p.numel() for p in self.params)

  def train_step(self):
    torch = self.torch
    self.model.train()
    logits = self.model(self.b, self.aux)
    labels = self.b["label"]
    valid = (labels >= 0) & (self.b["_valid"] > 0)
    ce = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    loss = torch.where(valid, ce, 0.0).sum() / valid.sum().clamp(min=1)
    acc = ((logits.argmax(-1) == labels) & valid).sum() / valid.sum().clamp(min=1)
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    if self.clip:
      torch.nn.utils.clip_grad_norm_(self.params, self.clip)
    self.opt.step()
    self.sched.step()
    return float(loss.detach()), float(acc)

  def infer_step(self):
    torch = self.torch
    self.model.eval()
    with torch.inference_mode():
      top = torch.topk(self.model(self.b, self.aux), 5, dim=-1).indices
    return top

  def eval_logits(self):
    torch = self.torch
    self.model.eval()
    with torch.inference_mode():
      return self.model(self.b, self.aux).numpy()


# ------------------------------------------------------------------------------------------------ JAX side


class BenchTask:
  """The OVQA task's model, loss and predict (borrowed from the OVQA Task) without a dataset on disk."""

  from evqa_jax.projects.ovqa.task import Task as _T  # pylint: disable=import-outside-toplevel

  _logits = _T._logits
  loss = _T.loss
  predict = _T.predict

  def __init__(self, config, model, aux, batch):
    self.config = config
    self.model = model
    self._aux = aux
    self._batch1 = {k: v[:1] for k, v in batch.items()}

  @property
  def trainable_patterns(self):
    return tuple(self.config.trainable)

  def aux_logical_axes(self, aux=None):
    return None

  def init_params(self, rng):
    import jax.numpy as jnp
    import jax

    return self.model.init({"params": rng}, jax.tree.map(jnp.asarray, self._batch1),
                           jax.tree.map(jnp.asarray, self._aux))["params"]


def build_jax(model: str, args, config, hf_dir: str, batch, aux):
  """-> dict(steps, state, batch, aux, task): the trainer's StepFns on a 1-device mesh, params from `hf_dir`."""
  from evqa_jax.models import encoders
  from evqa_jax.projects.ovqa.model import Model
  from evqa_jax.train import partition, sharding
  from evqa_jax.train import steps as steps_lib

  encoder = "bert" if model == "minilm" else "deberta_v2"
  overrides = dict(num_visual_tokens=args.frames, visual_dim=args.visual_dim)
  cfg_cls = encoders.config_class(encoder)
  base_cfg = (cfg_cls.from_hf_dir(hf_dir, **overrides) if model == "minilm"
              else cfg_cls.from_dict(deberta_shape(args), **overrides))
  ovqa = Model(encoder=encoder, head="open", use_adapters=True, adapter_reduction=8, dropout=args.dropout,
               dtype="float32", encoder_config=base_cfg, verbalizer=None)
  enc_cfg = ovqa.lm_config
  task = BenchTask(config, ovqa, aux, batch)
  mesh = sharding.make_mesh(config.mesh_shape, config.mesh_axes)
  rules = config.logical_axis_rules
  tx, _ = partition.make_optimizer(config.optim, TOTAL_STEPS)
  state, state_shardings = steps_lib.create_state(task, config, mesh, tx)
  # Pretrained/shared weights through the real importer; adapters / visual_proj / (DeBERTa) positions from init.
  state = steps_lib.load_pretrained_into(state, _Loader(encoder, enc_cfg, hf_dir, task.trainable_patterns),
                                         state_shardings)
  batch_shard = sharding.batch_sharding(mesh, rules)
  aux_shardings = steps_lib.aux_shardings_for(task, mesh, rules, aux)
  steps = steps_lib.StepFns(task, tx, mesh, rules, state_shardings, batch_shard, aux_shardings)
  return dict(steps=steps, state=state, batch=sharding.global_batch(batch, batch_shard),
              aux=sharding.host_to_global(aux, aux_shardings), task=task, mesh=mesh, partition=partition)


class _Loader:
  """What `steps.load_pretrained_into` needs of a task: the LM weights through the encoder's importer."""

  def __init__(self, encoder, enc_cfg, hf_dir, trainable_patterns):
    self.encoder, self.enc_cfg, self.hf_dir = encoder, enc_cfg, hf_dir
    self.trainable_patterns = trainable_patterns

  def load_pretrained(self, params):
    from evqa_jax.models import encoders
    params = dict(params)
    params["lm"], self.report = encoders.load_hf_params(self.encoder, self.enc_cfg, self.hf_dir, params["lm"])
    return params


# ------------------------------------------------------------------------------------------------ plain Flax side


def plain_flax_model(torch_cfg, args):
  """A straightforward Flax linen model of the demo's shape: what plain JAX reaches for the same work.

  BERT post-LN encoder (nn.MultiHeadDotProductAttention, nn.Dense, exact GELU, every layer over the whole sequence),
  the visual prefix, adapters x + up(dropout(relu(down(x)))) after the attention output and the FFN output, dropout
  on embeddings / attention probabilities / adapters / hidden states, the MLM transform on the [MASK] row, the
  open-vocabulary head (mean frozen word embeddings of each answer's sub-words). None of evqa_jax's model code.
  """
  import flax.linen as nn
  import jax.numpy as jnp

  hidden, heads, rate = torch_cfg.hidden_size, torch_cfg.num_attention_heads, args.dropout
  eps = torch_cfg.layer_norm_eps
  gelu = lambda x: nn.gelu(x, approximate=False)  # noqa: E731  (BERT's exact-erf GELU)

  class Adapter(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
      h = nn.Dropout(rate)(nn.relu(nn.Dense(hidden // 8, name="down")(x)), deterministic=deterministic)
      return x + nn.Dense(hidden, name="up")(h)

  class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, mask, deterministic):
      h = nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=hidden, out_features=hidden,
                                          dropout_rate=rate, deterministic=deterministic, name="attention")(
                                              x, mask=mask)
      h = nn.Dropout(rate)(Adapter(name="adapter_attn")(h, deterministic), deterministic=deterministic)
      x = nn.LayerNorm(epsilon=eps, name="attention_LayerNorm")(x + h)
      h = nn.Dense(hidden, name="output")(gelu(nn.Dense(torch_cfg.intermediate_size, name="intermediate")(x)))
      h = nn.Dropout(rate)(Adapter(name="adapter_ffn")(h, deterministic), deterministic=deterministic)
      return nn.LayerNorm(epsilon=eps, name="output_LayerNorm")(x + h)

  class PlainOVQA(nn.Module):
    @nn.compact
    def __call__(self, b, aux, deterministic=True):
      word = nn.Embed(torch_cfg.vocab_size, hidden, name="word_embeddings")
      x = jnp.concatenate([nn.Dense(hidden, name="visual_proj")(b["video"]), word(b["input_ids"])], axis=1)
      length = x.shape[1]
      x = x + nn.Embed(torch_cfg.max_position_embeddings, hidden, name="position_embeddings")(jnp.arange(length))
      x = x + nn.Embed(torch_cfg.type_vocab_size, hidden, name="token_type_embeddings")(
          jnp.zeros((1, length), jnp.int32))
      x = nn.Dropout(rate)(nn.LayerNorm(epsilon=eps, name="embeddings_LayerNorm")(x), deterministic=deterministic)
      keys = jnp.concatenate([b["video_mask"], b["attention_mask"]], axis=1) > 0
      mask = keys[:, None, None, :]
      for i in range(torch_cfg.num_hidden_layers):
        x = Layer(name=f"layer_{i}")(x, mask, deterministic)
      h = jnp.take_along_axis(x, b["mask_index"][:, None, None], axis=1)[:, 0]
      h = nn.LayerNorm(epsilon=eps, name="transform_LayerNorm")(gelu(nn.Dense(hidden, name="transform_dense")(h)))
      emb = word.embedding[aux["answer_tokens"]]
      m = aux["answer_token_mask"].astype(emb.dtype)[..., None]
      answers = (emb * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
      return jnp.where(aux["answer_mask"][None], h @ answers.T, jnp.finfo(jnp.float32).min)

  return PlainOVQA()


def plain_flax_params(torch_ovqa):
  """The plain model's parameters from the torch OVQA model's state dict (so all three sides hold one set)."""
  sd = {k: v.detach().numpy() for k, v in torch_ovqa.state_dict().items()}
  cfg = torch_ovqa.mlm.config
  heads, hd = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads

  def dense(prefix):
    return {"kernel": sd[prefix + ".weight"].T.copy(), "bias": sd[prefix + ".bias"].copy()}

  def ln(prefix):
    return {"scale": sd[prefix + ".weight"].copy(), "bias": sd[prefix + ".bias"].copy()}

  emb = "mlm.bert.embeddings."
  p = {"word_embeddings": {"embedding": sd[emb + "word_embeddings.weight"]},
       "position_embeddings": {"embedding": sd[emb + "position_embeddings.weight"]},
       "token_type_embeddings": {"embedding": sd[emb + "token_type_embeddings.weight"]},
       "embeddings_LayerNorm": ln(emb + "LayerNorm"), "visual_proj": dense("visual_proj"),
       "transform_dense": dense("mlm.cls.predictions.transform.dense"),
       "transform_LayerNorm": ln("mlm.cls.predictions.transform.LayerNorm")}
  for i in range(cfg.num_hidden_layers):
    t = f"mlm.bert.encoder.layer.{i}."
    attn = {}
    for name in ("query", "key", "value"):
      d = dense(t + f"attention.self.{name}")
      attn[name] = {"kernel": d["kernel"].reshape(-1, heads, hd), "bias": d["bias"].reshape(heads, hd)}
    d = dense(t + "attention.output.dense")
    attn["out"] = {"kernel": d["kernel"].reshape(heads, hd, -1), "bias": d["bias"]}
    p[f"layer_{i}"] = {
        "attention": attn, "attention_LayerNorm": ln(t + "attention.output.LayerNorm"),
        "intermediate": dense(t + "intermediate.dense"), "output": dense(t + "output.dense"),
        "output_LayerNorm": ln(t + "output.LayerNorm"),
        "adapter_attn": {"down": dense(f"adapters.{2 * i}.down"), "up": dense(f"adapters.{2 * i}.up")},
        "adapter_ffn": {"down": dense(f"adapters.{2 * i + 1}.down"), "up": dense(f"adapters.{2 * i + 1}.up")}}
  return p


PLAIN_TRAINABLE = re.compile(r"visual_proj|adapter|LayerNorm|transform_dense")  # the demo's trainable set, renamed


class PlainFlaxRunner:
  """Jitted train step (gradients and Adam state for the trainable subtree, donated) and top-5 inference."""

  def __init__(self, torch_ovqa, batch, aux, config, args):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import traverse_util
    from evqa_jax.train import partition

    model = plain_flax_model(torch_ovqa.mlm.config, args)
    self.batch = jax.tree.map(jnp.asarray, batch)
    self.aux = jax.tree.map(jnp.asarray, aux)
    params = plain_flax_params(torch_ovqa)
    expected = jax.eval_shape(lambda: model.init(jax.random.key(0), self.batch, self.aux))["params"]
    got = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    if jax.tree.structure(expected) != jax.tree.structure(got) or jax.tree.leaves(expected) != jax.tree.leaves(got):
      raise RuntimeError("plain Flax parameters from the torch model do not match the plain model's shapes")
    flat = traverse_util.flatten_dict(params, sep="/")
    self.trainable = jax.device_put(traverse_util.unflatten_dict(
        {k: v for k, v in flat.items() if PLAIN_TRAINABLE.search(k)}, sep="/"))
    self.frozen = jax.device_put(traverse_util.unflatten_dict(
        {k: v for k, v in flat.items() if not PLAIN_TRAINABLE.search(k)}, sep="/"))
    tx, _ = partition.make_optimizer(config.optim, TOTAL_STEPS)  # the demo's optimiser (clip + Adam + schedule)
    self.opt_state = tx.init(self.trainable)
    self.step = jnp.zeros((), jnp.int32)
    merge = partition.merge_params
    seed = config.seed

    def train_step(trainable, opt_state, step, frozen, b, a):
      key = jax.random.fold_in(jax.random.key(seed), step)

      def loss_fn(tr):
        logits = model.apply({"params": merge(tr, frozen)}, b, a, deterministic=False, rngs={"dropout": key})
        valid = (b["label"] >= 0) & (b["_valid"] > 0)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(b["label"], 0))
        return jnp.sum(jnp.where(valid, ce, 0.0)) / jnp.maximum(jnp.sum(valid), 1)

      loss, grads = jax.value_and_grad(loss_fn)(trainable)
      updates, opt_state = tx.update(grads, opt_state, trainable)
      return optax.apply_updates(trainable, updates), opt_state, step + 1, loss

    t0 = time.perf_counter()
    self._train = jax.jit(train_step, donate_argnums=(0, 1, 2)).lower(
        self.trainable, self.opt_state, self.step, self.frozen, self.batch, self.aux).compile()
    t1 = time.perf_counter()
    infer = lambda tr, fr, b, a: jax.lax.top_k(model.apply({"params": merge(tr, fr)}, b, a), 5)[1]  # noqa: E731
    self._infer = jax.jit(infer).lower(self.trainable, self.frozen, self.batch, self.aux).compile()
    self.compile_s = {"train": round(t1 - t0, 2), "infer": round(time.perf_counter() - t1, 2)}
    logits = lambda tr, fr, b, a: model.apply({"params": merge(tr, fr)}, b, a)  # noqa: E731
    self._logits = jax.jit(logits).lower(self.trainable, self.frozen, self.batch, self.aux).compile()

  @property
  def num_trainable(self) -> int:
    from evqa_jax.train import partition
    return partition.count_params(self.trainable)

  def train_step(self):
    self.trainable, self.opt_state, self.step, loss = self._train(self.trainable, self.opt_state, self.step,
                                                                  self.frozen, self.batch, self.aux)
    return loss

  def infer_step(self):
    return self._infer(self.trainable, self.frozen, self.batch, self.aux)

  def eval_logits(self):
    import numpy as np
    return np.asarray(self._logits(self.trainable, self.frozen, self.batch, self.aux))


def jax_step_runners(jx, ctx):
  """-> (train(n), infer(n)): n trainer steps on `build_jax`'s state and batch under `ctx()`, waited for; train
  returns the last step's metrics. The state lives on between calls (train steps update it)."""
  import jax

  steps, state = jx["steps"], {"s": jx["state"]}

  def train(n):
    with ctx():
      for _ in range(n):
        state["s"], metrics = steps.train_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(metrics)
    return metrics

  def infer(n):
    with ctx():
      for _ in range(n):
        o = steps.eval_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(o)

  return train, infer


def run_model(model: str, args, workdir: str, monitor) -> dict:
  import jax
  import numpy as np
  from evqa_jax.train import partition

  config = experiment_config(model)
  config.batch_size = args.batch
  print(f"[{model}] building torch model", file=sys.stderr, flush=True)
  mlm, hf_dir = build_torch(model, args, workdir)
  batch, aux = make_inputs(args, mlm.config.vocab_size)
  print(f"[{model}] building JAX state (importing {hf_dir})", file=sys.stderr, flush=True)
  jx = build_jax(model, args, config, hf_dir, batch, aux)
  steps = jx["steps"]
  # The trainer traces its steps under StepFns.context() (mesh + logical rules). DeBERTa-v2 cannot be traced there
  # yet: flax DenseGeneral's param shape check evaluates its kernel init, whose [embed, heads, kv] logical constraint
  # then meets the flattened 2-D kernel (ValueError). On this 1-device mesh the constraints are no-ops, so DeBERTa's
  # steps are traced without the context (the same compiled program otherwise).
  ctx = steps.context if model == "minilm" else contextlib.nullcontext
  params = partition.merge_params(jx["state"]["trainable"], jx["state"]["frozen"])
  lm_params = jax.tree.map(np.asarray, params["lm"])
  ovqa_t = make_torch_ovqa(model, mlm, lm_params, args)
  runner = TorchRunner(ovqa_t, batch, aux, config)
  # The plain-Flax reference exists for the demo model (BERT) only.
  flax_runner = PlainFlaxRunner(ovqa_t, batch, aux, config, args) if model == "minilm" else None
  frameworks = ("jax", "torch") + (("flax",) if flax_runner else ())

  out = {"trainable_params": {"jax": partition.count_params(jx["state"]["trainable"]),
                              "torch": runner.num_trainable},
         "frozen_params_jax": partition.count_params(jx["state"]["frozen"]),
         "torch_attn_implementation": getattr(mlm.config, "_attn_implementation", None)}
  if flax_runner:
    out["trainable_params"]["flax"] = flax_runner.num_trainable
  if len(set(out["trainable_params"].values())) != 1:
    raise RuntimeError(f"[{model}] trainable sets differ: {out['trainable_params']}")

  # Parity: every side deterministic on the same batch, against PyTorch.
  with ctx():
    jl = np.asarray(jax.jit(lambda p, b, a: jx["task"]._logits(p, b, a, None, train=False))(
        params, jx["batch"], jx["aux"]))
  tl = runner.eval_logits()
  valid = aux["answer_mask"]
  out["parity"] = {}
  for fw, logits in (("jax", jl), ("flax", flax_runner.eval_logits() if flax_runner else None)):
    if logits is None:
      continue
    diff = float(np.max(np.abs(logits[:, valid] - tl[:, valid])))
    out["parity"][fw] = {"max_abs_logit_diff": diff, "max_abs_logit": float(np.max(np.abs(tl[:, valid]))),
                         "same_top1": float(np.mean(np.argmax(logits[:, valid], -1) == np.argmax(tl[:, valid], -1)))}
    print(f"[{model}] parity {fw} vs torch {out['parity'][fw]}", file=sys.stderr, flush=True)
    if not diff < 1e-3 * max(1.0, out["parity"][fw]["max_abs_logit"]):
      raise RuntimeError(f"[{model}] {fw} and PyTorch models disagree: {out['parity'][fw]}")
  del params

  jax_train, jax_infer = jax_step_runners(jx, ctx)

  def torch_train(n):
    for _ in range(n):
      runner.train_step()

  def torch_infer(n):
    for _ in range(n):
      runner.infer_step()

  def flax_train(n):
    for _ in range(n):
      loss = flax_runner.train_step()
    return float(loss)

  def flax_infer(n):
    for _ in range(n):
      o = flax_runner.infer_step()
    jax.block_until_ready(o)

  fns = {("jax", "train"): jax_train, ("jax", "infer"): jax_infer,
         ("torch", "train"): torch_train, ("torch", "infer"): torch_infer,
         ("flax", "train"): flax_train, ("flax", "infer"): flax_infer}
  # the plain-Flax steps were compiled ahead (PlainFlaxRunner.compile_s)
  compile_s = {}
  for mode in ("train", "infer"):
    t0 = time.perf_counter()  # compile = first call - one steady call
    fns[("jax", mode)](1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fns[("jax", mode)](1)
    compile_s[mode] = round(max(first - (time.perf_counter() - t0), 0.0), 2)
    for fw in frameworks:
      fns[(fw, mode)](args.warmup)
  out["jax_compile_s"] = compile_s
  if flax_runner:
    out["flax_compile_s"] = flax_runner.compile_s
  out["jax_train_loss_after_warmup"] = float(jax_train(1)["loss"])
  out["torch_train_loss_after_warmup"] = runner.train_step()[0]
  if flax_runner:
    out["flax_train_loss_after_warmup"] = flax_train(1)

  # Blocks alternate: the framework order is rotated every repeat, so a load change hits every side alike.
  rates = {(fw, mode): [] for fw in frameworks for mode in ("train", "infer")}
  for r in range(args.repeats):
    order = frameworks[r % len(frameworks):] + frameworks[:r % len(frameworks)]
    for mode in ("train", "infer"):
      for fw in order:
        with monitor.block(f"{model}/{fw}/{mode}/{r}") as blk:
          t0 = time.perf_counter()
          fns[(fw, mode)](args.steps)
          rates[(fw, mode)].append(args.steps * args.batch / (time.perf_counter() - t0))
        print(f"[{model}] {fw} {mode}: {rates[(fw, mode)][-1]:.1f} ex/s (load {blk.record['load1_before']:.2f}, "
              f"foreign CPU {blk.record['foreign_cores']} cores)", file=sys.stderr, flush=True)
  out["examples_per_s"] = {fw: {mode: round(statistics.median(rates[(fw, mode)]), 2) for mode in ("train", "infer")}
                           for fw in frameworks}
  out["examples_per_s_blocks"] = {f"{fw}/{mode}": [round(x, 2) for x in v] for (fw, mode), v in rates.items()}
  eps = out["examples_per_s"]
  out["ratio_jax_over_torch"] = {mode: round(eps["jax"][mode] / eps["torch"][mode], 3) for mode in ("train", "infer")}
  if flax_runner:
    out["ratio_jax_over_flax"] = {mode: round(eps["jax"][mode] / eps["flax"][mode], 3) for mode in ("train", "infer")}
    out["ratio_flax_over_torch"] = {mode: round(eps["flax"][mode] / eps["torch"][mode], 3)
                                    for mode in ("train", "infer")}
  return out


def add_model_arguments(p) -> None:
  """The model and batch shape flags that `run_model`'s builders read."""
  p.add_argument("--models", default="minilm,deberta")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--text-len", type=int, default=64)
  p.add_argument("--frames", type=int, default=10)
  p.add_argument("--visual-dim", type=int, default=768)
  p.add_argument("--answers", type=int, default=500)
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--minilm-layers", type=int, default=6, help="MiniLM depth (6; fewer only for a fast smoke test)")
  p.add_argument("--deberta-layers", type=int, default=DEBERTA_XSMALL["num_hidden_layers"],
                 help="DeBERTa depth (xsmall: 12; fewer only for a fast smoke test)")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_model_arguments(p)
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--steps", type=int, default=5, help="steps per timed block")
  p.add_argument("--repeats", type=int, default=3, help="timed blocks per (framework, mode)")
  p.add_argument("--quick", action="store_true",
                 help="smoke run: 1 warm-up step, blocks of 1 step, 1 repeat (figures not for quoting)")
  p.add_argument("--out", default="")
  machine.add_arguments(p)
  args = p.parse_args(argv)
  if args.quick:
    args.warmup, args.steps, args.repeats = 1, 1, 1
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  for model in models:
    if model not in ("minilm", "deberta"):
      raise SystemExit(f"--models: unknown model {model!r} (minilm, deberta)")

  import torch
  import transformers

  torch.set_num_threads(args.threads)
  transformers.logging.set_verbosity_error()
  monitor = machine.monitor_from_args(args)
  result = {"benchmark": "ovqa_vs_torch",
            "setting": {"batch": args.batch, "visual_tokens": args.frames, "text_tokens": args.text_len,
                        "answers": args.answers, "dtype": "float32", "torch_threads": args.threads,
                        "warmup_steps": args.warmup, "steps_per_block": args.steps, "blocks": args.repeats,
                        "dropout": args.dropout, "minilm_layers": args.minilm_layers,
                        "deberta_layers": args.deberta_layers, "quick": args.quick},
            "models": {}}
  with tempfile.TemporaryDirectory(prefix="ovqa_bench_") as workdir:
    for model in models:
      result["models"][model] = run_model(model, args, workdir, monitor)
  result.update(monitor.report())
  result["summary"] = {m: {fw: r["examples_per_s"][fw] for fw in ("jax", "torch", "flax")
                           if fw in r["examples_per_s"]}
                       for m, r in result["models"].items()}
  for m, r in result["models"].items():
    result["summary"][m]["ratio"] = r["ratio_jax_over_torch"]
    if "ratio_jax_over_flax" in r:
      result["summary"][m]["ratio_jax_over_flax"] = r["ratio_jax_over_flax"]
  line = json.dumps(result)
  print(line, flush=True)
  if args.out:
    from evqa_jax import io as io_lib
    io_lib.write_text(args.out, line + "\n")
  return result


if __name__ == "__main__":
  main()
