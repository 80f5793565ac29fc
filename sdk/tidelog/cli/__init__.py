"""`tidelog`, the command-line client: topics, produce, consume, groups, and
`dev`, the local cluster that `make run` starts.

Every command takes `--bootstrap-server host:port` (or TIDELOG_BOOTSTRAP) and
defaults to the local cluster. Results go to stdout; progress and errors go
to stderr, and progress only when stderr is a terminal, so pipes stay clean.

Errors: `main` is the one place that turns a failure into what the user
sees, one line on stderr and an exit code: 2 for a command line that is
wrong in itself (argparse, or a value an SDK call refuses), 1 for a typed
error (the cluster's answer, or no broker reachable), 130 for Ctrl-C. A
traceback means a bug.
"""

from __future__ import annotations

import sys

import grpc

from tidelog.cli import consume, dev_cluster, groups, produce, security, topics
from tidelog.cli._common import EXIT_USAGE, ArgumentParser, add_bootstrap_argument, fail
from tidelog.errors import TidelogError, error_from_rpc


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="tidelog", description="Tidelog command-line client.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (dev_cluster, topics, produce, consume, groups, security):
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
    except grpc.RpcError as exc:
        # The SDK raises typed errors; a raw one escaping it still gets one line.
        error = error_from_rpc(exc)
        return fail(f"{type(error).__name__}: {error}")
    except (ValueError, TypeError) as exc:
        # A value the SDK refuses before any request (an option out of range).
        return fail(f"invalid argument: {exc}", EXIT_USAGE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (for example `| head`): not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
