"""`tidelog groups list|describe|reset-offsets|delete`: consumer groups.

Groups live on the coordinator; the AdminClient finds it through the broker
given with --bootstrap-server (a cluster: brokers started with --etcd).

`reset-offsets` only plans and prints unless given `--execute`, as Kafka's
kafka-consumer-groups does: a Kafka user who types the command they know
must not change a group's offsets without meaning to.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from tidelog.admin import AdminClient
from tidelog.cli._common import AddBootstrap, int_at_least
from tidelog.cli.consume import _parse_time_ms
from tidelog.errors import InvalidRequestError, UnknownTopicOrPartitionError
from tidelog.types import TopicPartition


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    groups = sub.add_parser("groups", help="list, describe, reset and delete consumer groups")
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="every group, its state and member count")
    listing.set_defaults(handler=_list)

    describe = actions.add_parser(
        "describe", help="per partition: owner, committed offset, log end offset, lag"
    )
    which = describe.add_mutually_exclusive_group(required=True)
    which.add_argument("group", nargs="?")
    which.add_argument("--all-groups", action="store_true", help="describe every group")
    describe.add_argument("--members", action="store_true", help="also list the members")
    describe.set_defaults(handler=_describe)

    reset = actions.add_parser(
        "reset-offsets",
        help="plan (and with --execute, make) new committed offsets for a group",
        description="Prints the new offsets and changes nothing unless given --execute, as "
        "kafka-consumer-groups does. Refused while the group has live members. New offsets "
        "are clamped to each partition's log (start to end).",
    )
    reset.add_argument("group")
    topics = reset.add_mutually_exclusive_group(required=True)
    topics.add_argument("--topic", action="append", help="a topic of the group (repeatable)")
    topics.add_argument(
        "--all-topics", action="store_true", help="every topic the group has committed offsets for"
    )
    reset.add_argument(
        "--partition",
        type=int_at_least(0),
        action="append",
        help="only this partition (repeatable; with a single --topic)",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument(
        "--to-current",
        action="store_true",
        help="the committed offset (the log end where none is committed)",
    )
    to.add_argument("--to-offset", type=int_at_least(0), metavar="N")
    to.add_argument("--to-datetime", metavar="ISO-8601", help="e.g. 2026-11-25T10:00:00Z")
    to.add_argument(
        "--by-duration",
        type=_duration_ms,
        metavar="DURATION",
        help="the first offset at or after now minus an ISO-8601 duration (e.g. PT10M, P1DT2H)",
    )
    to.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="print the new offsets, change nothing (default)"
    )
    mode.add_argument("--execute", action="store_true", help="change the offsets")
    reset.set_defaults(handler=_reset)

    delete = actions.add_parser("delete", help="delete a group and its offsets (when empty)")
    delete.add_argument("group")
    delete.set_defaults(handler=_delete)

    for parser in (listing, describe, reset, delete):
        add_bootstrap(parser)


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _list(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        rows = [["GROUP", "STATE", "MEMBERS"]]
        for group in admin.list_consumer_groups():
            rows.append([group.group_id, group.state, str(group.member_count)])
    _table(rows)
    return 0


#: An ISO-8601 duration as java.time.Duration.parse takes it (days, hours,
#: minutes, seconds with a fraction), at most 9 digits a field so that the
#: value stays bounded.
_DURATION = re.compile(
    r"P(?:(?P<d>\d{1,9})D)?(?:T(?:(?P<h>\d{1,9})H)?(?:(?P<m>\d{1,9})M)?"
    r"(?:(?P<s>\d{1,9})(?:[.,](?P<f>\d{1,9}))?S)?)?",
    re.IGNORECASE,
)


def _duration_ms(text: str) -> int:
    """--by-duration: an ISO-8601 duration (PT10M, P1DT2H, PT0.5S) in ms."""
    match = _DURATION.fullmatch(text)
    if not match or not any(match.group(g) for g in "dhms") or text.upper().endswith("T"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO-8601 duration such as PT10M, PT1H30M or P1DT2H"
        )
    days, hours, minutes, seconds = (int(match.group(g) or 0) for g in "dhms")
    fraction = (match.group("f") or "").ljust(3, "0")[:3]
    return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000 + int(fraction)


def _describe(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        if args.all_groups:
            names = sorted(group.group_id for group in admin.list_consumer_groups())
        else:
            names = [args.group]
        for i, name in enumerate(names):
            if i:
                print()
            _describe_one(admin, name, args.members)
    return 0


def _describe_one(admin: AdminClient, group: str, members: bool) -> None:
    description = admin.describe_consumer_groups([group])[group]
    committed = admin.list_consumer_group_offsets(group)
    owners: dict[TopicPartition, str] = {}
    for member in description.members:
        for tp in member.owned:
            owners[tp] = member.group_instance_id or member.member_id
    partitions = sorted(set(committed) | set(owners))
    ends = admin.list_offsets(dict.fromkeys(partitions, -1)) if partitions else {}
    print(
        f"group {description.group_id}: {description.state}, generation "
        f"{description.group_epoch}, {len(description.members)} members, "
        f"assignor {description.assignor or '-'}"
    )
    rows = [["TOPIC", "PARTITION", "OWNER", "COMMITTED", "LOG-END", "LAG"]]
    for tp in partitions:
        end = ends.get(tp, (-1, -1))[0]
        done = committed.get(tp)
        lag = "-" if done is None or end < 0 else str(max(0, end - done.offset))
        rows.append(
            [
                tp.topic,
                str(tp.partition),
                owners.get(tp, "-"),
                "-" if done is None else str(done.offset),
                "-" if end < 0 else str(end),
                lag,
            ]
        )
    _table(rows)
    if members and description.members:
        print()
        rows = [["MEMBER", "INSTANCE", "CLIENT", "EPOCH", "OWNED", "TARGET"]]
        for m in description.members:
            rows.append(
                [
                    m.member_id,
                    m.group_instance_id or "-",
                    m.client_id or "-",
                    str(m.member_epoch),
                    ",".join(f"{t}-{p}" for t, p in m.owned) or "-",
                    ",".join(f"{t}-{p}" for t, p in m.target) or "-",
                ]
            )
        _table(rows)


def _partitions_to_reset(admin: AdminClient, args: argparse.Namespace) -> list[TopicPartition]:
    """The partitions named by --topic/--partition, or every partition of
    every topic the group has committed offsets for (--all-topics)."""
    if args.all_topics:
        if args.partition:
            raise InvalidRequestError("--partition needs a single --topic, not --all-topics")
        committed = admin.list_consumer_group_offsets(args.group)
        topics = sorted({tp.topic for tp in committed})
        if not topics:
            raise InvalidRequestError(f"group {args.group!r} has no committed offsets")
    else:
        topics = list(dict.fromkeys(args.topic))
        if args.partition and len(topics) > 1:
            raise InvalidRequestError("--partition needs a single --topic")
    described = {d.name: d for d in admin.describe_topics(topics)}
    partitions: list[TopicPartition] = []
    for topic in topics:
        if topic not in described:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        count = len(described[topic].partitions)
        for p in args.partition or range(count):
            if not 0 <= p < count:
                raise InvalidRequestError(f"{topic} has partitions 0 to {count - 1}")
            partitions.append(TopicPartition(topic, p))
    return partitions


def _reset(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        partitions = _partitions_to_reset(admin, args)
        earliest = {
            tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(partitions, -2)).items()
        }
        latest = {tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(partitions, -1)).items()}
        if args.to_earliest:
            targets = dict(earliest)
        elif args.to_latest:
            targets = dict(latest)
        elif args.to_current:
            committed = admin.list_consumer_group_offsets(args.group, partitions)
            targets = {
                tp: committed[tp].offset if tp in committed else latest[tp] for tp in partitions
            }
        elif args.to_offset is not None:
            targets = dict.fromkeys(partitions, args.to_offset)
        elif args.to_datetime is not None or args.by_duration is not None:
            if args.to_datetime is not None:
                at_ms = _parse_time_ms(args.to_datetime)
            else:
                # Never below 0: a negative timestamp means "earliest" or
                # "latest" to ListOffsets.
                at_ms = max(0, int(time.time() * 1000) - args.by_duration)
            found = admin.list_offsets(dict.fromkeys(partitions, at_ms))
            targets = {tp: o if o >= 0 else latest[tp] for tp, (o, _) in found.items()}
        else:
            committed = admin.list_consumer_group_offsets(args.group, partitions)
            targets = {
                tp: (committed[tp].offset if tp in committed else earliest[tp]) + args.shift_by
                for tp in partitions
            }
        # Kafka's tool clamps to the log's range: an offset outside it would
        # only trigger auto_offset_reset at the next poll.
        targets = {tp: min(max(o, earliest[tp]), latest[tp]) for tp, o in targets.items()}
        rows = [["TOPIC", "PARTITION", "NEW-OFFSET"]]
        rows += [[tp.topic, str(tp.partition), str(o)] for tp, o in sorted(targets.items())]
        _table(rows)
        if not args.execute:
            members = admin.describe_consumer_groups([args.group])[args.group].members
            # As Kafka's tool does, say now what --execute would meet.
            blocked = (
                f"; group {args.group} has {len(members)} live members, and --execute is "
                "refused until they leave"
                if members
                else "; add --execute to change the offsets"
            )
            print(f"(dry run: nothing changed{blocked})", file=sys.stderr)
            return 0
        admin.alter_consumer_group_offsets(args.group, targets)
        print(f"reset the offsets of group {args.group}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        admin.delete_consumer_groups([args.group])
    print(f"deleted group {args.group}")
    return 0
