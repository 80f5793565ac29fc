"""Cancelling an AsyncConsumer's getmany() or stop() in a group, against a
real cluster (etcd, a coordinator, 3 brokers): the cancel propagates at
once, and the rebalance step it landed in is finished later, never dropped
(see `_async_consumer._AsyncIo.step`). The cancel is made to land inside
the step every time: the coordinator is frozen (SIGSTOP, undone in a
`finally`) while the step waits for it, or the listener blocks on an event."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from tidelog import AsyncAdminClient, AsyncConsumer, TopicPartition

from tests.integration.groups.conftest import committed_offsets, create_topic, produce
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 3
PER_PARTITION = 20
#: Long sessions and requests: a frozen coordinator must only make the step
#: wait, never end the membership or fail the request.
OPTIONS: dict[str, Any] = {
    "session_timeout_ms": 60_000,
    "heartbeat_interval_ms": 500,
    "request_timeout_ms": 60_000,
    "enable_auto_commit": False,
}


async def _until(check: Callable[[], Any], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel `task`: it must end with CancelledError (generous deadline:
    the step it is in must not hold the cancel back)."""
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=20)
    assert done, "the cancelled call did not end"
    assert task.cancelled(), task


async def _read_everything(consumer: AsyncConsumer, topic: str) -> set[tuple[int, int]]:
    """Every (partition, offset) the consumer returns until it has all that
    was produced; each record once."""
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(seen) < PARTITIONS * PER_PARTITION:
        assert time.monotonic() < deadline, (consumer.assignment(), len(seen))
        for batch in (await consumer.getmany(timeout_ms=200)).values():
            seen.extend((r.partition, r.offset) for r in batch)
    assert len(seen) == len(set(seen)), "a record was returned twice"
    assert consumer.assignment() == {TopicPartition(topic, p) for p in range(PARTITIONS)}
    return set(seen)


def _everything() -> set[tuple[int, int]]:
    return {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}


async def _wait_until_empty(bootstrap: str, group: str) -> None:
    """Until `group` has no member, within half the session: only a LeaveGroup empties it
    that soon."""
    async with AsyncAdminClient(bootstrap) as admin:
        deadline = time.monotonic() + 30
        while members := (await admin.describe_consumer_groups([group]))[group].members:
            assert time.monotonic() < deadline, members
            await asyncio.sleep(0.1)


def test_a_getmany_cancelled_while_it_reads_an_assignments_offsets_drops_no_partition(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """The cancel lands while getmany() waits for the committed offsets of
    its new partitions (coordinator frozen): the next getmany() calls read
    every record of every partition, and commits work."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    (coordinator,) = cluster.coordinators

    async def scenario() -> None:
        async with AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            # White box, for a deterministic window: the assignment has come
            # (queued for getmany) before the coordinator is frozen.
            events = consumer._side.group.events  # type: ignore[union-attr]
            await _until(lambda: events, "the assignment reaches the consumer")
            os.kill(coordinator.pid, signal.SIGSTOP)
            try:
                poll = asyncio.create_task(consumer.getmany(timeout_ms=30_000))
                await _until(lambda: not events, "getmany() takes up the assignment")
                await asyncio.sleep(0.3)  # its offset lookup is waiting on the coordinator
                assert not poll.done()
                await _cancel(poll)
            finally:
                os.kill(coordinator.pid, signal.SIGCONT)
            assert await _read_everything(consumer, topic) == _everything()
            await consumer.commit()
            committed = await committed_offsets(cluster.bootstrap, group)
            assert committed == dict.fromkeys(range(PARTITIONS), PER_PARTITION)

    asyncio.run(scenario())


class _BlockingListener:
    """The listener call named `blocks` ("assigned" or "revoked") waits for
    `release` (set it never: a listener that never returns); records what
    happened to each call."""

    def __init__(self, blocks: str = "assigned") -> None:
        self.blocks = blocks
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls: list[str] = []

    async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        await self._called("assigned")

    async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        await self._called("revoked")

    async def _called(self, name: str) -> None:
        self.calls.append(name)
        if name != self.blocks:
            return
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.calls.append(f"{name}: cancelled")
            raise
        self.calls.append(f"{name}: done")


def test_a_getmany_cancelled_inside_the_assigned_listener_lets_it_finish(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """The cancel lands inside on_partitions_assigned: the listener is not
    cut short (it finishes once released, called once), every record is
    read, and stop() revokes after it, leaving the group."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)

    async def scenario() -> None:
        listener = _BlockingListener()
        consumer = AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
        await consumer.start()
        try:
            await consumer.subscribe([topic], listener=listener)
            poll = asyncio.create_task(consumer.getmany(timeout_ms=30_000))
            await asyncio.wait_for(listener.entered.wait(), 30)
            await _cancel(poll)
            listener.release.set()
            assert await _read_everything(consumer, topic) == _everything()
            assert listener.calls == ["assigned", "assigned: done"]
            await consumer.commit()
        finally:
            listener.release.set()
            await consumer.stop()
        assert listener.calls == ["assigned", "assigned: done", "revoked"]
        assert await committed_offsets(cluster.bootstrap, group) == dict.fromkeys(
            range(PARTITIONS), PER_PARTITION
        )

    asyncio.run(scenario())


def test_a_getmany_cancelled_inside_a_revocation_hands_the_partitions_on_once_it_ends(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """A second member joins; the first one's getmany() is cancelled inside
    on_partitions_revoked (after the revocation's commit). The listener is
    not cut short, the partitions move only once it returns (no two owners),
    and records produced afterwards are read by the two members once each."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    options = dict(OPTIONS, enable_auto_commit=True, auto_commit_interval_ms=600_000)

    async def scenario() -> None:
        listener = _BlockingListener(blocks="revoked")
        first = AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, **options)
        second = AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **options
        )
        await first.start()
        try:
            await first.subscribe([topic], listener=listener)
            assert await _read_everything(first, topic) == _everything()
            await second.start()
            poll = asyncio.create_task(first.getmany(timeout_ms=30_000))
            deadline = time.monotonic() + 30
            while not listener.entered.is_set():  # the second member polls meanwhile
                assert time.monotonic() < deadline, "no revocation"
                assert await second.getmany(timeout_ms=100) == {}
            await _cancel(poll)
            for _ in range(10):  # held by the first member while its listener runs
                assert await second.getmany(timeout_ms=100) == {}
                assert second.assignment() == set()
            listener.release.set()
            seen: list[tuple[int, int]] = []
            await asyncio.to_thread(produce, cluster, topic, PARTITIONS, 5)
            deadline = time.monotonic() + 30
            while len(seen) < PARTITIONS * 5:
                assert time.monotonic() < deadline, (first.assignment(), second.assignment())
                for member in (first, second):
                    for batch in (await member.getmany(timeout_ms=100)).values():
                        seen.extend((r.partition, r.offset) for r in batch)
            assert sorted(seen) == [
                (p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION, PER_PARTITION + 5)
            ]
            assert second.assignment() and first.assignment().isdisjoint(second.assignment())
            assert listener.calls[:3] == ["assigned", "revoked", "revoked: done"]
        finally:
            listener.release.set()
            await second.stop()
            await first.stop()

    asyncio.run(scenario())


def test_a_cancelled_stop_still_commits_revokes_and_leaves(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """stop() cancelled while its final commit waits (coordinator frozen):
    the cancel propagates at once; the leaving goes on (commit, the
    listener's revocation, LeaveGroup), and a second stop() waits for it.
    The group is empty long before the member's 60 s session would end."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    (coordinator,) = cluster.coordinators
    options = dict(OPTIONS, enable_auto_commit=True, auto_commit_interval_ms=600_000)

    async def scenario() -> None:
        listener = _BlockingListener()
        listener.release.set()
        consumer = AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, **options)
        await consumer.start()
        await consumer.subscribe([topic], listener=listener)
        try:
            assert await _read_everything(consumer, topic) == _everything()
            os.kill(coordinator.pid, signal.SIGSTOP)
            try:
                stop = asyncio.create_task(consumer.stop())
                await asyncio.sleep(0.5)  # in the final commit, waiting on the coordinator
                assert not stop.done()
                await _cancel(stop)
            finally:
                os.kill(coordinator.pid, signal.SIGCONT)
        finally:
            await consumer.stop()
        assert listener.calls == ["assigned", "assigned: done", "revoked"]
        assert await committed_offsets(cluster.bootstrap, group) == dict.fromkeys(
            range(PARTITIONS), PER_PARTITION
        )
        await _wait_until_empty(cluster.bootstrap, group)

    asyncio.run(scenario())


def test_a_cancelled_seek_to_committed_moves_nothing(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """seek_to_committed() cancelled while it waits for the offsets: the
    positions are where they were (it applies the answer all at once), and
    reading goes on from there."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)
    (coordinator,) = cluster.coordinators

    async def scenario() -> None:
        async with AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            seen: set[tuple[int, int]] = set()
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < PARTITIONS or not seen:
                assert time.monotonic() < deadline, consumer.assignment()
                for batch in (await consumer.getmany(timeout_ms=200, max_records=1)).values():
                    seen.update((r.partition, r.offset) for r in batch)
            positions = {tp: await consumer.position(tp) for tp in consumer.assignment()}
            os.kill(coordinator.pid, signal.SIGSTOP)
            try:
                seek = asyncio.create_task(consumer.seek_to_committed())
                await asyncio.sleep(0.3)
                assert not seek.done()
                await _cancel(seek)
            finally:
                os.kill(coordinator.pid, signal.SIGCONT)
            assert {tp: await consumer.position(tp) for tp in positions} == positions
            deadline = time.monotonic() + 30
            while len(seen) < PARTITIONS * PER_PARTITION:
                assert time.monotonic() < deadline, len(seen)
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    for r in batch:
                        assert (r.partition, r.offset) not in seen
                        seen.add((r.partition, r.offset))
            assert seen == _everything()

    asyncio.run(scenario())


def test_stop_is_bounded_when_a_listener_never_returns(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """A cancelled getmany() left on_partitions_assigned running, and it
    never returns. stop(timeout_ms=...) cancels it at the bound, then
    leaves the group (empty long before the 60 s session would end) and
    closes its connections: no task of the consumer is left."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)

    async def scenario() -> None:
        listener = _BlockingListener()  # never released
        consumer = AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
        await consumer.start()
        await consumer.subscribe([topic], listener=listener)
        poll = asyncio.create_task(consumer.getmany(timeout_ms=30_000))
        await asyncio.wait_for(listener.entered.wait(), 30)
        await _cancel(poll)
        stop = asyncio.create_task(consumer.stop(timeout_ms=300))
        done, _ = await asyncio.wait([stop], timeout=30)
        assert done, "stop() waited for a listener that never returns"
        stop.result()
        assert listener.calls[:2] == ["assigned", "assigned: cancelled"]
        assert asyncio.all_tasks() == {asyncio.current_task()}
        await _wait_until_empty(cluster.bootstrap, group)

    asyncio.run(scenario())


def test_a_cancelled_subscribe_stands_and_the_next_getmany_joins(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """subscribe() cancelled while it joins: the subscription stands (as
    Kafka's subscribe() only records it), and getmany() reads every record
    of the group's partitions."""
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)

    async def scenario() -> None:
        async with AsyncConsumer(
            bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            subscribe = asyncio.create_task(consumer.subscribe([topic]))
            await asyncio.sleep(0)  # under way: joining
            await _cancel(subscribe)
            assert consumer.subscription() == {topic}
            assert await _read_everything(consumer, topic) == _everything()

    asyncio.run(scenario())
