"""Every numeric setting's allowed range, in one table, checked before anything is compiled or written.

`RULES` maps a config key pattern (fnmatch, on the dotted key: `verbalizer.eps`, `pretrained.shape.*`) to a `Num`
constraint; the first pattern that matches a key decides. `check_config(config)` runs at the start of
`train_and_evaluate` and `evaluate_checkpoint` (so a bad `--config.` override stops at once, naming the key, and not
after training under another name), and `arg(rule, flag)` is the argparse `type=` of the command-line tools' numeric
flags (`--cvqa-topk`, `--num-frames`, ...). `tests/test_round4_inputs.py` checks that every numeric key of every
shipped config variant has a rule, so a new setting cannot go unchecked.
"""

import argparse
import dataclasses
import fnmatch
import math
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Num:
  """A number in [lo, hi] (`lo_open` / `hi_open` exclude the bound); `integer` for counts and sizes; `none`: unset
  (None) is allowed."""
  lo: Optional[float] = None
  hi: Optional[float] = None
  integer: bool = False
  lo_open: bool = False
  hi_open: bool = False
  none: bool = False

  def describe(self) -> str:
    kind = "an integer" if self.integer else "a number"
    if self.lo is not None and self.hi is not None:
      text = f"{kind} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
    elif self.lo is not None:
      text = f"{kind} {'>' if self.lo_open else '>='} {self.lo:g}"
    elif self.hi is not None:
      text = f"{kind} {'<' if self.hi_open else '<='} {self.hi:g}"
    else:
      text = kind
    return text + (" (or None)" if self.none else "")

  def ok(self, value) -> bool:
    if value is None:
      return self.none
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
    if self.integer and not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
      return False
    if not math.isfinite(value):
      return False
    if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
      return False
    return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)


POSITIVE_INT = Num(1, integer=True)
COUNT = Num(0, integer=True)  # 0 allowed (0 = none / no limit, as the key's comment says)
INTEGER = Num(integer=True)
POSITIVE = Num(0, lo_open=True)
NON_NEGATIVE = Num(0)
FRACTION = Num(0, 1)
DROPOUT = Num(0, 1, hi_open=True)

RULES = (
    # run length and batching (evqa_jax.train.durations reads the *_steps / *_epochs / *_examples)
    ("seed", INTEGER),
    ("batch_size", POSITIVE_INT),
    ("eval_batch_size", POSITIVE_INT),
    ("log_every_steps", POSITIVE_INT),
    ("*_steps", Num(0, integer=True, none=True)),  # eval_every / checkpoint_every 0: only at the end
    ("*_examples", Num(0, integer=True, none=True)),
    ("*_epochs", Num(0, none=True)),
    ("checkpoint.max_to_keep", POSITIVE_INT),
    # data
    ("data.worker_count", COUNT),
    ("data.cvqa_topk", Num(0, integer=True, none=True)),  # 0 or None: the whole V_train
    ("data.frame_size", POSITIVE_INT),  # OVQA pixel backbones: the frames' side (data.augment: input.AUGMENTATIONS)
    ("data.*", POSITIVE_INT),  # frames, tokens, options, feature sizes, cache batch
    ("eval.*", FRACTION),  # mask / temporal thresholds
    # answer graphs and word vectors
    ("graph.min_sim", Num(-1, 1)),
    ("graph.max_edges", COUNT),
    ("graph.max_nodes", COUNT),
    ("graph.*", POSITIVE_INT),
    ("word_vectors.min_word_count", COUNT),
    ("word_vectors.*", POSITIVE_INT),
    ("verbalizer.eps", FRACTION),
    ("verbalizer.num_layers", COUNT),
    ("loss.*", NON_NEGATIVE),
    # models
    ("model.*dropout*", DROPOUT),
    ("model.mlm_prob*", FRACTION),
    ("model.frame.temporal_shift", Num(0, 0.5)),
    ("model.shape_radius", POSITIVE),
    ("model.num_layers", COUNT),
    ("model.*", POSITIVE_INT),  # widths, heads, layers, windows, strides
    ("optim.lr", POSITIVE),
    ("optim.b1", Num(0, 1, hi_open=True)),
    ("optim.b2", Num(0, 1, hi_open=True)),
    ("optim.eps", POSITIVE),
    ("optim.weight_decay", NON_NEGATIVE),
    ("optim.grad_clip", NON_NEGATIVE),  # 0: no clipping
    ("optim.warmup_fraction", FRACTION),
    ("pretrained.encoder_seed", INTEGER),
    # pretrained.shape / clip_shape: Hugging Face config.json fields
    ("pretrained.*shape.*dropout*", DROPOUT),
    ("pretrained.*shape.drop_*rate", DROPOUT),  # All-in-one: drop_rate, drop_path_rate
    ("pretrained.*shape.mlp_ratio", POSITIVE_INT),
    ("pretrained.*shape.max_text_len", POSITIVE_INT),
    ("pretrained.*shape.roll_div", POSITIVE_INT),
    ("pretrained.*shape.embed_dim", POSITIVE_INT),  # VIOLET's Video Swin (swin_shape; tuples are not numbers)
    ("pretrained.*shape.in_chans", POSITIVE_INT),
    ("pretrained.*shape.*_eps", POSITIVE),
    ("pretrained.*shape.initializer_*", NON_NEGATIVE),
    ("pretrained.*shape.max_relative_positions", Num(-1, integer=True)),  # -1: max_position_embeddings
    ("pretrained.*shape.position_buckets", Num(-1, integer=True)),  # -1: no log buckets
    ("pretrained.*shape.type_vocab_size", COUNT),
    ("pretrained.*shape.*_token_id", COUNT),
    ("pretrained.*shape.*_size", POSITIVE_INT),
    ("pretrained.*shape.num_*", POSITIVE_INT),
    ("pretrained.*shape.max_position_embeddings", POSITIVE_INT),
    ("pretrained.*shape.[lxr]_layers", COUNT),  # LXMERT's language / cross-modality / object-relationship layers
    ("pretrained.*shape.visual_*_dim", POSITIVE_INT),  # LXMERT's object feature and box sizes
    ("pretrained.*shape.*", Num()),  # any other field: a finite number
)


def rule_of(key: str) -> Optional[Num]:
  """The constraint of a dotted config key (the first matching pattern of RULES), or None when it has none."""
  for pattern, rule in RULES:
    if fnmatch.fnmatchcase(key, pattern):
      return rule
  return None


def leaves(node, prefix: str = ""):
  """(dotted key, value) of every leaf of a ConfigDict / dict (nested groups walked, placeholders read)."""
  for key in node.keys():
    value = node[key]
    if hasattr(value, "keys"):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_config(config) -> None:
  """ValueError naming the first key whose number breaks its rule (`config.verbalizer.eps = 1.5: expected a number in
  [0, 1]`). Only numbers are checked (text, flags, tuples and unset placeholders have their own readers)."""
  for key, value in leaves(config):
    rule = rule_of(key)
    if rule is not None and is_number(value) and not rule.ok(value):
      raise ValueError(f"config.{key} = {value!r}: expected {rule.describe()}")


def arg(rule: Num, flag: str):
  """argparse `type=` for a numeric flag: the value parsed (int for an integer rule) and checked against `rule`;
  argparse turns the error into one `error: argument --flag: ...` line (exit 2)."""
  def parse(text: str):
    try:
      value = int(text) if rule.integer else float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{flag} = {text!r}: expected {rule.describe()}") from None
    if not rule.ok(value):
      raise argparse.ArgumentTypeError(f"{flag} = {text}: expected {rule.describe()}")
    return value
  parse.__name__ = rule.describe()
  return parse
