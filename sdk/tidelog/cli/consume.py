"""`tidelog consume TOPIC`: print records, one value per line.

With `--group G` it joins consumer group G (partitions are shared with the
group's other members; positions are committed every few seconds and on
exit, so the next run continues where this one stopped).

A topic or partition that does not exist is an error at once, naming it
(the consumer itself would wait for it to appear).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from tidelog._connection import no_such_partition
from tidelog.cli._common import AddBootstrap, check_topic, int_at_least
from tidelog.consumer import Consumer
from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser("consume", help="print records of a topic")
    parser.add_argument("topic")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    start.add_argument(
        "--offset", type=int_at_least(0), help="start at this offset (needs --partition)"
    )
    start.add_argument(
        "--from-time",
        metavar="ISO-8601",
        help="start at the first record at or after this time, e.g. 2026-11-25T10:00:00Z",
    )
    parser.add_argument("--partition", type=int_at_least(0), help="read only this partition")
    parser.add_argument(
        "--group",
        metavar="GROUP",
        help="join this consumer group and commit (starts at its committed offsets; where it "
        "has none, at the end, or the beginning with --from-beginning; note: the SDK's "
        "Consumer defaults to auto_offset_reset='earliest', Kafka's clients to 'latest')",
    )
    parser.add_argument("--max-messages", type=int_at_least(1), help="exit after this many records")
    parser.add_argument(
        "--timeout-ms",
        type=int_at_least(0),
        help="exit after this long without a new record (default: wait forever)",
    )
    parser.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")
    parser.add_argument("--print-offset", action="store_true", help="print PARTITION:OFFSET first")
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


def _consume(args: argparse.Namespace) -> int:
    if args.offset is not None and args.partition is None:
        raise InvalidRequestError("--offset needs --partition: offsets are per partition")
    if args.group is not None and (
        args.partition is not None or args.offset is not None or args.from_time is not None
    ):
        raise InvalidRequestError(
            "--group takes partitions from the group: drop --partition, --offset and "
            "--from-time (or use `tidelog groups reset-offsets`)"
        )
    count = check_topic(args.bootstrap_server, args.topic)
    if args.group is not None:
        return _consume_group(args)
    if args.partition is not None and args.partition >= count:
        raise no_such_partition(args.topic, args.partition, count)
    out = sys.stdout.buffer
    with Consumer(
        bootstrap_servers=args.bootstrap_server,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        consumer_timeout_ms=args.timeout_ms,
    ) as consumer:
        partitions = [args.partition] if args.partition is not None else list(range(count))
        assignment = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(assignment)
        if args.from_beginning:
            consumer.seek_to_beginning(*assignment)
        elif args.offset is not None:
            consumer.seek(assignment[0], args.offset)
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
        _print_records(consumer, args)
    out.flush()
    return 0


def _consume_group(args: argparse.Namespace) -> int:
    with Consumer(
        args.topic,
        bootstrap_servers=args.bootstrap_server,
        group_id=args.group,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        consumer_timeout_ms=args.timeout_ms,
    ) as consumer:
        _print_records(consumer, args)
    sys.stdout.buffer.flush()
    return 0


def _print_records(consumer: Consumer, args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    printed = 0
    for record in consumer:
        if args.print_offset:
            out.write(f"{record.partition}:{record.offset}\t".encode())
        if args.print_key:
            out.write(record.key if record.key is not None else b"null")
            out.write(b"\t")
        out.write(record.value if record.value is not None else b"null")
        out.write(b"\n")
        printed += 1
        if args.max_messages is not None and printed >= args.max_messages:
            break
    return printed
