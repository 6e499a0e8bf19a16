"""The CLIP text tower (evqa_jax/models/clip_text.py) against Hugging Face's CLIPTextModelWithProjection."""

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evqa_jax.models import clip_text
from hf_towers import saved_tiny_model


@pytest.fixture(scope="module")
def hf_clip_text_dir():
  pytest.importorskip("torch")
  from transformers import CLIPTextConfig, CLIPTextModelWithProjection
  cfg = CLIPTextConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=12, projection_dim=24, eos_token_id=2)
  return saved_tiny_model(CLIPTextModelWithProjection, cfg, "tiny_clip_text_")


def test_clip_text_matches_hugging_face(hf_clip_text_dir):
  """Hidden states, the end-of-text pooled feature and the projected text embedding to 1e-5 (fp32), on sequences
  padded after their end-of-text token (the largest id, 49 here), as OpenAI's clip.tokenize pads; a full CLIPModel
  state dict (text_model. prefix, vision keys) imports the same parameters."""
  import torch
  path, hf_model = hf_clip_text_dir
  cfg = clip_text.CLIPTextConfig.from_hf_dir(path)
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.projection_dim, cfg.max_position_embeddings) == (32, 2, 24, 12)
  params, report = clip_text.load_hf_params(cfg, path)
  assert not report.missing and not report.unused
  ids = np.array([[48, 5, 7, 9, 49, 0, 0, 0, 0, 0], [48, 3, 49, 0, 0, 0, 0, 0, 0, 0],
                  [48, 11, 12, 13, 14, 15, 16, 17, 18, 49]], np.int64)
  with torch.no_grad():
    ref = hf_model(input_ids=torch.from_numpy(ids))
    hidden = hf_model.text_model(input_ids=torch.from_numpy(ids)).last_hidden_state
  out = jax.jit(clip_text.CLIPTextModel(cfg).apply)({"params": params}, jnp.asarray(ids, jnp.int32))
  np.testing.assert_allclose(np.asarray(out["last_hidden_state"]), hidden.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out["text_embeds"]), ref.text_embeds.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out["pooler_output"]), np.asarray(out["last_hidden_state"])[[0, 1, 2], [4, 2, 9]])

  from safetensors.numpy import save_file
  sd = {("" if k.startswith("text_projection") else "text_model.") + k.removeprefix("text_model."): v.numpy()
        for k, v in hf_model.state_dict().items()}
  sd["vision_model.embeddings.class_embedding"] = np.zeros((8,), np.float32)
  sd["logit_scale"] = np.zeros((), np.float32)
  d = tempfile.mkdtemp(prefix="full_clip_text_")
  save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, os.path.join(d, "model.safetensors"))
  full, report = clip_text.load_hf_params(cfg, d)
  assert not report.unused
  jax.tree.map(np.testing.assert_array_equal, full, params)
  with pytest.raises(ValueError, match=r"encoder_layers_0/mlp/fc1/(kernel|bias)"):
    clip_text.load_hf_params(clip_text.CLIPTextConfig.from_hf_dir(path, intermediate_size=40), path)


def _tiny_clip_folder(path, projection_dim):
  """A CLIPModel folder at toy size with a working CLIP BPE tokenizer (byte-level characters, no merges)."""
  import json as json_lib
  torch = pytest.importorskip("torch")
  from transformers import CLIPConfig, CLIPModel, CLIPTokenizer
  # GPT-2's byte -> printable character table (CLIP's BPE alphabet).
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  cs, n = bs[:], 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  chars = [chr(c) for c in cs]
  vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
  os.makedirs(path)
  CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
  torch.manual_seed(0)
  cfg = CLIPConfig(text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, max_position_embeddings=40,
                                    bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
                                    pad_token_id=vocab["<|endoftext|>"]),
                   vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, image_size=8, patch_size=4),
                   projection_dim=projection_dim)
  model = CLIPModel(cfg).eval()
  model.save_pretrained(path)
  return model


def test_zero_shot_clip_and_random_baselines(tmp_path):
  """launch/ovqa_zero_shot_baselines.py on the release fixtures (MSRVTT-QA's CLIP features, converted with a
  FrozenBiLM-style vocab file): CLIP's pick for each question is the argmax of Hugging Face's text features of
  "Question: {q}? Answer: {a}[ Subtitles: {s}]" dotted with the first frame; Random draws uniformly with the seed;
  both written as predictions.csv and scored by the official scorer."""
  import csv
  import json as json_lib
  import torch
  from data_prep import fixtures, ovqa as prep
  from evqa_jax.evaluate import ovqa as ovqa_eval
  sys_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch")
  import importlib.util
  spec = importlib.util.spec_from_file_location("zs", os.path.join(sys_path, "ovqa_zero_shot_baselines.py"))
  zs = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(zs)
  fixtures.main(["--out", str(tmp_path / "fx"), "--paper", "ovqa"])
  meta = tmp_path / "fx" / "ovqa" / "meta_data" / "msrvtt"
  vocab = ["woman", "piano", "guitar", "a dog"]
  (tmp_path / "vocab1000.json").write_text(json_lib.dumps({a: i for i, a in enumerate(vocab)}))
  data = str(tmp_path / "records")
  prep.convert(str(meta), str(meta / "clipvitl14.pth"), data, authors_vocab=str(meta), verbose=False,
               subtitles=str(meta / "subtitles.pkl"), trust_pickles=True, cvqa_vocab=str(tmp_path / "vocab1000.json"))
  model = _tiny_clip_folder(str(tmp_path / "clip"), projection_dim=768)  # the fixture's CLIP features are 768-d
  from transformers import CLIPTokenizer
  tok = CLIPTokenizer.from_pretrained(str(tmp_path / "clip"))

  metrics = zs.run(data, "clip", str(tmp_path / "clip_out"), clip_dir=str(tmp_path / "clip"), batch_size=3)
  examples = zs._test_examples(data)
  rows = list(csv.DictReader(open(tmp_path / "clip_out" / "predictions.csv")))
  assert [int(r["index"]) for r in rows] == [int(ex["index"]) for ex in examples]
  for ex, row in zip(examples, rows):
    texts = [zs.clip_text(str(ex["question"]), a, str(ex["subtitles"])) for a in vocab]
    enc = tok(texts, padding="max_length", max_length=40, truncation=True, return_tensors="pt")
    with torch.no_grad():
      feats = model.text_projection(model.text_model(input_ids=enc["input_ids"]).pooler_output).numpy()
    scores = feats @ np.asarray(ex["video"], np.float32)[0]
    assert row["prediction"] == vocab[int(np.argmax(scores))]
  assert any(str(ex["subtitles"]) for ex in examples)  # the subtitles part of the text is exercised
  assert zs.clip_text("what is it", "dog", "") == "Question: What is it? Answer: dog"
  official = ovqa_eval.evaluate_files(os.path.join(data, "train.csv"), os.path.join(data, "test.csv"),
                                      str(tmp_path / "clip_out" / "predictions.csv"))
  assert json_lib.loads((tmp_path / "clip_out" / "metrics.json").read_text()) == json_lib.loads(
      json_lib.dumps(official)) and metrics == official

  zs.run(data, "random", str(tmp_path / "random_out"), seed=3)
  rows = list(csv.DictReader(open(tmp_path / "random_out" / "predictions.csv")))
  picks = np.random.default_rng(3).integers(len(vocab), size=len(examples))
  assert [r["prediction"] for r in rows] == [vocab[i] for i in picks]
