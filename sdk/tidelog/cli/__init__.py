"""`tidelog`, the command-line client: topics, produce, consume, groups, the
admin operations (cluster, reassign, brokers, leaders, delete-records), and
`dev`, the local cluster that `make run` starts.

Every command takes `--bootstrap-server host:port` (`-b`, or
TIDELOG_BOOTSTRAP) before or after the subcommand, and defaults to the local
cluster. Results go to stdout; progress and errors go to stderr, and
progress only when stderr is a terminal, so pipes stay clean.

Errors: `main` is the one place that turns a failure into what the user
sees, one line on stderr and an exit code from a small documented set
(_common.EXIT_CODES_HELP, printed by `--help`): 2 usage, 3 not found,
4 unavailable or timed out, 5 refused, 1 any other error, 130 Ctrl-C. A
traceback means a bug.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

import grpc

from tidelog.cli import (
    brokers,
    cluster,
    consume,
    delete_records,
    dev_cluster,
    groups,
    leaders,
    produce,
    reassign,
    security,
    topics,
)
from tidelog.cli._common import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ArgumentParser,
    add_bootstrap_argument,
    add_security_arguments,
    exit_code_for,
    fail,
    split_global_options,
)
from tidelog.config import SECURITY_ENV, default_bootstrap
from tidelog.errors import TidelogError, error_from_rpc


def version() -> str:
    try:
        return importlib.metadata.version("tidelog")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="tidelog",
        description="Tidelog command-line client. Global options (--bootstrap-server/-b) "
        "may stand before or after the command.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tidelog {version()}")
    add_bootstrap_argument(parser)
    add_security_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (dev_cluster, topics, produce, consume, groups, security):
        module.register(sub, add_bootstrap_argument)
    # Admin operations (issue 13): one module each.
    for module in (cluster, reassign, brokers, leaders, delete_records):
        module.register(sub, add_bootstrap_argument)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dev"]:
        return dev_cluster.run(argv[1:])
    try:
        found, rest = split_global_options(argv)
    except argparse.ArgumentTypeError as exc:
        return fail(f"{exc} (see `tidelog --help`)", EXIT_USAGE)
    if rest[:1] == ["dev"]:
        return dev_cluster.run(rest[1:])  # the local cluster takes no bootstrap server
    args = build_parser().parse_args(rest)
    args.bootstrap_server = found.get("bootstrap_server") or default_bootstrap()
    for name, variable in SECURITY_ENV.items():
        if name in found:
            os.environ[variable] = found[name]
    try:
        return int(args.handler(args) or 0)
    except TidelogError as exc:
        return fail(f"{type(exc).__name__}: {exc}", exit_code_for(exc))
    except grpc.RpcError as exc:
        # The SDK raises typed errors; a raw one escaping it still gets one line.
        error = error_from_rpc(exc)
        return fail(f"{type(error).__name__}: {error}", exit_code_for(exc))
    except (ValueError, TypeError) as exc:
        # A value the SDK refuses before any request (an option out of range).
        return fail(f"invalid argument: {exc}", EXIT_USAGE)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our stdout went away (for example `| head`): not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
