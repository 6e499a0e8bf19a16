"""What a task provides to the generic trainer (`evqa_jax.train.train_and_evaluate`).

A task owns everything specific to one benchmark: its records, the per-example preprocessing into static shapes,
the model, the loss, the predictions and how they are written and scored. The trainer owns the mesh, sharding,
optimiser, checkpointing, logging and the loops.
"""

import abc
from typing import Any


class Task(abc.ABC):
  """Base class. `config` is the whole experiment ConfigDict."""

  #: Metric (a key of `evaluate`'s result) used to report the best checkpoint.
  main_metric: str = "accuracy"

  def __init__(self, config):
    self.config = config

  # -- data -------------------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def source(self, split: str):
    """A grain random-access source of decoded records of `split`."""

  @abc.abstractmethod
  def preprocess(self, example: dict, train: bool) -> dict:
    """One decoded record -> dict of fixed-shape numpy arrays (numeric only). Must include int `index`."""

  def preprocess_train(self, example: dict, key: tuple) -> dict:
    """`preprocess(example, train=True)` in the training loader, with the example's key (seed, step, index in the
    source; evqa_jax.data.pipeline.KeyedTransform) for random augmentation that a resume repeats exactly."""
    del key
    return self.preprocess(example, train=True)

  # -- model ------------------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def init_params(self, rng) -> Any:
    """Pure function: rng -> params with logical-axis boxes (called under jax.eval_shape and jax.jit)."""

  def load_pretrained(self, params: dict) -> dict:
    """Host numpy params -> params with pretrained weights filled in (called when not resuming)."""
    return params

  def check_zero_shot(self) -> None:
    """Raises when the weights `load_pretrained` gave are not a model worth scoring untrained (evaluate
    --zero_shot), e.g. a head that only training fills in. Called after `load_pretrained`."""

  @property
  @abc.abstractmethod
  def trainable_patterns(self) -> tuple:
    """Regexes over 'a/b/c' parameter paths; matching parameters are trained, the rest frozen."""

  def aux_inputs(self, split: str) -> dict:
    """Constant arrays the step needs besides the batch (answer vocabulary, graphs), as numpy.

    Train and eval values must have identical shapes and dtypes so that one compiled function serves both.
    """
    return {}

  def aux_logical_axes(self, aux: dict | None = None) -> dict:
    """Logical partition specs for the leaves of `aux` (default: `aux_inputs` of the train split), a tree of
    PartitionSpec; None: replicated. Called on `aux_inputs(split)` and on `precompute_aux`'s result alike."""
    return None

  #: Whether the steps read `precompute_aux`'s result instead of `aux_inputs(split)` itself.
  precomputes_aux: bool = False

  def precompute_aux(self, frozen_params, aux: dict) -> dict:
    """Pure function, traced under jit once per split: (the frozen parameters as loaded or restored, a split's aux
    inputs on the mesh) -> the aux inputs the train and eval steps read, when `precomputes_aux`.

    For work that the step would otherwise redo every step from frozen parameters and aux inputs alone (JustAsk+'s
    frozen answer encoder over every answer and graph node). Frozen parameters never change in training, so the
    result holds for the whole run; it must be what the step computes itself, to the last bit the compiler allows.
    The trainer (and launch/evaluate.py, the AOT check) call it through `evqa_jax.train.steps.StepAux`."""
    del frozen_params
    return aux

  @abc.abstractmethod
  def loss(self, params, batch: dict, aux: dict, rng, train: bool = True):
    """-> (scalar loss, dict of scalar metrics). Traced inside the jitted train step."""

  @abc.abstractmethod
  def predict(self, params, batch: dict, aux: dict) -> dict:
    """-> dict of per-example arrays [batch, ...]. Traced inside the jitted eval step."""

  # -- evaluation -------------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def evaluate(self, split: str, outputs: dict, out_dir: str) -> dict:
    """Predictions of all valid examples (numpy, ordered by `index`) -> metrics; writes the prediction files."""

  def console_metrics(self) -> tuple:
    """The metrics (keys of `evaluate`'s result) of the console's eval line; every metric goes to the metrics JSON
    and TensorBoard."""
    return (self.main_metric,)

  def describe(self) -> str:
    return type(self).__name__
