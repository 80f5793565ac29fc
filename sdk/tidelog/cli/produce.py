"""`tidelog produce TOPIC`: one record per line of stdin.

Lines are parsed as Kafka's console producer parses them (`--property
parse.headers=true`, `key.separator`, `null.marker`, ...: _line_reader),
with flags for the common cases (`--key-separator`, `--parse-headers`,
`--null-marker` for tombstones, `--timestamp`).

The topic is checked first (one Metadata call that lets a broker with
auto.create.topics.enable create it): a topic that does not exist, a bad
name or an unreachable broker is an error at once, before stdin is read.
A line that cannot be parsed stops the command with an error naming it;
the lines before it are sent.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tidelog._connection import no_such_partition
from tidelog.cli._common import (
    EXIT_CODES_HELP,
    AddBootstrap,
    Progress,
    check_topic,
    client_properties,
    int_at_least,
)
from tidelog.cli._line_reader import LineReader
from tidelog.config import ProducerConfig
from tidelog.errors import InvalidRequestError
from tidelog.producer import Producer


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser(
        "produce",
        help="send lines of stdin as records",
        description="Each line: [headers<TAB>][timestamp<TAB>][key<SEP>]value, the parts "
        "present as the options below say (Kafka's console producer properties).",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic")
    parser.add_argument(
        "-p", "--partition", type=int_at_least(0), default=None, help="send every record here"
    )
    parser.add_argument(
        "--key-separator",
        default=None,
        metavar="SEP",
        help="split each line at the first SEP into key and value (a line without SEP has "
        "no key); as --property parse.key=true key.separator=SEP ignore.error=true",
    )
    parser.add_argument(
        "--parse-headers",
        action="store_true",
        help="each line starts with headers k:v,k:v then a TAB (--property "
        "headers.delimiter, headers.separator, headers.key.separator change them)",
    )
    parser.add_argument(
        "--null-marker",
        metavar="S",
        help="a key, value or header value equal to S is sent as null (a null value is a "
        "tombstone)",
    )
    parser.add_argument(
        "--timestamp",
        type=int_at_least(0),
        metavar="MS",
        help="every record's timestamp, ms since the epoch (--property parse.timestamp=true "
        "reads one per line instead)",
    )
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a line-parsing property of Kafka's console producer: parse.key, key.separator, "
        "parse.headers, headers.delimiter, headers.separator, headers.key.separator, "
        "null.marker, ignore.error; and parse.timestamp, timestamp.separator (repeatable)",
    )
    parser.add_argument("--acks", choices=("0", "1", "all"), default="1")
    parser.add_argument(
        "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none"
    )
    parser.add_argument(
        "--producer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a producer option with Kafka's name, e.g. linger.ms=20 (repeatable; wins "
        "over --acks and --compression)",
    )
    add_bootstrap(parser)
    parser.set_defaults(handler=_produce)


def _line_properties(args: argparse.Namespace) -> dict[str, str]:
    properties: dict[str, str] = {}
    if args.key_separator:
        properties.update(
            {"parse.key": "true", "key.separator": args.key_separator, "ignore.error": "true"}
        )
    if args.parse_headers:
        properties["parse.headers"] = "true"
    if args.null_marker is not None:
        properties["null.marker"] = args.null_marker
    for pair in args.property:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidRequestError(f"--property expects key=value, got {pair!r}")
        properties[name.strip()] = value
    return properties


def _produce(args: argparse.Namespace) -> int:
    reader = LineReader(_line_properties(args))
    if args.timestamp is not None and reader.parse_timestamp:
        raise InvalidRequestError("give --timestamp or parse.timestamp=true, not both")
    options: dict[str, Any] = {
        "acks": -1 if args.acks == "all" else int(args.acks),
        "compression_type": args.compression,
        **client_properties(args.producer_property, ProducerConfig, "--producer-property"),
        "bootstrap_servers": args.bootstrap_server,
    }
    count = check_topic(args.bootstrap_server, args.topic, allow_auto_create=True)
    if args.partition is not None and args.partition >= count:
        raise no_such_partition(args.topic, args.partition, count)
    progress = Progress("sent")
    sent = 0
    futures = []
    with Producer(**options) as producer:
        try:
            for number, raw_line in enumerate(sys.stdin.buffer, 1):
                parsed = reader.parse(raw_line.rstrip(b"\r\n"), number)
                futures.append(
                    producer.send(
                        args.topic,
                        value=parsed.value,
                        key=parsed.key,
                        headers=parsed.headers or None,
                        partition=args.partition,
                        timestamp_ms=parsed.timestamp_ms
                        if parsed.timestamp_ms is not None
                        else args.timestamp,
                    )
                )
                sent += 1
                progress.update(sent)
        finally:
            # The lines before a bad one are sent (and reported) all the same.
            producer.flush()
            progress.done()
            _report(futures)
    return 0 if all(future.exception() is None for future in futures) else 1


def _report(futures: list[Any]) -> None:
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
