"""Trainable / frozen split of a parameter tree by path regex, and the optimiser built on the trainable part only.

Gradients and optimiser state exist only for trainable parameters: a frozen 900M-parameter LM costs neither backward
weight-gradient work nor Adam moments.
"""

import re
from typing import Sequence

import jax
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


def _key_str(path) -> str:
  """A jax tree path as the 'a/b/c' string of `path_str` (dict keys, sequence indices)."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def scale_by_group_lr(schedule: optax.Schedule, constant_lr: float, patterns: Sequence[str],
                      key: str = "config.optim.constant_lr_params") -> optax.GradientTransformation:
  """optax.scale_by_learning_rate(schedule), except that leaves whose 'a/b/c' path any of `patterns` `re.search`es
  are scaled by the constant `constant_lr` (a torch optimiser whose schedule updates only param_groups[0]). Its state
  is the step count only, so the parameters' Adam moments keep their usual layout. A pattern that matches no
  parameter is an error (a typo would otherwise leave every parameter on the schedule)."""
  regexes = [re.compile(p) for p in patterns]

  def is_constant(path) -> bool:
    name = _key_str(path)
    return any(r.search(name) for r in regexes)

  def init_fn(params):
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if leaves and all(hasattr(v, "shape") for _, v in leaves):  # not optax.tree_map_params' placeholder
      names = [_key_str(path) for path, _ in leaves]
      unused = [r.pattern for r in regexes if not any(r.search(n) for n in names)]
      if unused:
        raise ValueError(f"{key} = {tuple(patterns)}: {unused} match(es) no trainable parameter (trainable: "
                         f"{sorted({n.split('/')[0] for n in names})} ...)")
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    rate = schedule(state.count)
    updates = jax.tree_util.tree_map_with_path(
        lambda path, u: (-(constant_lr if is_constant(path) else rate) * u).astype(u.dtype), updates)
    return updates, optax.ScaleByScheduleState(count=optax.safe_int32_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def _adam(optim_config, schedule):
  """Adam (+ weight decay) as optax builds it; with `constant_lr_params`, its learning-rate step per group."""
  constant = tuple(optim_config.get("constant_lr_params", None) or ())  # absent from configs that predate it
  if not constant:
    if optim_config.name == "adam":
      if optim_config.weight_decay:
        return [optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                            weight_decay=optim_config.weight_decay)]
      return [optax.adam(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps)]
    if optim_config.name == "adam_l2":
      # torch.optim.Adam(weight_decay=w): L2 added to the gradient before the moments, as the VIOLIN authors' code.
      return [optax.add_decayed_weights(optim_config.weight_decay),
              optax.adam(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps)]
    raise ValueError(f"config.optim.name = {optim_config.name!r}: expected adam or adam_l2")
  # optax.adam / adamw are chain(scale_by_adam, [add_decayed_weights], scale_by_learning_rate): the same, with the
  # last step per group.
  if optim_config.name not in ("adam", "adam_l2"):
    raise ValueError(f"config.optim.name = {optim_config.name!r}: expected adam or adam_l2")
  parts = []
  if optim_config.name == "adam_l2":
    parts.append(optax.add_decayed_weights(optim_config.weight_decay))
  parts.append(optax.scale_by_adam(b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps))
  if optim_config.name == "adam" and optim_config.weight_decay:
    parts.append(optax.add_decayed_weights(optim_config.weight_decay))
  parts.append(scale_by_group_lr(schedule, optim_config.lr, constant))
  return parts


def make_optimizer(optim_config, total_steps: int):
  """-> (optax transformation, schedule). Adam(b1, b2) with optional decoupled weight decay and global-norm clip.

  `constant_lr_params` (regexes on trainable parameter paths, as `config.trainable`): those parameters train at the
  constant peak lr `optim_config.lr`, the others on the schedule (`scale_by_group_lr`); the gradient clip stays
  global over all of them. The schedule returned is the scheduled parameters'.
  """
  schedule = make_schedule(optim_config, total_steps)
  parts = []
  if optim_config.grad_clip:
    parts.append(optax.clip_by_global_norm(optim_config.grad_clip))
  parts.extend(_adam(optim_config, schedule))
  return optax.chain(*parts), schedule
