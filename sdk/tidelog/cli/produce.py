"""`tidelog produce TOPIC`: one record per line of stdin.

The topic is checked first (one Metadata call that lets a broker with
auto.create.topics.enable create it): a topic that does not exist, a bad
name or an unreachable broker is an error at once, before stdin is read.
"""

from __future__ import annotations

import argparse
import sys

from tidelog._connection import no_such_partition
from tidelog.cli._common import AddBootstrap, Progress, check_topic, int_at_least
from tidelog.producer import Producer


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser("produce", help="send lines of stdin as records")
    parser.add_argument("topic")
    parser.add_argument(
        "--partition", type=int_at_least(0), default=None, help="send every record here"
    )
    parser.add_argument(
        "--key-separator",
        default=None,
        metavar="SEP",
        help="split each line at the first SEP into key and value",
    )
    parser.add_argument("--acks", choices=("0", "1", "all"), default="1")
    parser.add_argument(
        "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none"
    )
    add_bootstrap(parser)
    parser.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    acks = -1 if args.acks == "all" else int(args.acks)
    separator = args.key_separator.encode() if args.key_separator else None
    count = check_topic(args.bootstrap_server, args.topic, allow_auto_create=True)
    if args.partition is not None and args.partition >= count:
        raise no_such_partition(args.topic, args.partition, count)
    progress = Progress("sent")
    sent = 0
    futures = []
    with Producer(
        bootstrap_servers=args.bootstrap_server,
        acks=acks,
        compression_type=args.compression,
    ) as producer:
        for raw_line in sys.stdin.buffer:
            line = raw_line.rstrip(b"\r\n")
            key = None
            if separator is not None:
                key, found, value = line.partition(separator)
                if not found:
                    key, value = None, line
            else:
                value = line
            futures.append(
                producer.send(args.topic, value=value, key=key, partition=args.partition)
            )
            sent += 1
            progress.update(sent)
        producer.flush()
    progress.done()
    acknowledged = 0
    failures: dict[str, int] = {}
    for future in futures:
        error = future.exception()
        if error is None:
            acknowledged += 1
        else:
            reason = f"{type(error).__name__}: {error}"
            failures[reason] = failures.get(reason, 0) + 1
    print(f"{acknowledged} records acknowledged")
    for message, count in failures.items():
        print(f"tidelog: {count} records failed: {message}", file=sys.stderr)
    return 0 if not failures else 1
