"""OVQA-trained checkpoints (mlvlab/OVQA train.py) as `config.pretrained.init_from`.

Their DebertaV2ForMaskedLM's state dict holds FrozenBiLM's names (deberta.* with embeddings.linear_video and the
adapters, lm_predictions.lm_head.{dense,LayerNorm,bias}: read by deberta_v2.load_frozenbilm_checkpoint) plus the GNN
soft verbalizer of model/deberta.py, `lm_predictions.lm_head.gnn{1,2}.lin_{src,dst}.weight` [D, D] (torch_geometric
Linear, no bias: y = x W^T), and answer_embeddings / answer_bias (the frozen answer encoder's output for the last
vocabulary set, recomputed here from the LM: not read).

Their score (W_dst h_i) . (W_src h_j) is ours h_i^T w_dst w_src^T h_j with w = W^T (evqa_jax/models/verbalizer.py
GATLayer), layer gnn<l> -> gat_<l - 1>.

train.py saves `{"model": model, ...}` with the whole nn.Module pickled, which only their code can unpickle; such a
file is refused (as every pickle is, unless config.trust_pickles) with the one-line conversion to a state dict.
"""

import re

import numpy as np

from evqa_jax import io as evqa_io
from evqa_jax.models import deberta_v2
from evqa_jax.models.verbalizer import canonical_variant

GNN_KEY = re.compile(r"^(?:module\.)?lm_predictions\.lm_head\.gnn(\d+)\.lin_(src|dst)\.weight$")
CONVERT = ("python -c \"import torch; c = torch.load('best_model.pth', weights_only=False); "
           "torch.save({'model': c['model'].state_dict()}, 'best_model_state_dict.pth')\"")


def read(path: str, trust_pickles: bool) -> dict:
  """{state-dict name: numpy array} of a FrozenBiLM or OVQA checkpoint (torch weights_only loading)."""
  try:
    return deberta_v2.read_frozenbilm_checkpoint(path, trust_pickles)
  except evqa_io.UnsafeInputError as e:
    raise evqa_io.UnsafeInputError(
        f"{e}. OVQA's train.py pickles the whole model in best_model.pth / ckpt.pth: turn it into a state dict "
        f"where their code runs: {CONVERT}") from None


def verbalizer_weights(ckpt: dict, path: str) -> list:
  """[{"w_src", "w_dst"} per GNN layer, in order] from the checkpoint's gnn<l>.lin_{src,dst}.weight (transposed to
  our kernels); [] when it holds none (a FrozenBiLM checkpoint)."""
  found = {}
  for name, value in ckpt.items():
    m = GNN_KEY.match(name)
    if m:
      found.setdefault(int(m.group(1)), {})[f"w_{m.group(2)}"] = (name, np.asarray(value, np.float32))
  layers = sorted(found)
  if layers and layers != list(range(1, len(layers) + 1)):
    raise ValueError(f"{path}: GNN verbalizer layers lm_predictions.lm_head.gnn{layers} are not gnn1..gnn"
                     f"{len(layers)}")
  out = []
  for layer in layers:
    pair = found[layer]
    for side in ("w_src", "w_dst"):
      if side not in pair:
        raise ValueError(f"{path}: lm_predictions.lm_head.gnn{layer}.lin_{side[2:]}.weight is missing (its "
                         f"lin_{'dst' if side == 'w_src' else 'src'} is there)")
      name, w = pair[side]
      if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"{path}: {name} has shape {w.shape}, expected [D, D]")
    out.append({side: pair[side][1].T.copy() for side in ("w_src", "w_dst")})
  return out


def load_verbalizer(params: dict, layers: list, verbalizer_config, path: str) -> dict:
  """`params["verbalizer"]` (host numpy) with the checkpoint's GNN `layers` in place of the identity init."""
  variant = canonical_variant(verbalizer_config.variant)
  if variant != "gat" or "verbalizer" not in params:
    raise ValueError(f"{path} holds a trained GNN verbalizer (lm_predictions.lm_head.gnn1..{len(layers)}) but "
                     f"config.verbalizer.variant = {verbalizer_config.variant!r}: set it to 'E' to use it")
  ours = params["verbalizer"]
  if len(layers) != verbalizer_config.num_layers:
    raise ValueError(f"{path} holds {len(layers)} GNN layers but config.verbalizer.num_layers = "
                     f"{verbalizer_config.num_layers}")
  new = dict(ours)
  for i, layer in enumerate(layers):
    mine = ours[f"gat_{i}"]
    for side, w in layer.items():
      if w.shape != tuple(mine[side].shape):
        raise ValueError(f"{path}: lm_predictions.lm_head.gnn{i + 1}.lin_{side[2:]}.weight is {w.shape[0]} x "
                         f"{w.shape[1]} but the model's verbalizer is {mine[side].shape[0]}-d (the LM's hidden size)")
    new[f"gat_{i}"] = {side: layer[side].astype(np.asarray(mine[side]).dtype) for side in ("w_dst", "w_src")}
  return dict(params, verbalizer=new)
