"""One wrapper for every command-line entry point: bad input ends in one line, exit status 2.

    if __name__ == "__main__":
      sys.exit(cli.run(main))

Errors raised on bad input (ValueError and subclasses, OSError, OverflowError, KeyError, ...) carry messages that
name the file, row and field (evqa_jax.io's readers and validators build them); the wrapper prints that message as
one `error: ...` line on stderr and returns 2. `--verbose` (removed from argv before `main` sees it) re-raises, so
the traceback is shown.
"""

import sys
from typing import Callable, Optional, Sequence

EXIT_BAD_INPUT = 2
VERBOSE_FLAG = "--verbose"


def one_line(e: BaseException) -> str:
  text = " ".join(str(e).split()) or type(e).__name__
  if isinstance(e, KeyError) and len(e.args) == 1:
    text = f"missing key {e.args[0]!r}"
  if not isinstance(e, (ValueError, OSError, KeyError)):
    text = f"{type(e).__name__}: {text}"
  return text


def strip_verbose(argv: Sequence[str]) -> tuple[list, bool]:
  """(argv without --verbose, whether it was there); arguments after "--" belong to a child command, untouched."""
  argv = list(argv)
  end = argv.index("--") if "--" in argv else len(argv)
  verbose = VERBOSE_FLAG in argv[:end]
  return [a for a in argv[:end] if a != VERBOSE_FLAG] + argv[end:], verbose


def run(main: Callable, argv: Optional[Sequence[str]] = None) -> int:
  """Calls `main(argv)` (argv defaults to sys.argv[1:]) -> its int status (0 for anything else), or 2 with one
  line on stderr when it raises; `--verbose` in argv shows the traceback instead."""
  argv, verbose = strip_verbose(sys.argv[1:] if argv is None else argv)
  try:
    status = main(argv)
  except (KeyboardInterrupt, SystemExit):
    raise
  except Exception as e:  # pylint: disable=broad-except  (everything ends in one line unless --verbose)
    if verbose:
      raise
    print(f"error: {one_line(e)} (rerun with {VERBOSE_FLAG} for the traceback)", file=sys.stderr)
    return EXIT_BAD_INPUT
  return status if isinstance(status, int) else 0


HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")


def asks_help(argv: Sequence[str]) -> bool:
  """Whether argv (before any "--") holds one of absl's help flags (--help, -h, --helpfull, ...)."""
  argv = list(argv)
  own = argv[:argv.index("--")] if "--" in argv else argv
  return any(a.lstrip("-").split("=")[0] in HELP_FLAGS for a in own if a.startswith("-"))


def run_absl(main: Callable, argv: Optional[Sequence[str]] = None) -> int:
  """`run` for an absl entry point (`app.run(main)`): flags parsed by absl, errors as in `run`; a help flag prints
  the help and exits 0 (absl's own help flags exit 1)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv if argv is None else argv)

  def call(rest):
    try:
      return app.run(main, argv=[argv[0], *rest])
    except SystemExit as e:
      if e.code == 1 and asks_help(rest):
        return 0
      raise
  return run(call, argv[1:])
