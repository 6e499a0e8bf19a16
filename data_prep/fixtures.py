"""Release-shaped fixtures: tiny replicas of every artifact a user downloads, so that every real-data command can be
tried (and is tested) without the real download.

  python -m data_prep.fixtures --out DIR [--paper ovqa violin evqa]   # default: all three papers

writes DIR/<paper>/ with the files laid out as the releases ship them (the command prints the tree and the paths to
pass to the real-data commands of docs/<paper>.md). The OVQA files are torch.save'd `.pth` files as released, so
`--paper ovqa` needs torch (CPU wheel: `pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`);
without torch the default writes VIOLIN and E-VQA and says so. Everything else, the E-VQA chain's tiny Hugging Face
CLIP folder included, is written with numpy.

Each builder writes the exact layout, file names, key names and dtypes of one release at toy sizes; its docstring
says where that layout comes from (the authors' loader code read for this module). Nothing here is downloaded.

  deberta_v2_dir        Hugging Face microsoft/deberta-v2-xlarge folder (config.json, spm.model, pytorch_model.bin,
                        tokenizer_config.json)
  frozenbilm_checkpoint FrozenBiLM's released .pth ({"model": state_dict, "optimizer", "epoch", "args"})
  ovqa_checkpoint       an OVQA-trained checkpoint (FrozenBiLM's names + the GNN lm_head.gnn{1,2}.lin_{src,dst})
  msrvtt_qa             FrozenBiLM / Just Ask MSRVTT-QA folder (train/val/test.csv, vocab.json, clipvitl14.pth,
                        subtitles.pkl)
  ovqa_meta_data        OVQA's meta_data/<dataset>/: train/test.csv, clipvitl14.pth, subtitles.pkl and the files of
  distilbert_dir        Hugging Face distilbert-base-uncased folder (config.json, vocab.txt, model.safetensors)
  justask_checkpoint    Just Ask's released VQA-T .pth (the DataParallel state dict, "module." keys)
  ovqa_authors_files    OVQA's train_vocab.json, test_vocab.json, ans2cat.json and answer_graph/*.pth
  violin_release        VIOLIN's violin_annotation.json and all_res101_pool5_feat.h5 (all_det_features.h5 for det)
  ovqa_raw_videos       MSVD / MSRVTT / TGIF / ActivityNet video files (avi, mp4, gif, mkv) in the datasets' naming,
                        with CSVs and MSVD's youtube_mapping.txt (data_prep/ovqa_frames.py)
  evqa_release          ST-Evidence: st_evidence_gen.csv, videos_6fps/*.mp4, masks/, and the MCQ files
  evqa_instruct         ST-Evidence-Instruct: gen_mask/ (CSV, polygon/RLE JSON masks, frame_%04d.jpg frames) and
                        gen_qa/vicas/ (CSV with mask_evidence, ViCaS annotations, frames)
  clip_vision_dir       Hugging Face openai/clip-vit-base-patch16 vision tower folder (config.json,
                        model.safetensors) at toy sizes, written without torch
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tarfile

import numpy as np

# Prompts as OVQA / FrozenBiLM build them, plus statements: the SentencePiece training text.
CORPUS = [
    "Question: What is the man doing? Answer: [MASK]. Subtitles: he plays the guitar",
    "Question: Who is singing on the stage? Answer: [MASK].",
    "Question: What color is the car? Answer: [MASK].",
    "Question: Where are the people dancing? Answer: [MASK].",
    "Question: How many dogs run in the park? Answer: [MASK].",
    "Question: When does the woman cook dinner? Answer: [MASK].",
    "a man plays the guitar while a woman sings a song",
    "the red car drives down the road near the park",
    "two dogs run on the grass and a cat sleeps",
    "people dance in the kitchen, then cook pasta and eat",
    "The weather is nice today; children play football outside.",
    "What is the Man doing?? He's riding a BIKE (fast)!",
]

# Special pieces of DeBERTa-v2's spm.model: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3; [MASK] is not a piece: the
# tokenizer appends it after the SentencePiece vocabulary (id 128000 for the real 128000-piece model).
SPM_SPECIAL = dict(pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]",
                   unk_id=3, unk_piece="[UNK]")


def train_spm(out_dir: str, sentences=CORPUS, vocab_size: int = 120) -> str:
  """Trains a unigram SentencePiece model with DeBERTa-v2's special pieces; returns the path of `spm.model`."""
  import sentencepiece as spm
  os.makedirs(out_dir, exist_ok=True)
  text = os.path.join(out_dir, "spm_corpus.txt")
  with open(text, "w") as f:
    f.write("\n".join(list(sentences) * 4) + "\n")
  prefix = os.path.join(out_dir, "spm")
  spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=vocab_size, model_type="unigram",
                                 character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
                                 num_threads=1, **SPM_SPECIAL)
  os.remove(text)
  os.remove(prefix + ".vocab")
  return prefix + ".model"


def deberta_v2_config(vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 4) -> dict:
  """microsoft/deberta-v2-xlarge's config.json (same keys and flags) at toy sizes.

  The real one: hidden 1536, 24 layers, 24 heads, intermediate 6144, vocab_size 128100 (128000 spm pieces +
  [MASK] + spare rows), relative attention with 256 log buckets, share_att_key, p2c|c2p, conv after layer 0,
  no absolute positions in the input (position_biased_input false), type_vocab_size 0.
  """
  return {
      "model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
      "hidden_dropout_prob": 0.1, "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 2 * hidden,
      "max_position_embeddings": 64, "relative_attention": True, "position_buckets": 8, "norm_rel_ebd": "layer_norm",
      "share_att_key": True, "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "conv_kernel_size": 3,
      "conv_act": "gelu", "max_relative_positions": -1, "position_biased_input": False,
      "num_attention_heads": heads, "attention_head_size": hidden // heads, "num_hidden_layers": layers,
      "type_vocab_size": 0, "vocab_size": vocab_size,
  }


def deberta_v2_dir(root: str, sentences=CORPUS, spm_vocab: int = 120, seed: int = 0, **shape) -> dict:
  """A Hugging Face `microsoft/deberta-v2-xlarge` folder in miniature.

  Files as in that repository: config.json, spm.model (SentencePiece, no tokenizer.json), tokenizer_config.json
  ({"do_lower_case": false, "vocab_type": "spm"}), pytorch_model.bin (a torch.save'd state dict with the original
  Microsoft names: deberta.embeddings.*, deberta.encoder.layer.N.attention.self.{query,key,value}_proj,
  deberta.encoder.rel_embeddings, deberta.encoder.conv.*, lm_predictions.lm_head.{dense,LayerNorm,bias}, and the
  absolute position_embeddings the enhanced mask decoder uses). FrozenBiLM and OVQA load it with
  `DebertaV2Tokenizer.from_pretrained(path)` and `DebertaV2ForMaskedLM.from_pretrained(path)`.

  Returns {"path", "config", "state_dict" (torch tensors), "spm_pieces", "mask_id"}.
  """
  import sentencepiece as spm
  import torch
  import transformers
  os.makedirs(root, exist_ok=True)
  model_file = train_spm(root, sentences, spm_vocab)
  pieces = spm.SentencePieceProcessor(model_file=model_file).get_piece_size()
  config = deberta_v2_config(vocab_size=pieces + 4, **shape)  # spare rows after [MASK], as 128100 > 128001
  with open(os.path.join(root, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  with open(os.path.join(root, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": False, "vocab_type": "spm"}, f)
  torch.manual_seed(seed)
  hf_cfg = {k: v for k, v in config.items() if k != "model_type"}
  hf_cfg["pos_att_type"] = hf_cfg["pos_att_type"].split("|")
  mlm = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(legacy=False, **hf_cfg)).eval()
  g = torch.Generator().manual_seed(seed)
  sd = {}
  for k, v in mlm.state_dict().items():
    # Non-trivial values everywhere (HF initialises LayerNorms to 1/0 and biases to 0).
    sd[k] = (v + 0.1 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v.clone()
  sd["deberta.embeddings.position_embeddings.weight"] = 0.1 * torch.randn(
      config["max_position_embeddings"], config["hidden_size"], generator=g)
  torch.save(sd, os.path.join(root, "pytorch_model.bin"))
  return {"path": root, "config": config, "state_dict": sd, "spm_pieces": pieces, "mask_id": pieces}


def frozenbilm_checkpoint(path: str, hf_state_dict: dict, config: dict, features_dim: int = 768,
                          ds_factor: int = 8, n_ans: int = 5, seed: int = 1, trained_only: bool = False) -> dict:
  """FrozenBiLM's released checkpoint (e.g. frozenbilm.pth, frozenbilm_msrvtt.pth) in miniature.

  Layout from FrozenBiLM main.py (`dist.save_on_master({"model": model.state_dict(), "optimizer": ...,
  "epoch": epoch, "args": args}, path)`, `args` an argparse.Namespace) and model/deberta.py: DebertaV2ForMaskedLM
  holds deberta.* (with embeddings.linear_video = Linear(features_dim, hidden), embeddings.position_ids,
  encoder.layer.N.attention.output.adapter.{down,up} and encoder.layer.N.output.adapter.{down,up} from
  model/adapter.py, down = Linear(hidden, hidden // ds_factor)), lm_predictions.lm_head.* (+ its decoder kept for
  compatibility), answer_embeddings.weight [n_ans, hidden] and answer_bias [n_ans]. OVQA's train.py loads
  `checkpoint["model"]` with strict=False. With `trained_only`, only what FrozenBiLM trains (linear_video, the
  adapters, the LayerNorms: its freeze_lm / ft_ln rule in model/deberta.py) -- most released checkpoints "only
  contain updated parameters" (FrozenBiLM README), the LM coming from the Hugging Face folder. Returns the state
  dict written.
  """
  import torch
  g = torch.Generator().manual_seed(seed)
  h, n_pos = config["hidden_size"], config["max_position_embeddings"]
  sd = {k: v.clone() for k, v in hf_state_dict.items()}
  sd["deberta.embeddings.position_ids"] = torch.arange(n_pos)[None]
  sd["deberta.embeddings.linear_video.weight"] = 0.05 * torch.randn(h, features_dim, generator=g)
  sd["deberta.embeddings.linear_video.bias"] = 0.05 * torch.randn(h, generator=g)
  for i in range(config["num_hidden_layers"]):
    for where in ("attention.output.adapter", "output.adapter"):
      p = f"deberta.encoder.layer.{i}.{where}"
      sd[f"{p}.down.weight"] = 0.05 * torch.randn(h // ds_factor, h, generator=g)
      sd[f"{p}.down.bias"] = 0.05 * torch.randn(h // ds_factor, generator=g)
      sd[f"{p}.up.weight"] = 0.05 * torch.randn(h, h // ds_factor, generator=g)
      sd[f"{p}.up.bias"] = 0.05 * torch.randn(h, generator=g)
  sd["lm_predictions.lm_head.decoder.weight"] = sd["deberta.embeddings.word_embeddings.weight"].clone()
  sd["lm_predictions.lm_head.decoder.bias"] = sd["lm_predictions.lm_head.bias"].clone()
  sd["answer_embeddings.weight"] = torch.randn(n_ans, h, generator=g)
  sd["answer_bias"] = torch.zeros(n_ans)
  if trained_only:
    sd = {k: v for k, v in sd.items() if "linear_video" in k or "adapter" in k or "LayerNorm" in k}
  args = argparse.Namespace(model_name="microsoft/deberta-v2-xlarge", max_feats=10, features_dim=features_dim,
                            ds_factor_attn=ds_factor, ds_factor_ff=ds_factor, use_video=True)
  torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": []}, "epoch": 9, "args": args}, path)
  return sd


def ovqa_checkpoint(path: str, hf_state_dict: dict, config: dict, features_dim: int = 768, ds_factor: int = 8,
                    n_ans: int = 5, num_gnn_layers: int = 2, seed: int = 2) -> dict:
  """An OVQA-trained checkpoint (mlvlab/OVQA train.py, best_model.pth / ckpt.pth) as a state dict, in miniature.

  Their DebertaV2ForMaskedLM (model/deberta.py) holds FrozenBiLM's names (see `frozenbilm_checkpoint`: deberta.*
  with linear_video and the adapters, lm_predictions.lm_head.{dense,LayerNorm,bias,decoder}), the GNN soft
  verbalizer lm_predictions.lm_head.gnn{1,2}.lin_{src,dst}.weight [hidden, hidden] (model/gnn.py: torch_geometric
  Linear without bias; initialised to the identity, trained: here identity + noise), and answer_embeddings.weight
  [n_ans, hidden] / answer_bias [n_ans] of the last vocabulary set_answer_embeddings installed (the test vocabulary).
  train.py saves `{"model": model, "optimizer", "epoch", "args"}` with the whole nn.Module pickled; this is the
  state-dict form `{"model": model.state_dict(), ...}` that loads without unpickling code (docs/ovqa.md: the one
  line that converts theirs). Returns the state dict written.
  """
  import torch
  g = torch.Generator().manual_seed(seed)
  h = config["hidden_size"]
  sd = frozenbilm_checkpoint(path, hf_state_dict, config, features_dim=features_dim, ds_factor=ds_factor,
                             n_ans=n_ans, seed=seed)
  for layer in range(1, num_gnn_layers + 1):
    for side in ("src", "dst"):
      sd[f"lm_predictions.lm_head.gnn{layer}.lin_{side}.weight"] = torch.eye(h) + 0.3 * torch.randn(h, h, generator=g)
  args = argparse.Namespace(dataset="msrvtt", lr=5e-5, eps=0.7, max_feats=10, features_dim=features_dim,
                            ds_factor_attn=ds_factor, ds_factor_ff=ds_factor, max_atokens=5)
  torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": []}, "epoch": 19, "args": args}, path)
  return sd


def distilbert_dir(root: str, sentences=CORPUS, hidden: int = 32, layers: int = 2, heads: int = 4,
                   max_positions: int = 64, seed: int = 0) -> dict:
  """A Hugging Face `distilbert-base-uncased` folder in miniature: config.json (model_type distilbert, its keys:
  dim, n_layers, n_heads, hidden_dim, activation, dropout, attention_dropout, sinusoidal_pos_embds), vocab.txt (a
  WordPiece vocabulary of the corpus words, lower-cased, with [PAD] = 0, [UNK], [CLS], [SEP], [MASK] as in the real
  one's first rows), tokenizer_config.json and model.safetensors of a random `DistilBertModel` (every tensor
  perturbed: HF initialises LayerNorms to 1/0 and biases to 0, which would hide mapping mistakes). Just Ask loads
  it with `DistilBertTokenizer.from_pretrained` / `DistilBertModel.from_pretrained("distilbert-base-uncased")`.

  Returns {"path", "config", "state_dict" (torch tensors)}.
  """
  import re
  import torch
  import transformers
  os.makedirs(root, exist_ok=True)
  words = sorted({w for s in sentences for w in re.findall(r"[a-z0-9]+|[^a-z0-9\s]", s.lower())})
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  with open(os.path.join(root, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  config = transformers.DistilBertConfig(
      vocab_size=len(vocab), dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=4 * hidden,
      max_position_embeddings=max_positions, activation="gelu", dropout=0.1, attention_dropout=0.1, pad_token_id=0)
  torch.manual_seed(seed)
  model = transformers.DistilBertModel(config).eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn(p.shape, generator=g))
  model.save_pretrained(root)
  transformers.DistilBertTokenizerFast(vocab_file=os.path.join(root, "vocab.txt"), do_lower_case=True
                                       ).save_pretrained(root)
  return {"path": root, "config": config.to_dict(),
          "state_dict": {k: v.clone() for k, v in model.state_dict().items()}}


def justask_checkpoint(path: str, distilbert_state_dict: dict, word_dim: int, feature_dim: int = 1024,
                       d_model: int = 512, n_layers: int = 2, ff_dim: int = 2048, question_len: int = 20,
                       num_frames: int = 20, seed: int = 1) -> dict:
  """Just Ask's released VQA-T checkpoint (e.g. ckpt_pt_howtovqa69m.pth, ckpt_ft_msrvttqa.pth) in miniature.

  Layout from github.com/antoyang/just-ask: main_videoqa.py saves `model.state_dict()` of `nn.DataParallel(
  MMT_VideoQA(...))`, so every key starts with "module."; model/multimodal_transformer.py and
  model/language_model.py give the names: bert.bert.* (the question DistilBERT, `Bert().bert`), amodel.bert.bert.*
  and amodel.linear_text (the answer encoder), linear_video / norm_video, linear_question / norm_question,
  position.{position_embeddings (the frozen sinusoidal table of Q + T rows), modality_embedding, LayerNorm},
  mmt.layer.N.{attention.{q,k,v,out}_lin, sa_layer_norm, ffn.lin1, ffn.lin2, output_layer_norm}, vqproj.1 (after a
  Dropout in an nn.Sequential), the MLM head vocab_transform / vocab_norm / vocab_projector and the pretraining's
  crossmodal_matching. Both DistilBERTs start from `distilbert_state_dict` (the answer one perturbed, so a mix-up
  of the two shows). Returns the state dict written (without the "module." prefix).
  """
  import torch
  g = torch.Generator().manual_seed(seed)

  def rnd(*shape, base=0.0):
    return base + 0.05 * torch.randn(*shape, generator=g)

  sd = {}
  for k, v in distilbert_state_dict.items():
    sd[f"bert.bert.{k}"] = v.clone()
    sd[f"amodel.bert.bert.{k}"] = v + rnd(*v.shape) if v.is_floating_point() else v.clone()
  vocab_size = distilbert_state_dict["embeddings.word_embeddings.weight"].shape[0]
  linears = {"amodel.linear_text": (d_model, word_dim), "linear_video": (d_model, feature_dim),
             "linear_question": (d_model, word_dim), "vqproj.1": (d_model, d_model),
             "vocab_transform": (d_model, d_model), "vocab_projector": (vocab_size, d_model),
             "crossmodal_matching": (1, d_model)}
  for i in range(n_layers):
    for name in ("q_lin", "k_lin", "v_lin", "out_lin"):
      linears[f"mmt.layer.{i}.attention.{name}"] = (d_model, d_model)
    linears[f"mmt.layer.{i}.ffn.lin1"] = (ff_dim, d_model)
    linears[f"mmt.layer.{i}.ffn.lin2"] = (d_model, ff_dim)
  for name, (out, inp) in linears.items():
    sd[f"{name}.weight"], sd[f"{name}.bias"] = rnd(out, inp), rnd(out)
  norms = ["norm_video", "norm_question", "position.LayerNorm", "vocab_norm"]
  norms += [f"mmt.layer.{i}.{n}" for i in range(n_layers) for n in ("sa_layer_norm", "output_layer_norm")]
  for name in norms:
    sd[f"{name}.weight"], sd[f"{name}.bias"] = rnd(d_model, base=1.0), rnd(d_model)
  pos = np.arange(question_len + num_frames, dtype=np.float64)[:, None] / np.power(
      10000, 2 * (np.arange(d_model)[None] // 2) / d_model)
  table = np.where(np.arange(d_model)[None] % 2 == 0, np.sin(pos), np.cos(pos))
  sd["position.position_embeddings.weight"] = torch.tensor(table, dtype=torch.float32)
  sd["position.modality_embedding.weight"] = rnd(2, d_model)
  torch.save({f"module.{k}": v for k, v in sd.items()}, path)
  return sd


MSRVTT_TYPES = {"what": 0, "how": 1, "color": 2, "where": 3, "who": 4, "when": 5}

# (question, answer, video_id) per split; MSRVTT-QA questions are lower case without "?".
MSRVTT_ROWS = {
    "train": [("what is a man playing", "guitar", 7010), ("who is singing", "woman", 7010),
              ("what is a man playing", "guitar", 7011), ("what is running on grass", "dog", 7012),
              ("what color is the car", "red", 7013), ("where are people dancing", "kitchen", 7014),
              ("how many dogs run", "two", 7012), ("what is a man riding", "bike", 7015),
              ("who is cooking", "woman", 7014), ("what is a woman cooking", "pasta", 7014)],
    "val": [("what is a man playing", "guitar", 7016), ("who sleeps", "cat", 7012)],
    "test": [("what is a man playing", "guitar", 7017), ("what color is the car", "red", 7013),
             ("what is a woman singing", "song", 7010), ("when do people eat", "night", 7014),
             ("who is riding", "man", 7015)],
}


def msrvtt_qa(root: str, frames=None, feature_dim: int = 768, vocab_topk: int = 4000, seed: int = 0) -> dict:
  """FrozenBiLM's `<DATA_DIR>/MSRVTT-QA` folder (the Just Ask preprocessing) in miniature.

  train.csv / val.csv / test.csv: columns question, answer, category_id, video_id, id, type (Just Ask
  preproc/preproc_msrvttqa.py `json_to_df`; type from the first word: what 0, how 1, color 2, where 3, who 4,
  when 5; train rows whose answer is outside the top-k vocabulary are dropped there). video_id is the integer
  MSRVTT id. vocab.json: {answer: id} over the 4000 most common train answers (`get_vocabulary`).
  clipvitl14.pth: torch.save'd dict {int video_id: float16 tensor [T_video, 768]} (FrozenBiLM
  extract/merge_features.py: msrvtt keys int(name[5:]), `features[mapping[x]] = feat.half()`), read by
  videoqa_dataset.py with `th.load(features_path)[video_id].float()`.

  Returns {"dir", "features" (video_id -> np.float16 array), "rows"}.
  """
  import pandas as pd
  import torch
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(seed)
  counts = collections.Counter(a for _, a, _ in MSRVTT_ROWS["train"])
  vocab = {a: i for i, (a, _) in enumerate(counts.most_common(vocab_topk))}
  with open(os.path.join(root, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  next_id = 0
  for split, rows in MSRVTT_ROWS.items():
    qs = [q for q, _, _ in rows]
    df = pd.DataFrame({"question": qs, "answer": [a for _, a, _ in rows], "category_id": [v % 20 for _, _, v in rows],
                       "video_id": [v for _, _, v in rows], "id": list(range(next_id, next_id + len(rows)))},
                      columns=["question", "answer", "category_id", "video_id", "id"])
    next_id += len(rows)
    if split == "train":
      df = df[df["answer"].isin(vocab)]
    df["type"] = [MSRVTT_TYPES["color"] if "color" in q else MSRVTT_TYPES[q.split(" ")[0]] for q in df["question"]]
    df.to_csv(os.path.join(root, f"{split}.csv"), index=False)
  video_ids = sorted({v for rows in MSRVTT_ROWS.values() for _, _, v in rows})
  frames = frames or {v: int(rng.integers(3, 15)) for v in video_ids}
  feats = {v: rng.normal(size=(frames[v], feature_dim)).astype(np.float16) for v in video_ids}
  torch.save({v: torch.from_numpy(x) for v, x in feats.items()}, os.path.join(root, "clipvitl14.pth"))
  write_subtitles(root)
  return {"dir": root, "features": feats, "rows": MSRVTT_ROWS}


# ASR subtitles of some MSRVTT videos (the others have none), keyed as the CSVs' video_id.
MSRVTT_SUBTITLES = {7010: "he plays the guitar while a woman sings", 7014: "let's cook pasta and eat in the kitchen",
                    7015: "the man rides a bike fast"}


def write_subtitles(root: str, subtitles=None) -> str:
  """`subtitles.pkl`: a pickled dict {video_id: text} (FrozenBiLM README, "Speech Subtitles"; read by its
  datasets/videoqa_dataset.py and OVQA's dataset.py with `pickle.load`, the text appended as f" Subtitles: {sub}"),
  keys of the CSVs' video_id type (int for MSRVTT). Returns the path."""
  import pickle
  path = os.path.join(root, "subtitles.pkl")
  with open(path, "wb") as f:
    pickle.dump(dict(MSRVTT_SUBTITLES if subtitles is None else subtitles), f)
  return path


def ovqa_category(train_count: int) -> str:
  """The OVQA paper's answer categories by train frequency: base > 100, common 11..100, rare 1..10, unseen 0."""
  return "base" if train_count > 100 else "common" if train_count > 10 else "rare" if train_count > 0 else "unseen"


def ovqa_authors_files(root: str, train_answers, test_answers, embed_dim: int = 32, seed: int = 0,
                       categories: dict | None = None) -> dict:
  """OVQA's `meta_data/<dataset>/` vocabulary, category and answer-graph files (mlvlab/OVQA README, dataset.py).

  train_vocab.json, test_vocab.json: {answer: id}; dataset.py reads `ans2id = json.load(f"{split}_vocab.json")`
  and looks the CSV answer up directly (`answer_id = self.ans2id[original_answer]`), so every answer of the split
  is a key; ids are 0..n-1 (train.py sizes the answer tables with len(ans2id) and indexes them with the id).
  Here the ids follow the train frequency (ties: first seen) for V_train; V_test lists the test answers in
  their first-seen order -- deliberately not our converter's order, so a test can tell whose vocabulary is used.
  ans2cat.json: {answer: "base" | "common" | "rare" | "unseen"} covering both vocabularies (dataset.py builds eps
  from `ans2cat[k] for k in ans2id`, train.py's evaluate reads `ans2cat[ans]` for every test answer);
  `categories` overrides single answers (the authors' counts may come from a larger pool than the CSVs).
  answer_graph/{split}_edge_index.pth: int64 tensor [2, E] (torch_geometric edge_index, row 0 source, row 1
  target); answer_graph/{split}_x.pth: float32 tensor [N, D], the node features with the |V_split| answers first
  (model/deberta.py: gnn(vocab_embeddings, edge_index)[:n_ans]; D is the LM's hidden size: `embed_dim`, 32 as the
  toy LMs of these tests). Here N = |V| + 2 and the edges are n-2 -> 0, n-1 -> 1, 0 -> n-2, 2 -> 3 (answer to
  answer) and 1 -> 1 (a self-loop, which their GATConv removes before adding one to every node).
  """
  import torch
  os.makedirs(os.path.join(root, "answer_graph"), exist_ok=True)
  counts = collections.Counter(train_answers)
  first = {}
  for a in train_answers:
    first.setdefault(a, len(first))
  train_vocab = {a: i for i, a in enumerate(sorted(counts, key=lambda a: (-counts[a], first[a])))}
  test_vocab = {}
  for a in test_answers:
    test_vocab.setdefault(a, len(test_vocab))
  ans2cat = {a: ovqa_category(counts.get(a, 0)) for a in list(train_vocab) + list(test_vocab)}
  ans2cat.update(categories or {})
  for name, obj in (("train_vocab.json", train_vocab), ("test_vocab.json", test_vocab), ("ans2cat.json", ans2cat)):
    with open(os.path.join(root, name), "w") as f:
      json.dump(obj, f)
  g = torch.Generator().manual_seed(seed)
  for split, vocab in (("train", train_vocab), ("test", test_vocab)):
    n = len(vocab) + 2  # two extra neighbour words
    src = torch.tensor([n - 2, n - 1, 0, 2, 1], dtype=torch.int64)
    dst = torch.tensor([0, 1, n - 2, 3, 1], dtype=torch.int64)
    torch.save(torch.stack([src, dst]), os.path.join(root, "answer_graph", f"{split}_edge_index.pth"))
    x = 0.1 * torch.randn(n, embed_dim, generator=g)  # word-embedding scale: no attention weight near 0 or 1
    torch.save(x, os.path.join(root, "answer_graph", f"{split}_x.pth"))
  return {"dir": root, "train_vocab": train_vocab, "test_vocab": test_vocab, "ans2cat": ans2cat}


def ovqa_meta_data(root: str, feature_dim: int = 768, embed_dim: int = 32, seed: int = 0,
                   categories: dict | None = None) -> dict:
  """OVQA's own `meta_data/<dataset>/` folder (mlvlab/OVQA README "Data Preparation", dataset.py), in miniature:
  train.csv, test.csv (no val split: train.py evaluates on test), clipvitl14.pth, subtitles.pkl, and the
  vocabulary / category / answer-graph files of `ovqa_authors_files`. dataset.py reads the CSV columns question,
  answer, video_id and type (`self.data["question"]`, ...) and nothing else; the release's other columns are not
  documented, so these CSVs hold exactly those four (in another order than FrozenBiLM's). Every train answer is
  kept (V_train is all train answers), unlike FrozenBiLM's top-k filtered train.csv. `categories` overrides single
  answers' categories (ovqa_authors_files): the CSVs are too small for a base answer (>= 101 train samples).
  Returns {"dir", "features", "train_vocab", "test_vocab", "ans2cat"}.
  """
  import pandas as pd
  import torch
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(seed)
  for split in ("train", "test"):
    rows = MSRVTT_ROWS[split]
    pd.DataFrame({"video_id": [v for _, _, v in rows], "question": [q for q, _, _ in rows],
                  "answer": [a for _, a, _ in rows],
                  "type": [MSRVTT_TYPES["color"] if "color" in q else MSRVTT_TYPES[q.split(" ")[0]]
                           for q, _, _ in rows]}).to_csv(os.path.join(root, f"{split}.csv"), index=False)
  video_ids = sorted({v for split in ("train", "test") for _, _, v in MSRVTT_ROWS[split]})
  feats = {v: rng.normal(size=(int(rng.integers(3, 15)), feature_dim)).astype(np.float16) for v in video_ids}
  torch.save({v: torch.from_numpy(x) for v, x in feats.items()}, os.path.join(root, "clipvitl14.pth"))
  write_subtitles(root)
  authors = ovqa_authors_files(root, [a for _, a, _ in MSRVTT_ROWS["train"]], [a for _, a, _ in MSRVTT_ROWS["test"]],
                               embed_dim=embed_dim, seed=seed, categories=categories)
  return dict(authors, dir=root, features=feats)


VIOLIN_CLIPS = {
    "friends_s01e01_seg01_clip_00": ("train", [["Ross: Hi, I'm Ross.", 0.5, 2.0], ["Rachel: You're late!", 2.0, 3.5]]),
    "friends_s01e01_seg01_clip_01": ("train", [["Monica: Let's eat.", 0.0, 1.2]]),
    "movieclips_a_quiet_place_clip_3": ("validate", [["(whispering) Don't move...", 1.0, 4.0]]),
    "desperate_housewives_s02e03_clip_07": ("test", [["Gabrielle: I can't believe it's over.", 3.0, 6.5]]),
}


def violin_release(root: str, feature: str = "resnet", seed: int = 0) -> dict:
  """VIOLIN's feature folder (jimmy646/violin violin_dataset.py) in miniature.

  violin_annotation.json: {clip_id: {"file": clip_id, "source", "split": "train" | "validate" | "test",
  "sub": [[text, start, end], ...], "statement": [[positive, negative] x 3]}} (the loader keeps clips with
  clip["split"] == mode, asserts clip["file"] unique, joins `clean_str(ss[0]).lower()` over clip["sub"], and
  reads clip["statement"][i][0 | 1]). all_res101_pool5_feat.h5 (resnet) / all_c3d_fc6_features.h5 (c3d) /
  all_det_features.h5 (det, the per-frame pooled Faster R-CNN features, which the release never shipped: the loader's
  layout for its other kinds): one group per clip file with dataset `resnet_features` float32 [T, 2048] /
  `c3d_features` [T, 4096] / `det_features` [T, 2048] (`fin[clip_id + '/{}_features'.format(opt.feat)]`).
  """
  import h5py
  from data_prep import violin  # pylint: disable=g-import-not-at-top
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(seed)
  dim = violin.FEATURE_DIMS[feature]
  ann = {}
  for k, (clip, (split, sub)) in enumerate(VIOLIN_CLIPS.items()):
    ann[clip] = {"file": clip, "source": clip.split("_")[0], "split": split, "sub": sub,
                 "statement": [[f"Statement {k}.{i} is true, isn't it?", f"Statement {k}.{i} is false!"]
                               for i in range(3)]}
  with open(os.path.join(root, "violin_annotation.json"), "w") as f:
    json.dump(ann, f)
  name = violin.RELEASE_FILES[feature]
  feats = {}
  with h5py.File(os.path.join(root, name), "w") as f:
    for clip in ann:
      feats[clip] = rng.random((int(rng.integers(2, 6)), dim), dtype=np.float32)
      f.create_group(clip).create_dataset(f"{feature}_features", data=feats[clip])
  return {"dir": root, "annotation": ann, "features": feats, "h5": os.path.join(root, name)}


EVQA_FPS = 6


def write_mp4(path: str, frames: np.ndarray, fps: int = EVQA_FPS) -> None:
  """Encodes RGB uint8 frames [N, H, W, 3] as H.264 mp4 at `fps` (PyAV), near-lossless (crf 0-ish)."""
  import av
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with av.open(path, "w") as container:
    stream = container.add_stream("libx264", rate=fps)
    stream.width, stream.height = frames.shape[2], frames.shape[1]
    stream.pix_fmt = "yuv444p"
    stream.options = {"crf": "0", "preset": "ultrafast"}
    for img in frames:
      for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


def smooth_frames(num: int, height: int, width: int, seed: int = 0) -> np.ndarray:
  """Smooth colour gradients that move over time ([num, H, W, 3] uint8): a video codec keeps them close."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width]
  out = np.zeros((num, height, width, 3), np.uint8)
  base = rng.uniform(100, 180, size=3)  # every channel >= 50 away from pure red
  for t in range(num):
    for c in range(3):
      out[t, :, :, c] = np.clip(base[c] + 30 * np.sin((x + 3 * t + 7 * c) / 9.0) + 20 * np.cos(y / 7.0), 0, 255)
  return out


# OVQA from raw videos (data_prep/ovqa_frames.py): per dataset, (question, answer, CSV video_id, video file under the
# dataset's folder, frame count); the files are named as the datasets ship them (MSVD's YouTubeClips/<clip>.avi with
# youtube_mapping.txt, MSRVTT's video<N>.mp4, TGIF's <gif_name>.gif, ActivityNet's v_<id>.mp4 / .mkv).
OVQA_VIDEO_ROWS = {
    "msvd": {"train": [("what is a man playing", "guitar", "vid1"), ("what is a woman cutting", "onion", "vid2"),
                       ("who is singing", "woman", "vid1")],
             "test": [("what is a man playing", "guitar", "vid3"), ("what is a cat doing", "sleeping", "vid2")]},
    "msrvtt": {"train": [("what is a man playing", "guitar", "7010"), ("who is cooking", "woman", "7011")],
               "test": [("what is running on grass", "dog", "7012"), ("who is cooking", "woman", "7011")]},
    "tgif": {"train": [("what is the dog doing", "running", "tumblr_nk172bbdPI1u1lr18o1_250"),
                       ("what does the man hold", "cup", "tumblr_ni35trYvWA1u3wbp4o1_400")],
             "test": [("what is the cat doing", "jumping", "tumblr_nhtc6b5Ls31u7uqpeo1_250")]},
    "activitynet": {"train": [("what is the person doing", "surfing", "v_QOlSCBRmfWY"),
                              ("is the man outdoors", "yes", "v_ehGHCYKzyZ8")],
                    "test": [("what is the person doing", "skiing", "v_nwznKOuZM7w")]},
}
OVQA_VIDEO_FILES = {  # dataset -> {file under <root>/<dataset>/: (frame count, height, width)}
    "msvd": {"YouTubeClips/-4wsuPCjDBc_5_15.avi": (12, 24, 32), "YouTubeClips/-7KMZQEsJW4_205_208.avi": (9, 24, 32),
             "YouTubeClips/-8y1Q0rA3n8_108_114.avi": (15, 24, 32)},
    "msrvtt": {"videos/all/video7010.mp4": (12, 24, 32), "videos/all/video7011.mp4": (20, 32, 24),
               "videos/all/video7012.mp4": (7, 24, 32)},
    "tgif": {"gifs/tumblr_nk172bbdPI1u1lr18o1_250.gif": (10, 20, 30), "gifs/tumblr_ni35trYvWA1u3wbp4o1_400.gif":
             (6, 30, 20), "gifs/tumblr_nhtc6b5Ls31u7uqpeo1_250.gif": (8, 24, 24)},
    "activitynet": {"videos/v_QOlSCBRmfWY.mp4": (16, 24, 32), "videos/v_ehGHCYKzyZ8.mkv": (11, 24, 32),
                    "videos/v_nwznKOuZM7w.mp4": (13, 24, 32)},
}
MSVD_MAPPING = {"-4wsuPCjDBc_5_15": "vid1", "-7KMZQEsJW4_205_208": "vid2", "-8y1Q0rA3n8_108_114": "vid3"}
OVQA_VIDEO_DIRS = {"msvd": "YouTubeClips", "msrvtt": "videos/all", "tgif": "gifs", "activitynet": "videos"}


def ovqa_raw_videos(root: str, seed: int = 0) -> dict:
  """The datasets' own videos beside OVQA / FrozenBiLM-style CSVs, for data_prep/ovqa_frames.py: root/<dataset>/
  {train,test}.csv (question, answer, video_id, type, id) and the video files of OVQA_VIDEO_FILES (real mp4 / avi /
  gif / mkv files, PyAV-encoded smooth colour gradients), plus MSVD's youtube_mapping.txt ("<clip> vid<N>", the
  MSVD-QA release's). Returns {dataset: {"csv_dir", "videos", "video_map", "files": {file: frame count}}}."""
  import pandas as pd
  from data_prep import ovqa_frames
  out = {}
  for k, (dataset, splits) in enumerate(OVQA_VIDEO_ROWS.items()):
    base = os.path.join(root, dataset)
    os.makedirs(base, exist_ok=True)
    next_id = 0
    for split, rows in splits.items():
      types = [MSRVTT_TYPES.get(q.split(" ")[0], 0) for q, _, _ in rows]
      pd.DataFrame({"question": [q for q, _, _ in rows], "answer": [a for _, a, _ in rows],
                    "video_id": [v for _, _, v in rows], "type": types,
                    "id": list(range(next_id, next_id + len(rows)))}).to_csv(os.path.join(base, f"{split}.csv"),
                                                                              index=False)
      next_id += len(rows)
    files = {}
    for j, (rel, (n, h, w)) in enumerate(OVQA_VIDEO_FILES[dataset].items()):
      path = os.path.join(base, rel)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      ovqa_frames.write_video(path, smooth_frames(n, h, w, seed=seed + 10 * k + j))
      files[path] = n
    video_map = None
    if dataset == "msvd":
      video_map = os.path.join(base, "youtube_mapping.txt")
      with open(video_map, "w") as f:
        f.writelines(f"{clip} {vid}\n" for clip, vid in MSVD_MAPPING.items())
    out[dataset] = {"csv_dir": base, "videos": os.path.join(base, OVQA_VIDEO_DIRS[dataset]), "video_map": video_map,
                    "files": files}
  return out


EVQA_ENTRIES = [
    # entry_id, video_id, frames, question, candidates, answer, segments
    ("q0001", "vid_a", 14, "What does the person pick up?", ["cup", "book", "phone", "ball", "key"], "cup",
     [[0.5, 1.5]]),
    ("q0002", "vid_b", 12, "Which animal enters first?", ["cat", "dog", "bird", "horse", "cow"], "dog",
     [[0.0, 0.5], [1.0, 1.5]]),
]


def evqa_release(root: str, height: int = 24, width: int = 32, seed: int = 0, mask_digits: int = 5) -> dict:
  """The ST-Evidence release (SalesforceAIResearch/EVQA benchmark/HUGGINGFACE_README.md) in miniature.

  st_evidence_gen/st_evidence_gen.csv: entry_id, video_id, video_path, question, candidates (python-list
  string), answer (text), segment ("[[s, e], ...]" seconds). st_evidence_gen/videos_6fps/<video_id>.mp4 (the
  extracted videos_6fps.tar.gz; the authors' scripts map `<video_id>.mp4` found in the folder or one level below).
  st_evidence_gen/masks/<entry_id>/<frame:05d>.png (the extracted masks.tar.gz; eval_st_evidence.py reads
  `gt_masks/<entry_id>/<name>.png`, `convert('L') > 0`, one file per annotated 6 fps frame; 0/255 here; the
  names are those of the authors' prediction scripts, `str(frame).zfill(5)`, since the evaluator pairs files by
  name; `mask_digits` = 0 writes "12.png" instead, a folder named otherwise than the release).
  st_evidence_mcq/: st_evidence_mcq.csv (the README's columns entry_id, video_id, video_path, question,
  candidates, answer, segment, mask_options, temp_options); temp_options.json {entry_id: {"question",
  "time_evidence_options": [[[s, e], ...] x 4], "correct_answer": "A".."D", "ground_truth_segments": [[s, e]]}};
  mask_options.json {entry_id: {"entry_id", "question", "gt", "d1", "d2", "d3": image paths relative to the
  folder options.tar.gz is extracted in, "options": the four keys in option order, "answer": index of "gt"}}
  (benchmark/st_evidence_mcq/*_st_evidence_mcq.py); options.tar.gz holds options/<entry_id>/{gt,d1,d2,d3}.png,
  the reference frame with a red boundary drawn around each candidate mask (RGB).

  Returns {"dir", "frames": {video_id: [N, H, W, 3] uint8}, "masks": {entry_id: {frame: [H, W] bool}},
  "entries", "temp_options", "mask_options", "spatial": {entry_id: (reference frame, the 4 candidate boxes
  [4, H, W] bool in option order)}}.
  """
  import pandas as pd
  from PIL import Image
  rng = np.random.default_rng(seed)
  gen, mcq = os.path.join(root, "st_evidence_gen"), os.path.join(root, "st_evidence_mcq")
  os.makedirs(gen, exist_ok=True)
  os.makedirs(mcq, exist_ok=True)
  frames, masks, rows, temp, mask_opts, spatial = {}, {}, [], {}, {}, {}
  options_root = os.path.join(mcq, "_options_src")
  for k, (entry_id, video_id, n, question, cands, answer, segs) in enumerate(EVQA_ENTRIES):
    frames[video_id] = smooth_frames(n, height, width, seed=seed + k)
    write_mp4(os.path.join(gen, "videos_6fps", f"{video_id}.mp4"), frames[video_id])
    masks[entry_id] = {}
    for s, e in segs:
      for f_idx in range(int(round(s * EVQA_FPS)), int(round(e * EVQA_FPS)) + 1):
        m = np.zeros((height, width), bool)
        y0, x0 = int(rng.integers(0, height - 8)), int(rng.integers(0, width - 8))
        m[y0:y0 + 8, x0:x0 + 10] = True
        masks[entry_id][f_idx] = m
        d = os.path.join(gen, "masks", entry_id)
        os.makedirs(d, exist_ok=True)
        name = f"{f_idx:0{mask_digits}d}.png" if mask_digits else f"{f_idx}.png"
        Image.fromarray(m.astype(np.uint8) * 255).save(os.path.join(d, name))
    rows.append({"entry_id": entry_id, "video_id": video_id, "video_path": f"videos_6fps/{video_id}.mp4",
                 "question": question, "candidates": str(cands), "answer": answer, "segment": str(segs)})
    distractors = [[[round(s + 0.5 * (j + 1), 2), round(e + 0.5 * (j + 1), 2)] for s, e in segs] for j in range(3)]
    t_answer = k % 4
    t_opts = distractors[:t_answer] + [segs] + distractors[t_answer:]
    temp[entry_id] = {"question": question, "time_evidence_options": t_opts,
                      "correct_answer": "ABCD"[t_answer], "ground_truth_segments": segs}
    order = [["d1", "gt", "d2", "d3"], ["d3", "d2", "d1", "gt"]][k % 2]
    ref_index = min(masks[entry_id])
    ref = frames[video_id][ref_index]
    d = os.path.join(options_root, "options", entry_id)
    os.makedirs(d, exist_ok=True)
    boxes = {}
    for j, key in enumerate(("gt", "d1", "d2", "d3")):
      img = ref.copy()
      y0, x0 = 2 + 4 * j, 3 + 6 * j  # distinct 6 x 7 boxes
      img[y0, x0:x0 + 7] = img[y0 + 5, x0:x0 + 7] = img[y0:y0 + 6, x0] = img[y0:y0 + 6, x0 + 6] = (255, 0, 0)
      box = np.zeros((height, width), bool)
      box[y0:y0 + 6, x0:x0 + 7] = True
      boxes[key] = box
      Image.fromarray(img).save(os.path.join(d, f"{key}.png"))
    mask_opts[entry_id] = {"entry_id": entry_id, "question": question,
                           **{key: f"options/{entry_id}/{key}.png" for key in ("gt", "d1", "d2", "d3")},
                           "options": order, "answer": order.index("gt")}
    spatial[entry_id] = (ref_index, np.stack([boxes[key] for key in order]))
  pd.DataFrame(rows).to_csv(os.path.join(gen, "st_evidence_gen.csv"), index=False)
  mcq_rows = [dict(r, mask_options=r["entry_id"], temp_options=r["entry_id"]) for r in rows]
  pd.DataFrame(mcq_rows).to_csv(os.path.join(mcq, "st_evidence_mcq.csv"), index=False)
  with open(os.path.join(mcq, "temp_options.json"), "w") as f:
    json.dump(temp, f)
  with open(os.path.join(mcq, "mask_options.json"), "w") as f:
    json.dump(mask_opts, f)
  with tarfile.open(os.path.join(mcq, "options.tar.gz"), "w:gz") as tar:
    tar.add(os.path.join(options_root, "options"), arcname="options")
  import shutil
  shutil.rmtree(options_root)
  return {"dir": root, "frames": frames, "masks": masks, "entries": EVQA_ENTRIES, "temp_options": temp,
          "mask_options": mask_opts, "spatial": spatial}


def rle_encode(mask: np.ndarray) -> dict:
  """COCO RLE of a 0/1 mask [H, W] with the compressed string counts (pycocotools' rleToString), as ViCaS ships."""
  flat = np.asarray(mask, np.uint8).T.reshape(-1)  # column-major
  runs, value, pos = [], 0, 0
  while pos < len(flat):
    end = pos
    while end < len(flat) and flat[end] == value:
      end += 1
    runs.append(end - pos)
    pos, value = end, 1 - value
  chars = []
  for i, run in enumerate(runs):
    x = run - runs[i - 2] if i > 2 else run
    more = True
    while more:
      c = x & 0x1F
      x >>= 5
      more = (x != -1) if (c & 0x10) else (x != 0)
      chars.append(chr((c | 0x20 if more else c) + 48))
  return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": "".join(chars)}


def _jpeg_frames(directory: str, frames: np.ndarray, name) -> None:
  from PIL import Image
  os.makedirs(directory, exist_ok=True)
  for i, img in enumerate(frames):
    Image.fromarray(img).save(os.path.join(directory, name(i)), quality=95)


# (entry_id, video_id, video_path, frames, question, candidates, answer, temporal_evidence)
INSTRUCT_GEN_MASK = [
    ("YNIWQ_868759", "YNIWQ", "videos/star/YNIWQ.mp4", 9, "What does the person hold?",
     ["a backpack", "a cup", "a book", "a phone", "a towel"], "a backpack", [[0.3, 0.7]]),
]
INSTRUCT_VICAS = [
    ("10375_0", "10375", "010375_video.mp4", 6, "What object is the man holding?",
     ["A desk", "A book", "A chair", "A pole"], "A pole", [1, 2], [[0.0, 0.5]]),
]
# The hand-checkable masks: a 17 x 13 rectangle (PIL fills the boundary) with a 5 x 5 hole = 196 pixels.
INSTRUCT_POLYGON = {"exterior": [[4, 4], [20, 4], [20, 16], [4, 16]], "holes": [[[8, 8], [12, 8], [12, 12], [8, 12]]]}


def evqa_instruct(root: str, height: int = 24, width: int = 32, seed: int = 3) -> dict:
  """ST-Evidence-Instruct (Hugging Face Salesforce/ST-Evidence-Instruct, extracted) in miniature: the layout read by
  the authors' loaders in SalesforceAIResearch/EVQA train/unipixel/dataset/sub_classes/segmentation.py.

  gen_mask/ (STEvidenceGenMaskDataset): st_evidence.csv (entry_id, video_id, video_path, question, answer,
  candidates, source, split, temporal_evidence: the README's columns without mask_evidence), masks/<entry_id>.json
  ({entry_id, video_path, fps 6.0, width, height, evidence_objects: [{ref_expression, masks: [{frame, mask}]}]},
  mask = {exterior, holes} polygon -- holes are 'ignore' shapes there, drawn as background -- here frames 2-4 of
  object 0, plus an RLE {size, counts} mask of object 1 on frame 3), video_frames_6fps/<video_path without
  extension>/frame_%04d.jpg.
  gen_qa/vicas/ (STEvidenceGenQADataset): st_evidence_vicas.csv (+ mask_evidence "[1, 2]", qa_source),
  annotations/v1.0/<video_id:06d>.json ({segmentations: [{filename, track_ids, mask_rles}]}, compressed COCO RLE;
  track 1 on frames 0-2, track 2 on frames 1-3, track 3 -- not evidence -- everywhere) and
  video_frames/<video_id:06d>/<filename>.jpg. (The pickle st_evidence_meta.pkl of the release is not written:
  the converter never unpickles.)

  Returns {"dir", "gen_mask", "vicas", "masks": {entry_id: {frame: [H, W] uint8 merged evidence mask}}}.
  """
  import pandas as pd
  gen, vicas = os.path.join(root, "gen_mask"), os.path.join(root, "gen_qa", "vicas")
  os.makedirs(os.path.join(gen, "masks"), exist_ok=True)
  masks, rows = {}, []
  box = np.zeros((height, width), np.uint8)
  box[18:22, 24:30] = 1  # object 1's RLE mask: 4 x 6
  for k, (entry_id, video_id, path, n, question, cands, answer, segs) in enumerate(INSTRUCT_GEN_MASK):
    _jpeg_frames(os.path.join(gen, "video_frames_6fps", os.path.splitext(path)[0]),
                 smooth_frames(n, height, width, seed=seed + k), lambda i: f"frame_{i:04d}.jpg")
    objs = [{"ref_expression": "gray backpack on the bed",
             "masks": [{"frame": f, "mask": INSTRUCT_POLYGON} for f in (2, 3, 4)]},
            {"ref_expression": "the cup", "masks": [{"frame": 3, "mask": rle_encode(box)}]}]
    with open(os.path.join(gen, "masks", f"{entry_id}.json"), "w") as f:
      json.dump({"entry_id": entry_id, "video_path": path, "fps": 6.0, "width": width, "height": height,
                 "evidence_objects": objs}, f)
    poly = np.zeros((height, width), np.uint8)
    poly[4:17, 4:21] = 1
    poly[8:13, 8:13] = 0
    masks[entry_id] = {2: poly, 3: np.maximum(poly, box), 4: poly}
    rows.append({"entry_id": entry_id, "video_id": video_id, "video_path": path, "question": question,
                 "answer": answer, "candidates": str(cands), "source": "star", "split": "train",
                 "temporal_evidence": str(segs)})
  pd.DataFrame(rows).to_csv(os.path.join(gen, "st_evidence.csv"), index=False)
  rows = []
  for k, (entry_id, video_id, path, n, question, cands, answer, tracks, segs) in enumerate(INSTRUCT_VICAS):
    vid = video_id.zfill(6)
    _jpeg_frames(os.path.join(vicas, "video_frames", vid), smooth_frames(n, height, width, seed=seed + 10 + k),
                 lambda i: f"{i:05d}.jpg")
    t1, t2, t3 = (np.zeros((height, width), np.uint8) for _ in range(3))
    t1[2:6, 2:10] = 1
    t2[10:20, 12:16] = 1
    t3[:, :] = 1
    segmentations, merged = [], {}
    for i in range(n):
      present = [(1, t1)] * (i <= 2) + [(2, t2)] * (1 <= i <= 3) + [(3, t3)]
      segmentations.append({"filename": f"{i:05d}.jpg", "track_ids": [t for t, _ in present],
                            "mask_rles": [rle_encode(m) for _, m in present]})
      ev = [m for t, m in present if t in tracks]
      if ev:
        merged[i] = np.maximum.reduce(ev)
    masks[entry_id] = merged
    os.makedirs(os.path.join(vicas, "annotations", "v1.0"), exist_ok=True)
    with open(os.path.join(vicas, "annotations", "v1.0", f"{vid}.json"), "w") as f:
      json.dump({"video_id": int(video_id), "filename": path, "segmentations": segmentations}, f)
    rows.append({"entry_id": entry_id, "video_id": video_id, "video_path": path, "question": question,
                 "answer": answer, "candidates": str(cands), "mask_evidence": str(tracks), "source": "vicas",
                 "split": "train", "qa_source": "gemini", "temporal_evidence": str(segs)})
  pd.DataFrame(rows).to_csv(os.path.join(vicas, "st_evidence_vicas.csv"), index=False)
  return {"dir": root, "gen_mask": gen, "vicas": vicas, "masks": masks}


# The tiny CLIP of the E-VQA chain (docs/evqa.md): frames of --frame-size 32 32, patches of 8.
TINY_CLIP = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                 patch_size=8, num_channels=3, hidden_act="quick_gelu", layer_norm_eps=1e-5)


def clip_vision_dir(path: str, seed: int = 3, **shape) -> dict:
  """A Hugging Face `CLIPVisionModel` folder (openai/clip-vit-base-patch16's vision tower as `save_pretrained`
  writes it) at toy sizes with random weights: config.json (model_type clip_vision_model) and model.safetensors,
  every tensor under its Hugging Face name ("vision_model.encoder.layers.0.self_attn.q_proj.weight", torch layouts:
  Linear weights [out, in], the patch Conv2d [D, 3, p, p]). Written with numpy: no torch needed.
  Returns {"path", "config"}."""
  from safetensors.numpy import save_file
  cfg = dict(TINY_CLIP, **shape)
  d, i, p, c = cfg["hidden_size"], cfg["intermediate_size"], cfg["patch_size"], cfg["num_channels"]
  rng = np.random.default_rng(seed)
  t = lambda *s: (0.02 * rng.normal(size=s)).astype(np.float32)  # noqa: E731
  norm = lambda: {"weight": (1 + 0.1 * rng.normal(size=d)).astype(np.float32), "bias": t(d)}  # noqa: E731
  sd = {"embeddings.class_embedding": t(d), "embeddings.patch_embedding.weight": t(d, c, p, p),
        "embeddings.position_embedding.weight": t((cfg["image_size"] // p) ** 2 + 1, d)}
  for name in ("pre_layrnorm", "post_layernorm"):
    sd.update({f"{name}.{k}": v for k, v in norm().items()})
  for layer in range(cfg["num_hidden_layers"]):
    pre = f"encoder.layers.{layer}"
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
      sd[f"{pre}.self_attn.{name}.weight"], sd[f"{pre}.self_attn.{name}.bias"] = t(d, d), t(d)
    sd[f"{pre}.mlp.fc1.weight"], sd[f"{pre}.mlp.fc1.bias"] = t(i, d), t(i)
    sd[f"{pre}.mlp.fc2.weight"], sd[f"{pre}.mlp.fc2.bias"] = t(d, i), t(d)
    for name in ("layer_norm1", "layer_norm2"):
      sd.update({f"{pre}.{name}.{k}": v for k, v in norm().items()})
  os.makedirs(path, exist_ok=True)
  save_file({f"vision_model.{k}": v for k, v in sd.items()}, os.path.join(path, "model.safetensors"),
            metadata={"format": "pt"})
  config = dict(cfg, model_type="clip_vision_model", architectures=["CLIPVisionModel"], attention_dropout=0.0,
                initializer_range=0.02, initializer_factor=1.0, projection_dim=d, torch_dtype="float32")
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  return {"path": path, "config": config}


# Just Ask's checkpoint in the OVQA fixture: the multi-modal transformer at toy width (docs/justask.md passes the
# matching --config.model.* overrides).
JUSTASK_FIXTURE = dict(d_model=32, n_layers=2, ff_dim=64, question_len=20, num_frames=20, feature_dim=1024)


def s3d_features(path: str, frames: dict, seed: int = 2) -> dict:
  """Just Ask's `s3d.pth` (args.features_path; main_videoqa.py: `features = torch.load(path)`, then
  `features[video_id]`): a torch.save'd dict {video_id: float32 tensor [T_video, 1024]} of S3D clip features."""
  import torch
  rng = np.random.default_rng(seed)
  feats = {v: rng.normal(size=(n, 1024)).astype(np.float32) for v, n in frames.items()}
  torch.save({v: torch.from_numpy(x) for v, x in feats.items()}, path)
  return feats


def write_ovqa(root: str) -> dict:
  """OVQA on MSRVTT-QA: root/models/{deberta-v2-xlarge/, frozenbilm.pth, ovqa_msrvtt.pth (an OVQA-trained
  checkpoint, state-dict form), distilbert-base-uncased/, ckpt_pt_howtovqa69m.pth (Just Ask's)}, root/MSRVTT-QA/
  (FrozenBiLM's CSVs, clipvitl14.pth, subtitles.pkl and Just Ask's s3d.pth), root/meta_data/msrvtt/ (the OVQA
  release: its CSVs, features, subtitles, vocabularies, categories and answer graphs) and root/raw_videos/<dataset>/
  (each dataset's own video files with CSVs, for data_prep/ovqa_frames.py)."""
  deb = deberta_v2_dir(os.path.join(root, "models", "deberta-v2-xlarge"))
  frozenbilm_checkpoint(os.path.join(root, "models", "frozenbilm.pth"), deb["state_dict"], deb["config"])
  ovqa_checkpoint(os.path.join(root, "models", "ovqa_msrvtt.pth"), deb["state_dict"], deb["config"])
  dist = distilbert_dir(os.path.join(root, "models", "distilbert-base-uncased"))
  justask_checkpoint(os.path.join(root, "models", "ckpt_pt_howtovqa69m.pth"), dist["state_dict"],
                     word_dim=dist["config"]["dim"], **JUSTASK_FIXTURE)
  rel = msrvtt_qa(os.path.join(root, "MSRVTT-QA"))
  s3d_features(os.path.join(root, "MSRVTT-QA", "s3d.pth"), {v: len(x) for v, x in rel["features"].items()})
  meta = ovqa_meta_data(os.path.join(root, "meta_data", "msrvtt"), embed_dim=deb["config"]["hidden_size"])
  ovqa_raw_videos(os.path.join(root, "raw_videos"))
  return {"deberta": deb["path"], "msrvtt_qa": rel["dir"], "meta_data": meta["dir"], "distilbert": dist["path"],
          "raw_videos": os.path.join(root, "raw_videos")}


def write_violin(root: str) -> dict:
  """VIOLIN: root/violin_annotation.json, root/all_res101_pool5_feat.h5 (as in the authors' feature folder) and
  root/all_det_features.h5 (the detection features in the same layout)."""
  violin_release(root, feature="det", seed=1)
  return {"dir": violin_release(root)["dir"]}


def write_evqa(root: str) -> dict:
  """ST-Evidence: root/st_evidence_gen/ (CSV, 6 fps videos, masks) and root/st_evidence_mcq/ (the MCQ files), and
  ST-Evidence-Instruct: root/st-evidence-instruct/{gen_mask, gen_qa/vicas}/."""
  instruct = evqa_instruct(os.path.join(root, "st-evidence-instruct"))
  clip = clip_vision_dir(os.path.join(root, "models", "clip-vit-tiny"))
  return {"dir": evqa_release(root)["dir"], "instruct": instruct["dir"], "clip": clip["path"]}


TORCH_INSTALL = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"  # evqa_jax.io's
PAPERS = {"ovqa": write_ovqa, "violin": write_violin, "evqa": write_evqa}


def main(argv=None) -> None:
  import shutil
  import tempfile
  parser = argparse.ArgumentParser(prog="python -m data_prep.fixtures", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="a new (or empty) folder; DIR/<paper>/ per paper")
  parser.add_argument("--paper", nargs="+", choices=sorted(PAPERS),
                      help=f"default: {' '.join(sorted(PAPERS))} (without torch: all but ovqa, said so)")
  args = parser.parse_args(argv)
  if args.paper is None:
    args.paper = sorted(PAPERS)
    try:
      import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      args.paper.remove("ovqa")
      print(f"ovqa: not written here: its .pth files are torch.save'd as released, which needs torch ({TORCH_INSTALL}"
            "); then add it with --paper ovqa", flush=True)
  from evqa_jax import io as evqa_io  # pylint: disable=g-import-not-at-top
  if evqa_io.is_uri(args.out):  # refused, not written to a local folder named "gs:"
    parser.error(f"--out {args.out}: the fixtures are release-shaped inputs, and the converters read their inputs "
                 "from a local disk; write them to a local folder (the converters' --out may be gs://)")
  out = os.path.abspath(os.path.expanduser(args.out))
  taken = [p for p in args.paper if os.path.lexists(os.path.join(out, p))]
  if taken:
    parser.error(f"--out {args.out}: {', '.join(os.path.join(out, p) for p in taken)} already exists; "
                 "choose another folder (nothing was written)")
  if "ovqa" in args.paper:
    try:
      import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      parser.error(f"--paper ovqa writes torch.save'd .pth files as the releases ship them and needs torch: "
                   f"{TORCH_INSTALL} (or leave out ovqa)")
  os.makedirs(out, exist_ok=True)
  for paper in args.paper:
    tmp = tempfile.mkdtemp(prefix=f".{paper}.", suffix=".tmp", dir=out)  # whole or nothing: renamed when complete
    try:
      PAPERS[paper](tmp)
      os.replace(tmp, os.path.join(out, paper))
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    print(f"{paper}: {os.path.join(out, paper)}")
    for dirpath, dirnames, filenames in sorted(os.walk(os.path.join(out, paper))):
      dirnames.sort()
      depth = os.path.relpath(dirpath, out).count(os.sep)
      if depth <= 2:
        shown = sorted(filenames)[:6]
        more = f" (+{len(filenames) - 6} more)" if len(filenames) > 6 else ""
        print(f"  {os.path.relpath(dirpath, out)}/ {' '.join(shown)}{more}")


if __name__ == "__main__":
  import sys
  from evqa_jax import cli
  sys.exit(cli.run(main))
