"""Parity of evqa_jax.models.lxmert with Hugging Face PyTorch `LxmertModel` at a tiny random size, and its importer."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from evqa_jax.models import lxmert

TINY = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=48, max_position_embeddings=24,
            type_vocab_size=2, l_layers=2, x_layers=2, r_layers=1, visual_feat_dim=12, visual_pos_dim=4,
            num_qa_labels=3, num_object_labels=5, num_attr_labels=4)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """A tiny LxmertModel with every tensor random (LayerNorms and biases too, so no mapping mistake hides behind
  (1, 0) initial values), saved with save_pretrained, and the reloaded PyTorch model."""
  torch.manual_seed(0)
  model = transformers.LxmertModel(transformers.LxmertConfig(**TINY)).eval()
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      scale = name.endswith(("LayerNorm.weight", "layer_norm.weight"))
      p.copy_(0.2 * torch.randn(p.shape, generator=g) + (1.0 if scale else 0.0))
  d = str(tmp_path_factory.mktemp("tiny_lxmert"))
  model.save_pretrained(d)
  return d, transformers.LxmertModel.from_pretrained(d).eval()


def _inputs(seed=0, b=3, length=7, objects=5):
  r = np.random.RandomState(seed)
  ids = r.randint(1, TINY["vocab_size"], (b, length)).astype(np.int64)
  mask = (np.arange(length)[None] < np.array([7, 4, 2])[:, None]).astype(np.int64)
  types = (np.arange(length)[None] >= np.array([3, 2, 1])[:, None]).astype(np.int64) * mask
  feats = r.randn(b, objects, TINY["visual_feat_dim"]).astype(np.float32)
  pos = r.rand(b, objects, 4).astype(np.float32)
  vmask = (np.arange(objects)[None] < np.array([5, 3, 1])[:, None]).astype(np.int64)
  return ids, mask, types, feats, pos, vmask


def test_outputs_match_hugging_face_lxmert(hf):
  path, torch_model = hf
  cfg = lxmert.LxmertConfig.from_hf_dir(path)
  assert (cfg.l_layers, cfg.x_layers, cfg.r_layers, cfg.visual_feat_dim) == (2, 2, 1, 12)
  params, report = lxmert.load_hf_params(cfg, path)
  assert not report.missing and not report.unused, report
  ids, mask, types, feats, pos, vmask = _inputs()
  with torch.no_grad():
    want = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(types), visual_feats=torch.tensor(feats),
                       visual_pos=torch.tensor(pos), visual_attention_mask=torch.tensor(vmask))
  run = jax.jit(lambda p, *a: lxmert.LxmertLM(cfg).apply(
      {"params": p}, jnp.asarray(a[0]), jnp.asarray(a[1]), token_type_ids=jnp.asarray(a[2]), visual=a[3],
      visual_pos=a[4], visual_mask=jnp.asarray(a[5])))
  got = run(params, ids, mask, types, feats, pos, vmask)
  for ours, theirs in (("hidden", want.language_output), ("vision", want.vision_output),
                       ("pooled", want.pooled_output)):
    theirs = theirs.numpy()
    # Measured max |diff| 1.7e-6 (hidden), 1.8e-6 (vision), 1.1e-6 (pooled) on values up to 2.8, 3.3, 1.0: float32
    # rounding through the 5 layers.
    np.testing.assert_allclose(np.asarray(got[ours]), theirs, atol=5e-6, rtol=0, err_msg=ours)
  # One LayerNorm scale of the last cross-modality layer x 0.999 moves the outputs far beyond that bound.
  moved = jax.tree.map(lambda x: x, params)
  ln = moved["encoder"]["x_layers_1"]["lang_output"]["LayerNorm"]
  ln["scale"] = ln["scale"] * 0.999
  assert np.abs(np.asarray(run(moved, ids, mask, types, feats, pos, vmask)["hidden"]) -
                want.language_output.numpy()).max() > 1e-4
  # Without a visual mask every object is attended, as Hugging Face's visual_attention_mask=None.
  with torch.no_grad():
    want = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), visual_feats=torch.tensor(feats),
                       visual_pos=torch.tensor(pos))
  got = lxmert.LxmertLM(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), visual=feats,
                                   visual_pos=pos)
  np.testing.assert_allclose(np.asarray(got["pooled"]), want.pooled_output.numpy(), atol=5e-6, rtol=0)


def test_importer_refuses_mismatched_config_and_weights(hf, tmp_path):
  path, _ = hf
  cfg = lxmert.LxmertConfig.from_hf_dir(path, x_layers=3)  # the config says 3 cross layers, the weights hold 2
  with pytest.raises(ValueError, match=r"x_layers_2.*config and the weights do not match"):
    lxmert.load_hf_params(cfg, path)
  with open(os.path.join(path, "config.json")) as f:
    d = json.load(f)
  with pytest.raises(ValueError, match="model_type 'bert' is not an LXMERT"):
    lxmert.LxmertConfig.from_dict(dict(d, model_type="bert"))
  bad = lxmert.LxmertConfig.from_hf_dir(path, visual_feat_dim=16)
  with pytest.raises(ValueError, match="visn_fc"):
    lxmert.load_hf_params(bad, path)
