"""VIOLIN: video-and-language inference (does a statement follow from a video with subtitles?).

Records: one per (clip, statement pair), see data_prep/violin.py (clip_id, pair_index, split, statement_pos,
statement_neg, subtitles, video [T_i, D], video_len). The dataset directory also holds the converter's copy of the
annotation (violin_annotation.json), the ground truth that `evaluate` scores against with the same functions as
`python -m evqa_jax.evaluate.violin`.

Models (`config.model.name`, through the `MODELS` table):
  baseline    the authors' baseline (evqa_jax.models.violin_baseline.ViolinBaseline) on token features of a FROZEN
              BERT-family encoder. The statement and the subtitles go through the encoder (last layer, one shared
              encoder); the features are under stop_gradient and the encoder's parameters live under `text_encoder/`,
              which `config.model.trainable` (default "^baseline/") leaves frozen. Both statements of a pair share the
              clip's subtitles and video; the loss is the paired loss mean(-log p(pos) - log(1 - p(neg))).
  crossmodal  evqa_jax.models.violin_crossmodal (a BERT-family LM over [video tokens; statement; subtitles] with a
              classification head): a single joint encoder, so no cached text features.

Text features (`config.model.text_features`):
  online  the encoder runs inside the jitted step (what an accelerator job does; encoder params are frozen state).
  cached  the same encoder with the same weights is run ONCE over every distinct statement and subtitle text of the
          used splits, and the step reads those features from disk. Because the encoder is frozen, deterministic and
          run per text, this is the same function (the authors also fed precomputed BERT features); it turns CPU runs
          from hours into minutes. The cache lives in `config.data.text_cache_dir` (default DATA_DIR/text_cache),
          keyed by encoder, weights, tokenizer, maximum length and the texts, so sweep points share it.

Inputs (Table 3 ablations, `config.model.use_video / use_subtitles / single_frame`): statement only, + subtitles,
+ video, + both, and the single middle frame. Video features are padded (or uniformly subsampled, first and last frame
kept) to `config.data.max_frames` with a mask.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.evaluate import json_safe
from evqa_jax.evaluate import violin as violin_eval
from evqa_jax.metrics import violin as violin_metrics
from evqa_jax.models import encoders
from evqa_jax.models import violin_baseline
from evqa_jax.tasks import base

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
TEXT_KINDS = ("statement", "subtitle")


# ---------------------------------------------------------------------------------------------------- models


class BaselineModel(nn.Module):
  """Frozen text encoder (online mode) + ViolinBaseline, scoring both statements of each pair.

  batch (online): statement_ids / statement_mask `[b, 2, Ls]` (pair order: positive, negative), subtitle_ids /
  subtitle_mask `[b, Lu]`, video `[b, T, D]`, video_mask `[b, T]`.
  batch (cached): statement_feat `[b, 2, Ls, H]` and subtitle_feat `[b, Lu, H]` instead of the ids.
  -> logits `[b, 2]` (positive, negative), pre-sigmoid. The clip (video, subtitles) is encoded once per pair.
  """
  encoder: str
  encoder_config: Any
  feature_dim: int
  online: bool
  use_video: bool
  use_subtitles: bool
  single_frame: bool = False
  middle_frame: str = "lower"
  subtitle_lstm: bool = False
  dropout: float = 0.5
  dtype: Any = jnp.float32
  hsize1: int = violin_baseline.HSIZE1
  hsize2: int = violin_baseline.HSIZE2
  embed_size: int = violin_baseline.EMBED_SIZE

  def _encode(self, encoder, ids, mask):
    # Frozen features: no gradient flows into (or through) the encoder.
    return jax.lax.stop_gradient(encoder(ids, mask, deterministic=True)["hidden"])

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True):
    hidden = self.encoder_config.hidden_size
    if self.online:
      encoder = encoders.ENCODERS[self.encoder](self.encoder_config, name="text_encoder")
      b, _, ls = batch["statement_ids"].shape
      # [b, 2, Ls] -> [2b, Ls] interleaved (row 2i positive, 2i+1 negative of pair i): rows stay on their shard.
      statement = self._encode(encoder, batch["statement_ids"].reshape(2 * b, ls),
                               batch["statement_mask"].reshape(2 * b, ls)).reshape(b, 2, ls, hidden)
      subtitles = (self._encode(encoder, batch["subtitle_ids"], batch["subtitle_mask"])
                   if self.use_subtitles else None)
    else:
      statement = batch["statement_feat"]
      subtitles = batch["subtitle_feat"] if self.use_subtitles else None
    model = violin_baseline.ViolinBaseline(
        feature_dim=self.feature_dim, text_dim=hidden, use_video=self.use_video, use_subtitles=self.use_subtitles,
        single_frame=self.single_frame, dropout=self.dropout, dtype=self.dtype, middle_frame=self.middle_frame,
        subtitle_lstm=self.subtitle_lstm, hsize1=self.hsize1, hsize2=self.hsize2, embed_size=self.embed_size,
        name="baseline")
    return model(statement.astype(self.dtype), batch["statement_mask"],
                 subtitles, batch.get("subtitle_mask") if self.use_subtitles else None,
                 batch.get("video") if self.use_video else None,
                 batch.get("video_mask") if self.use_video else None,
                 deterministic=deterministic)


def _crossmodal_class():
  return importlib.import_module("evqa_jax.models.violin_crossmodal").ViolinCrossModal


# config.model.name -> the model class (crossmodal imported lazily: it may pull in more of the encoders).
MODELS = {
    "baseline": lambda: BaselineModel,
    "crossmodal": _crossmodal_class,
}


def model_class(name: str):
  if name not in MODELS:
    raise ValueError(f"config.model.name = {name!r}: expected one of {sorted(MODELS)}")
  return MODELS[name]()


# ---------------------------------------------------------------------------------------------------- helpers


def load_tokenizer(path: str):
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from transformers import AutoTokenizer
  if not os.path.isdir(path):
    raise FileNotFoundError(
        f"config.model.tokenizer / config.model.pretrained = {path!r} is not a directory: point it at a local "
        "Hugging Face checkpoint directory (tokenizer files); nothing is downloaded at run time")
  return AutoTokenizer.from_pretrained(path)


def frame_indices(num_frames: int, max_frames: int) -> np.ndarray:
  """All frames when they fit, else `max_frames` indices spread uniformly (first and last kept), as the converter."""
  if num_frames <= max_frames:
    return np.arange(num_frames)
  return np.round(np.linspace(0, num_frames - 1, max_frames)).astype(np.int64)


def pad_video(video: np.ndarray, video_len: int, max_frames: int) -> tuple[np.ndarray, np.ndarray]:
  """[T_i, D] -> ([max_frames, D] float32, [max_frames] int32 mask)."""
  video = np.asarray(video, np.float32)[:video_len]
  video = video[frame_indices(len(video), max_frames)]
  out = np.zeros((max_frames, video.shape[1]), np.float32)
  out[:len(video)] = video
  mask = np.zeros((max_frames,), np.int32)
  mask[:len(video)] = 1
  return out, mask


def subtitle_text(entry: dict) -> str:
  """The record's `subtitles` string from an annotation entry: stripped non-empty lines joined by one space."""
  lines = [str(line[0]).strip() for line in entry.get("sub", [])]
  return " ".join(line for line in lines if line)


class TextFeatureCache:
  """Frozen-encoder features of a fixed list of texts: `[N, max_len, H]` float32 + valid lengths, on disk.

  Opened lazily and memory-mapped; pickles without the arrays (Grain workers reopen the file).
  """

  def __init__(self, path: str):
    self.path = path
    with open(path + ".json") as f:
      meta = json.load(f)
    self.row = {t: i for i, t in enumerate(meta["texts"])}
    self.lengths = np.asarray(meta["lengths"], np.int32)
    self.max_len = int(meta["max_len"])
    self._features = None

  @property
  def features(self) -> np.ndarray:
    if self._features is None:
      self._features = np.load(self.path + ".npy", mmap_mode="r")
    return self._features

  def lookup(self, text: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    i = self.row.get(text)
    if i is None:
      raise KeyError(f"{where}: text {text[:80]!r} is not in the text-feature cache {self.path}.npy (the cache "
                     "was built from the annotation JSON; records and annotation disagree)")
    mask = (np.arange(self.max_len) < self.lengths[i]).astype(np.int32)
    return np.asarray(self.features[i], np.float32), mask

  def __getstate__(self):
    return dict(self.__dict__, _features=None)


class IndexedSource:
  """A record source whose examples also carry `index` (the record's position in the split)."""

  def __init__(self, source):
    self.source = source

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    example = dict(self.source[i])
    example["index"] = np.int32(i)
    return example

  def __repr__(self) -> str:
    return f"Indexed({self.source!r})"


# ---------------------------------------------------------------------------------------------------- task


class ViolinTask(base.Task):
  main_metric = "accuracy"

  def __init__(self, config):
    super().__init__(config)
    dc, mc = config.data, config.model
    self.data_dir = os.path.expanduser(dc.dir)
    if dc.synthetic:
      self._build_synthetic_world()
    elif not os.path.exists(os.path.join(self.data_dir, "metadata.json")):
      raise FileNotFoundError(
          f"config.data.dir = {dc.dir!r} holds no converted VIOLIN records (no metadata.json). Convert the "
          "release first:\n  python -m data_prep.violin --annotation violin_annotation.json --features "
          f"<features>.h5 --feature {dc.feature} --out {dc.dir}\nor run the demo variant "
          "(--config=configs/violin.py:demo) on the built-in synthetic world.")
    self.metadata = records.load_metadata(self.data_dir)
    feature_dim = int(self.metadata.get("feature_dim", dc.feature_dim))
    if feature_dim != dc.feature_dim:
      raise ValueError(f"config.data.feature_dim = {dc.feature_dim} but the records in {self.data_dir} hold "
                       f"{self.metadata.get('feature', '?')} features of dimension {feature_dim}")
    self.feature_dim = feature_dim
    ann_path = os.path.join(self.data_dir, self.metadata.get("annotation_file", "violin_annotation.json"))
    if not os.path.exists(ann_path):
      raise FileNotFoundError(f"{ann_path} is missing: the VIOLIN converter keeps the annotation next to the "
                              "records as the ground truth for evaluation")
    self.annotation_path = ann_path
    self.clips = violin_eval.read_annotation(ann_path)
    self.clip_ids = list(self.clips)
    self.clip_index = {c: i for i, c in enumerate(self.clip_ids)}
    types_file = (self.metadata.get("synthetic") or {}).get("statement_types_file")
    self.statement_types = None
    if types_file and os.path.exists(os.path.join(self.data_dir, types_file)):
      with open(os.path.join(self.data_dir, types_file)) as f:
        self.statement_types = json.load(f)

    if mc.name not in MODELS:
      raise ValueError(f"config.model.name = {mc.name!r}: expected one of {sorted(MODELS)}")
    if mc.text_features not in ("online", "cached"):
      raise ValueError(f"config.model.text_features = {mc.text_features!r}: expected 'online' or 'cached'")
    if mc.single_frame and not mc.use_video:
      raise ValueError("config.model.single_frame = True needs config.model.use_video = True")
    self.online = mc.text_features == "online" or mc.name == "crossmodal"
    self.pretrained_dir = pretrained.resolve(mc.pretrained) if mc.pretrained else None
    tokenizer_dir = mc.tokenizer or mc.pretrained
    if not tokenizer_dir:
      raise ValueError("config.model.tokenizer and config.model.pretrained are both empty: one must name a local "
                       "Hugging Face directory with the tokenizer")
    self.tokenizer = load_tokenizer(pretrained.resolve(tokenizer_dir))
    self.encoder_config = self._make_encoder_config()
    self._encoder_params = None
    self._caches: dict[str, TextFeatureCache] = {}
    self.model = self._make_model()
    if not self.online:  # build (or open) the caches now, not inside the data loader's first batch
      self.text_cache("statement")
      if mc.use_subtitles:
        self.text_cache("subtitle")

  # -- set-up ---------------------------------------------------------------------------------------------------
  def _build_synthetic_world(self) -> None:
    """Generates the built-in synthetic world (data_prep.synthetic_violin.ensure_world) into the parent of
    config.data.dir, unless a complete one is there already."""
    from data_prep import synthetic_violin
    preset = self.config.data.synthetic
    if preset not in synthetic_violin.PRESETS:
      raise ValueError(f"config.data.synthetic = {preset!r}: expected '' or one of {list(synthetic_violin.PRESETS)}")
    if os.path.basename(os.path.normpath(self.data_dir)) != "records":
      raise ValueError(f"config.data.dir = {self.config.data.dir!r}: the synthetic world writes WORLD/records, so "
                       "the directory must be named 'records'")
    synthetic_violin.ensure_world(os.path.dirname(os.path.abspath(self.data_dir)), preset)

  def _make_encoder_config(self):
    mc = self.config.model
    cfg_cls = encoders.config_class(mc.encoder)
    overrides = dict(dtype=_DTYPES[mc.dtype])
    if mc.name == "crossmodal":  # the LM reads the frames itself: one visual token per frame slot
      overrides.update(num_visual_tokens=self.config.data.max_frames, visual_dim=self.feature_dim,
                       use_adapters=mc.use_adapters)
    if mc.shape:  # explicit architecture (tests), else the checkpoint's config.json
      return cfg_cls.from_dict(dict(mc.shape), **overrides)
    if self.pretrained_dir is None or not os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
      raise FileNotFoundError(
          f"config.model.pretrained = {mc.pretrained!r} has no config.json: point it at a local Hugging Face "
          "BERT checkpoint directory (the authors use BERT-base fine-tuned on VIOLIN text), or set "
          "config.model.shape")
    return cfg_cls.from_hf_dir(self.pretrained_dir, **overrides)

  def _make_model(self):
    mc = self.config.model
    cls = model_class(mc.name)
    if mc.name == "baseline":
      return cls(encoder=mc.encoder, encoder_config=self.encoder_config, feature_dim=self.feature_dim,
                 online=self.online, use_video=mc.use_video, use_subtitles=mc.use_subtitles,
                 single_frame=mc.single_frame, middle_frame=mc.middle_frame, subtitle_lstm=mc.subtitle_lstm,
                 dropout=mc.dropout, dtype=_DTYPES[mc.dtype], hsize1=mc.hsize1, hsize2=mc.hsize2,
                 embed_size=mc.embed_size)
    return cls(encoder=mc.encoder, encoder_config=self.encoder_config, use_video=mc.use_video,
               use_subtitles=mc.use_subtitles, single_frame=mc.single_frame, dropout=mc.dropout,
               middle_frame=mc.middle_frame)

  def encoder_params(self) -> dict:
    """Host params of the frozen text encoder: the pretrained checkpoint, else a seeded random init (tests)."""
    if self._encoder_params is None:
      mc = self.config.model
      module = encoders.ENCODERS[mc.encoder](self.encoder_config)
      ids = jnp.ones((1, 8), jnp.int32)
      kwargs = {}
      if self.encoder_config.num_visual_tokens:
        kwargs["visual"] = jnp.zeros((1, self.encoder_config.num_visual_tokens, self.encoder_config.visual_dim))
      init = jax.jit(lambda r: nn.meta.unbox(module.init(r, ids, jnp.ones_like(ids), **kwargs)["params"]))(
          jax.random.key(mc.encoder_seed))
      params = init
      if self.pretrained_dir and os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
        params, report = encoders.load_hf_params(mc.encoder, self.encoder_config, self.pretrained_dir, init)
        print(f"text encoder: {str(report).splitlines()[0]}", flush=True)
      self._encoder_params = jax.tree.map(np.asarray, params)
    return self._encoder_params

  def _weights_identity(self) -> str:
    if self.pretrained_dir and os.path.exists(os.path.join(self.pretrained_dir, "config.json")):
      files = sorted(f for f in os.listdir(self.pretrained_dir) if f.endswith((".safetensors", ".bin")))
      stats = [(f, os.path.getsize(os.path.join(self.pretrained_dir, f))) for f in files]
      return f"{os.path.abspath(self.pretrained_dir)}:{stats}"
    return f"random-init:seed={self.config.model.encoder_seed}"

  # -- text -----------------------------------------------------------------------------------------------------
  def max_len(self, kind: str) -> int:
    dc = self.config.data
    return dc.max_statement_tokens if kind == "statement" else dc.max_subtitle_tokens

  def tokenize(self, text: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    enc = self.tokenizer(text, max_length=self.max_len(kind), truncation=True, padding="max_length")
    return np.asarray(enc["input_ids"], np.int32), np.asarray(enc["attention_mask"], np.int32)

  def _texts(self, kind: str) -> list[str]:
    """Distinct texts of `kind` over the clips of the splits this run uses, in annotation order."""
    dc = self.config.data
    splits = {dc.train_split, *dc.eval_splits}
    with open(self.annotation_path) as f:
      ann = json.load(f)
    out = {}
    for entry in ann.values():
      if entry.get("split") not in splits:
        continue
      if kind == "statement":
        for pair in entry["statement"]:
          for s in pair:
            out[str(s).strip()] = None
      else:
        out[subtitle_text(entry)] = None
    return list(out)

  def text_cache(self, kind: str) -> TextFeatureCache:
    """The frozen-encoder features of every `kind` text of the used splits, computed once and kept on disk."""
    if kind in self._caches:
      return self._caches[kind]
    mc, dc = self.config.model, self.config.data
    texts = self._texts(kind)
    max_len = self.max_len(kind)
    encoder_fields = {k: str(v) for k, v in dataclasses.asdict(self.encoder_config).items()}
    key_src = json.dumps({"encoder": mc.encoder, "config": encoder_fields, "weights": self._weights_identity(),
                          "tokenizer": str(getattr(self.tokenizer, "name_or_path", "")), "vocab": len(self.tokenizer),
                          "max_len": max_len, "texts": hashlib.sha1("\n".join(texts).encode()).hexdigest()},
                         sort_keys=True)
    key = hashlib.sha1(key_src.encode()).hexdigest()[:16]
    cache_dir = os.path.expanduser(dc.text_cache_dir) if dc.text_cache_dir else os.path.join(self.data_dir,
                                                                                           "text_cache")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{kind}-{key}")
    with io_lib.file_lock(os.path.join(cache_dir, ".lock")):
      if not (os.path.exists(path + ".npy") and os.path.exists(path + ".json")):
        self._build_cache(path, texts, kind, key_src)
    self._caches[kind] = TextFeatureCache(path)
    return self._caches[kind]

  def _build_cache(self, path: str, texts: list[str], kind: str, key_src: str) -> None:
    import time
    max_len = self.max_len(kind)
    hidden = self.encoder_config.hidden_size
    ids = np.zeros((len(texts), max_len), np.int32)
    mask = np.zeros((len(texts), max_len), np.int32)
    for i, t in enumerate(texts):
      ids[i], mask[i] = self.tokenize(t, kind)
    lengths = mask.sum(-1)
    module = encoders.ENCODERS[self.config.model.encoder](self.encoder_config)
    encode = jax.jit(lambda p, i, m: module.apply({"params": p}, i, m, deterministic=True)["hidden"])
    params = jax.tree.map(jnp.asarray, self.encoder_params())
    feats = np.zeros((len(texts), max_len, hidden), np.float32)
    # Length buckets: texts sorted by length, each batch padded only to its longest text rounded up to 8; masked
    # padding keys leave the valid positions' features unchanged.
    order = np.argsort(lengths, kind="stable")
    bs = self.config.data.text_cache_batch_size
    t0 = time.time()
    print(f"text-feature cache: encoding {len(texts)} {kind} texts (max {max_len} tokens) -> {path}.npy", flush=True)
    for start in range(0, len(texts), bs):
      rows = order[start:start + bs]
      width = min(max_len, max(8, -(-int(lengths[rows].max()) // 8) * 8))
      pad = bs - len(rows)
      bi = np.pad(ids[rows, :width], ((0, pad), (0, 0)))
      bm = np.pad(mask[rows, :width], ((0, pad), (0, 0)))
      out = np.asarray(encode(params, bi, bm), np.float32)[:len(rows)]
      out = out * mask[rows, :width, None]  # padded positions hold zeros, as the model never reads them
      feats[rows, :width] = out
    with io_lib.atomic_path(path + ".npy") as tmp:
      with open(tmp, "wb") as f:
        np.save(f, feats)
    io_lib.write_json(path + ".json", {"texts": texts, "lengths": lengths.tolist(), "max_len": max_len,
                                       "key": json.loads(key_src)})
    print(f"text-feature cache: {kind} done in {time.time() - t0:.0f}s", flush=True)

  # -- data -----------------------------------------------------------------------------------------------------
  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    missing = {"clip_id", "pair_index", "statement_pos", "statement_neg", "subtitles", "video",
               "video_len"} - set(spec)
    if missing:
      raise ValueError(f"{self.data_dir} split {split!r}: records lack the VIOLIN fields {sorted(missing)}")
    return IndexedSource(source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
                                                       on_corrupt=self.config.data.on_corrupt))

  def preprocess(self, example: dict, train: bool) -> dict:
    del train
    mc, dc = self.config.model, self.config.data
    index = int(example["index"])
    clip_id = str(example["clip_id"])
    where = f"record {index} (clip {clip_id!r}, pair {int(example['pair_index'])}) of {self.data_dir}"
    if clip_id not in self.clip_index:
      raise ValueError(f"{where}: clip is not in the annotation {self.annotation_path}")
    statements = [str(example["statement_pos"]).strip(), str(example["statement_neg"]).strip()]
    out = {"index": np.int32(index), "clip": np.int32(self.clip_index[clip_id]),
           "pair": np.int32(example["pair_index"])}
    if self.online:
      toks = [self.tokenize(s, "statement") for s in statements]
      out["statement_ids"] = np.stack([t[0] for t in toks])
      out["statement_mask"] = np.stack([t[1] for t in toks])
    else:
      cache = self.text_cache("statement")
      feats = [cache.lookup(s, where) for s in statements]
      out["statement_feat"] = np.stack([f[0] for f in feats])
      out["statement_mask"] = np.stack([f[1] for f in feats])
    if mc.use_subtitles:
      sub = str(example["subtitles"])
      if self.online:
        out["subtitle_ids"], out["subtitle_mask"] = self.tokenize(sub, "subtitle")
      else:
        out["subtitle_feat"], out["subtitle_mask"] = self.text_cache("subtitle").lookup(sub, where)
    if mc.use_video:
      video = np.asarray(example["video"])
      if video.ndim != 2 or video.shape[1] != self.feature_dim:
        raise ValueError(f"{where}: field 'video' has shape {video.shape}, expected [T, {self.feature_dim}]")
      video_len = int(example["video_len"])
      if not 0 <= video_len <= len(video):
        raise ValueError(f"{where}: field 'video_len' = {video_len} but 'video' has {len(video)} frames")
      out["video"], out["video_mask"] = pad_video(video, video_len, dc.max_frames)
    return out

  # -- model ----------------------------------------------------------------------------------------------------
  def _dummy_batch(self):
    mc, dc = self.config.model, self.config.data
    ls, lu, h = dc.max_statement_tokens, dc.max_subtitle_tokens, self.encoder_config.hidden_size
    batch = {"statement_mask": jnp.ones((1, 2, ls), jnp.int32)}
    if self.online:
      batch["statement_ids"] = jnp.ones((1, 2, ls), jnp.int32)
    else:
      batch["statement_feat"] = jnp.zeros((1, 2, ls, h), jnp.float32)
    if mc.use_subtitles:
      batch["subtitle_mask"] = jnp.ones((1, lu), jnp.int32)
      if self.online:
        batch["subtitle_ids"] = jnp.ones((1, lu), jnp.int32)
      else:
        batch["subtitle_feat"] = jnp.zeros((1, lu, h), jnp.float32)
    if mc.use_video:
      batch["video"] = jnp.zeros((1, dc.max_frames, self.feature_dim), jnp.float32)
      batch["video_mask"] = jnp.ones((1, dc.max_frames), jnp.int32)
    return batch

  def init_params(self, rng):
    return self.model.init({"params": rng, "dropout": rng}, self._dummy_batch(), deterministic=True)["params"]

  def load_pretrained(self, params: dict) -> dict:
    params = dict(params)
    if "text_encoder" in params:
      enc = self.encoder_params()
      ours = jax.tree.structure(params["text_encoder"])
      if jax.tree.structure(enc) != ours:
        raise ValueError("text encoder parameters from the checkpoint do not match the model's parameter tree")
      params["text_encoder"] = enc
    return params

  @property
  def trainable_patterns(self) -> tuple:
    return tuple(self.config.model.trainable)

  def _logits(self, params, batch, rng, train: bool):
    rngs = {"dropout": rng} if train else {}
    return self.model.apply({"params": params}, batch, deterministic=not train, rngs=rngs)

  def loss(self, params, batch, aux, rng, train: bool = True):
    del aux
    logits = self._logits(params, batch, rng, train)
    pos, neg = logits[:, 0], logits[:, 1]
    if "_valid" in batch:  # evaluation batches padded to the static shape
      valid = batch["_valid"] > 0
      per_pair = -jax.nn.log_sigmoid(pos) - jax.nn.log_sigmoid(-neg)
      n = jnp.maximum(jnp.sum(valid), 1)
      loss = jnp.sum(jnp.where(valid, per_pair, 0.0)) / n
      correct = jnp.sum(jnp.where(valid, (pos >= 0).astype(jnp.int32) + (neg < 0).astype(jnp.int32), 0))
      return loss, {"accuracy": correct / (2 * n)}
    loss = violin_baseline.paired_loss(pos, neg)
    correct, total = violin_baseline.violin_accuracy(pos, neg)
    return loss, {"accuracy": correct / total}

  def predict(self, params, batch, aux) -> dict:
    del aux
    probs = jax.nn.sigmoid(self._logits(params, batch, None, train=False).astype(jnp.float32))
    return {"p_pos": probs[:, 0], "p_neg": probs[:, 1], "clip": batch["clip"], "pair": batch["pair"]}

  # -- evaluation -----------------------------------------------------------------------------------------------
  def predictions_json(self, outputs: dict) -> dict:
    """Per-record outputs -> the evaluator's {clip_id: [[p_pos, p_neg] x pairs]}; incomplete clips are left out
    (the evaluator then counts them wrong)."""
    per_clip: dict[str, dict[int, list]] = {}
    for c, j, pp, pn in zip(outputs["clip"], outputs["pair"], outputs["p_pos"], outputs["p_neg"]):
      per_clip.setdefault(self.clip_ids[int(c)], {})[int(j)] = [float(pp), float(pn)]
    out = {}
    for clip_id, pairs in per_clip.items():
      n = len(self.clips[clip_id]["statement"])
      if sorted(pairs) == list(range(n)):
        out[clip_id] = [pairs[j] for j in range(n)]
      else:
        print(f"WARNING: clip {clip_id} has predictions for pairs {sorted(pairs)} of {n}; left out (counted wrong)",
              flush=True)
    return out

  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    pred_path = os.path.join(out_dir, "predictions.json")
    io_lib.write_json(pred_path, self.predictions_json(outputs))
    # The same reading, validation and scoring as `python -m evqa_jax.evaluate.violin --gt ... --split split`.
    preds = violin_eval.read_predictions(pred_path, self.clips)
    full = violin_metrics.violin_metrics(self.clips, preds, [split])
    metrics = {k: full[k] for k in ("accuracy", "num_statements", "num_correct", "num_clips", "num_missing_clips")}
    if self.statement_types is not None:
      metrics.update(self._accuracy_by_type(split, preds))
    metrics = json_safe(metrics)
    io_lib.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return metrics

  def _accuracy_by_type(self, split: str, preds: dict) -> dict:
    """Synthetic world only: accuracy per statement type (visual / dialogue / combined) and negative kind."""
    groups: dict[str, list] = {}
    for clip_id, clip in self.clips.items():
      if clip["split"] != split or clip_id not in self.statement_types:
        continue
      probs = preds.get(clip_id)
      for j, (stype, neg_kind) in enumerate(self.statement_types[clip_id]):
        pair = probs[j] if probs is not None else [0.0, 1.0]  # a missing clip counts wrong, as the evaluator
        for key in (stype, f"neg_{neg_kind}"):
          groups.setdefault(key, []).append(pair)
    out = {}
    for key, pairs in sorted(groups.items()):
      arr = np.asarray(pairs, np.float64)
      out[f"accuracy_{key}"] = violin_metrics.violin_accuracy(arr[:, 0], arr[:, 1])
    return out

  def describe(self) -> str:
    mc = self.config.model
    inputs = ["statement"] + (["subtitles"] if mc.use_subtitles else []) + (
        ["video (single middle frame)" if mc.single_frame else "video"] if mc.use_video else [])
    return (f"VIOLIN {mc.name} ({mc.encoder} text, {mc.text_features} features; inputs: {' + '.join(inputs)}; "
            f"{self.config.data.feature} features)")
