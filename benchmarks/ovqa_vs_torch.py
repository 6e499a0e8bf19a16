"""OVQA train-step and inference throughput: evqa_jax (the real trainer step) against Hugging Face PyTorch, on CPU.

  python benchmarks/ovqa_vs_torch.py [--models minilm,deberta --batch 32 --text-len 64 --frames 10 --answers 500
                                      --threads 2 --warmup 2 --steps 5 --repeats 3 --out bench.json]

Two models, each built once with the SAME weights on both sides:
- minilm: the demo model (configs/ovqa_*.py:demo): MiniLM-L6 (BERT, hidden 384, pretrained weights from
  evqa_jax.pretrained.minilm_dir(); its missing MLM transform randomly initialised), T visual tokens, adapters,
  trainable = visual_proj|adapter|LayerNorm|verbalizer|cvqa_head|predictions/transform, the demo optimiser.
- deberta: DeBERTa-v2 with deberta-v3-xsmall shapes (hidden 384, 12 layers, 6 heads, FFN 1536, vocab 128100,
  relative attention with 256 buckets, p2c|c2p, share_att_key, norm_rel_ebd layer_norm, position_biased_input False,
  no conv), random weights, the enhanced mask decoder, the paper's trainable set and optimiser.
The head is the open-vocabulary one: [MASK] feature . mean frozen word embeddings of each answer's <= 5 sub-words
(`--answers` answers padded to a multiple of 64, as the demo config pads), softmax cross-entropy.

JAX side: `evqa_jax.train.steps.StepFns` (the jitted `train_step` the trainer runs: gradients for the trainable
subtree only, Adam state only for it, donated state; `eval_step` = predict = top-5) with the OVQA task's own
`loss` / `predict` / `_logits` (evqa_jax.projects.ovqa.task.Task), dropout on in training.
PyTorch side: `BertForMaskedLM` / `DebertaV2ForMaskedLM` (transformers, default attention implementation) +
adapters as forward hooks adding x + up(dropout(relu(down(x)))) after attention.output.dense and output.dense,
visual prefix through `inputs_embeds = concat(visual_proj(video), word_embeddings(ids))`, the same freezing
(the same regexes over the parameter names, requires_grad False elsewhere), the same head and loss, Adam
(betas from the config, foreach) with the same global-norm clip and schedule shape; `model.train()` (dropout 0.1
everywhere) for training, `eval()` + `inference_mode()` for inference. DeBERTa's EMD in torch runs the last layer
twice over the whole sequence (transformers' DisentangledSelfAttention cannot take one query row per example; this
is how FrozenBiLM and tests/test_deberta_v2.py compute it), evqa_jax runs it on the [MASK] row only.

Before timing, a parity check runs both models deterministically on the benchmark batch and reports the largest
logit difference (proof that both sides compute the same function). Timing: `--warmup` steps are excluded (the JAX
compile happens there and is reported separately as compile_s = first call - one steady step); then `--repeats`
blocks of `--steps` steps, alternating JAX and PyTorch blocks so that load changes on a shared machine hit both
alike; the reported figure is the median block. The 1-minute load average is recorded around every block.
Prints one JSON line (and writes it to --out when given).
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEBERTA_XSMALL = dict(
    vocab_size=128100, hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
    hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True,
    max_relative_positions=-1, position_buckets=256, pos_att_type=["p2c", "c2p"], share_att_key=True,
    norm_rel_ebd="layer_norm", position_biased_input=False, pad_token_id=0)
ANSWER_PAD = 64  # the demo config's graph.pad_multiple, which also pads the answer vocabulary
MAX_SUBWORDS = 5
TOTAL_STEPS = 1000  # only shapes the LR schedule


def _load1() -> float:
  return os.getloadavg()[0]


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
    mlm = transformers.BertForMaskedLM.from_pretrained(pretrained.minilm_dir())
  else:
    mlm = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(legacy=False, **DEBERTA_XSMALL))
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
    return float(loss), float(acc)

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

  def aux_logical_axes(self):
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
              else cfg_cls.from_dict(DEBERTA_XSMALL, **overrides))
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


# ------------------------------------------------------------------------------------------------ timing


def timed_blocks(fn_block, repeats, steps, batch):
  """-> list of examples/s, one per block, and the load averages."""
  rates = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn_block(steps)
    rates.append(steps * batch / (time.perf_counter() - t0))
  return rates


def run_model(model: str, args, workdir: str) -> dict:
  import jax
  import numpy as np
  import torch
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

  out = {"trainable_params": {"jax": partition.count_params(jx["state"]["trainable"]),
                              "torch": runner.num_trainable},
         "frozen_params_jax": partition.count_params(jx["state"]["frozen"]),
         "torch_attn_implementation": getattr(mlm.config, "_attn_implementation", None)}
  if out["trainable_params"]["jax"] != out["trainable_params"]["torch"]:
    raise RuntimeError(f"[{model}] trainable sets differ: {out['trainable_params']}")

  # Parity: both models, deterministic, same batch.
  with ctx():
    jl = np.asarray(jax.jit(lambda p, b, a: jx["task"]._logits(p, b, a, None, train=False))(
        params, jx["batch"], jx["aux"]))
  tl = runner.eval_logits()
  valid = aux["answer_mask"]
  diff = float(np.max(np.abs(jl[:, valid] - tl[:, valid])))
  out["parity"] = {"max_abs_logit_diff": diff, "max_abs_logit": float(np.max(np.abs(tl[:, valid]))),
                   "same_top1": float(np.mean(np.argmax(jl[:, valid], -1) == np.argmax(tl[:, valid], -1)))}
  print(f"[{model}] parity {out['parity']}", file=sys.stderr, flush=True)
  if not diff < 1e-3 * max(1.0, out["parity"]["max_abs_logit"]):
    raise RuntimeError(f"[{model}] JAX and PyTorch models disagree: {out['parity']}")
  del params

  state = {"s": jx["state"]}

  def jax_train(n):
    with ctx():
      for _ in range(n):
        state["s"], metrics = steps.train_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(metrics)
    return metrics

  def jax_infer(n):
    with ctx():
      for _ in range(n):
        o = steps.eval_step(state["s"], jx["batch"], jx["aux"])
      jax.block_until_ready(o)

  def torch_train(n):
    for _ in range(n):
      runner.train_step()

  def torch_infer(n):
    for _ in range(n):
      runner.infer_step()

  fns = {("jax", "train"): jax_train, ("jax", "infer"): jax_infer,
         ("torch", "train"): torch_train, ("torch", "infer"): torch_infer}
  compile_s = {}
  for mode in ("train", "infer"):
    t0 = time.perf_counter()
    fns[("jax", mode)](1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fns[("jax", mode)](1)
    compile_s[mode] = max(first - (time.perf_counter() - t0), 0.0)
    for fw in ("jax", "torch"):
      fns[(fw, mode)](args.warmup)
  out["jax_compile_s"] = compile_s
  m = jax_train(1)
  out["jax_train_loss_after_warmup"] = float(m["loss"])
  out["torch_train_loss_after_warmup"] = runner.train_step()[0]

  rates = {(fw, mode): [] for fw in ("jax", "torch") for mode in ("train", "infer")}
  loads = []
  for r in range(args.repeats):
    for mode in ("train", "infer"):
      order = ("jax", "torch") if r % 2 == 0 else ("torch", "jax")
      for fw in order:
        loads.append(_load1())
        rates[(fw, mode)] += timed_blocks(fns[(fw, mode)], 1, args.steps, args.batch)
        print(f"[{model}] {fw} {mode}: {rates[(fw, mode)][-1]:.1f} ex/s (load {loads[-1]:.2f})",
              file=sys.stderr, flush=True)
  loads.append(_load1())
  out["examples_per_s"] = {fw: {mode: round(statistics.median(rates[(fw, mode)]), 2) for mode in ("train", "infer")}
                           for fw in ("jax", "torch")}
  out["examples_per_s_blocks"] = {f"{fw}/{mode}": [round(x, 2) for x in v] for (fw, mode), v in rates.items()}
  out["ratio_jax_over_torch"] = {mode: round(out["examples_per_s"]["jax"][mode] / out["examples_per_s"]["torch"][mode],
                                             3) for mode in ("train", "infer")}
  out["load_avg_1min"] = {"min": min(loads), "max": max(loads), "mean": round(statistics.mean(loads), 2)}
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--models", default="minilm,deberta")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--text-len", type=int, default=64)
  p.add_argument("--frames", type=int, default=10)
  p.add_argument("--visual-dim", type=int, default=768)
  p.add_argument("--answers", type=int, default=500)
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--steps", type=int, default=5, help="steps per timed block")
  p.add_argument("--repeats", type=int, default=3, help="timed blocks per (framework, mode)")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)

  import jax
  import torch
  import transformers

  torch.set_num_threads(args.threads)
  transformers.logging.set_verbosity_error()
  result = {"benchmark": "ovqa_vs_torch",
            "setting": {"batch": args.batch, "visual_tokens": args.frames, "text_tokens": args.text_len,
                        "answers": args.answers, "dtype": "float32", "torch_threads": args.threads,
                        "warmup_steps": args.warmup, "steps_per_block": args.steps, "blocks": args.repeats,
                        "dropout": args.dropout},
            "versions": {"jax": jax.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
            "cpu_count": os.cpu_count(), "xla_flags": os.environ.get("XLA_FLAGS", ""), "models": {}}
  with tempfile.TemporaryDirectory(prefix="ovqa_bench_") as workdir:
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
      if model not in ("minilm", "deberta"):
        raise SystemExit(f"--models: unknown model {model!r} (minilm, deberta)")
      result["models"][model] = run_model(model, args, workdir)
  result["summary"] = {m: {"jax": r["examples_per_s"]["jax"], "torch": r["examples_per_s"]["torch"],
                           "ratio": r["ratio_jax_over_torch"]} for m, r in result["models"].items()}
  line = json.dumps(result)
  print(line, flush=True)
  if args.out:
    from evqa_jax import io as io_lib
    io_lib.write_text(args.out, line + "\n")
  return result


if __name__ == "__main__":
  main()
