"""`tidelog consume TOPIC`: print records, one value per line (or as a
kcat format string, or JSON lines: _record_output).

With `--group G` it joins consumer group G (partitions are shared with the
group's other members; positions are committed every few seconds and on
exit, so the next run continues where this one stopped).

Where to start: the end (default), `--from-beginning`, `--from-time`, or
`--offset`: N >= 0 with `--partition` is that offset; a negative N is
relative to each partition's end (`--offset -10`: the last ten records of
every partition read, as kcat's `-o -10`).

`--exit-at-end` (`-e`, as kcat's): stop once every partition read has been
read up to the end it had when the command started (in a group: when the
partition was assigned), instead of waiting for new records.

A topic or partition that does not exist is an error at once, naming it
(the consumer itself would wait for it to appear).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

from tidelog._connection import no_such_partition
from tidelog.cli._common import (
    EXIT_CODES_HELP,
    AddBootstrap,
    check_topic,
    client_properties,
    int_at_least,
    unescape,
)
from tidelog.cli._record_output import (
    FORMAT_HELP,
    Writer,
    format_writer,
    json_writer,
    plain_writer,
)
from tidelog.config import ConsumerConfig
from tidelog.consumer import Consumer
from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition

#: The longest one poll waits, so that --timeout-ms and --exit-at-end are
#: checked at least this often.
POLL_SLICE_MS = 200


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser(
        "consume",
        help="print records of a topic",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    start.add_argument(
        "-o",
        "--offset",
        type=int,
        help="N >= 0: start at offset N (needs --partition); N < 0: at N from each "
        "partition's end (-10: the last ten records of each partition)",
    )
    start.add_argument(
        "--from-time",
        metavar="ISO-8601",
        help="start at the first record at or after this time, e.g. 2026-11-25T10:00:00Z",
    )
    parser.add_argument("-p", "--partition", type=int_at_least(0), help="read only this partition")
    parser.add_argument(
        "-G",
        "--group",
        metavar="GROUP",
        help="join this consumer group and commit (starts at its committed offsets; where it "
        "has none, at the end, or the beginning with --from-beginning; note: the SDK's "
        "Consumer defaults to auto_offset_reset='earliest', Kafka's clients to 'latest')",
    )
    parser.add_argument(
        "-c", "--max-messages", type=int_at_least(1), help="exit after this many records"
    )
    parser.add_argument(
        "--timeout-ms",
        type=int_at_least(0),
        help="exit after this long without a new record (default: wait forever)",
    )
    parser.add_argument(
        "-e",
        "--exit-at-end",
        action="store_true",
        help="exit once every partition is read up to its end as of the start (kcat's -e)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("-f", "--format", metavar="FMT", help=FORMAT_HELP)
    output.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="json: one object per line (topic, partition, offset, timestamp, key, value, "
        "headers; bytes that are not UTF-8 in base64, with <field>_encoding saying which; "
        "null stays null)",
    )
    parser.add_argument("--print-key", action="store_true", help="print KEY<TAB> before the value")
    parser.add_argument(
        "--print-offset", action="store_true", help="print PARTITION:OFFSET<TAB> first"
    )
    parser.add_argument(
        "--print-timestamp", action="store_true", help="print CreateTime:MS<TAB> first"
    )
    parser.add_argument(
        "--print-headers", action="store_true", help="print k:v,k:v<TAB> (or NO_HEADERS<TAB>)"
    )
    parser.add_argument(
        "--consumer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a consumer option with Kafka's name, e.g. fetch.max.wait.ms=100 (repeatable)",
    )
    add_bootstrap(parser)
    parser.set_defaults(handler=_consume)


def _parse_time_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequestError(
            f"--from-time {text!r} is not an ISO-8601 time such as 2026-11-25T10:00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise InvalidRequestError(f"--from-time {text!r} needs a time zone, e.g. a trailing Z")
    return int(moment.timestamp() * 1000)


def _writer(args: argparse.Namespace) -> Writer:
    if args.format is not None:
        return format_writer(unescape(args.format))
    if args.output == "json":
        return json_writer
    return plain_writer(
        print_timestamp=args.print_timestamp,
        print_offset=args.print_offset,
        print_headers=args.print_headers,
        print_key=args.print_key,
    )


def _consume(args: argparse.Namespace) -> int:
    if args.offset is not None and args.offset >= 0 and args.partition is None:
        raise InvalidRequestError(
            "--offset N needs --partition: offsets are per partition "
            "(a negative --offset counts back from each partition's end)"
        )
    if args.group is not None and (
        args.partition is not None or args.offset is not None or args.from_time is not None
    ):
        raise InvalidRequestError(
            "--group takes partitions from the group: drop --partition, --offset and "
            "--from-time (or use `tidelog groups reset-offsets`)"
        )
    writer = _writer(args)
    options: dict[str, Any] = {
        "auto_offset_reset": "earliest" if args.from_beginning else "latest",
        **client_properties(args.consumer_property, ConsumerConfig, "--consumer-property"),
        "bootstrap_servers": args.bootstrap_server,
    }
    count = check_topic(args.bootstrap_server, args.topic)
    if args.group is not None:
        with Consumer(args.topic, group_id=args.group, **options) as consumer:
            _print_records(consumer, args, writer)
        return 0
    if args.partition is not None and args.partition >= count:
        raise no_such_partition(args.topic, args.partition, count)
    with Consumer(**options) as consumer:
        partitions = [args.partition] if args.partition is not None else list(range(count))
        assignment = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(assignment)
        _seek(consumer, assignment, args)
        _print_records(consumer, args, writer)
    return 0


def _seek(consumer: Consumer, assignment: list[TopicPartition], args: argparse.Namespace) -> None:
    if args.from_beginning:
        consumer.seek_to_beginning(*assignment)
    elif args.offset is not None and args.offset >= 0:
        consumer.seek(assignment[0], args.offset)
    elif args.offset is not None:
        # Relative to the end, never before the start.
        ends = consumer.end_offsets(assignment)
        starts = consumer.beginning_offsets(assignment)
        for tp in assignment:
            consumer.seek(tp, max(starts[tp], ends[tp] + args.offset))
    elif args.from_time is not None:
        timestamp_ms = _parse_time_ms(args.from_time)
        found = consumer.offsets_for_times({tp: timestamp_ms for tp in assignment})
        for tp in assignment:
            match = found.get(tp)
            if match is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, match.offset)
    else:
        consumer.seek_to_end(*assignment)


class _EndTracker:
    """--exit-at-end: each partition's end as of when it was first seen
    assigned, and whether it has been read up to there."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._ends: dict[TopicPartition, int] = {}

    def all_read(self) -> bool:
        assignment = self._consumer.assignment()
        if not assignment:
            return False  # a group member not assigned yet
        new = [tp for tp in assignment if tp not in self._ends]
        if new:
            self._ends.update(self._consumer.end_offsets(new))
        return all(self._consumer.position(tp) >= self._ends[tp] for tp in assignment)


def _print_records(consumer: Consumer, args: argparse.Namespace, writer: Writer) -> int:
    out = sys.stdout.buffer
    printed = 0
    ends = _EndTracker(consumer) if args.exit_at_end else None
    idle_since = time.monotonic()
    while True:
        if ends is not None and ends.all_read():
            break
        wanted = None if args.max_messages is None else args.max_messages - printed
        batch = consumer.poll(timeout_ms=POLL_SLICE_MS, max_records=wanted)
        if not batch:
            if (
                args.timeout_ms is not None
                and (time.monotonic() - idle_since) * 1000 >= args.timeout_ms
            ):
                break
            continue
        idle_since = time.monotonic()
        for records in batch.values():
            for record in records:
                out.write(writer(record))
            printed += len(records)
        if args.max_messages is not None and printed >= args.max_messages:
            break
    out.flush()
    return printed
