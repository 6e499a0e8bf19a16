"""The JustAsk backbone (`config.model.backbone = "justask"`, the `:justask` variant): JustAsk's inputs, model and
weights (its model: justask.py); the loss, predictions, answer vocabularies, graphs and evaluation are the OVQA task's
(task.py, input.py).

Inputs (the authors' data/videoqa_loader.py and util.compute_a2v): the question alone, `[CLS] question [SEP]`
truncated and padded to config.data.max_tokens (their qmax_words, 20), no prompt; answers (and answer-graph node
words) `[CLS] answer [SEP]` within config.data.answer_max_subwords tokens (their amax_words, 10); frames as the
records hold them (config.data.num_frames, their max_feats 20).

Weights: both text towers from the DistilBERT folder in config.pretrained.dir, then config.pretrained.init_from:
the authors' checkpoint (.pth, e.g. the HowToVQA69M-pretrained ckpt_pt_howtovqa69m.pth) or the workdir of an earlier
run of this task (JustAsk+'s second stage: the OVQA paper trains the answer encoder first, then the GNN verbalizer
with that answer encoder frozen).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax import log
from evqa_jax import pretrained
from evqa_jax.models import distilbert, hf_utils
from evqa_jax.projects.ovqa import justask
from evqa_jax.projects.ovqa.backbones import Backbone
from evqa_jax.projects.ovqa.backbones.text import padded_tokens
from evqa_jax.runs import checkpointing


class JustAsk(Backbone):
  """JustAsk (head "cvqa": its top-k vocabulary) and JustAsk+ (head "open", optionally with the GNN verbalizer)."""
  title = "JustAsk"
  video_input = "features"
  variant = "justask"
  heads = justask.HEADS
  model_class = justask.Model

  paper_checkpoint = "ckpt_pt_howtovqa69m.pth (or the workdir of a first-stage run)"
  plain_encoder = "DistilBERT"

  def text_inputs(self, inp, example: dict) -> dict:
    """`[CLS] question [SEP]` ids and mask: the bare question, no prompt."""
    question = str(example["question"])
    if not question.strip():
      raise ValueError(f"record {int(example['index'])} of {inp.data_dir}: empty question")
    ids, mask = padded_tokens(inp.tokenizer, question, self.config.data.max_tokens)
    return {"question_ids": ids, "question_mask": mask}

  def answer_tokens(self, inp, answers, pad_to: int):
    """`[pad_to, L]` ids and mask of `[CLS] answer [SEP]`, L the longest over both vocabularies and graphs (at most
    config.data.answer_max_subwords): the authors pad their vocabulary to its longest answer likewise, and every
    padded slot costs the answer encoder as much as a word."""
    n = self.answer_len(inp)
    ids = np.zeros((pad_to, n), np.int32)
    mask = np.zeros((pad_to, n), np.bool_)
    if len(answers):
      ids[:len(answers)], mask[:len(answers)] = padded_tokens(inp.tokenizer, list(answers), n)
    return ids, mask

  def answer_len(self, inp) -> int:
    if getattr(self, "_answer_len", None) is None:
      words = list(inp.answers_train) + list(inp.answers_eval)
      for graph in inp.graphs.values():
        words += list(graph.node_words or ())
      enc = inp.tokenizer(words, max_length=self.config.data.answer_max_subwords, truncation=True)
      self._answer_len = max(len(x) for x in enc["input_ids"])  # pylint: disable=attribute-defined-outside-init
    return self._answer_len

  def build_model(self, inp):
    config = self.config
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    pc = config.pretrained
    if pc.shape:
      text_config = distilbert.config_from_dict(dict(pc.shape))
    elif pretrained.has_checkpoint(self.pretrained_dir):
      text_config = distilbert.config_from_hf_dir(self.pretrained_dir)
    else:
      raise FileNotFoundError(f"config.pretrained.dir = {pc.dir!r} has no config.json: download distilbert-base-"
                              "uncased to a local directory, or give the architecture in config.pretrained.shape")
    if len(inp.tokenizer) > text_config.vocab_size:
      raise ValueError(f"the tokenizer has {len(inp.tokenizer)} ids but the text encoder's vocabulary is "
                       f"{text_config.vocab_size} (config.pretrained.tokenizer / dir / shape)")
    self.model = justask.Model(
        **config.model, text_config=text_config, feature_dim=inp.visual_dim,
        num_frames=config.data.num_frames, question_len=config.data.max_tokens,
        verbalizer=dict(config.verbalizer) if inp.use_graph else None,
        verbalizer_call=inp.verbalizer_call())
    self.tokenizer = tok = inp.tokenizer
    self.special_ids = np.asarray(sorted(set(tok.all_special_ids) | {tok.pad_token_id}), np.int32)
    return self.model

  def dummy_batch(self):
    dc = self.config.data
    return {"question_ids": jnp.zeros((1, dc.max_tokens), jnp.int32),
            "question_mask": jnp.ones((1, dc.max_tokens), jnp.int32),
            "video": jnp.zeros((1, dc.num_frames, self.model.feature_dim), jnp.float32),
            "video_mask": jnp.ones((1, dc.num_frames), jnp.int32)}

  def load_pretrained(self, params: dict) -> dict:
    params = dict(params)
    self.verbalizer_from_checkpoint = False
    if pretrained.has_checkpoint(self.pretrained_dir):
      config = self.model.tower_config
      for path in (("bert",), ("amodel", "bert")):
        tree = params
        for key in path[:-1]:
          tree = tree[key] = dict(tree[key])
        tree[path[-1]], report = distilbert.load_hf_params(config, self.pretrained_dir, tree[path[-1]])
      log.info(f"Loaded the question and answer DistilBERTs from {self.pretrained_dir}: {len(report.loaded)} tensors "
               "each")
    if not self.init_from:
      return params
    path = os.path.expanduser(self.init_from)
    if os.path.isdir(os.path.join(path, "checkpoints")):
      return self._load_run(path, params)
    params, report = justask.load_checkpoint(self.model, path, params, trust_pickles=self.config.trust_pickles)
    log.info(f"Initialised from Just Ask checkpoint {path}: {str(report).splitlines()[0]}")
    return params

  def _load_run(self, workdir: str, params: dict) -> dict:
    """Every parameter of an earlier run of this task (its newest checkpoint) that this model has with the same shape;
    the others (the verbalizer of a second stage) keep their initial values."""
    step, theirs = checkpointing.load_params(workdir)
    theirs = hf_utils.flatten_params(theirs)
    ours = hf_utils.flatten_params(params)
    taken = [k for k, v in ours.items() if k in theirs and np.shape(theirs[k]) == np.shape(v)]
    if not any(k.startswith("amodel/") for k in taken):
      raise ValueError(f"config.pretrained.init_from = {workdir}: its checkpoint holds no JustAsk answer encoder "
                       "(not a run of a :justask config?)")
    ours.update({k: np.asarray(theirs[k]) for k in taken})
    self.verbalizer_from_checkpoint = any(k.startswith("verbalizer/") for k in taken)  # a second stage's run
    log.info(f"Initialised from step {step} of {workdir}: {len(taken)} of {len(ours)} parameters "
             f"({', '.join(sorted({k.split('/')[0] for k in set(ours) - set(taken)})) or 'none'} from init)")
    return hf_utils.unflatten_params(ours)

  @property
  def trainable_patterns(self) -> tuple:
    """config.trainable, less the answer encoder when it is frozen (model.freeze_answer_encoder)."""
    patterns = tuple(self.config.trainable)
    if self.model.freeze_answer_encoder:
      patterns = tuple(f"^(?!amodel/).*(?:{p})" for p in patterns)
    return patterns

  @property
  def precomputes_aux(self) -> bool:
    """A frozen answer encoder (model.freeze_answer_encoder) with model.cache_answer_encoder: its outputs over the
    answers / graph nodes are computed once per split instead of in every step."""
    return self.model.freeze_answer_encoder and self.model.cache_answer_encoder

  def precompute_aux(self, frozen_params, aux):
    """`aux` with the frozen answer encoder's outputs in place of its tokens (justask.Model.encode_vocab), computed
    from `frozen_params` alone (which hold `amodel/` when it is frozen: trainable_patterns)."""
    if not self.precomputes_aux:
      return aux
    return self.model.apply({"params": frozen_params}, aux, method=self.model.encode_vocab)

  def train_loss(self, params, batch, rng, loss, metrics):
    """The VideoQA cross-entropy (task.py) plus, with mlm_prob > 0, the authors' masked-LM loss on the question
    (mask_tokens with their 80/10/10 rule; special and padding tokens never masked)."""
    if not self.model.mlm_prob:
      return loss, metrics
    mask_rng, drop_rng = jax.random.split(jax.random.fold_in(rng, 1))
    ids = batch["question_ids"]
    special = jnp.isin(ids, jnp.asarray(self.special_ids))
    tok = self.tokenizer
    ids, labels = justask.mask_tokens(mask_rng, ids, special, int(tok.mask_token_id), len(tok), self.model.mlm_prob)
    logits = self.model.apply({"params": params}, batch, ids, deterministic=False, rngs={"dropout": drop_rng},
                              method=self.model.mlm_logits)
    mlm = justask.mlm_loss(logits, labels)
    return loss + mlm, dict(metrics, mlm_loss=mlm, vqa_loss=loss)

  def describe(self, inp) -> str:
    vc, k, mc = self.config.verbalizer, len(inp.answers_train), self.config.model
    kind = (f"JustAsk (CVQA, top-{k} answers)" if mc.head == "cvqa" else
            f"JustAsk+ with verbalizer {vc.variant} eps={vc.eps}" if inp.use_graph else "JustAsk+")
    frozen = (f"; answer encoder frozen, its {'graph-node' if inp.use_graph else 'answer'} outputs computed "
              "once per split" if self.precomputes_aux else "; answer encoder frozen" if mc.freeze_answer_encoder
              else "")
    return (f"OVQA {kind} (multi-modal transformer {mc.n_layers}x{mc.d_model}, text towers "
            f"{self.model.text_config.num_hidden_layers}x{self.model.text_config.hidden_size}{frozen})")
