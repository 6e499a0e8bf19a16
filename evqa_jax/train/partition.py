"""Trainable / frozen split of a parameter tree by path regex, and the optimiser built on the trainable part only.

Gradients and optimiser state exist only for trainable parameters: a frozen 900M-parameter LM costs neither backward
weight-gradient work nor Adam moments.
"""

import re
from typing import Sequence

import optax
from flax import traverse_util


def path_str(path: tuple) -> str:
  return "/".join(str(p) for p in path)


def split_params(params: dict, trainable_patterns: Sequence[str]):
  """-> (trainable, frozen) nested dicts; a leaf is trainable when any pattern `re.search`es its 'a/b/c' path."""
  regex = re.compile("|".join(f"(?:{p})" for p in trainable_patterns)) if trainable_patterns else None
  flat = traverse_util.flatten_dict(params)
  trainable, frozen = {}, {}
  for path, leaf in flat.items():
    (trainable if regex is not None and regex.search(path_str(path)) else frozen)[path] = leaf
  return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def merge_params(trainable: dict, frozen: dict) -> dict:
  flat = dict(traverse_util.flatten_dict(frozen))
  flat.update(traverse_util.flatten_dict(trainable))
  return traverse_util.unflatten_dict(flat)


def count_params(tree) -> int:
  return int(sum(x.size for x in traverse_util.flatten_dict(tree).values())) if tree else 0


def make_schedule(optim_config, total_steps: int) -> optax.Schedule:
  """Linear warm-up over `warmup_fraction` of the steps, then `decay` ('linear' to 0, 'cosine' or 'constant')."""
  warmup = int(round(optim_config.warmup_fraction * total_steps))
  peak = optim_config.lr
  decay_steps = max(total_steps - warmup, 1)
  if optim_config.decay == "linear":
    after = optax.linear_schedule(peak, 0.0, decay_steps)
  elif optim_config.decay == "cosine":
    after = optax.cosine_decay_schedule(peak, decay_steps)
  elif optim_config.decay == "constant":
    after = optax.constant_schedule(peak)
  else:
    raise ValueError(f"config.optim.decay = {optim_config.decay!r}: expected linear, cosine or constant")
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def make_optimizer(optim_config, total_steps: int):
  """-> (optax transformation, schedule). Adam(b1, b2) with optional decoupled weight decay and global-norm clip."""
  schedule = make_schedule(optim_config, total_steps)
  parts = []
  if optim_config.grad_clip:
    parts.append(optax.clip_by_global_norm(optim_config.grad_clip))
  if optim_config.name == "adam":
    if optim_config.weight_decay:
      parts.append(optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                               weight_decay=optim_config.weight_decay))
    else:
      parts.append(optax.adam(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps))
  elif optim_config.name == "adam_l2":
    # torch.optim.Adam(weight_decay=w): L2 added to the gradient before the moments, as the VIOLIN authors' code uses.
    parts.append(optax.add_decayed_weights(optim_config.weight_decay))
    parts.append(optax.adam(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps))
  else:
    raise ValueError(f"config.optim.name = {optim_config.name!r}: expected adam or adam_l2")
  return optax.chain(*parts), schedule
