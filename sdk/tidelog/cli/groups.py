"""`tidelog groups list|describe|reset-offsets|delete`: consumer groups.

Groups live on the coordinator; the AdminClient finds it through the broker
given with --bootstrap-server (a cluster: brokers started with --etcd).
"""

from __future__ import annotations

import argparse
import sys

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
    describe.add_argument("group")
    describe.add_argument("--members", action="store_true", help="also list the members")
    describe.set_defaults(handler=_describe)

    reset = actions.add_parser(
        "reset-offsets",
        help="move a group's committed offsets (refused while the group has live members)",
    )
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument(
        "--partition",
        type=int_at_least(0),
        action="append",
        help="only this partition (repeatable)",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-offset", type=int_at_least(0), metavar="N")
    to.add_argument("--to-datetime", metavar="ISO-8601", help="e.g. 2026-11-25T10:00:00Z")
    to.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    reset.add_argument(
        "--dry-run", action="store_true", help="print the new offsets, change nothing"
    )
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


def _describe(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        description = admin.describe_consumer_groups([args.group])[args.group]
        committed = admin.list_consumer_group_offsets(args.group)
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
    if args.members and description.members:
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
    return 0


def _reset(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        described = admin.describe_topics([args.topic])
        if not described:
            raise UnknownTopicOrPartitionError(f"topic {args.topic!r} does not exist")
        count = len(described[0].partitions)
        partitions = [TopicPartition(args.topic, p) for p in (args.partition or range(count))]
        for tp in partitions:
            if not 0 <= tp.partition < count:
                raise InvalidRequestError(f"{args.topic} has partitions 0 to {count - 1}")
        earliest = {
            tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(partitions, -2)).items()
        }
        latest = {tp: o for tp, (o, _) in admin.list_offsets(dict.fromkeys(partitions, -1)).items()}
        if args.to_earliest:
            targets = dict(earliest)
        elif args.to_latest:
            targets = dict(latest)
        elif args.to_offset is not None:
            targets = dict.fromkeys(partitions, args.to_offset)
        elif args.to_datetime is not None:
            at_ms = _parse_time_ms(args.to_datetime)
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
        if args.dry_run:
            print("(dry run: nothing changed)", file=sys.stderr)
            return 0
        admin.alter_consumer_group_offsets(args.group, targets)
    return 0


def _delete(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        admin.delete_consumer_groups([args.group])
    print(f"deleted group {args.group}")
    return 0
