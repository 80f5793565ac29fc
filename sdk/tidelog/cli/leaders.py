"""`tidelog leaders elect`: preferred-leader election on demand, as
kafka-leader-election --election-type PREFERRED does: each partition's first
replica becomes its leader where it is alive and in the ISR.

Partitions: `--topic T [--partition P]`, `--all-topic-partitions` (`--all`),
or `--path-to-json-file F` ({"partitions": [{"topic", "partition"}]}).
Exit 1 when an election failed (ELECTION_NOT_NEEDED is not a failure).
"""

from __future__ import annotations

import argparse

from tidelog.admin import AdminClient
from tidelog.cli._common import EXIT_ERROR, AddBootstrap, int_at_least
from tidelog.cli._json_files import read_partitions
from tidelog.errors import ElectionNotNeededError
from tidelog.types import TopicPartition


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    leaders = sub.add_parser("leaders", help="preferred-leader election")
    actions = leaders.add_subparsers(dest="action", required=True, metavar="ACTION")
    elect = actions.add_parser(
        "elect",
        help="make each partition's preferred replica (its first) the leader",
        description="Preferred-leader election (kafka-leader-election --election-type "
        "PREFERRED): a partition whose first replica is alive and in the ISR is led by it.",
    )
    which = elect.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", help="a topic (all its partitions, or --partition)")
    which.add_argument(
        "--all-topic-partitions", "--all", action="store_true", help="every partition"
    )
    which.add_argument("--path-to-json-file", metavar="FILE", help="partitions from a JSON file")
    elect.add_argument("--partition", type=int_at_least(0), help="with --topic: one partition")
    elect.add_argument(
        "--election-type",
        choices=["preferred", "PREFERRED"],
        default="preferred",
        help="only preferred (an unclean election is the topic config "
        "unclean.leader.election.enable)",
    )
    elect.set_defaults(handler=_elect)
    add_bootstrap(elect)


def _elect(args: argparse.Namespace) -> int:
    if args.partition is not None and args.topic is None:
        raise ValueError("--partition goes with --topic")
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        partitions: list[TopicPartition] | None
        if args.path_to_json_file:
            partitions = read_partitions(args.path_to_json_file)
        elif args.topic is not None and args.partition is not None:
            partitions = [TopicPartition(args.topic, args.partition)]
        elif args.topic is not None:
            (topic,) = admin.describe_topics([args.topic])
            partitions = [TopicPartition(topic.name, p.partition) for p in topic.partitions]
        else:
            partitions = None
        results = admin.elect_leaders(partitions)
    elected = sorted(tp for tp, e in results.items() if e is None)
    not_needed = sorted(tp for tp, e in results.items() if isinstance(e, ElectionNotNeededError))
    failed = {
        tp: e
        for tp, e in results.items()
        if e is not None and not isinstance(e, ElectionNotNeededError)
    }
    if elected:
        print(
            f"Successfully completed leader election (PREFERRED) for partitions {_names(elected)}"
        )
    if not_needed:
        print(f"Valid replica already elected for partitions {_names(not_needed)}")
    for tp, error in sorted(failed.items()):
        print(
            f"Error completing leader election (PREFERRED) for partition {tp.topic}-"
            f"{tp.partition}: {type(error).__name__}: {error}"
        )
    return EXIT_ERROR if failed else 0


def _names(tps: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)
