"""`tidelog reassign`: move partitions to other replicas, as
kafka-reassign-partitions does, from a JSON plan
({"version": 1, "partitions": [{"topic", "partition", "replicas"}]}).

- `--execute`: print the current replicas (a plan to roll back with), start
  the moves; `--throttle B` limits what each leader sends to the new
  replicas to B bytes/s (running it again with another throttle changes it);
- `--verify`: per partition, done or in progress, with each new replica's
  progress (offset and bytes still to copy, in the ISR or not), or why it
  has none (its broker not reachable, or its log offline);
- `--cancel`: stop the moves of the plan's partitions, restoring their
  original replicas.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from tidelog.admin import AdminClient
from tidelog.cli._common import EXIT_ERROR, AddBootstrap, int_at_least
from tidelog.cli._json_files import plan_json, read_reassignment_plan
from tidelog.errors import TidelogError
from tidelog.types import PartitionReassignment, TopicPartition

#: Partitions per request: the coordinator writes each in its own etcd
#: transaction (~10 ms here), so a request stays well inside its deadline.
CHUNK = 500


def _alter_in_chunks(
    admin: AdminClient, changes: Mapping[TopicPartition, Sequence[int] | None], throttle: int
) -> dict[TopicPartition, TidelogError | None]:
    items = sorted(changes.items())
    results: dict[TopicPartition, TidelogError | None] = {}
    for i in range(0, len(items), CHUNK):
        results.update(
            admin.alter_partition_reassignments(
                dict(items[i : i + CHUNK]), throttle, raise_errors=False
            )
        )
    return results


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    reassign = sub.add_parser(
        "reassign",
        help="move partitions to other replicas (kafka-reassign-partitions)",
        description="Moves partitions to the replicas of a JSON plan: the new replicas copy "
        "the log (throttled with --throttle), join the ISR, then the old ones are removed "
        "and their logs deleted; leadership moves first when the leader is leaving.",
    )
    action = reassign.add_mutually_exclusive_group(required=True)
    action.add_argument("--execute", action="store_true", help="start the plan's moves")
    action.add_argument("--verify", action="store_true", help="show the moves' progress")
    action.add_argument(
        "--cancel", action="store_true", help="cancel the moves, restoring the original replicas"
    )
    reassign.add_argument(
        "--reassignment-json-file",
        required=True,
        metavar="FILE",
        help='the plan: {"version": 1, "partitions": [{"topic": "t", "partition": 0, '
        '"replicas": [2, 3]}]}',
    )
    reassign.add_argument(
        "--throttle",
        type=int_at_least(1),
        metavar="BYTES_PER_S",
        help="with --execute: bytes per second each leader sends to the new replicas "
        "(default: no limit)",
    )
    reassign.set_defaults(handler=_run)
    add_bootstrap(reassign)


def _run(args: argparse.Namespace) -> int:
    plan = read_reassignment_plan(args.reassignment_json_file)
    if args.throttle is not None and not args.execute:
        raise ValueError("--throttle goes with --execute")
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        if args.execute:
            return execute(admin, plan, args.throttle or 0)
        if args.cancel:
            return _cancel(admin, plan)
        return _verify(admin, plan)


def execute(admin: AdminClient, plan: dict[TopicPartition, list[int]], throttle: int) -> int:
    """Print the current replicas (for a rollback), then start the moves."""
    topics = sorted({tp.topic for tp in plan})
    current = {
        TopicPartition(t.name, p.partition): p.replicas
        for t in admin.describe_topics(topics)
        for p in t.partitions
        if TopicPartition(t.name, p.partition) in plan
    }
    ongoing = admin.list_partition_reassignments(list(plan))
    for tp, reassignment in ongoing.items():
        current[tp] = reassignment.original_replicas
    print("Current partition replica assignment (save it to roll back with --execute):")
    print(plan_json(current))
    print()
    results = _alter_in_chunks(admin, plan, throttle)
    failed = {tp: e for tp, e in results.items() if e is not None}
    started = sorted(tp for tp in results if tp not in failed)
    if started:
        limit = f" (throttle {throttle} bytes/s)" if throttle else ""
        print(f"Started the reassignment of {_names(started)}{limit}")
    for tp, error in sorted(failed.items()):
        print(f"Failed to reassign {tp.topic}-{tp.partition}: {type(error).__name__}: {error}")
    return EXIT_ERROR if failed else 0


def _cancel(admin: AdminClient, plan: dict[TopicPartition, list[int]]) -> int:
    results = _alter_in_chunks(admin, dict.fromkeys(plan, None), 0)
    failed = 0
    for tp, error in sorted(results.items()):
        if error is None:
            print(f"Cancelled the reassignment of {tp.topic}-{tp.partition}")
        else:
            failed += 1
            print(f"Cannot cancel {tp.topic}-{tp.partition}: {type(error).__name__}: {error}")
    return EXIT_ERROR if failed else 0


def _verify(admin: AdminClient, plan: dict[TopicPartition, list[int]]) -> int:
    ongoing = admin.list_partition_reassignments(list(plan))
    topics = sorted({tp.topic for tp in plan})
    replicas = {
        TopicPartition(t.name, p.partition): p.replicas
        for t in admin.describe_topics(topics)
        for p in t.partitions
    }
    for tp, target in sorted(plan.items()):
        name = f"{tp.topic}-{tp.partition}"
        if tp in ongoing:
            print(f"Reassignment of partition {name} is still in progress")
            _progress(ongoing[tp])
        elif replicas.get(tp) == target:
            print(f"Reassignment of partition {name} is completed")
        else:
            print(
                f"Partition {name} has replicas {replicas.get(tp)}, not the plan's {target}, "
                "and no reassignment in progress (cancelled, or never started)"
            )
    return 0


def _progress(reassignment: PartitionReassignment) -> None:
    for broker, p in sorted(reassignment.progress.items()):
        if not p.reachable:
            print(f"  replica {broker}: not reachable")
            continue
        if p.error is not None:
            # Its log is offline: it copies nothing until its broker restarts.
            print(f"  replica {broker}: offline: {p.error.message}")
            continue
        state = "in sync" if p.in_sync else "catching up"
        if reassignment.leader < 0 or reassignment.leader_log_end_offset < 0:
            # No leader, or it did not tell (down, or its log offline): the
            # lag is unknown (-1), not 0 (what older servers answer).
            leader = (
                "the partition has no leader"
                if reassignment.leader < 0
                else f"leader {reassignment.leader} is down or its log offline"
            )
            print(
                f"  replica {broker}: {state}, log end offset {p.log_end_offset}, lag "
                f"unknown: the leader's figures are unknown ({leader})"
            )
            continue
        print(
            f"  replica {broker}: {state}, log end offset {p.log_end_offset} of "
            f"{reassignment.leader_log_end_offset}, {p.lag_records} records "
            f"({p.lag_bytes} bytes) behind leader {reassignment.leader}"
        )


def _names(tps: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)
