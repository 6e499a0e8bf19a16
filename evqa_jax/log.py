"""The library's messages: the `evqa_jax` logger (Python's logging), shown on the console by default.

    from evqa_jax import log
    log.info("Resumed from %s at step %d", directory, step)          # process 0 of a multi-process job only
    log.warning("checkpoint %s is damaged", step_dir)               # printed as "WARNING: checkpoint ... is damaged"
    log.info("staged %s -> %s", path, target, every_process=True)   # a message about this process alone

Progress lines (training steps, evaluations, what was loaded from where) are the output a user watches, so the
logger writes them to stdout, the message alone (a warning prefixed "WARNING: "), at INFO and above, without
passing them on to the root logger (absl's handler would print each one a second time, with its prefix, on stderr).
A message is written by process 0 only, unless it is about the process that writes it (`every_process=True`): each
host's staged copy, its lock. To route the messages elsewhere, change the logger as any other:
`logging.getLogger("evqa_jax")` (`.setLevel(logging.WARNING)` for warnings only; `.handlers.clear()` and
`.propagate = True` for the application's own handlers).
"""

import logging
import sys

LOGGER = logging.getLogger("evqa_jax")


def process_index() -> int:
  """This process's index in a multi-process JAX job, 0 when JAX's distributed runtime is not started (asking JAX
  before then would start its backend, after which `jax.distributed.initialize()` fails)."""
  jax = sys.modules.get("jax")
  if jax is None or not jax.distributed.is_initialized():
    return 0
  return jax.process_index()


class _Console(logging.StreamHandler):
  """A StreamHandler on the sys.stdout of the moment (a redirected or captured stdout is followed)."""

  def __init__(self):
    super().__init__(sys.stdout)

  @property
  def stream(self):
    return sys.stdout

  @stream.setter
  def stream(self, value):
    del value


class _Format(logging.Formatter):
  def format(self, record):
    text = super().format(record)
    return text if record.levelno < logging.WARNING else f"{record.levelname}: {text}"


class _ProcessZero(logging.Filter):
  def filter(self, record):
    return getattr(record, "every_process", False) or process_index() == 0


def _setup() -> None:
  if any(isinstance(h, _Console) for h in LOGGER.handlers):
    return
  handler = _Console()
  handler.setFormatter(_Format("%(message)s"))
  LOGGER.addHandler(handler)
  LOGGER.addFilter(_ProcessZero())
  if LOGGER.level == logging.NOTSET:
    LOGGER.setLevel(logging.INFO)
  LOGGER.propagate = False


_setup()


def info(msg: str, *args, every_process: bool = False) -> None:
  LOGGER.info(msg, *args, extra={"every_process": every_process})


def warning(msg: str, *args, every_process: bool = False) -> None:
  LOGGER.warning(msg, *args, extra={"every_process": every_process})
