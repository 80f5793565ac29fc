"""DescribeTopics shows a partition's eligible leader replicas
(PartitionState.elr, Kafka's KIP-966) and says of a leaderless partition
what the controller does with them: an untorn live ELR member is elected,
so the partition is not offline for good; a torn ISR member waits for an
away ELR member, and the error names it.

Before, describe left the ELR out, and called a partition whose ISR members
were all away offline ("... until one of them is back") while the
controller was about to elect its eligible replica.

The real coordinator servicer over real gRPC on a real etcd, and the real
controller code (LeaderElector) run one pass after the describe, so that
both are seen to agree; brokers are registrations only.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tidelog.admin import _description
from tidelog.cli.topics import partition_table
from tidelog.types import TopicDescription
from tidelog.v1 import admin_pb2, common_pb2
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.coordinator_describe import describe_topic
from tests.support.etcd import EtcdProcess

TOPIC = "events"
REPLICAS = (0, 1, 2)


def describe_then_elect(
    etcd: EtcdProcess,
    prefix: bytes,
    state: PartitionState,
    registrations: list[BrokerRegistration],
) -> tuple[admin_pb2.TopicDescription, PartitionState]:
    """TOPIC-0 (and TOPIC-1, without an ELR) on REPLICAS, partition 0 in
    `state`; `registrations` written. The coordinator's DescribeTopics
    answer, then the state after one controller pass."""

    async def run() -> tuple[admin_pb2.TopicDescription, PartitionState]:
        client = connect(etcd.endpoint)
        keys = Keys(prefix.decode().rstrip("/"))
        try:
            for registration in registrations:
                await client.put(keys.broker(registration.broker_id), registration.encode())
            record = TopicAssignment(TOPIC, uuid.uuid4().hex, (REPLICAS, REPLICAS), {})
            await client.put(keys.topic(TOPIC), record.encode())
            await client.put(keys.partition_state(TOPIC, 0), state.encode())
            await client.put(
                keys.partition_state(TOPIC, 1), PartitionState(-1, 2, (1,), 3).encode()
            )
            described = await describe(client, keys)
            await LeaderElector(client, keys, preferred_interval_ms=0).elect_once(
                None, preferred=False
            )
            got = await client.get(keys.partition_state(TOPIC, 0))
            return described, PartitionState.decode(got.value)
        finally:
            await client.close()

    return asyncio.run(run())


async def describe(client: Any, keys: Keys) -> admin_pb2.TopicDescription:
    return await describe_topic(client, keys, TOPIC)


def registered(broker: int, torn: bool = False) -> BrokerRegistration:
    return BrokerRegistration(
        broker,
        "127.0.0.1",
        9092 + broker,
        torn_partitions=((TOPIC, 0),) if torn else (),
    )


def test_describe_shows_the_elr_and_a_live_elr_member_keeps_the_partition_from_being_offline(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # ISR [1] is down; broker 0, removed from the ISR below min.insync.replicas,
    # is live and untorn: the controller elects it, so describe must not call
    # the partition offline.
    state = PartitionState(-1, 8, (1,), 12, elr=(0,))
    topic, after = describe_then_elect(etcd, prefix, state, [registered(0), registered(2)])
    first, second = topic.partitions
    assert list(first.eligible_leader_replicas) == [0]
    assert list(second.eligible_leader_replicas) == []
    assert first.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert "is offline" not in first.error.message, first.error.message
    assert first.error.message == (
        f"{TOPIC}-0 has no leader right now (replicas 0, 1, 2): its log figures are unknown; retry"
    )
    # What the controller does with it: broker 0 leads and rejoins the ISR.
    assert (after.leader, after.isr) == (0, (0,))

    # The SDK and the CLI show it: an `elr` column, `-` where there is none.
    info = _description(topic)
    assert [p.eligible_leader_replicas for p in info.partitions] == [[0], []]
    header, *rows = partition_table(TopicDescription(TOPIC, info.partitions, {}))
    assert header[-1] == "elr"
    assert [row[-1] for row in rows] == ["0", "-"]
    header, _ = partition_table(TopicDescription(TOPIC, info.partitions[1:], {}))
    assert "elr" not in header


def test_a_torn_isr_member_is_described_waiting_for_an_away_elr_member(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Broker 1, the only ISR member, is back torn; broker 0 (eligible) is
    # down and may hold more: the controller elects nobody, and describe
    # says whom it waits for.
    state = PartitionState(-1, 8, (1,), 12, elr=(0,))
    topic, after = describe_then_elect(
        etcd, prefix, state, [registered(1, torn=True), registered(2)]
    )
    first = topic.partitions[0]
    assert list(first.torn_replicas) == [1]
    assert list(first.eligible_leader_replicas) == [0]
    assert first.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert (
        "in-sync broker 1 may have lost the tail of its log at restart and is not elected "
        "while broker 0 (eligible leader replica) may return (start it again;"
    ) in first.error.message, first.error.message
    assert after.leader == -1
