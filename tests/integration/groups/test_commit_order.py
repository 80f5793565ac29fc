"""A consumer's commits apply at the coordinator in the order it made them,
against a real cluster (etcd, coordinator, 3 brokers): many commit_async()
calls with rising offsets for one partition, back to back, leave the last
one committed (never an earlier one that landed after it), and a commit()
made after them lands after them. Both consumers, assign() with a group id
(a standalone consumer: its commits are AlterOffsets calls) and subscribed
(a member: its commits go over the commit stream)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tidelog import AsyncConsumer, Consumer, TopicPartition

from tests.integration.groups.conftest import committed_offsets, create_topic, wait_until
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(180)

#: Partitions, commit_async() calls per partition and round, rounds (each a
#: new consumer). On main (concurrent unary calls) a round ended on an
#: earlier offset for some partition about every other time, mostly while
#: the consumer's first calls were still finding the coordinator.
PARTITIONS = 8
CALLS = 50
ROUNDS = 10
#: The asyncio consumer's calls per round (one partition): on main its
#: commit() went before the commit_async() tasks had started, every round.
ASYNC_CALLS = 200

OPTIONS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "enable_auto_commit": False,
}


def _called_back(consumer: Consumer, seen: list[Any]) -> bool:
    consumer.commit({})  # runs the callbacks of the commits answered by now
    return len(seen) == PARTITIONS * CALLS


def _commit_round(consumer: Consumer, topic: str, group: str, bootstrap: str, base: int) -> None:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    seen: list[tuple[int, BaseException | None]] = []

    def callback(offsets: dict, error: BaseException | None) -> None:
        seen.extend((om.offset, error) for om in offsets.values())

    futures = [
        consumer.commit_async({tp: base + i}, callback) for i in range(1, CALLS + 1) for tp in tps
    ]
    for future in futures:
        future.result(timeout=60)
    committed = asyncio.run(committed_offsets(bootstrap, group))
    assert committed == dict.fromkeys(range(PARTITIONS), base + CALLS)
    # commit() after commit_async(): after it, even unawaited.
    consumer.commit_async({tps[0]: base + CALLS - 1})
    consumer.commit({tps[0]: base + CALLS + 1})
    assert asyncio.run(committed_offsets(bootstrap, group))[0] == base + CALLS + 1
    # Each callback gets its own commit's outcome.
    wait_until(lambda: _called_back(consumer, seen), 30, "the callbacks")
    assert sorted(o for o, _ in seen) == sorted(base + i for i in range(1, CALLS + 1) for _ in tps)
    assert {e for _, e in seen} == {None}


def test_standalone_consumer_commits_land_in_call_order(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    for round_ in range(ROUNDS):
        with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS) as consumer:
            _commit_round(consumer, topic, group, cluster.bootstrap, round_ * (CALLS + 2))


async def _commit_rounds_async(
    bootstrap: str, group: str, tp: TopicPartition, subscribe: bool
) -> None:
    async with AsyncConsumer(bootstrap_servers=bootstrap, group_id=group, **OPTIONS) as consumer:
        if subscribe:
            await consumer.subscribe([tp.topic])
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=100)
        else:
            consumer.assign([tp])
        for round_ in range(ROUNDS):
            base = round_ * (ASYNC_CALLS + 1)
            tasks = [consumer.commit_async({tp: base + i}) for i in range(1, ASYNC_CALLS + 1)]
            # commit() right after them, none of them started yet: after them.
            await consumer.commit({tp: base + ASYNC_CALLS + 1})
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert await committed_offsets(bootstrap, group) == {
                tp.partition: base + ASYNC_CALLS + 1
            }


@pytest.mark.parametrize("subscribe", [False, True], ids=["standalone", "member"])
def test_async_consumer_commits_land_in_call_order(
    cluster: ClusterProcesses, names: tuple[str, str], subscribe: bool
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    rounds = _commit_rounds_async(cluster.bootstrap, group, tp, subscribe)
    asyncio.run(asyncio.wait_for(rounds, 150))


def test_a_standalone_consumers_poll_runs_its_commit_callbacks(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """As a member's poll() does (Kafka's consumers both do): the callbacks of an
    assign() consumer's commit_async() calls run in its next poll(), on the
    polling thread, not only at its next commit() or close()."""
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS) as consumer:
        consumer.assign([tp])
        seen: list[tuple[dict, BaseException | None]] = []
        consumer.commit_async({tp: 7}, lambda offsets, error: seen.append((offsets, error)))
        wait_until(lambda: bool(consumer.poll(timeout_ms=200)) or bool(seen), 30, "a callback")
        assert [(om.offset, error) for offsets, error in seen for om in offsets.values()] == [
            (7, None)
        ]

    async def getmany_runs_them() -> None:
        async with AsyncConsumer(
            bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            consumer.assign([tp])
            seen: list[BaseException | None] = []
            consumer.commit_async({tp: 8}, lambda _, error: seen.append(error))
            async with asyncio.timeout(30):
                while not seen:
                    await consumer.getmany(timeout_ms=200)
            assert seen == [None]

    asyncio.run(getmany_runs_them())
