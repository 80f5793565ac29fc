"""A subscribe() whose join fails, against a real cluster (etcd, a
coordinator, 3 brokers): the coordinator refuses it (a group id beyond its
limit) or does not answer (frozen with SIGSTOP, undone in a `finally`)
until request_timeout_ms. The call raises, and the consumer is left as
before it, not subscribed and holding no membership: assign() reads, its
commits are the standalone consumer's (AlterOffsets), and subscribe() can
be called again. Both consumers: they share the group's calling side."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from tidelog import AsyncConsumer, Consumer, TopicPartition
from tidelog.errors import InvalidRequestError, TidelogTimeoutError

from tests.integration.groups.conftest import create_topic, produce
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 2
PER_PARTITION = 5
#: Short: a join the coordinator does not answer fails within it.
REQUEST_TIMEOUT_MS = 3_000
#: Above the coordinator's limit of 249 characters (group_limits).
TOO_LONG_GROUP_ID = "g" * 300


def _read_everything_sync(consumer: Consumer) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while len(seen) < PARTITIONS * PER_PARTITION:
        assert time.monotonic() < deadline, len(seen)
        for batch in consumer.poll(timeout_ms=200).values():
            seen.update((r.partition, r.offset) for r in batch)
    return seen


async def _read_everything(consumer: AsyncConsumer) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while len(seen) < PARTITIONS * PER_PARTITION:
        assert time.monotonic() < deadline, len(seen)
        for batch in (await consumer.getmany(timeout_ms=200)).values():
            seen.update((r.partition, r.offset) for r in batch)
    return seen


def _everything() -> set[tuple[int, int]]:
    return {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}


def test_a_subscribe_the_coordinator_refuses_raises_and_leaves_no_membership(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """On main the refusal was only logged, again and again, by a membership
    that kept rejoining; subscribe() returned and getmany() waited forever."""
    topic, _group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)

    async def scenario() -> None:
        async with AsyncConsumer(
            bootstrap_servers=cluster.bootstrap,
            group_id=TOO_LONG_GROUP_ID,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        ) as consumer:
            with pytest.raises(InvalidRequestError, match="at most 249"):
                await consumer.subscribe([topic])
            assert consumer.subscription() == set()
            assert consumer._side.group.membership is None  # type: ignore[union-attr]
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            assert await _read_everything(consumer) == _everything()

    asyncio.run(scenario())


def test_a_blocking_subscribe_the_coordinator_refuses_raises_and_leaves_no_membership(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, _group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    with Consumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=TOO_LONG_GROUP_ID,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    ) as consumer:
        with pytest.raises(InvalidRequestError, match="at most 249"):
            consumer.subscribe([topic])
        assert consumer.subscription() == set()
        assert consumer._side.group.membership is None  # type: ignore[union-attr]
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        assert _read_everything_sync(consumer) == _everything()


class _Frozen:
    """The coordinator stopped (SIGSTOP) inside the block, continued after."""

    def __init__(self, cluster: ClusterProcesses) -> None:
        (self.pid,) = (c.pid for c in cluster.coordinators)

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc_info: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _options() -> dict[str, Any]:
    return {
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "session_timeout_ms": 60_000,
        "enable_auto_commit": False,
    }


def test_a_subscribe_no_coordinator_answers_fails_then_assign_commits_and_subscribe_joins(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """The join times out (coordinator frozen; on main subscribe() returned
    without an answer, as if joined). Afterwards, as before the call: the
    assign()'s commit is the standalone consumer's and lands, and after
    unassigning, subscribe() joins."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        async with AsyncConsumer(
            bootstrap_servers=cluster.bootstrap, group_id=group, **_options()
        ) as consumer:
            with _Frozen(cluster), pytest.raises(TidelogTimeoutError):
                await consumer.subscribe([topic])
            assert consumer.subscription() == set()
            consumer.assign([tp])
            await consumer.commit({tp: 3})
            assert await consumer.committed(tp) == 3
            consumer.assign([])
            await consumer.subscribe([topic])
            assert await _read_everything(consumer) >= {(0, o) for o in range(3, PER_PARTITION)}

    asyncio.run(scenario())


def test_a_blocking_subscribe_no_coordinator_answers_fails_then_assign_commits_and_subscribe_joins(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **_options()) as consumer:
        with _Frozen(cluster), pytest.raises(TidelogTimeoutError):
            consumer.subscribe([topic])
        assert consumer.subscription() == set()
        consumer.assign([tp])
        consumer.commit({tp: 3})
        assert consumer.committed(tp) == 3
        consumer.assign([])
        consumer.subscribe([topic])
        assert _read_everything_sync(consumer) >= {(0, o) for o in range(3, PER_PARTITION)}
