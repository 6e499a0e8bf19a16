"""One vocabulary for durations: `<prefix>_steps`, `<prefix>_epochs` or `<prefix>_examples`.

A config sets exactly one of the three for a given prefix (the others left at None); `to_steps` converts it to a number
of optimiser steps, so the library never guesses which unit a number is in.
"""

import math


def to_steps(config, prefix: str, *, steps_per_epoch: float, batch_size: int, required: bool = True):
  """Returns the duration `config.<prefix>_{steps,epochs,examples}` in steps (None when unset and not required)."""
  values = {}
  for unit in ("steps", "epochs", "examples"):
    key = f"{prefix}_{unit}"
    if key in config and config[key] is not None:
      values[unit] = config[key]
  if len(values) > 1:
    raise ValueError(f"config sets {sorted(f'{prefix}_{u}' for u in values)}: set only one of "
                     f"{prefix}_steps, {prefix}_epochs, {prefix}_examples")
  if not values:
    if required:
      raise ValueError(f"config sets none of {prefix}_steps, {prefix}_epochs, {prefix}_examples")
    return None
  (unit, value), = values.items()
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"config.{prefix}_{unit} = {value!r} is not a number")
  if unit != "epochs" and value != int(value):
    raise ValueError(f"config.{prefix}_{unit} = {value!r} is not a whole number")
  if value < 0:
    raise ValueError(f"config.{prefix}_{unit} = {value} is negative")
  if unit == "steps":
    return int(value)
  if unit == "epochs":
    return int(math.ceil(value * steps_per_epoch))
  return int(math.ceil(value / batch_size))
