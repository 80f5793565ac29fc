"""`tidelog brokers decommission ID`: a reassignment plan that moves every
replica off a broker, so that it can be removed (Kafka users write this plan
with kafka-reassign-partitions --generate; here it is one command).

Each replica on the broker is replaced, in its place in the replica list
(so the preferred leader stays first), by a live broker not yet holding the
partition: one in the same rack when there is one (rack spread is kept),
else any; among those, the one with the fewest replicas (counting the plan
so far). Partitions already being moved are planned from their target.

Without `--execute` it prints the plan and changes nothing (as
`groups reset-offsets` and Kafka's tools do); the plan is JSON on stdout,
so `> plan.json` keeps it for `tidelog reassign --verify` and `--cancel`.
With `--execute` the moves start (item of `tidelog reassign --execute`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from tidelog.admin import AdminClient
from tidelog.cli import reassign
from tidelog.cli._common import AddBootstrap, int_at_least
from tidelog.cli._json_files import plan_json
from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    brokers = sub.add_parser("brokers", help="decommission a broker")
    actions = brokers.add_subparsers(dest="action", required=True, metavar="ACTION")
    decommission = actions.add_parser(
        "decommission",
        help="plan (and with --execute, start) moving every replica off a broker",
        description="Prints a reassignment plan moving every replica off the broker (JSON "
        "on stdout) and changes nothing unless given --execute. Follow it with "
        "`tidelog reassign --verify --reassignment-json-file PLAN`.",
    )
    decommission.add_argument("broker_id", type=int_at_least(0), metavar="ID")
    decommission.add_argument("--execute", action="store_true", help="start the moves")
    decommission.add_argument(
        "--throttle",
        type=int_at_least(1),
        metavar="BYTES_PER_S",
        help="with --execute: bytes per second each leader sends to the new replicas",
    )
    decommission.set_defaults(handler=_decommission)
    add_bootstrap(decommission)


def decommission_plan(
    broker_id: int,
    replicas: Mapping[TopicPartition, Sequence[int]],
    racks: Mapping[int, str | None],
) -> dict[TopicPartition, list[int]]:
    """The target replicas of every partition that has `broker_id` among
    `replicas` (partition -> current, or target when moving), given the
    live brokers and their racks (`racks`, broker -> rack or None). Pure.

    Raises InvalidRequestError naming the first partition that cannot move
    (every other live broker already holds it)."""
    load: dict[int, int] = dict.fromkeys(racks, 0)
    for current in replicas.values():
        for b in current:
            if b in load:
                load[b] += 1
    plan: dict[TopicPartition, list[int]] = {}
    for tp, current in sorted(replicas.items()):
        if broker_id not in current:
            continue
        candidates = [b for b in racks if b != broker_id and b not in current]
        if not candidates:
            raise InvalidRequestError(
                f"cannot move {tp.topic}-{tp.partition} off broker {broker_id}: its "
                f"replicas {list(current)} already use every other live broker; add a broker "
                "first"
            )
        rack = racks.get(broker_id)
        same_rack = [b for b in candidates if rack and racks.get(b) == rack]
        chosen = min(same_rack or candidates, key=lambda b: (load[b], b))
        load[chosen] += 1
        plan[tp] = [chosen if b == broker_id else b for b in current]
    return plan


def _decommission(args: argparse.Namespace) -> int:
    if args.throttle is not None and not args.execute:
        raise ValueError("--throttle goes with --execute")
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        cluster = admin.describe_cluster()
        racks = {node.id: node.rack for node in cluster.brokers}
        replicas = {
            TopicPartition(t.name, p.partition): p.replicas
            for t in admin.describe_topics()
            for p in t.partitions
        }
        for tp, ongoing in admin.list_partition_reassignments().items():
            target = [b for b in ongoing.replicas if b not in ongoing.removing_replicas]
            replicas[tp] = target
        plan = decommission_plan(args.broker_id, replicas, racks)
        if not plan:
            print(f"broker {args.broker_id} holds no replica: nothing to move", file=sys.stderr)
            return 0
        if args.execute:
            print("Proposed partition reassignment (keep it for reassign --verify/--cancel):")
            print(plan_json(plan))
            print()
            return reassign.execute(admin, plan, args.throttle or 0)
    print(plan_json(plan))
    print(
        f"plan only: {len(plan)} partition(s) would move off broker {args.broker_id}; "
        "save the plan (> plan.json) and run again with --execute",
        file=sys.stderr,
    )
    return 0
