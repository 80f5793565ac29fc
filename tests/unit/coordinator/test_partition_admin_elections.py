"""Preferred-leader elections (tidelog_coordinator.partition_admin) against a
real etcd, counting the calls they make.

ElectLeaders with no partitions named elects every partition of the
cluster. It used to read each partition's state with its own etcd call, one
after another: 10,000 round trips for one topic at the partition limit,
longer than a client's deadline on a loaded machine (the fuzzer's
ElectLeaders calls hung in CI). The states are now read with one range read
per topic, and only the partitions whose leader changes are written.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

from tidelog.errors import ElectionNotNeededError, PreferredLeaderNotAvailableError
from tidelog.types import TopicPartition
from tidelog_coordinator.partition_admin import PartitionAdmin
from tidelog_server.etcd.records import BrokerRegistration, PartitionState

from tests.support.etcd import EtcdProcess
from tests.unit.coordinator.partition_states import (
    BROKERS,
    CountingClient,
    cluster_in_etcd,
    preferred_leaders,
    read_states,
)

PARTITIONS = 400


def elect(
    etcd: EtcdProcess, prefix: bytes, leaders: list[int], wanted: list[TopicPartition] | None
) -> tuple[dict[TopicPartition, Any], Counter[str], list[PartitionState]]:
    """Results, etcd calls made by the election, and the states after it."""

    async def run() -> tuple[dict[TopicPartition, Any], Counter[str], list[PartitionState]]:
        async with cluster_in_etcd(etcd.endpoint, prefix, "big", leaders) as (raw, keys):
            counting = CountingClient(raw)
            admin = PartitionAdmin(SimpleNamespace(client=counting, keys=keys))  # type: ignore[arg-type]
            results = await admin.elect_preferred(wanted)
            states = await read_states(raw, keys, "big", len(leaders))
            return {r.tp: r for r in results}, counting.calls, states

    return asyncio.run(run())


def test_electing_every_partition_reads_their_states_in_one_range_read(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    results, calls, _ = elect(etcd, prefix, preferred_leaders(PARTITIONS), None)

    assert len(results) == PARTITIONS
    assert all(isinstance(r.error, ElectionNotNeededError) for r in results.values())
    # Live brokers, topics, every partition state: nothing per partition.
    assert calls == {"get_prefix": 3}, calls


def test_only_the_partitions_whose_leader_changes_are_written(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    preferred = preferred_leaders(PARTITIONS)
    # Every tenth partition is led by another replica than its preferred one.
    leaders = [
        BROKERS[(p + 1) % len(BROKERS)] if p % 10 == 0 else preferred[p] for p in range(PARTITIONS)
    ]
    wanted = [TopicPartition("big", p) for p in range(PARTITIONS)]
    results, calls, states = elect(etcd, prefix, leaders, wanted)

    moved = [p for p in range(PARTITIONS) if p % 10 == 0]
    assert [p for p in range(PARTITIONS) if results[wanted[p]].error is None] == moved
    assert all(results[wanted[p]].leader == preferred[p] for p in moved)
    assert [s.leader for s in states] == preferred
    assert all(states[p].leader_epoch == 2 for p in moved)
    # Brokers, topics, the one topic's states; one transaction per change.
    assert calls == {"get_prefix": 3, "transaction": len(moved)}, calls


def test_a_preferred_replica_whose_log_is_offline_is_not_elected(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """Its broker's registration lists the partition offline: the election
    answers so and writes nothing (the controller's pass moves leadership
    off an offline leader; see test_leader_election_offline)."""

    async def run() -> tuple[Any, Any, PartitionState]:
        # Partition 0 prefers broker 0; broker 1 leads it.
        async with cluster_in_etcd(etcd.endpoint, prefix, "big", [1, 1]) as (raw, keys):
            offline = BrokerRegistration(0, "127.0.0.1", 9092, offline_partitions=(("big", 0),))
            await raw.put(keys.broker(0), offline.encode())
            admin = PartitionAdmin(SimpleNamespace(client=raw, keys=keys))  # type: ignore[arg-type]
            zero, one = TopicPartition("big", 0), TopicPartition("big", 1)
            results = {r.tp: r for r in await admin.elect_preferred([zero, one])}
            (state,) = await read_states(raw, keys, "big", 1)
            return results[zero], results[one], state

    zero, one, state = asyncio.run(run())
    assert isinstance(zero.error, PreferredLeaderNotAvailableError)
    assert "log offline" in str(zero.error)
    assert state.leader == 1 and state.leader_epoch == 1
    # Partition 1 prefers broker 1, which leads it already.
    assert isinstance(one.error, ElectionNotNeededError)
