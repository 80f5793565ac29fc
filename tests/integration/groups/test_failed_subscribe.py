"""A subscribe() whose join fails, against a real cluster (etcd, a
coordinator, 3 brokers): the coordinator refuses it (a group id beyond its
limit), does not answer (frozen with SIGSTOP, undone in a `finally`) until
request_timeout_ms, or is not registered at all (frozen past its lease):
a join that finds no coordinator in time raises TidelogTimeoutError naming
the last answer; one that finds it meanwhile joins. A failed call leaves
the consumer as before it, not subscribed and holding no membership:
assign() reads, its commits are the standalone consumer's (AlterOffsets),
and subscribe() can be called again. Both consumers: they share the
group's calling side."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
from tidelog import AsyncConsumer, Consumer, TopicPartition
from tidelog.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    TidelogTimeoutError,
)

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
        self.cluster = cluster
        (self.pid,) = (c.pid for c in cluster.coordinators)

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc_info: object) -> None:
        os.kill(self.pid, signal.SIGCONT)
        # Frozen for longer than its 3 s lease, it registers again under a
        # new one: what follows tests the consumer, with a 3 s
        # request_timeout_ms, not how soon a loaded machine lets it do so.
        self.cluster.wait_registered(len(self.cluster.brokers))


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


def _wait_unregistered(cluster: ClusterProcesses) -> None:
    """Until no coordinator is registered: the frozen one's lease expired."""
    deadline = time.monotonic() + 60
    while cluster.describe().coordinators:
        assert time.monotonic() < deadline, "the frozen coordinator's lease did not expire"
        time.sleep(0.1)


def test_a_subscribe_while_no_coordinator_is_registered_times_out_naming_the_cause(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """Frozen past its lease, the coordinator is no longer registered: every
    lookup answers COORDINATOR_NOT_AVAILABLE, a retriable answer, so the join
    looks again until request_timeout_ms and then raises the join's timeout
    naming that cause (on main it raised the lookup's last answer itself,
    CoordinatorNotAvailableError, what the frozen-coordinator tests above
    met under load when the lease ran out before the lookup)."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)

    async def scenario() -> None:
        async with AsyncConsumer(
            bootstrap_servers=cluster.bootstrap, group_id=group, **_options()
        ) as consumer:
            with _Frozen(cluster):
                _wait_unregistered(cluster)
                with pytest.raises(
                    TidelogTimeoutError,
                    match=r"request_timeout_ms=3000; last error: "
                    r"CoordinatorNotAvailableError: .*no coordinator is registered",
                ) as raised:
                    await consumer.subscribe([topic])
                assert isinstance(raised.value.__cause__, CoordinatorNotAvailableError)
            assert consumer.subscription() == set()
            assert consumer._side.group.membership is None  # type: ignore[union-attr]

    asyncio.run(scenario())


def test_a_subscribe_waits_for_a_coordinator_that_registers_within_its_timeout(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """The join's lookup is retried, not raised: a coordinator that registers
    again while subscribe() looks for it (continued after its lease expired)
    takes the member in."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    frozen = _Frozen(cluster)
    thaw = threading.Timer(1.0, os.kill, (frozen.pid, signal.SIGCONT))
    with Consumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=group,
        request_timeout_ms=60_000,
        session_timeout_ms=60_000,
    ) as consumer:
        frozen.__enter__()
        try:
            _wait_unregistered(cluster)
            thaw.start()
            consumer.subscribe([topic])
        finally:
            thaw.cancel()
            if thaw.ident is not None:
                thaw.join()
            frozen.__exit__()
        assert _read_everything_sync(consumer) == _everything()
