"""The FrozenBiLM backbone (`config.model.backbone = "frozenbilm"`, the OVQA configs' default): FrozenBiLM+ (optionally
with the GNN soft verbalizer) and its CVQA rows. Model: model.py; FrozenBiLM checkpoints: checkpoint.py.

Inputs: the prompt `Question: {q}? Answer: [MASK]. Subtitles: ...` (`build_prompt`) truncated and padded to
config.data.max_tokens, the [MASK] position after the config.data.num_frames visual tokens; answers (and answer-graph
node words) as at most config.data.answer_max_subwords sub-words without special tokens, embedded by the frozen LM's
input word embeddings (`tokenize_answers`).

Weights: the LM from config.pretrained.dir, then config.pretrained.init_from: a FrozenBiLM checkpoint (LM,
linear_video, adapters, LayerNorms) or an OVQA-trained one (the same, plus its GNN verbalizer).
"""

import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax import pretrained
from evqa_jax.models import encoders
from evqa_jax.projects.ovqa import model as model_lib
from evqa_jax.projects.ovqa.backbones import Backbone
from evqa_jax.projects.ovqa.backbones.text import padded_tokens


def build_prompt(question: str, subtitles: str, mask_token: str) -> str:
  """`Question: {q}? Answer: [MASK].` + ` Subtitles: {sub}`; `?` added if missing.

  q = question.capitalize().strip() as FrozenBiLM / OVQA write it: first character upper-cased, the rest lower-cased
  (so a question with leading whitespace keeps a lower-case first letter).
  """
  q = question.capitalize().strip()
  if not q:
    raise ValueError("empty question")
  if not q.endswith("?"):
    q = q + "?"
  text = f"Question: {q} Answer: {mask_token}."
  if subtitles:
    text += f" Subtitles: {subtitles.strip()}"
  return text


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


class FrozenBiLM(Backbone):
  """FrozenBiLM+ (head "open", optionally with the GNN verbalizer), its CVQA row ("cvqa") and an MLP ("cvqa_mlp")."""
  title = "FrozenBiLM"
  video_input = "features"
  heads = model_lib.HEADS
  model_class = model_lib.Model

  # The authors' `--load`: OVQA fine-tunes FrozenBiLM's pretrained checkpoint, not plain DeBERTa (another model).
  paper_checkpoint = "frozenbilm.pth"
  plain_encoder = "DeBERTa-v2"

  def text_inputs(self, inp, example: dict) -> dict:
    dc = self.config.data
    subtitles = str(example["subtitles"]) if dc.use_subtitles else ""
    text = build_prompt(str(example["question"]), subtitles, inp.mask_token)
    ids, mask = padded_tokens(inp.tokenizer, text, dc.max_tokens)
    positions = np.nonzero(ids == inp.mask_token_id)[0]
    if len(positions) != 1:
      raise ValueError(f"record {int(example['index'])} of {inp.data_dir}: the prompt holds {len(positions)} "
                       f"{inp.mask_token} tokens after truncation to config.data.max_tokens = {dc.max_tokens}")
    return {"input_ids": ids, "attention_mask": mask, "mask_index": np.int32(positions[0] + dc.num_frames)}

  def answer_tokens(self, inp, answers, pad_to: int):
    """`[pad_to, config.data.answer_max_subwords]` ids and mask."""
    return tokenize_answers(inp.tokenizer, answers, self.config.data.answer_max_subwords, pad_to)

  def build_model(self, inp):
    config = self.config
    self.pretrained_dir = pretrained.checkpoint_dir(config.pretrained)
    encoder_config = encoders.encoder_config(config.model.encoder, config.pretrained,
                                             num_visual_tokens=config.data.num_frames, visual_dim=inp.visual_dim)
    self.model = model_lib.Model(
        **config.model, encoder_config=encoder_config, num_classes=len(inp.answers_train),
        verbalizer=dict(config.verbalizer) if inp.use_graph else None, verbalizer_call=inp.verbalizer_call())
    self.encoder_config = self.model.lm_config
    return self.model

  def dummy_batch(self) -> dict:
    dc = self.config.data
    return {"input_ids": jnp.zeros((1, dc.max_tokens), jnp.int32),
            "attention_mask": jnp.ones((1, dc.max_tokens), jnp.int32),
            "mask_index": jnp.zeros((1,), jnp.int32),
            "video": jnp.zeros((1, dc.num_frames, self.encoder_config.visual_dim), jnp.float32),
            "video_mask": jnp.ones((1, dc.num_frames), jnp.int32)}

  def load_pretrained(self, params: dict) -> dict:
    """The LM from pretrained.dir, then init_from: a FrozenBiLM checkpoint (LM, linear_video, adapters, LayerNorms)
    or an OVQA-trained one (the same, plus its GNN verbalizer: checkpoint.py)."""
    encoder, init_from = self.config.model.encoder, self.init_from
    params = dict(params)
    params["lm"] = encoders.load_encoder_weights(encoder, self.encoder_config, self.pretrained_dir, params["lm"])
    self.verbalizer_from_checkpoint = False
    if init_from:
      from evqa_jax.models import deberta_v2
      from evqa_jax.projects.ovqa import checkpoint
      if encoder != "deberta_v2":
        raise ValueError("config.pretrained.init_from loads a FrozenBiLM checkpoint, which holds a DeBERTa-v2: set "
                         "config.model.encoder = 'deberta_v2'")
      path = io_lib.local_copy(init_from, "init_from")
      ckpt = checkpoint.read(path, self.config.trust_pickles)
      lm, report = deberta_v2.load_frozenbilm_checkpoint(self.encoder_config, path, params["lm"], checkpoint=ckpt)
      log.info(f"Initialised from FrozenBiLM checkpoint {init_from}: {str(report).splitlines()[0]}")
      params["lm"] = lm
      layers = checkpoint.verbalizer_weights(ckpt, path)
      if layers:
        params = checkpoint.load_verbalizer(params, layers, self.config.verbalizer, path)
        self.verbalizer_from_checkpoint = True
        log.info(f"Initialised the GNN verbalizer from {init_from} ({len(layers)} layers)")
    return params

  def describe(self, inp) -> str:
    vc, k = self.config.verbalizer, len(inp.answers_train)
    kind = {"cvqa": f"CVQA (FrozenBiLM's head, top-{k} answers)", "cvqa_mlp": f"CVQA MLP (top-{k} answers)"}.get(
        self.model.head, "FrozenBiLM+" if not inp.use_graph else f"FrozenBiLM+ with verbalizer {vc.variant} "
        f"eps={vc.eps}")
    return f"OVQA {kind} ({self.config.model.encoder})"
