"""Reruns a recorded demo table (docs/results.md) and compares every printed number with the committed files
(docs/results/).

  python launch/check_results.py docs/results/<table> [--workdir=DIR]      # DIR: compare an existing run instead
  python launch/check_results.py docs/results/<table> --record --printed='{"<file>": {"eval.test.mAcc": 2}}' \
      [--workdir=DIR] -- python launch/train.py --config=... --workdir={workdir}

Exit status 0 when every printed number matches; otherwise each mismatch is listed and the status is 1.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evqa_jax.train import results  # noqa: E402


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  command = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("folder", help="docs/results/<table>")
  parser.add_argument("--workdir", help="a run that already holds the command's outputs (no rerun)")
  parser.add_argument("--record", action="store_true", help="write the record (command after --) instead")
  parser.add_argument("--printed", help='JSON {"<file under the workdir>": {"<dotted key>": decimals}}')
  args = parser.parse_args(argv)
  if args.record:
    if not command or not args.printed:
      parser.error("--record needs --printed and the command after --")
    results.record(args.folder, command, json.loads(args.printed), workdir=args.workdir)
    print(f"recorded {args.folder}")
    return 0
  bad = results.check(args.folder, workdir=args.workdir)
  for line in bad:
    print(f"MISMATCH {line}")
  print(f"{args.folder}: {'OK, every printed number matches' if not bad else f'{len(bad)} mismatch(es)'}")
  return 1 if bad else 0


if __name__ == "__main__":
  from evqa_jax import cli  # noqa: E402
  sys.exit(cli.run(main))
