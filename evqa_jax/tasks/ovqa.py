"""OVQA: open-vocabulary video QA with FrozenBiLM+ (optionally + the GNN soft verbalizer) or the CVQA baseline.

Records: see data_prep/ovqa.py (question, answer, video [T, 768], video_mask, subtitles, index). The dataset
directory also holds vocab.json (train counts, V_train, V_test, the CVQA top-k set) and, for the verbalizer, the
answer graphs graph_train.npz / graph_test.npz (data_prep/answer_graphs.py).

Training scores the [MASK] feature against V_train; evaluation swaps in V_test (and its graph). Both vocabularies
(and graphs) are padded to one static budget so a single compiled step serves both.
"""

import csv
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from evqa_jax import io as io_lib
from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.metrics import ovqa as ovqa_metrics
from evqa_jax.models import encoders
from evqa_jax.models.ovqa_model import OVQAModel
from evqa_jax.tasks import base

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def build_prompt(question: str, subtitles: str, mask_token: str) -> str:
  """`Question: {q}? Answer: [MASK].` + ` Subtitles: {sub}`; question capitalised, `?` added if missing."""
  q = question.strip()
  if not q:
    raise ValueError("empty question")
  q = q[0].upper() + q[1:]
  if not q.endswith("?"):
    q = q + "?"
  text = f"Question: {q} Answer: {mask_token}."
  if subtitles:
    text += f" Subtitles: {subtitles.strip()}"
  return text


def load_tokenizer(path: str):
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from transformers import AutoTokenizer
  if not os.path.isdir(path):
    raise FileNotFoundError(
        f"config.model.pretrained = {path!r} is not a directory: point it at a local Hugging Face checkpoint "
        "directory (config.json, weights, tokenizer files); nothing is downloaded at run time")
  return AutoTokenizer.from_pretrained(path)


def tokenize_answers(tokenizer, answers, max_subwords: int, pad_to: int):
  """Answer encoder inputs: `[pad_to, max_subwords]` ids and mask (no special tokens, at most 5 sub-words)."""
  ids = np.zeros((pad_to, max_subwords), np.int32)
  mask = np.zeros((pad_to, max_subwords), np.bool_)
  for i, answer in enumerate(answers):
    toks = tokenizer(answer, add_special_tokens=False)["input_ids"][:max_subwords]
    if not toks:
      toks = [tokenizer.unk_token_id]
    ids[i, :len(toks)] = toks
    mask[i, :len(toks)] = True
  return ids, mask


class OVQATask(base.Task):
  main_metric = "mAcc"

  def __init__(self, config):
    super().__init__(config)
    data_dir = config.data.dir
    self.data_dir = data_dir
    root = io_lib.epath_of(data_dir)  # local or gs://...: read through etils.epath
    if not (root / "metadata.json").exists():
      if config.data.synthetic:
        from data_prep import synthetic_ovqa
        synthetic_ovqa.ensure_world(os.path.dirname(os.path.abspath(data_dir)), preset=config.data.synthetic)
      else:
        raise FileNotFoundError(
            f"config.data.dir = {data_dir!r} holds no converted OVQA records (no metadata.json). Convert the "
            "release first:\n  python -m data_prep.ovqa --csv-dir <dataset>/ --features <dataset>/clipvitl14.pth "
            f"--out {data_dir}\n  python data_prep/answer_graphs.py --data {data_dir}\n"
            "or run the demo variant (--config=configs/ovqa_msrvtt.py:demo) on the built-in synthetic world.")
    self.metadata = records.load_metadata(data_dir)
    self.vocab = json.loads((root / "vocab.json").read_text())
    self.train_counts = self.vocab["train_counts"]
    mc = config.model
    self.pretrained_dir = pretrained.resolve(mc.pretrained) if mc.pretrained else None
    self.tokenizer = load_tokenizer(pretrained.resolve(mc.tokenizer or mc.pretrained))
    self.mask_token = self.tokenizer.mask_token
    self.mask_token_id = self.tokenizer.mask_token_id
    num_frames = int(self.metadata.get("num_frames", config.data.num_frames))
    if num_frames != config.data.num_frames:
      raise ValueError(f"config.data.num_frames = {config.data.num_frames} but the records in {data_dir} hold "
                       f"{num_frames} frames per video")
    cfg_cls = encoders.config_class(mc.encoder)
    overrides = dict(num_visual_tokens=config.data.num_frames, visual_dim=int(self.metadata.get("feature_dim", 768)),
                     use_adapters=mc.use_adapters, adapter_reduction=mc.adapter_reduction, remat=mc.remat,
                     dtype=_DTYPES[mc.dtype])
    if mc.dropout is not None:
      overrides.update(hidden_dropout_prob=mc.dropout, attention_probs_dropout_prob=mc.dropout,
                       adapter_dropout=mc.dropout)
    if mc.shape:  # explicit architecture (benchmarks, tests), else the checkpoint's config.json
      self.encoder_config = cfg_cls.from_dict(dict(mc.shape), **overrides)
    else:
      if self.pretrained_dir is None or not os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
        raise FileNotFoundError(
            f"config.model.pretrained = {mc.pretrained!r} has no config.json; download the Hugging Face checkpoint "
            "(e.g. microsoft/deberta-v2-xlarge) to a local directory and point config.model.pretrained at it")
      self.encoder_config = cfg_cls.from_hf_dir(self.pretrained_dir, **overrides)

    self.head = mc.head
    if self.head == "cvqa":
      self.answers_train = list(self.vocab["vocab_cvqa"])
      self.answers_eval = self.answers_train
      if mc.cvqa_topk and mc.cvqa_topk < len(self.answers_train):
        self.answers_train = self.answers_train[:mc.cvqa_topk]
        self.answers_eval = self.answers_train
    else:
      self.answers_train = list(self.vocab["vocab_train"])
      self.answers_eval = list(self.vocab["vocab_test"])
    self.answer_index_train = {a: i for i, a in enumerate(self.answers_train)}
    self.answer_index_eval = {a: i for i, a in enumerate(self.answers_eval)}

    vc = config.verbalizer
    self.use_graph = self.head == "open" and vc.variant != "A"
    self.graphs = {}
    if self.use_graph:
      from evqa_jax.graphs import answer_graph
      for split, name in (("train", "graph_train.npz"), ("eval", "graph_test.npz")):
        path = os.fspath(root / name)
        if not (root / name).exists():
          raise FileNotFoundError(f"{path} is missing: the verbalizer (config.verbalizer.variant = {vc.variant!r}) "
                                  f"needs answer graphs; build them with `python data_prep/answer_graphs.py --data "
                                  f"{data_dir}`, or set --config.verbalizer.variant=A")
        self.graphs[split] = answer_graph.load_answer_graph(path)
      if self.graphs["train"].num_answers != len(self.answers_train):
        raise ValueError(f"{data_dir}/graph_train.npz has {self.graphs['train'].num_answers} answers but vocab.json "
                         f"V_train has {len(self.answers_train)}: rebuild the graphs")
      if self.graphs["eval"].num_answers != len(self.answers_eval):
        raise ValueError(f"{data_dir}/graph_test.npz has {self.graphs['eval'].num_answers} answers but vocab.json "
                         f"V_test has {len(self.answers_eval)}: rebuild the graphs")
    self._budget = self._vocab_budget()
    verbalizer_call = None
    if self.use_graph:
      from evqa_jax.graphs import padding
      verbalizer_call = padding.verbalizer_budget(*self.graphs.values(), max_answers=self._budget["answers"],
                                                  max_edges=self._budget["edges"],
                                                  multiple=self.config.verbalizer.pad_multiple)
    self.model = OVQAModel(encoder=mc.encoder, encoder_config=self.encoder_config, head=self.head,
                           num_classes=len(self.answers_train), verbalizer=self._verbalizer_config(),
                           verbalizer_call=verbalizer_call)
    self._aux_cache = {}

  # -- vocabulary / graph budgets -------------------------------------------------------------------------------
  def _vocab_budget(self) -> dict:
    """One static budget for V_train and V_test (answers, and graph nodes/edges when a verbalizer is used)."""
    vc = self.config.verbalizer
    if not self.use_graph:
      return {"answers": round_up(max(len(self.answers_train), len(self.answers_eval)), vc.pad_multiple)}
    from evqa_jax.graphs import padding
    nodes, edges, answers = padding.graph_budget(*self.graphs.values(), multiple=vc.pad_multiple)
    for key, need, override in (("max_nodes", nodes, vc.max_nodes), ("max_edges", edges, vc.max_edges)):
      if override and override < need:
        raise ValueError(f"config.verbalizer.{key} = {override} < {need} needed by the answer graphs of "
                         f"{self.data_dir}")
    return {"answers": answers, "nodes": vc.max_nodes or nodes, "edges": vc.max_edges or edges}

  def _verbalizer_config(self):
    if self.head != "open" or not self.use_graph:
      return None
    vc = self.config.verbalizer
    return dict(variant=vc.variant, num_layers=vc.num_layers, eps=vc.eps, eps_base_fixed=vc.eps_base_fixed,
                dtype=_DTYPES[self.config.model.dtype])

  # -- data -----------------------------------------------------------------------------------------------------
  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    return source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
                                         on_corrupt=self.config.data.on_corrupt)

  def preprocess(self, example: dict, train: bool) -> dict:
    mc, dc = self.config.model, self.config.data
    question = str(example["question"])
    subtitles = str(example["subtitles"]) if dc.use_subtitles else ""
    text = build_prompt(question, subtitles, self.mask_token)
    enc = self.tokenizer(text, max_length=dc.max_tokens, truncation=True, padding="max_length")
    ids = np.asarray(enc["input_ids"], np.int32)
    positions = np.nonzero(ids == self.mask_token_id)[0]
    if len(positions) != 1:
      raise ValueError(f"record {int(example['index'])} of {self.data_dir}: the prompt holds {len(positions)} "
                       f"{self.mask_token} tokens after truncation to config.data.max_tokens = {dc.max_tokens}")
    answer = str(example["answer"])
    table = self.answer_index_train if train else self.answer_index_eval
    label = table.get(answer, -1)
    if train and label < 0 and self.head == "open":
      raise ValueError(f"record {int(example['index'])} of {self.data_dir}: train answer {answer!r} is not in V_train "
                       "of vocab.json (vocabulary and records do not match)")
    del mc
    return {
        "input_ids": ids,
        "attention_mask": np.asarray(enc["attention_mask"], np.int32),
        "mask_index": np.int32(positions[0] + dc.num_frames),
        "video": np.asarray(example["video"], np.float32),
        "video_mask": np.asarray(example["video_mask"], np.int32),
        "label": np.int32(label),
        "index": np.int32(example["index"]),
    }

  def aux_inputs(self, split: str) -> dict:
    key = "train" if split == self.config.data.train_split else "eval"
    if key in self._aux_cache:
      return self._aux_cache[key]
    if self.head == "cvqa":
      self._aux_cache[key] = {}
      return {}
    answers = self.answers_train if key == "train" else self.answers_eval
    n_ans = self._budget["answers"]
    ids, mask = tokenize_answers(self.tokenizer, answers, self.config.model.answer_max_subwords, n_ans)
    answer_mask = np.zeros((n_ans,), np.bool_)
    answer_mask[:len(answers)] = True
    is_base = np.zeros((n_ans,), np.bool_)
    for i, a in enumerate(answers):
      is_base[i] = self.train_counts.get(a, 0) >= 101
    aux = {"answer_tokens": ids, "answer_token_mask": mask, "answer_mask": answer_mask, "is_base": is_base}
    if self.use_graph:
      from evqa_jax.graphs import padding
      graph = self.graphs[key]
      # Node features are computed in the step from the frozen word embeddings, so the padded graph carries the
      # nodes' sub-word ids, placed at their padded positions (answers first, padding slots empty).
      ids, mask = tokenize_answers(self.tokenizer, graph.node_words, self.config.model.answer_max_subwords,
                                   graph.num_nodes)
      padded, _ = padding.pad_graph(graph, np.zeros((graph.num_nodes, 1), np.float32), self._budget["nodes"],
                                    self._budget["edges"], n_ans)
      pos = padding.node_positions(graph, n_ans)
      node_ids = np.zeros((self._budget["nodes"], ids.shape[1]), np.int32)
      node_mask = np.zeros((self._budget["nodes"], ids.shape[1]), np.bool_)
      node_ids[pos], node_mask[pos] = ids, mask
      aux.update(node_tokens=node_ids, node_token_mask=node_mask, senders=np.asarray(padded.senders),
                 receivers=np.asarray(padded.receivers), n_node=np.asarray(padded.n_node),
                 n_edge=np.asarray(padded.n_edge))
    self._aux_cache[key] = aux
    return aux

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    dc = self.config.data
    return {"input_ids": jnp.zeros((1, dc.max_tokens), jnp.int32),
            "attention_mask": jnp.ones((1, dc.max_tokens), jnp.int32),
            "mask_index": jnp.zeros((1,), jnp.int32),
            "video": jnp.zeros((1, dc.num_frames, self.encoder_config.visual_dim), jnp.float32),
            "video_mask": jnp.ones((1, dc.num_frames), jnp.int32)}

  def init_params(self, rng):
    aux = jax.tree.map(jnp.asarray, self.aux_inputs(self.config.data.train_split)) if self.head == "open" else None
    return self.model.init({"params": rng}, self._dummy_batch(), aux)["params"]

  def load_pretrained(self, params: dict) -> dict:
    mc = self.config.model
    params = dict(params)
    if self.pretrained_dir and os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
      lm, report = encoders.load_hf_params(mc.encoder, self.encoder_config, self.pretrained_dir, params["lm"])
      print(f"Loaded {mc.encoder} weights from {self.pretrained_dir}: {str(report).splitlines()[0]}", flush=True)
      params["lm"] = lm
    if mc.init_from:
      from evqa_jax.models import deberta_v2
      if mc.encoder != "deberta_v2":
        raise ValueError("config.model.init_from loads a FrozenBiLM checkpoint, which holds a DeBERTa-v2: set "
                         "config.model.encoder = 'deberta_v2'")
      lm, report = deberta_v2.load_frozenbilm_checkpoint(self.encoder_config, os.path.expanduser(mc.init_from),
                                                         params["lm"])
      print(f"Initialised from FrozenBiLM checkpoint {mc.init_from}: {str(report).splitlines()[0]}", flush=True)
      params["lm"] = lm
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.model.trainable)

  def aux_logical_axes(self):
    from jax.sharding import PartitionSpec as P
    aux = self.aux_inputs(self.config.data.train_split)
    specs = {}
    for k, v in aux.items():
      specs[k] = P(*(["nodes"] + [None] * (v.ndim - 1))) if k.startswith("node_") else P()
    return specs

  def _logits(self, params, batch, aux, rng, train: bool):
    rngs = {"dropout": rng} if train else {}
    return self.model.apply({"params": params}, batch, aux if self.head == "open" else None,
                            deterministic=not train, rngs=rngs)

  def loss(self, params, batch, aux, rng, train: bool = True):
    logits = self._logits(params, batch, aux, rng, train)
    labels = batch["label"]
    valid = labels >= 0  # CVQA: training rows whose answer is outside the top-k carry no loss
    if "_valid" in batch:
      valid = valid & (batch["_valid"] > 0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    denom = jnp.maximum(jnp.sum(valid), 1)
    loss = jnp.sum(jnp.where(valid, ce, 0.0)) / denom
    acc = jnp.sum(jnp.where(valid, jnp.argmax(logits, -1) == labels, False)) / denom
    return loss, {"accuracy": acc}

  def predict(self, params, batch, aux) -> dict:
    logits = self._logits(params, batch, aux, None, train=False)
    top = jax.lax.top_k(logits, 5)
    return {"pred": top[1][:, 0].astype(jnp.int32), "top5": top[1].astype(jnp.int32)}

  # -- evaluation -----------------------------------------------------------------------------------------------
  def split_csv(self, split: str) -> str:
    path = os.fspath(io_lib.epath_of(self.data_dir) / f"{split}.csv")
    if not io_lib.epath_of(path).exists():
      raise FileNotFoundError(f"{path} is missing: the OVQA converter copies each split's CSV next to the records")
    return path

  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    answers = self.answers_eval
    preds = [answers[i] if 0 <= i < len(answers) else "" for i in outputs["pred"]]
    os.makedirs(out_dir, exist_ok=True)
    pred_path = os.path.join(out_dir, "predictions.csv")
    with io_lib.atomic_path(pred_path) as tmp:
      with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "prediction"])
        for idx, p in zip(outputs["index"], preds):
          w.writerow([int(idx), p])
    metrics = ovqa_metrics.evaluate_files(self.split_csv("train"), self.split_csv(split), pred_path)
    io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return metrics

  def describe(self) -> str:
    vc = self.config.verbalizer
    kind = "CVQA" if self.head == "cvqa" else ("FrozenBiLM+" if not self.use_graph
                                                 else f"FrozenBiLM+ with verbalizer {vc.variant} eps={vc.eps}")
    return f"OVQA {kind} ({self.config.model.encoder})"
