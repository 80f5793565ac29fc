"""`tidelog topics create|list|describe|alter|delete`.

`describe` prints `none` as the leader of a partition without one (-1 in
the API), as kafka-topics prints "Leader: none", `-` for an empty replica
or ISR list (every cell holds something, so a line splits into its
columns), and an `offline` column,
as kafka-topics prints "Offline:", when a replica cannot serve: its broker
is down (not registered), or its log is offline (its broker lists it so: a
storage failure, until that broker restarts). It can list only the partitions in trouble,
as kafka-topics does: `--under-replicated-partitions` (fewer in-sync
replicas than replicas, or an offline replica not yet out of the ISR of a
leader that serves), `--unavailable-partitions`
(no live leader, or a leader whose log is offline), `--under-min-isr-partitions`
(fewer in-sync replicas than min.insync.replicas: acks=all writes fail) and
`--at-min-isr-partitions`. `alter --partitions N` adds partitions.
"""

from __future__ import annotations

import argparse
import sys

from tidelog.admin import AdminClient
from tidelog.cli._common import AddBootstrap, int_at_least
from tidelog.errors import InvalidConfigError, StorageError
from tidelog.types import NewPartitions, NewTopic, PartitionInfo, TopicDescription

#: Kafka's warning, printed when partitions are added.
KEYED_RECORDS_WARNING = (
    "WARNING: if partitions are added to a topic whose records have keys, records with a "
    "given key may go to another partition than before, so their order across the change "
    "is no longer guaranteed"
)


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    topics = sub.add_parser(
        "topics", help="create, list, describe, alter (configs, partitions) and delete topics"
    )
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument(
        "--partitions", type=int_at_least(1), help="default 1, or the --replica-assignment's"
    )
    create.add_argument(
        "--replication-factor",
        type=int_at_least(1),
        help="default 1, or the --replica-assignment's",
    )
    create.add_argument(
        "--replica-assignment",
        type=parse_replica_assignment,
        metavar="B:B,B:B",
        help="place the replicas yourself, as kafka-topics does: partitions separated by "
        "commas, each a colon-separated list of broker ids, the preferred leader first "
        "(e.g. 0:1:2,1:2:0 is 2 partitions of 3 replicas)",
    )
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config with Kafka's name, e.g. retention.ms=86400000 (repeatable)",
    )
    create.set_defaults(handler=_create)

    listing = actions.add_parser("list", help="list topic names")
    listing.set_defaults(handler=_list)

    describe = actions.add_parser("describe", help="partitions, leaders, offsets, sizes")
    describe.add_argument("name", nargs="?", help="a topic (default: all)")
    describe.add_argument(
        "--configs",
        action="store_true",
        help="also print every topic config and where it comes from (topic override, "
        "broker default, built-in default)",
    )
    trouble = describe.add_mutually_exclusive_group()
    for flag, text in _FILTERS.items():
        trouble.add_argument(flag, dest="only", action="store_const", const=flag, help=text)
    describe.set_defaults(handler=_describe, only=None)

    alter = actions.add_parser(
        "alter", help="add partitions, or set or remove topic config overrides"
    )
    alter.add_argument("name")
    alter.add_argument(
        "--partitions",
        type=int_at_least(1),
        metavar="N",
        help="grow the topic to N partitions (more than it has); keyed records may then "
        "map to other partitions",
    )
    alter.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an override with Kafka's name, e.g. retention.ms=86400000 (repeatable)",
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="KEY",
        help="remove an override: the key falls back to the broker's default (repeatable)",
    )
    alter.set_defaults(handler=_alter)

    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(handler=_delete)

    for parser in (create, listing, describe, alter, delete):
        add_bootstrap(parser)


def _parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--config expects key=value, got {pair!r}")
        configs[key.strip()] = value.strip()
    return configs


def parse_replica_assignment(text: str) -> dict[int, list[int]]:
    """kafka-topics' --replica-assignment: "0:1:2,1:2:0" -> {0: [0, 1, 2], 1: [1, 2, 0]}
    (the n-th comma-separated group is partition n)."""
    assignment: dict[int, list[int]] = {}
    for partition, group in enumerate(text.split(",")):
        try:
            assignment[partition] = [int(b) for b in group.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"partition {partition} is {group.strip()!r}: expected broker ids separated "
                f"by colons, partitions by commas (e.g. 0:1:2,1:2:0)"
            ) from None
    return assignment


def _create(args: argparse.Namespace) -> int:
    assignment = args.replica_assignment
    # Without an assignment, 1 is the default; with one, -1 takes each count
    # from it (an explicit one must agree with it).
    unset = 1 if assignment is None else -1
    partitions = args.partitions or unset
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        admin.create_topics(
            [
                NewTopic(
                    args.name,
                    num_partitions=partitions,
                    replication_factor=args.replication_factor or unset,
                    topic_configs=_parse_configs(args.config),
                    replica_assignments=assignment,
                )
            ]
        )
    count = len(assignment) if assignment is not None else partitions
    print(f"created topic {args.name} with {count} partition(s)")
    return 0


def _list(args: argparse.Namespace) -> int:
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        for name in sorted(admin.list_topics()):
            print(name)
    return 0


def _human_bytes(n: int) -> str:
    """`n` bytes as one cell without spaces (`100B`, `1.5MiB`): the table's
    rows split on whitespace into their columns."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


_FILTERS = {
    "--under-replicated-partitions": "only partitions with fewer in-sync replicas than "
    "replicas, or with an offline replica still in the ISR of a serving leader",
    "--unavailable-partitions": "only partitions without a live leader (or whose leader's "
    "log is offline)",
    "--under-min-isr-partitions": "only partitions with fewer in-sync replicas than "
    "min.insync.replicas (acks=all writes to them fail)",
    "--at-min-isr-partitions": "only partitions with exactly min.insync.replicas in-sync replicas",
}


def in_trouble(
    only: str | None, topic: TopicDescription, partition: PartitionInfo, live: set[int]
) -> bool:
    """Whether `partition` passes the describe filter `only` (a _FILTERS flag)."""
    min_isr = int(topic.configs.get("min.insync.replicas", "1") or 1)
    if only == "--under-replicated-partitions":
        # As kafka-topics: an ISR smaller than the replicas. An offline
        # replica (its broker down, or its log offline) leaves the ISR, but
        # the controller may not have written that yet: under-replicated
        # either way, while a leader serves. A partition whose leader cannot
        # serve keeps its ISR on purpose (to elect a member that comes back):
        # it is unavailable, not under-replicated, as in Kafka.
        offline = partition.offline_replicas
        serving = partition.leader >= 0 and partition.leader not in offline
        return len(partition.isr) < len(partition.replicas) or (
            serving and any(b in offline for b in partition.isr)
        )
    if only == "--unavailable-partitions":
        return (
            partition.leader < 0
            or partition.leader not in live
            # Until leadership moves off it (or for good with no other ISR
            # member), an offline leader serves nothing. A dead leader is
            # offline too, but a server older than that lists only offline
            # logs: `live` answers for it.
            or partition.leader in partition.offline_replicas
        )
    if only == "--under-min-isr-partitions":
        return len(partition.isr) < min_isr
    if only == "--at-min-isr-partitions":
        return len(partition.isr) == min_isr
    return True


def _offline(partition: PartitionInfo) -> bool:
    """Whether `partition` is described as offline: its leader's log is
    offline (StorageError), or it has no leader that serves and none of its
    ISR can serve (its brokers down or their logs offline: the error then
    says which, and what brings it back)."""
    if isinstance(partition.error, StorageError):
        return True
    offline = partition.offline_replicas
    leaderless = partition.leader < 0 or partition.leader in offline
    return leaderless and bool(partition.isr) and all(b in offline for b in partition.isr)


def _describe(args: argparse.Namespace) -> int:
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        descriptions = admin.describe_topics([args.name] if args.name else None)
        configs = admin.describe_configs([t.name for t in descriptions]) if args.configs else {}
        live = {b.id for b in admin.describe_cluster().brokers} if args.only else set()
    if args.only:
        descriptions = [
            TopicDescription(
                t.name, [p for p in t.partitions if in_trouble(args.only, t, p, live)], t.configs
            )
            for t in descriptions
        ]
        descriptions = [t for t in descriptions if t.partitions]
    for topic in descriptions:
        print(f"topic {topic.name}  partitions {len(topic.partitions)}")
        header, *rows = partition_table(topic)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
        for p in topic.partitions:
            if p.error is not None:
                # An offline log, or a partition no replica can lead, is not
                # an outage to wait out: the message says what brings it back.
                why = "offline" if _offline(p) else "unknown"
                print(f"  partition {p.partition}: ? = {why}: {p.error.message}")
        if args.configs:
            entries = configs.get(topic.name, {})
            print("  configs (* = topic override):")
            for key in sorted(entries):
                entry = entries[key]
                mark = "*" if entry.is_override else " "
                print(f"   {mark}{key}={entry.value}  ({entry.source})")
    return 0


def partition_table(topic: TopicDescription) -> list[tuple[str, ...]]:
    """The cells of `topic`'s partition table, the header first (pure).
    A partition without a leader (-1 in the API) has `none` in the leader
    column, as kafka-topics prints "Leader: none"."""
    header: tuple[str, ...] = (
        "partition", "leader", "replicas", "isr", "start", "end", "size", "segments",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [
        (
            str(p.partition),
            _leader_cell(p.leader),
            # An empty list (a partition with no state yet) is `-` like
            # the other empty cells: a blank cell would shift the columns
            # of a line split on spaces.
            _ids_cell(p.replicas),
            _ids_cell(p.isr),
            # Unknown (-1) when its leader could not tell: the
            # reason is printed under the table.
            *(
                ("?",) * 4
                if p.error is not None
                else (
                    str(p.log_start_offset),
                    str(p.log_end_offset),
                    _human_bytes(p.size_bytes),
                    str(p.segment_count),
                )
            ),
        )
        for p in topic.partitions
    ]
    if any(p.adding_replicas or p.removing_replicas for p in topic.partitions):
        # A reassignment in progress: say which replicas come and go.
        header += ("adding", "removing")
        rows = [
            (
                *row,
                _ids_cell(p.adding_replicas),
                _ids_cell(p.removing_replicas),
            )
            for row, p in zip(rows, topic.partitions, strict=True)
        ]
    # Broker lists shown only when some partition has one, each a column:
    # Kafka's "Offline:" (replicas that cannot serve, their broker down or
    # their log taken offline by a storage failure: never elected, out of
    # the ISR until their broker is back); replicas that may have lost their
    # tail in a crash (in the ISR but not elected while another ISR member
    # may return, which is why a partition with live ISR members can wait
    # leaderless); eligible leader replicas (KIP-966: out of the ISR but
    # holding every acknowledged record, so they may lead, and a torn ISR
    # member waits for them).
    for name, ids_of in (
        ("offline", lambda p: p.offline_replicas),
        ("torn", lambda p: p.torn_replicas),
        ("elr", lambda p: p.eligible_leader_replicas),
    ):
        if any(ids_of(p) for p in topic.partitions):
            header += (name,)
            rows = [
                (*row, _ids_cell(ids_of(p))) for row, p in zip(rows, topic.partitions, strict=True)
            ]
    return [header, *rows]


def _ids_cell(ids: list[int]) -> str:
    """Broker ids as one cell: comma-separated, or `-` when there are none."""
    return ",".join(map(str, ids)) or "-"


def _leader_cell(leader: int) -> str:
    """A leader as the table shows it: its broker id, or `none`."""
    return str(leader) if leader >= 0 else "none"


def _alter(args: argparse.Namespace) -> int:
    changes: dict[str, str | None] = dict(_parse_configs(args.config))
    for key in args.delete_config:
        changes[key.strip()] = None
    if not changes and args.partitions is None:
        raise InvalidConfigError(
            "topics alter needs --partitions N, --config KEY=VALUE or --delete-config KEY"
        )
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        if args.partitions is not None:
            print(KEYED_RECORDS_WARNING, file=sys.stderr)
            admin.create_partitions({args.name: NewPartitions(args.partitions)})
            print(f"topic {args.name} now has {args.partitions} partitions")
        if changes:
            admin.alter_configs({args.name: changes})
    if not changes:
        return 0
    print(
        f"altered configs of topic {args.name}: "
        + ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in changes.items())
    )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        admin.delete_topics([args.name])
    print(f"deleted topic {args.name}")
    return 0
