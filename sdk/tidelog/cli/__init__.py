"""`tidelog`, the command-line client: topics, produce, consume, groups, and
`dev`, the local cluster that `make run` starts.

Every command takes `--bootstrap-server host:port` (or TIDELOG_BOOTSTRAP) and
defaults to the local cluster. Results go to stdout; progress and errors go
to stderr, and progress only when stderr is a terminal, so pipes stay clean.
"""

from __future__ import annotations

import argparse
import sys

from tidelog.cli import consume, dev_cluster, groups, produce, topics
from tidelog.cli._common import add_bootstrap_argument, fail
from tidelog.errors import TidelogError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidelog", description="Tidelog command-line client.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (dev_cluster, topics, produce, consume, groups):
        module.register(sub, add_bootstrap_argument)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dev"]:
        return dev_cluster.run(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except TidelogError as exc:
        return fail(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (for example `| head`): not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
