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

#: commit_async() calls per round, and rounds: on main (concurrent unary
#: calls) one round of 200 ended on an earlier offset most of the time;
#: five rounds made every run fail.
CALLS = 200
ROUNDS = 30

OPTIONS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "enable_auto_commit": False,
}


def _outcomes() -> tuple[list[tuple[int, BaseException | None]], Any]:
    seen: list[tuple[int, BaseException | None]] = []

    def callback(offsets: dict, error: BaseException | None) -> None:
        seen.extend((om.offset, error) for om in offsets.values())

    return seen, callback


def _called_back(consumer: Consumer, seen: list[Any]) -> bool:
    consumer.commit({})  # runs the callbacks of the commits answered by now
    return len(seen) == CALLS


def _commit_rounds_sync(consumer: Consumer, tp: TopicPartition, group: str, bootstrap: str) -> None:
    for round_ in range(ROUNDS):
        base = round_ * (CALLS + 1)
        seen, callback = _outcomes()
        futures = [consumer.commit_async({tp: base + i}, callback) for i in range(1, CALLS + 1)]
        for future in futures:
            future.result(timeout=60)
        assert asyncio.run(committed_offsets(bootstrap, group)) == {tp.partition: base + CALLS}
        # commit() after commit_async(): after them, even unawaited.
        consumer.commit_async({tp: base + CALLS - 1})
        consumer.commit({tp: base + CALLS + 1})
        assert asyncio.run(committed_offsets(bootstrap, group)) == {tp.partition: base + CALLS + 1}
        # Each callback gets its own commit's outcome.
        wait_until(lambda: _called_back(consumer, seen), 30, "the callbacks")  # noqa: B023
        assert sorted(o for o, _ in seen) == list(range(base + 1, base + CALLS + 1))
        assert {e for _, e in seen} == {None}


def test_standalone_consumer_commits_land_in_call_order(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS) as consumer:
        consumer.assign([tp])
        _commit_rounds_sync(consumer, tp, group, cluster.bootstrap)


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
            base = round_ * (CALLS + 1)
            tasks = [consumer.commit_async({tp: base + i}) for i in range(1, CALLS + 1)]
            # commit() right after them, none of them started yet: after them.
            await consumer.commit({tp: base + CALLS + 1})
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert await committed_offsets(bootstrap, group) == {tp.partition: base + CALLS + 1}


@pytest.mark.parametrize("subscribe", [False, True], ids=["standalone", "member"])
def test_async_consumer_commits_land_in_call_order(
    cluster: ClusterProcesses, names: tuple[str, str], subscribe: bool
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    rounds = _commit_rounds_async(cluster.bootstrap, group, tp, subscribe)
    asyncio.run(asyncio.wait_for(rounds, 150))
