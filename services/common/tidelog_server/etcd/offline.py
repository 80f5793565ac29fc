"""Which replicas of a partition are offline, as Metadata
(`PartitionMetadata.offline_replicas`) and DescribeTopics
(`PartitionDescription.offline_replicas`) report them: the one rule shared
by what answers them in cluster mode, the brokers' and the gateway's
`ClusterView` and the coordinator's `LiveBrokers` (leader_election).

As Kafka's: a replica is offline when it cannot serve, that is when its
broker has no live registration (dead, its lease expired or revoked; or a
broker id that never registered at all) or when its live broker's
registration lists the partition's log among its `offline_partitions` (a
storage failure took it offline). Only what is reported: the controller's
elections keep treating dead brokers (not registered) and offline logs
apart, and read neither through this rule.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable


def offline_replicas(
    replicas: Iterable[int], live: Container[int], log_offline: Callable[[int], bool]
) -> list[int]:
    """Those of `replicas` that cannot serve, in replica order: not in `live`
    (the ids of the registered brokers), or `log_offline(broker_id)` (the
    live broker's registration lists its log of the partition offline)."""
    return [b for b in replicas if b not in live or log_offline(b)]
