"""Trainable / frozen split of a parameter tree by path regex, and the optimiser built on the trainable part only.

Gradients and optimiser state exist only for trainable parameters: a frozen 900M-parameter LM costs neither backward
weight-gradient work nor Adam moments.
"""

import re
from typing import Sequence

import jax.numpy as jnp
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
  """Linear warm-up over `warmup_fraction` of the steps, then `decay` ('linear' to 0, 'cosine' or 'constant').

  With `lr_after_step` the schedule runs one step late, as in training loops that set the learning rate after each
  optimiser step (OVQA's train.py calls `adjust_learning_rate(curr_step)` after `optimizer.step()`): step 0 runs at
  the optimiser's initial lr, the peak, and step s > 0 at the schedule's value for s - 1.
  """
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
  schedule = after if warmup == 0 else optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), after], [warmup])
  if optim_config.get("lr_after_step", False):
    on_time = schedule
    schedule = lambda count: jnp.where(count == 0, peak, on_time(jnp.maximum(count - 1, 0)))
  return schedule


def constant_lr_labels(patterns: Sequence[str], key: str = "config.optim.constant_lr_params"):
  """-> label function of optax.multi_transform: "constant" for a trainable leaf whose 'a/b/c' path any of
  `patterns` `re.search`es, else "scheduled". A pattern that matches no trainable parameter is an error (a typo
  would otherwise leave every parameter on the schedule)."""
  regexes = [re.compile(p) for p in patterns]

  def labels(params):
    flat = traverse_util.flatten_dict(params)
    used = set()
    out = {}
    for path, _ in flat.items():
      hits = [r.pattern for r in regexes if r.search(path_str(path))]
      used.update(hits)
      out[path] = "constant" if hits else "scheduled"
    unused = [p for p in patterns if p not in used]
    if unused:
      raise ValueError(f"{key} = {tuple(patterns)}: {unused} match(es) no trainable parameter (trainable: "
                       f"{sorted({path_str(p[:1]) for p in flat})[:20]} ...)")
    return traverse_util.unflatten_dict(out)

  return labels


def _adam(optim_config, lr):
  if optim_config.name == "adam":
    if optim_config.weight_decay:
      return [optax.adamw(lr, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                          weight_decay=optim_config.weight_decay)]
    return [optax.adam(lr, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps)]
  if optim_config.name == "adam_l2":
    # torch.optim.Adam(weight_decay=w): L2 added to the gradient before the moments, as the VIOLIN authors' code uses.
    return [optax.add_decayed_weights(optim_config.weight_decay),
            optax.adam(lr, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps)]
  raise ValueError(f"config.optim.name = {optim_config.name!r}: expected adam or adam_l2")


def make_optimizer(optim_config, total_steps: int):
  """-> (optax transformation, schedule). Adam(b1, b2) with optional decoupled weight decay and global-norm clip.

  `constant_lr_params` (regexes on trainable parameter paths, as `config.trainable`): those parameters train at the
  constant peak lr `optim_config.lr`, the others on the schedule (a torch optimiser whose schedule updates only
  param_groups[0]); the gradient clip stays global over all of them. The schedule returned is the scheduled group's.
  """
  schedule = make_schedule(optim_config, total_steps)
  parts = []
  if optim_config.grad_clip:
    parts.append(optax.clip_by_global_norm(optim_config.grad_clip))
  constant = tuple(optim_config.get("constant_lr_params", None) or ())
  if constant:
    parts.append(optax.multi_transform(
        {"scheduled": optax.chain(*_adam(optim_config, schedule)),
         "constant": optax.chain(*_adam(optim_config, optim_config.lr))},
        constant_lr_labels(constant)))
  else:
    parts.extend(_adam(optim_config, schedule))
  return optax.chain(*parts), schedule
