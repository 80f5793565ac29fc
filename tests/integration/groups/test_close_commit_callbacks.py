"""close() runs the callbacks of the commit_async() calls it waited for,
against a real cluster (etcd, a coordinator, 3 brokers), as Kafka's close()
does: the coordinator is frozen (SIGSTOP) when commit_async() is called and
continued (SIGCONT) a moment later, while close() waits for the commit. Both
consumers, assign() with a group id (standalone: AlterOffsets) and
subscribed (a member: the commit stream).

On main close() waited for the answer, then returned without running the
callback: the application never heard of a commit that had landed."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from tidelog import AsyncConsumer, Consumer, TopicPartition

from tests.integration.groups.conftest import committed_offsets, create_topic
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(120)

#: How long the coordinator stays frozen after commit_async(): close() is
#: waiting for the answer by then (it waits up to request_timeout_ms).
FROZEN_S = 1.5

OPTIONS: dict[str, Any] = {
    "session_timeout_ms": 20_000,
    "heartbeat_interval_ms": 500,
    "enable_auto_commit": False,
    "request_timeout_ms": 30_000,
}

Seen = list[tuple[dict[int, int], BaseException | None]]


@contextmanager
def _frozen_for_a_moment(cluster: ClusterProcesses) -> Iterator[None]:
    """The coordinator stopped now and continued FROZEN_S later (or at the
    latest when the block ends)."""
    (pid,) = (c.pid for c in cluster.coordinators)
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(FROZEN_S, os.kill, (pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.kill(pid, signal.SIGCONT)


def _recorder(seen: Seen) -> Any:
    def callback(offsets: dict, error: BaseException | None) -> None:
        seen.append(({tp.partition: om.offset for tp, om in offsets.items()}, error))

    return callback


@pytest.mark.parametrize("subscribe", [False, True], ids=["standalone", "member"])
def test_blocking_close_runs_the_callback_of_a_commit_answered_while_it_waits(
    cluster: ClusterProcesses, names: tuple[str, str], subscribe: bool
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    seen: Seen = []
    consumer = Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
    try:
        if subscribe:
            consumer.subscribe([topic])
            while not consumer.assignment():
                consumer.poll(timeout_ms=100)
        else:
            consumer.assign([tp])
        consumer.commit({tp: 1})  # the coordinator found: what follows waits for the freeze only
        with _frozen_for_a_moment(cluster):
            consumer.commit_async({tp: 5}, _recorder(seen))
            consumer.close()
    finally:
        consumer.close()
    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 5}
    assert seen == [({0: 5}, None)]


@pytest.mark.parametrize("subscribe", [False, True], ids=["standalone", "member"])
def test_async_stop_runs_the_callback_of_a_commit_answered_while_it_waits(
    cluster: ClusterProcesses, names: tuple[str, str], subscribe: bool
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    seen: Seen = []

    async def scenario() -> None:
        consumer = AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
        await consumer.start()
        try:
            if subscribe:
                await consumer.subscribe([topic])
                while not consumer.assignment():
                    await consumer.getmany(timeout_ms=100)
            else:
                consumer.assign([tp])
            await consumer.commit({tp: 1})
            with _frozen_for_a_moment(cluster):
                consumer.commit_async({tp: 5}, _recorder(seen))
                await consumer.stop()
        finally:
            await consumer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 90))
    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 5}
    assert seen == [({0: 5}, None)]
