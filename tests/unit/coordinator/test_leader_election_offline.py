"""The controller's election pass (LeaderElector.elect_once) against a real
etcd, with brokers whose registration lists offline partition logs
(`BrokerRegistration.offline_partitions`: a reset or truncation failed
part-way and the log serves nothing until the broker restarts).

Before, the controller never knew: a leader whose log went offline stayed
leader while answering STORAGE_ERROR to everything, and when a leader died
before the ISR shrank (replica.lag.time.max.ms), the offline replica could
be elected, leaving the partition unavailable until a restart.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog_coordinator.leader_election import LeaderElector, read_live_brokers
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess

TOPIC = "events"
REPLICAS = (0, 1, 2)


async def register(
    client: Any, keys: Keys, broker: int, offline: tuple[tuple[str, int], ...] = ()
) -> None:
    """Broker `broker`'s registration as a broker writes it; spelled out
    here, so that the wire format (which brokers and coordinators of other
    releases read) cannot change unnoticed."""
    value: dict[str, Any] = {"host": "127.0.0.1", "id": broker, "port": 9092 + broker, "rack": ""}
    if offline:
        value["offline_partitions"] = {}
        for topic, partition in offline:
            value["offline_partitions"].setdefault(topic, []).append(partition)
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    assert BrokerRegistration.decode(raw).offline_partitions == tuple(sorted(offline))
    assert BrokerRegistration.decode(raw).encode() == raw
    await client.put(keys.broker(broker), raw)


def run_passes(
    etcd: EtcdProcess,
    prefix: bytes,
    state: PartitionState,
    offline_on: dict[int, tuple[tuple[str, int], ...]],
    live: tuple[int, ...] = REPLICAS,
    between: Callable[[Any, Keys], Awaitable[None]] | None = None,
    unclean: bool = False,
    first: Callable[[Any, Keys], Awaitable[None]] | None = None,
) -> list[PartitionState]:
    """TOPIC's partition 0 on REPLICAS in `state`; brokers `live` registered
    (those in `offline_on` listing those partitions offline), then `first`
    (if given); one pass, then `between` (if given) and another pass.
    Returns the state after each."""

    async def run() -> list[PartitionState]:
        client = connect(etcd.endpoint)
        keys = Keys(prefix.decode().rstrip("/"))
        try:
            for broker in live:
                await register(client, keys, broker, offline_on.get(broker, ()))
            configs = {"unclean.leader.election.enable": "true"} if unclean else {}
            record = TopicAssignment(TOPIC, uuid.uuid4().hex, (REPLICAS,), configs)
            await client.put(keys.topic(TOPIC), record.encode())
            await client.put(keys.partition_state(TOPIC, 0), state.encode())
            if first is not None:
                await first(client, keys)
            elector = LeaderElector(client, keys, preferred_interval_ms=0)
            states = []
            for step in range(2 if between is not None else 1):
                if step == 1 and between is not None:
                    await between(client, keys)
                await elector.elect_once(None, preferred=False)
                got = await client.get(keys.partition_state(TOPIC, 0))
                states.append(PartitionState.decode(got.value))
            return states
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_leader_whose_log_is_offline_is_replaced_by_another_isr_member(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (after,) = run_passes(etcd, prefix, state, {0: ((TOPIC, 0),)})
    assert after == PartitionState(leader=1, leader_epoch=4, isr=(1, 2), version=6)


def test_an_offline_replica_is_not_elected_when_the_leader_dies(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Leader 0 died (not registered) before its ISR shrank; replica 1, next
    # in placement order, has its log offline: 2 leads.
    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (after,) = run_passes(etcd, prefix, state, {1: ((TOPIC, 0),)}, live=(1, 2))
    assert after == PartitionState(leader=2, leader_epoch=4, isr=(2,), version=6)


def test_an_offline_follower_leaves_the_isr_in_the_same_epoch(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (after,) = run_passes(etcd, prefix, state, {2: ((TOPIC, 0),)})
    assert after == PartitionState(leader=0, leader_epoch=3, isr=(0, 1), version=6)


def test_offline_logs_of_other_partitions_change_nothing(etcd: EtcdProcess, prefix: bytes) -> None:
    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (after,) = run_passes(etcd, prefix, state, {0: ((TOPIC, 1), ("other", 0))})
    assert after == state


def test_an_offline_only_isr_member_waits_for_its_restart_not_an_unclean_choice(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Only leader 0 is in the ISR and its log is offline: nobody else has
    # every acknowledged record, so the partition has no leader (a new
    # epoch fences 0) and keeps its ISR; a restart (a new registration,
    # listing nothing offline) recovers the log and 0 leads again.
    async def broker_0_restarts(client: Any, keys: Keys) -> None:
        await client.delete(keys.broker(0))
        await register(client, keys, 0)

    state = PartitionState(leader=0, leader_epoch=3, isr=(0,), version=5)
    fenced, restarted = run_passes(
        etcd, prefix, state, {0: ((TOPIC, 0),)}, between=broker_0_restarts
    )
    assert fenced == PartitionState(leader=-1, leader_epoch=4, isr=(0,), version=6)
    assert restarted == PartitionState(leader=0, leader_epoch=5, isr=(0,), version=7)


def test_an_unclean_election_never_picks_an_offline_replica(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # ISR [0] and 0 died; 1 is offline, 2 is not: the unclean choice is 2.
    state = PartitionState(leader=0, leader_epoch=3, isr=(0,), version=5)
    (after,) = run_passes(etcd, prefix, state, {1: ((TOPIC, 0),)}, live=(1, 2), unclean=True)
    assert after == PartitionState(leader=2, leader_epoch=4, isr=(2,), version=6)


def test_a_registration_of_an_older_broker_lists_nothing_offline(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # The bytes an older broker writes: no offline_partitions field.
    old = b'{"host":"127.0.0.1","id":0,"port":9092,"rack":""}'
    assert BrokerRegistration.decode(old).offline_partitions == ()
    assert BrokerRegistration.decode(old).encode() == old

    async def older_broker_0(client: Any, keys: Keys) -> None:
        await client.put(keys.broker(0), old)

    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (first, second) = run_passes(etcd, prefix, state, {}, between=older_broker_0)
    assert first == second == state


def test_described_offline_replicas_add_dead_brokers_but_elections_read_logs_only(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """LiveBrokers, from one read of the registrations: what DescribeTopics
    reports (Kafka's offline replicas: broker 3 not registered, broker 9
    never was, broker 1's log offline; in replica order) and what elections
    read (`offline_of`: the offline logs of live brokers alone, unchanged)."""

    async def run() -> tuple[tuple[int, ...], tuple[int, ...], frozenset[int], set[int]]:
        client = connect(etcd.endpoint)
        keys = Keys(prefix.decode().rstrip("/"))
        try:
            await register(client, keys, 1, ((TOPIC, 0),))
            await register(client, keys, 2)
            brokers = await read_live_brokers(client, keys)
            return (
                brokers.offline_replicas(TOPIC, 0, [3, 2, 1, 9]),
                brokers.offline_replicas(TOPIC, 1, [2, 1]),
                brokers.offline_of(TOPIC, 0),
                set(brokers.registered),
            )
        finally:
            await client.close()

    reported, other_partition, elections_read, registered = asyncio.run(run())
    assert reported == (3, 1, 9)
    assert other_partition == ()
    assert elections_read == frozenset({1})
    assert registered == {1, 2}


def test_a_dead_replica_reported_offline_changes_no_election(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Follower 2 died (not registered) and is still in the ISR: it leaves
    # the ISR in the same epoch, leader 0 stays, as before dead brokers were
    # reported offline; nothing is fenced as an offline log would be.
    state = PartitionState(leader=0, leader_epoch=3, isr=REPLICAS, version=5)
    (after,) = run_passes(etcd, prefix, state, {}, live=(0, 1))
    assert after == PartitionState(leader=0, leader_epoch=3, isr=(0, 1), version=6)


def test_a_starting_broker_is_elected_only_once_it_said_which_logs_are_torn(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Leaderless, its only ISR member back but still opening its logs (its
    # registration says "starting"): not elected until it rewrites it, which
    # it does once it knows which logs recovery cut (not torn here).
    async def started(client: Any, keys: Keys) -> None:
        await client.put(keys.broker(0), BrokerRegistration(0, "127.0.0.1", 9092).encode())

    async def starting(client: Any, keys: Keys) -> None:
        raw = BrokerRegistration(0, "127.0.0.1", 9092, starting=True).encode()
        assert b'"starting":true' in raw
        await client.put(keys.broker(0), raw)

    state = PartitionState(leader=-1, leader_epoch=3, isr=(0,), version=5)
    before, after = run_passes(
        etcd, prefix, state, {}, live=(1, 2), between=started, first=starting
    )
    assert before == state
    assert after == PartitionState(leader=0, leader_epoch=4, isr=(0,), version=6)


def _torn_registration(broker: int, figures: tuple[int, int] | None) -> bytes:
    """Broker `broker`'s registration listing TOPIC-0 torn, with its log's
    (last epoch, log end offset) as a broker of this release publishes
    them, or without (None: as a broker of the release before writes it);
    spelled out so that the wire format cannot change unnoticed."""
    value: dict[str, Any] = {
        "host": "127.0.0.1",
        "id": broker,
        "port": 9092 + broker,
        "rack": "",
        "torn_partitions": {TOPIC: [0]},
    }
    if figures is not None:
        value["torn_figures"] = {TOPIC: [[0, *figures]]}
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    assert BrokerRegistration.decode(raw).encode() == raw
    return raw


def test_torn_isr_members_all_back_elect_the_longest_log_or_with_old_registrations_the_first(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """ISR [2, 0], both back and torn. With figures, broker 2 (the longer
    log) leads though 0 comes first in placement; with a registration of the
    release before (no figures) the first in order leads, as it did."""

    def elected(figures_of_0: tuple[int, int] | None) -> PartitionState:
        async def torn_brokers(client: Any, keys: Keys) -> None:
            await client.put(keys.broker(0), _torn_registration(0, figures_of_0))
            await client.put(keys.broker(2), _torn_registration(2, (4, 120)))

        state = PartitionState(leader=-1, leader_epoch=5, isr=(2, 0), version=5)
        (after,) = run_passes(etcd, prefix, state, {}, live=(1,), first=torn_brokers)
        return after

    assert elected((4, 90)) == PartitionState(leader=2, leader_epoch=6, isr=(2, 0), version=6)
    assert elected(None) == PartitionState(leader=0, leader_epoch=6, isr=(2, 0), version=6)
