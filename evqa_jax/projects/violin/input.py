"""VIOLIN input: records, the annotation (ground truth), tokenisation, video padding and the frozen text features.

Records: one per (clip, statement pair), see data_prep/violin.py (clip_id, pair_index, split, statement_pos,
statement_neg, subtitles, video [T_i, D], video_len). The dataset directory also holds the converter's copy of the
annotation (violin_annotation.json), the ground truth that evaluator.py scores against.

Text features (`config.model.text_features`, baseline model):
  online  the encoder runs inside the jitted step (what an accelerator job does; encoder params are frozen state).
  cached  the same encoder with the same weights is run ONCE over every distinct statement and subtitle text of the
          used splits, and the step reads those features from disk (`TextFeatureCache`). Because the encoder is
          frozen, deterministic and run per text, this is the same function (the authors also fed precomputed BERT
          features); it turns CPU runs from hours into minutes. The cache lives in `config.data.text_cache_dir`
          (default DATA_DIR/text_cache), keyed by encoder, weights, tokenizer, text preprocessing, maximum length and
          the texts, so sweep points share it and a change of any of them never reuses an old cache.

Text preprocessing (`config.data.text_preprocessing`): `authors` runs statements and subtitles through the authors'
clean_str + lower case (evqa_jax/violin_text.py) before the tokenizer, as their violin_dataset.py; `none` tokenizes the
text as released. Tokens are [CLS] + word pieces cut to max_len - 2 + [SEP], padded: their tokenize_and_pad.

GloVe text (`config.model.encoder = "glove"`, configs/violin.py:glove, Table 3's GloVe rows): the authors' VIOLIN
release has no GloVe code, so the text path is that of the TVQA code it is built on (jayleicn/TVQA tvqa_dataset.py):
words = the preprocessed text lower-cased and split on whitespace, "," tokens dropped, "<eos>" appended
(`line_to_words`); ids <pad> 0, <unk> 1, <eos> 2, then the words of the training split's statements and subtitles
that occur at least `config.word_vectors.min_word_count` times (TVQA: 2), in first-seen order (`build_word_vocabulary`);
other words are <unk>. The table row of a word is its GloVe vector (`config.word_vectors.source`, exact match), else
N(0, 0.4^2) as TVQA draws it; it is computed once and cached next to the text features (`WordTable`).

Video features are padded (or uniformly subsampled, first and last frame kept) to `config.data.max_frames` with a mask.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax import pretrained
from evqa_jax import violin_text
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.evaluate import violin as violin_eval
from evqa_jax.models import encoders
from evqa_jax.runs import checkpointing


# config.data.text_preprocessing values (see the module docstring).
TEXT_PREPROCESSING = ("authors", "none")

# TVQA's special words (tvqa_dataset.py word2idx) and the std of the random vectors of words GloVe lacks.
PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
UNKNOWN_WORD_STD = 0.4


def glove_words(text: str) -> list[str]:
  """TVQA's line_to_words: lower case, whitespace split, "," tokens dropped, "<eos>" appended."""
  return [w for w in text.lower().split() if w != ","] + [EOS]


def build_vocabulary(texts, min_count: int) -> list[str]:
  """[PAD, UNK, EOS] + the words of `texts` (glove_words) seen >= min_count times, in first-seen order."""
  counts = collections.Counter()
  for t in texts:
    counts.update(glove_words(t))
  specials = [PAD, UNK, EOS]
  return specials + [w for w in counts if counts[w] >= min_count and w not in specials]


class WordTable:
  """The word vocabulary of the training text and its GloVe-initialised table `[vocab, dim]` float32.

  The table is built once per (GloVe file, vocabulary, dim, seed) and cached as `glove-<key>.npy` in the text-cache
  folder (reading GloVe 840B takes minutes).
  """

  def __init__(self, words: list[str], source: str, dim: int, seed: int, cache_dir: str):
    self.words = words
    self.index = {w: i for i, w in enumerate(words)}
    self.source, self.dim, self.seed, self.cache_dir = source, int(dim), int(seed), cache_dir

  def __len__(self) -> int:
    return len(self.words)

  def ids(self, text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) `[max_len]` int32 of a preprocessed text; words beyond max_len are cut (the last may be <eos>)."""
    ids = [self.index.get(w, 1) for w in glove_words(text)][:max_len]
    out = np.zeros((max_len,), np.int32)
    out[:len(ids)] = ids
    mask = np.zeros((max_len,), np.int32)
    mask[:len(ids)] = 1
    return out, mask

  def _key(self) -> str:
    path = pretrained.resolve(self.source)
    stat = os.stat(path) if os.path.isfile(path) else None
    src = json.dumps({"source": os.path.abspath(path), "size": stat.st_size if stat else None,
                      "mtime": stat.st_mtime if stat else None, "dim": self.dim, "seed": self.seed,
                      "words": hashlib.sha1("\n".join(self.words).encode()).hexdigest()}, sort_keys=True)
    return hashlib.sha1(src.encode()).hexdigest()[:16]

  def matrix(self) -> np.ndarray:
    """`[vocab, dim]` float32: GloVe vectors where GloVe has the word, N(0, 0.4^2) (seeded) elsewhere."""
    from evqa_jax.graphs import word_vectors  # only the GloVe path reads word vectors
    os.makedirs(self.cache_dir, exist_ok=True)
    path = os.path.join(self.cache_dir, f"glove-{self._key()}.npy")
    with io_lib.file_lock(os.path.join(self.cache_dir, ".lock")):
      if not os.path.exists(path):
        t0 = time.time()
        log.info(f"word table: looking up {len(self.words)} words in {self.source} -> {path}")
        found = word_vectors.lookup_vectors(self.source, self.words, self.dim)
        table = (np.random.default_rng(self.seed).standard_normal((len(self.words), self.dim)) *
                 UNKNOWN_WORD_STD).astype(np.float32)
        for i, w in enumerate(self.words):
          if w in found:
            table[i] = found[w]
        with io_lib.atomic_path(path) as tmp:
          with open(tmp, "wb") as f:
            np.save(f, table)
        log.info(f"word table: {len(found)} of {len(self.words)} words in GloVe ({time.time() - t0:.0f}s)")
      return np.load(path)


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


def _encoder_init(encoder: str, encoder_config):
  """rng -> plain (unboxed) params of the text encoder `encoder_config` on dummy inputs."""
  module = encoders.ENCODERS[encoder](encoder_config)
  kwargs = encoders.dummy_inputs(encoder, encoder_config)
  ids, mask = kwargs.pop("input_ids"), kwargs.pop("attention_mask")
  return lambda r: nn.meta.unbox(module.init(r, ids, mask, **kwargs)["params"])


def frozen_encoder_params(encoder: str, encoder_config, pretrained_dir, seed: int) -> dict:
  """Host params of the frozen text encoder: the pretrained checkpoint, else a seeded random init (tests)."""
  init = jax.jit(_encoder_init(encoder, encoder_config))(jax.random.key(seed))
  params = encoders.load_encoder_weights(encoder, encoder_config, pretrained_dir, init)
  return jax.tree.map(np.asarray, params)


def fine_tuned_encoder_params(init_from: str, encoder: str, encoder_config,
                              allow_unverified: bool = False) -> tuple[dict, str]:
  """`config.pretrained.init_from`: the text encoder of the newest checkpoint of the BERT fine-tuning stage's workdir
  (configs/violin_bert_ft.py, params under `text_encoder/`) -> (host float32 params, what they are: the cache key).

  The checkpoint's tree and shapes must be those of `encoder_config` (config.pretrained.dir / shape); errors name
  config.pretrained.init_from.
  """
  key = f"config.pretrained.init_from = {init_from!r}"
  workdir = io_lib.absolute(init_from)  # local or gs://...
  stage = f"python launch/train.py --config=configs/violin_bert_ft.py --workdir={init_from}"
  cfg_path = os.path.join(workdir, "config.json")
  if not io_lib.epath_of(cfg_path).exists():
    raise FileNotFoundError(f"{key}: {workdir} is not a workdir (no config.json). It must be the workdir of the BERT "
                            f"fine-tuning stage ({stage}), or '' to use the weights of config.pretrained.dir")
  written = io_lib.load_json(cfg_path, "workdir config").get("config", {})
  if written.get("model_name") != "bert_mlm":
    raise ValueError(f"{key}: {cfg_path} records a {written.get('task')!r} run of model {written.get('model_name')!r}, "
                     "not the BERT fine-tuning stage (model_name 'bert_mlm', configs/violin_bert_ft.py)")
  try:
    step, params = checkpointing.load_params(workdir, allow_unverified=allow_unverified)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{key}: {e}; run the fine-tuning stage to its end first ({stage})") from None
  params = params.get("text_encoder")
  expected = jax.eval_shape(_encoder_init(encoder, encoder_config), jax.random.key(0))
  flat = traverse_util.flatten_dict(params or {}, sep="/")
  want = traverse_util.flatten_dict(expected, sep="/")
  bad = sorted(set(want) ^ set(flat)) + sorted(k for k in set(want) & set(flat) if flat[k].shape != want[k].shape)
  if bad:
    shown = ", ".join(f"{k} ({tuple(flat[k].shape) if k in flat else 'absent'} in the checkpoint, "
                      f"{tuple(want[k].shape) if k in want else 'absent'} here)" for k in bad[:3])
    raise ValueError(f"{key}: the text encoder of {workdir} (step {step}) does not fit this config's encoder "
                     f"(config.pretrained.dir / config.pretrained.shape): {len(bad)} parameter(s) differ, e.g. {shown}")
  digest = hashlib.sha1()
  for k in sorted(flat):
    digest.update(k.encode())
    digest.update(np.ascontiguousarray(flat[k], np.float32).tobytes())
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  log.info(f"Text encoder from the fine-tuning stage {workdir} (step {step})")
  return params, f"init_from:{workdir}:step={step}:sha1={digest.hexdigest()}"


def _file_sha1(path: str) -> str:
  digest = hashlib.sha1()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 24), b""):
      digest.update(chunk)
  return digest.hexdigest()


def weights_identity(pretrained_dir, seed: int) -> str:
  """What the frozen encoder's weights are (checkpoint files and their contents, or the random seed): part of the
  cache key, so that other weights in the same folder (e.g. the authors' fine-tuned BERT) never reuse a cache."""
  if pretrained.has_checkpoint(pretrained_dir):
    files = sorted(f for f in os.listdir(pretrained_dir) if f.endswith((".safetensors", ".bin")))
    stats = [(f, _file_sha1(os.path.join(pretrained_dir, f))) for f in files]
    return f"{os.path.abspath(pretrained_dir)}:{stats}"
  return f"random-init:seed={seed}"


class TextFeatureCache:
  """Frozen-encoder features of a fixed list of texts: `[N, max_len, H]` float32 + valid lengths, on disk.

  Opened lazily and memory-mapped; pickles without the arrays (Grain workers reopen the file).
  """

  def __init__(self, path: str):
    self.path = path
    meta = io_lib.load_json(path + ".json", "text feature cache index")
    self.row = {t: i for i, t in enumerate(meta["texts"])}
    self.lengths = np.asarray(meta["lengths"], np.int32)
    self.max_len = int(meta["max_len"])
    self._features = None

  @property
  def features(self) -> np.ndarray:
    if self._features is None:
      self._features = io_lib.load_npy(self.path + ".npy", mmap_mode="r")  # no pickles; errors name the file
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


class Input:
  """Reads config.data.dir: `source`, `preprocess` for the trainer; the annotation for the evaluator.

  online: the batch carries token ids (the model encodes them); else it carries cached features, which need
  `use_text_encoder(encoder, encoder_config, params_fn, identity)` first.
  """

  def __init__(self, config, online: bool):
    self.config = config
    dc = config.data
    self.online = online
    self.data_dir = os.path.expanduser(dc.dir)
    records.require_records(
        config, "VIOLIN", "python -m data_prep.violin --annotation violin_annotation.json --features "
        f"<features>.h5 --feature {dc.feature} --out {dc.dir}", "configs/violin.py:demo")
    self.metadata = records.load_metadata(self.data_dir)
    feature_dim = int(self.metadata.get("feature_dim", dc.feature_dim))
    if feature_dim != dc.feature_dim:
      raise ValueError(f"config.data.feature_dim = {dc.feature_dim} but the records in {self.data_dir} hold "
                       f"{self.metadata.get('feature', '?')} features of dimension {feature_dim}")
    self.feature_dim = feature_dim
    ann_path = os.path.join(self.data_dir, self.metadata.get("annotation_file", "violin_annotation.json"))
    if not io_lib.epath_of(ann_path).exists():  # local or gs://...
      raise FileNotFoundError(f"{ann_path} is missing: the VIOLIN converter keeps the annotation next to the "
                              "records as the ground truth for evaluation")
    self.annotation_path = ann_path
    self.clips = violin_eval.read_annotation(ann_path)
    self.clip_ids = list(self.clips)
    self.clip_index = {c: i for i, c in enumerate(self.clip_ids)}
    types_file = (self.metadata.get("synthetic") or {}).get("statement_types_file")
    self.statement_types = None
    if types_file and io_lib.epath_of(os.path.join(self.data_dir, types_file)).exists():
      self.statement_types = io_lib.load_json(os.path.join(self.data_dir, types_file), "statement types")
    if dc.text_preprocessing not in TEXT_PREPROCESSING:
      raise ValueError(f"config.data.text_preprocessing = {dc.text_preprocessing!r}: expected one of "
                       f"{TEXT_PREPROCESSING}")
    self.words = None
    if config.model.get("encoder") == "glove":  # word ids over the training text's vocabulary (module docstring)
      wc = config.word_vectors
      train = [self.model_text(t, kind) for kind in ("statement", "subtitle")
               for t in self.texts(kind, [dc.train_split])]
      self.words = WordTable(build_vocabulary(train, wc.min_word_count), wc.source, wc.dim, config.seed,
                             self.text_cache_dir())
      self.tokenizer = None
    else:
      self.tokenizer = pretrained.load_tokenizer(config.pretrained)
    self._encoder = None
    self._caches: dict[str, TextFeatureCache] = {}

  def use_text_encoder(self, encoder: str, encoder_config, params_fn, identity: str) -> None:
    """The frozen encoder whose features `text_cache` stores; `params_fn()` gives its host params (called only when
    a cache has to be built)."""
    self._encoder = (encoder, encoder_config, params_fn, identity)

  # -- text -----------------------------------------------------------------------------------------------------
  def max_len(self, kind: str) -> int:
    dc = self.config.data
    return dc.max_statement_tokens if kind == "statement" else dc.max_subtitle_tokens

  def model_text(self, text: str, kind: str) -> str:
    """What the encoder reads of a record's statement or subtitles (`config.data.text_preprocessing`).

    The records hold a clip's subtitle lines stripped and joined by one space. clean_str acts within a line and a
    space never starts a match, so cleaning the joined string gives the authors' per-line join up to whitespace,
    which the tokenizer drops.
    """
    if self.config.data.text_preprocessing == "none":
      return text
    return violin_text.statement_text(text) if kind == "statement" else violin_text.subtitles_text([text])

  def text_cache_dir(self) -> str:
    dc = self.config.data
    cache_dir = os.path.expanduser(dc.text_cache_dir) if dc.text_cache_dir else os.path.join(self.data_dir,
                                                                                           "text_cache")
    if io_lib.is_uri(cache_dir):  # memory-mapped: on this host's disk, under the cache of staged inputs
      cache_dir = os.path.join(io_lib.cache_root(), "violin_text_cache", *cache_dir.split("://", 1))
    return cache_dir

  def tokenize(self, text: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A raw statement or subtitles string -> (ids, mask) `[max_len(kind)]` int32, preprocessed first."""
    if self.words is not None:
      return self.words.ids(self.model_text(text, kind), self.max_len(kind))
    enc = self.tokenizer(self.model_text(text, kind), max_length=self.max_len(kind), truncation=True,
                         padding="max_length")
    return np.asarray(enc["input_ids"], np.int32), np.asarray(enc["attention_mask"], np.int32)

  def texts(self, kind: str, splits=None) -> list[str]:
    """Distinct raw texts of `kind` over the clips of `splits` (default: those this run uses), in annotation order."""
    dc = self.config.data
    splits = {dc.train_split, *dc.eval_splits} if splits is None else set(splits)
    ann = io_lib.load_json(self.annotation_path, "annotation file")
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

  def cache_key(self, kind: str, texts: list[str]) -> tuple[str, str]:
    """(16 hex digits, the JSON they hash) naming the `kind` features of `texts`: everything the features depend on."""
    encoder, encoder_config, _, identity = self._encoder
    dc = self.config.data
    max_len = self.max_len(kind)
    encoder_fields = {k: str(v) for k, v in dataclasses.asdict(encoder_config).items()}
    key_src = json.dumps({"encoder": encoder, "config": encoder_fields, "weights": identity,
                          "tokenizer": str(getattr(self.tokenizer, "name_or_path", "")), "vocab": len(self.tokenizer),
                          "preprocessing": dc.text_preprocessing, "max_len": max_len,
                          "texts": hashlib.sha1("\n".join(texts).encode()).hexdigest()},
                         sort_keys=True)
    return hashlib.sha1(key_src.encode()).hexdigest()[:16], key_src

  def text_cache(self, kind: str) -> TextFeatureCache:
    """The frozen-encoder features of every `kind` text of the used splits, computed once and kept on disk."""
    if kind in self._caches:
      return self._caches[kind]
    dc = self.config.data
    texts = self.texts(kind)
    key, key_src = self.cache_key(kind, texts)
    cache_dir = self.text_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{kind}-{key}")
    with io_lib.file_lock(os.path.join(cache_dir, ".lock")):
      if not (os.path.exists(path + ".npy") and os.path.exists(path + ".json")):
        self._build_cache(path, texts, kind, key_src)
    self._caches[kind] = TextFeatureCache(path)
    return self._caches[kind]

  def _build_cache(self, path: str, texts: list[str], kind: str, key_src: str) -> None:
    encoder, encoder_config, params_fn, _ = self._encoder
    max_len = self.max_len(kind)
    hidden = encoder_config.hidden_size
    ids = np.zeros((len(texts), max_len), np.int32)
    mask = np.zeros((len(texts), max_len), np.int32)
    for i, t in enumerate(texts):
      ids[i], mask[i] = self.tokenize(t, kind)
    lengths = mask.sum(-1)
    module = encoders.ENCODERS[encoder](encoder_config)
    encode = jax.jit(lambda p, i, m: module.apply({"params": p}, i, m, deterministic=True)["hidden"])
    params = jax.tree.map(jnp.asarray, params_fn())
    feats = np.zeros((len(texts), max_len, hidden), np.float32)
    # Length buckets: texts sorted by length, each batch padded only to its longest text rounded up to 8; masked
    # padding keys leave the valid positions' features unchanged.
    order = np.argsort(lengths, kind="stable")
    bs = self.config.data.text_cache_batch_size
    t0 = time.time()
    log.info(f"text-feature cache: encoding {len(texts)} {kind} texts (max {max_len} tokens) -> {path}.npy")
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
    log.info(f"text-feature cache: {kind} done in {time.time() - t0:.0f}s")

  # -- records --------------------------------------------------------------------------------------------------
  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    missing = {"clip_id", "pair_index", "statement_pos", "statement_neg", "subtitles", "video",
               "video_len"} - set(spec)
    if missing:
      raise ValueError(f"{self.data_dir} split {split!r}: records lack the VIOLIN fields {sorted(missing)}")
    return source_lib.IndexedSource(source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
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
