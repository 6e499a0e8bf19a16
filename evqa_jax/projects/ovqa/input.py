"""OVQA input: records, the answer vocabularies and their graphs; the question's tokens and the answer encoder's are
the backbone's (backbones/: `text_inputs`, `answer_tokens`).

Records: see data_prep/ovqa.py (question, answer, video [T, 768], video_mask, subtitles, index). The dataset
directory also holds vocab.json (train counts, V_train, V_test, the CVQA top-k set) and, for the verbalizer, the
answer graphs graph_train.npz / graph_test.npz (data_prep/answer_graphs.py: built from GloVe, or the OVQA authors'
imported with --authors-graph, which carry their own node features; config.graph.source says which).

Video: by the backbone's `video_input`. "features": the record's `video` [T, dim] and `video_mask` [T]. "frames"
(pixel records, data_prep/ovqa_frames.py: uint8 [T, R, R, 3], R = metadata.json's stored_size): `frames` uint8
[T, S, S, 3], S = config.data.frame_size, cut from the stored frames at the centre (evaluation, and training with
config.data.augment = "none") or, in training with augment = "allinone", at a random offset, the same for every frame
of the clip (All-in-one's RandomCrop), drawn from np.random.default_rng((seed, step, index)): the loader's key
(evqa_jax.data.pipeline.KeyedTransform), so a resumed run sees the same crops. The model normalises the pixels.

Training scores the [MASK] feature against V_train; evaluation swaps in V_test (and its graph). Both vocabularies
(and graphs) are padded to one static budget so a single compiled step serves both. The closed heads (cvqa, cvqa_mlp)
score the top-k train answers in both, and train only on the rows whose answer is among them.
"""

import os

import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import pretrained
from evqa_jax.data import records
from evqa_jax.data import source as source_lib
from evqa_jax.models import verbalizer


# config.data.augment values: the train-time frame augmentation of pixel records (module docstring).
AUGMENTATIONS = ("none", "allinone")


def round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


class Input:
  """Reads config.data.dir: `source`, `preprocess`, `aux_inputs` (answer vocabulary, graph) for the trainer."""

  #: The records' video (metadata.json video_input; records without the key hold features).
  video_input = "features"

  def __init__(self, config, head: str, backbone):
    self.config = config
    self.backbone = backbone  # backbones.Backbone: the question's and the answers' tokens
    data_dir = os.path.expanduser(config.data.dir)
    self.data_dir = data_dir
    convert = ("python -m data_prep.ovqa_frames --csv-dir <dataset>/ --videos <dataset videos>/ --dataset <name> "
               f"--num-frames {config.data.num_frames} --frame-size {config.data.get('frame_size')}"
               if backbone.video_input == "frames" else
               "python -m data_prep.ovqa --csv-dir <dataset>/ --features <dataset>/clipvitl14.pth")
    records.require_records(config, "OVQA", f"{convert} --out {data_dir}\n  python data_prep/answer_graphs.py --data "
                            f"{data_dir}", "configs/ovqa_msrvtt.py:demo")
    self.metadata = records.load_metadata(data_dir)
    root = io_lib.epath_of(data_dir)  # local or gs://...: read through etils.epath
    self.vocab = io_lib.load_json(os.fspath(root / "vocab.json"), "answer vocabulary")
    self.train_counts = self.vocab["train_counts"]
    self.tokenizer = pretrained.load_tokenizer(config.pretrained)
    self.mask_token = self.tokenizer.mask_token
    self.mask_token_id = self.tokenizer.mask_token_id
    num_frames = int(self.metadata.get("num_frames", config.data.num_frames))
    if num_frames != config.data.num_frames:
      raise ValueError(f"config.data.num_frames = {config.data.num_frames} but the records in {data_dir} hold "
                       f"{num_frames} frames per video")
    self._check_video_input(data_dir)
    self.visual_dim = int(self.metadata.get("feature_dim", 768))
    if config.data.use_subtitles and self.metadata.get("has_subtitles") is False:
      raise ValueError(f"config.data.use_subtitles = True but the records in {data_dir} were converted without "
                       "subtitles (metadata.json: has_subtitles false): convert again with --subtitles (or "
                       "--ovqa-release with its subtitles.json), or pass --config.data.use_subtitles=False")

    self.head = head
    dc = config.data
    self.closed = head in ("cvqa", "cvqa_mlp")
    if self.closed:
      # FrozenBiLM's closed vocabulary: the top-k train answers (vocab.json's vocab_cvqa, the converter's
      # --cvqa-topk or the authors' file), the same answer set in training and evaluation.
      self.answers_train = list(self.vocab["vocab_cvqa"])
      if dc.cvqa_topk and dc.cvqa_topk < len(self.answers_train):
        self.answers_train = self.answers_train[:dc.cvqa_topk]
      self.answers_eval = self.answers_train
    else:
      self.answers_train = list(self.vocab["vocab_train"])
      self.answers_eval = list(self.vocab["vocab_test"])
    self.answer_index_train = {a: i for i, a in enumerate(self.answers_train)}
    self.answer_index_eval = {a: i for i, a in enumerate(self.answers_eval)}

    vc = config.verbalizer
    self.use_graph = self.head == "open" and verbalizer.reads_graph(vc.variant)
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
        gc = config.graph
        answer_graph.check_build_params(self.graphs[split], path, data_dir, gc.k, gc.hops, gc.min_sim, gc.source)
      if self.graphs["train"].num_answers != len(self.answers_train):
        raise ValueError(f"{data_dir}/graph_train.npz has {self.graphs['train'].num_answers} answers but vocab.json "
                         f"V_train has {len(self.answers_train)}: rebuild the graphs")
      if self.graphs["eval"].num_answers != len(self.answers_eval):
        raise ValueError(f"{data_dir}/graph_test.npz has {self.graphs['eval'].num_answers} answers but vocab.json "
                         f"V_test has {len(self.answers_eval)}: rebuild the graphs")
      dims = [None if g.node_features is None else g.node_features.shape[1] for g in self.graphs.values()]
      if dims[0] != dims[1]:  # one compiled step serves both graphs
        raise ValueError(f"{data_dir}: graph_train.npz and graph_test.npz carry node features of sizes {dims} "
                         "(None: embedded from node words): build or import both the same way")
    self.budget = self._vocab_budget()
    self._aux_cache = {}
    self._in_vocab = {}  # split -> record positions with an in-vocabulary answer (closed heads)

  def _check_video_input(self, data_dir: str) -> None:
    """The records' video (metadata.json video_input, frame_size, stored_size) against the backbone and config.data;
    ValueError naming the key and the file."""
    dc, where = self.config.data, os.path.join(data_dir, records.METADATA_FILE)
    augment = dc.get("augment", "none")  # configs saved before pixel backbones have neither key
    self.video_input = self.metadata.get("video_input", "features")  # records before pixels: features
    wants = self.backbone.video_input
    if self.video_input != wants:
      tool = "data_prep/ovqa_frames.py" if wants == "frames" else "data_prep/ovqa.py"
      raise ValueError(f"config.model.backbone = {self.config.model.backbone!r} reads video {wants} but {where} has "
                       f"video_input {self.video_input!r}: convert the dataset with {tool} (or point config.data.dir "
                       "at such records)")
    if augment not in AUGMENTATIONS:
      raise ValueError(f"config.data.augment = {augment!r}: expected one of {AUGMENTATIONS}")
    self.augment = augment
    if self.video_input != "frames":
      if augment != "none":
        raise ValueError(f"config.data.augment = {augment!r} augments frames, but {where} holds features: use "
                         "--config.data.augment=none")
      return
    self.frame_size = int(self.metadata.get("frame_size", -1))
    self.stored_size = int(self.metadata.get("stored_size", self.frame_size))
    if self.frame_size != dc.get("frame_size"):
      raise ValueError(f"config.data.frame_size = {dc.get('frame_size')} but {where} has frame_size {self.frame_size}: "
                       "convert again with --frame-size, or set the config to the records'")
    if self.stored_size < self.frame_size:
      raise ValueError(f"{where}: stored_size {self.stored_size} < frame_size {self.frame_size}")
    if augment == "allinone" and self.stored_size == self.frame_size:
      raise ValueError(f"config.data.augment = 'allinone' crops frame_size {self.frame_size} from larger frames, but "
                       f"{where} stores them at that size (frame_recipe {self.metadata.get('frame_recipe')!r}): "
                       "convert with --recipe allinone, or set --config.data.augment=none")

  def _vocab_budget(self) -> dict:
    """One static budget for V_train and V_test (answers, and graph nodes/edges when a verbalizer is used)."""
    gc = self.config.graph
    if not self.use_graph:
      return {"answers": round_up(max(len(self.answers_train), len(self.answers_eval)), gc.pad_multiple)}
    from evqa_jax.graphs import padding
    nodes, edges, answers = padding.graph_budget(*self.graphs.values(), multiple=gc.pad_multiple)
    for key, need, override in (("max_nodes", nodes, gc.max_nodes), ("max_edges", edges, gc.max_edges)):
      if override and override < need:
        raise ValueError(f"config.graph.{key} = {override} < {need} needed by the answer graphs of {self.data_dir}")
    return {"answers": answers, "nodes": gc.max_nodes or nodes, "edges": gc.max_edges or edges}

  def verbalizer_call(self):
    """Static work bounds of the verbalizer's edge loops (evqa_jax.graphs.padding.verbalizer_budget), or None."""
    if not self.use_graph:
      return None
    from evqa_jax.graphs import padding
    return padding.verbalizer_budget(*self.graphs.values(), max_answers=self.budget["answers"],
                                     max_edges=self.budget["edges"], multiple=self.config.graph.pad_multiple)

  def source(self, split: str):
    spec = records.load_spec(self.data_dir, split)
    if self.video_input == "frames":
      want = (self.config.data.num_frames, self.stored_size, self.stored_size, 3)
      if "frames_jpeg" in spec:  # JPEG frames (data_prep/ovqa_frames.py --frame-format jpeg): checked when decoded
        got, want = tuple(spec["frames_jpeg_ends"].shape), (self.config.data.num_frames,)
      else:
        got = tuple(spec["frames"].shape) if "frames" in spec and spec["frames"].dtype == "uint8" else None
      if got != want:
        raise ValueError(f"split {split!r} of {self.data_dir}: the records' frames are {got}, metadata.json says "
                         f"uint8 {want}")
    src = source_lib.TFRecordDataSource(records.split_paths(self.data_dir, split), spec,
                                        on_corrupt=self.config.data.on_corrupt)
    if self.closed and split == self.config.data.train_split:
      # FrozenBiLM (datasets/videoqa_dataset.py) removes the train rows whose answer is outside its vocabulary:
      # they are not in the epoch at all (not merely loss-free rows in a batch).
      return source_lib.SubsetSource(src, self.in_vocab_rows(split, src),
                                     f"train rows whose answer is in the top-{len(self.answers_train)} answers")
    return src

  def in_vocab_rows(self, split: str, src) -> list:
    """Positions in `src` (the records of `split`) whose answer is in the closed vocabulary. Read from `{split}.csv`
    (the converter copies exactly the converted rows, in record order), or from the records themselves when their
    count differs (records skipped with config.data.on_corrupt = "skip")."""
    if split not in self._in_vocab:
      from evqa_jax.evaluate import ovqa as ovqa_eval
      from evqa_jax.projects.ovqa import evaluator
      path = evaluator.split_csv(self.data_dir, split)
      answers = ovqa_eval.read_answers(path, f"{split} CSV")
      if len(answers) != len(src):
        answers = [str(src[i]["answer"]) for i in range(len(src))]
      kept = [i for i, a in enumerate(answers) if a in self.answer_index_train]
      if not kept:
        raise ValueError(f"no {split} row of {self.data_dir} has an answer among the top-{len(self.answers_train)} "
                         "answers of its vocab.json (vocab_cvqa, config.data.cvqa_topk)")
      self._in_vocab[split] = kept
    return self._in_vocab[split]

  def preprocess(self, example: dict, train: bool, key: tuple | None = None) -> dict:
    """One record -> the model's arrays; `key` (seed, step, index): the training loader's, for the augmentation
    (None: none, e.g. shape probes)."""
    return {**self.backbone.text_inputs(self, example), **self.video_and_label(example, train, key)}

  def frames(self, stored: np.ndarray, train: bool, key: tuple | None) -> np.ndarray:
    """uint8 [T, S, S, 3] cut from the stored frames [T, R, R, 3] (module docstring)."""
    r, s = self.stored_size, self.frame_size
    if train and key is not None and self.augment == "allinone":
      y, x = np.random.default_rng([int(k) for k in key]).integers(0, r - s + 1, size=2)  # their RandomCrop
    else:
      y = x = int(round((r - s) / 2.))  # their CenterCrop
    return np.ascontiguousarray(stored[:, y:y + s, x:x + s])

  def video_and_label(self, example: dict, train: bool, key: tuple | None = None) -> dict:
    """The record's video (video and video_mask, or frames), label (its answer's index in the active vocabulary, -1
    outside) and index."""
    answer = str(example["answer"])
    table = self.answer_index_train if train else self.answer_index_eval
    label = table.get(answer, -1)
    if train and label < 0:  # closed heads: such rows are not in the train source (`source`)
      vocab = "vocab_cvqa" if self.closed else "V_train"
      raise ValueError(f"record {int(example['index'])} of {self.data_dir}: train answer {answer!r} is not in {vocab} "
                       "of vocab.json (vocabulary and records do not match)")
    if self.video_input == "frames":
      if "frames_jpeg" in example:
        from evqa_jax.data import frames as frames_lib  # pylint: disable=g-import-not-at-top
        where = f"record {int(example['index'])} of {self.data_dir}"
        stored = frames_lib.decode_jpeg(example, where)
        r = self.stored_size
        if stored.shape != (self.config.data.num_frames, r, r, 3):
          raise ValueError(f"{where}: field 'frames_jpeg' decodes to {list(stored.shape)}, metadata.json says "
                           f"[{self.config.data.num_frames}, {r}, {r}, 3]")
      else:
        stored = np.asarray(example["frames"], np.uint8)
      video = {"frames": self.frames(stored, train, key)}
    else:
      video = {"video": np.asarray(example["video"], np.float32),
               "video_mask": np.asarray(example["video_mask"], np.int32)}
    return {
        **video,
        "label": np.int32(label),
        "index": np.int32(example["index"]),
    }

  def tokenize_answers(self, answers, pad_to: int):
    """The answer encoder's inputs (the backbone's): `[pad_to, L]` ids and mask."""
    return self.backbone.answer_tokens(self, answers, pad_to)

  def aux_inputs(self, split: str) -> dict:
    key = "train" if split == self.config.data.train_split else "eval"
    if key in self._aux_cache:
      return self._aux_cache[key]
    if self.head == "cvqa_mlp":  # a classifier: no answer embeddings
      self._aux_cache[key] = {}
      return {}
    answers = self.answers_train if key == "train" else self.answers_eval
    n_ans = self.budget["answers"]
    ids, mask = self.tokenize_answers(answers, n_ans)
    answer_mask = np.zeros((n_ans,), np.bool_)
    answer_mask[:len(answers)] = True
    is_base = np.zeros((n_ans,), np.bool_)
    for i, a in enumerate(answers):
      is_base[i] = self.vocab["categories"].get(a) == "base"  # the converter's (or the authors') categories
    aux = {"answer_tokens": ids, "answer_token_mask": mask, "answer_mask": answer_mask, "is_base": is_base}
    if self.use_graph:
      from evqa_jax.graphs import padding
      graph = self.graphs[key]
      if graph.node_features is not None:  # an imported graph's own features (the authors' x.pth)
        padded, _ = padding.pad_graph(graph, graph.node_features, self.budget["nodes"], self.budget["edges"], n_ans)
        aux["node_features"] = np.asarray(padded.nodes)
      else:
        # Node features are computed in the step from the frozen word embeddings, so the padded graph carries the
        # nodes' sub-word ids, placed at their padded positions (answers first, padding slots empty).
        ids, mask = self.tokenize_answers(graph.node_words, graph.num_nodes)
        padded, _ = padding.pad_graph(graph, np.zeros((graph.num_nodes, 1), np.float32), self.budget["nodes"],
                                      self.budget["edges"], n_ans)
        pos = padding.node_positions(graph, n_ans)
        node_ids = np.zeros((self.budget["nodes"], ids.shape[1]), np.int32)
        node_mask = np.zeros((self.budget["nodes"], ids.shape[1]), np.bool_)
        node_ids[pos], node_mask[pos] = ids, mask
        aux.update(node_tokens=node_ids, node_token_mask=node_mask)
      aux.update(senders=np.asarray(padded.senders), receivers=np.asarray(padded.receivers),
                 n_node=np.asarray(padded.n_node), n_edge=np.asarray(padded.n_edge))
    self._aux_cache[key] = aux
    return aux

  def aux_logical_axes(self, aux=None):
    """Per-node arrays (`node_*`: tokens, features, cached encodings) split over `nodes`; the rest replicated."""
    from jax.sharding import PartitionSpec as P
    aux = self.aux_inputs(self.config.data.train_split) if aux is None else aux
    specs = {}
    for k, v in aux.items():
      specs[k] = P(*(["nodes"] + [None] * (len(v.shape) - 1))) if k.startswith("node_") else P()
    return specs
