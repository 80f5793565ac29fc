"""Consumer calls of issue 17 that need a coordinator, against a real cluster
(etcd, coordinator, 3 brokers): assign() with a group_id (commit, committed,
seek_to_committed without joining), a rebalance forgetting the pause of the
partitions it revokes, close(autocommit=False), and wakeup() and close()
from another thread in a group (and wakeup() of a commit() waiting for a
frozen coordinator)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, TopicPartition
from tidelog.errors import ClosedError, WakeupError

from tests.integration.groups.conftest import committed_offsets, create_topic, produce
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(120)

OPTIONS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}


def read(consumer: Consumer, count: int, timeout_s: float = 30) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"{len(out)} of {count} records"
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(records)
    return out


def test_assign_with_a_group_id_commits_and_seeks_to_committed_without_joining(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 10)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group) as consumer:
        consumer.assign([p0])
        assert consumer.committed(p0) is None
        records = read(consumer, 10)
        assert [r.offset for r in records] == list(range(10))
        # A replicated partition's leader stamps its epoch on every batch.
        assert {r.leader_epoch >= 0 for r in records} == {True}
        consumer.seek(p0, 4)
        consumer.commit()
        assert consumer.committed(p0) == 4
        assert consumer.subscription() == set()  # it never joined

    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 4}

    with Consumer(
        bootstrap_servers=cluster.bootstrap, group_id=group, auto_offset_reset="latest"
    ) as later:
        later.assign([p0, p1])
        assert later.seek_to_committed() == {p0: 4, p1: None}
        assert later.position(p0) == 4
        assert later.position(p1) == 10  # none committed: auto_offset_reset
        assert [r.offset for r in read(later, 6)] == list(range(4, 10))

    async def scenario() -> None:
        async with AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id=group) as consumer:
            consumer.assign([p0])
            await consumer.seek_to_beginning(p0)
            assert await consumer.position(p0) == 0
            assert await consumer.seek_to_committed(p0) == {p0: 4}
            assert await consumer.position(p0) == 4
            record = await consumer.getone()
            assert record.offset == 4
            await consumer.commit()
            assert await consumer.committed(p0) == 5

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_rebalance_that_revokes_a_paused_partition_forgets_its_pause(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    first = Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
    second: Consumer | None = None
    try:
        deadline = time.monotonic() + 60
        while len(first.assignment()) != 2:
            assert time.monotonic() < deadline, first.assignment()
            first.poll(timeout_ms=200)
        both = first.assignment()
        first.pause(*both)
        produce(cluster, topic, 2, 3)
        assert first.poll(timeout_ms=500) == {}  # paused: nothing comes

        second = Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
        while len(first.assignment()) != 1 or len(second.assignment()) != 1:
            assert time.monotonic() < deadline, (first.assignment(), second.assignment())
            first.poll(timeout_ms=100)
            second.poll(timeout_ms=100)
        (moved,) = both - first.assignment()
        # What stays with the first member stays paused; what moved is not
        # paused anywhere.
        assert first.paused() == first.assignment()
        assert second.paused() == set()
        assert [r.partition for r in read(second, 3)] == [moved.partition] * 3

        second.close()
        second = None
        while len(first.assignment()) != 2:
            assert time.monotonic() < deadline, first.assignment()
            first.poll(timeout_ms=200)
        # Back with the first member, the moved partition is not paused.
        assert moved not in first.paused()
        assert first.paused() == both - {moved}
    finally:
        first.close()
        if second is not None:
            second.close()


def test_close_without_autocommit_commits_nothing(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    produce(cluster, topic, 1, 5)
    options = dict(OPTIONS, enable_auto_commit=True, auto_commit_interval_ms=600_000)
    consumer = Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **options)
    try:
        assert len(read(consumer, 5)) == 5
    finally:
        consumer.close(autocommit=False, timeout_ms=20_000)
    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {}

    with Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **options) as again:
        assert len(read(again, 5)) == 5  # nothing was committed: read again
    # close() (autocommit=True by default) committed what was read.
    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 5}


def test_describe_cluster_lists_brokers_coordinators_and_the_controller(
    cluster: ClusterProcesses,
) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        described = admin.describe_cluster()
    reply = cluster.describe()
    assert described.cluster_id == reply.cluster_id and described.cluster_id
    assert [b.id for b in described.brokers] == [0, 1, 2]
    assert {f"{b.host}:{b.port}" for b in described.brokers} == {
        f"{b.host}:{b.port}" for b in reply.brokers
    }
    assert described.coordinators == [(c.id, f"{c.host}:{c.port}") for c in reply.coordinators]
    assert described.coordinators
    assert described.controller_id in {c for c, _ in described.coordinators}


def test_a_group_member_reads_named_partitions(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 4)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def scenario() -> None:
        async with AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            got: list[tuple[int, int]] = []
            deadline = time.monotonic() + 60
            while len(got) < 4:
                assert time.monotonic() < deadline, got
                batch = await consumer.getmany(p1, timeout_ms=200)
                assert set(batch) <= {p1}
                got.extend((r.partition, r.offset) for r in batch.get(p1, []))
            assert got == [(1, o) for o in range(4)]
            first = await asyncio.wait_for(consumer.getone(p0), 30)
            assert (first.partition, first.offset) == (0, 0)
            await consumer.commit()
            assert await consumer.committed(p0) == 1
            assert await consumer.committed(p1) == 4

    asyncio.run(asyncio.wait_for(scenario(), 90))


def test_stop_with_no_time_left_drops_the_final_commit(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 1)
    produce(cluster, topic, 1, 3)
    options = dict(OPTIONS, enable_auto_commit=True, auto_commit_interval_ms=600_000)

    async def scenario() -> None:
        consumer = AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **options
        )
        await consumer.start()
        try:
            got = 0
            while got < 3:
                got += sum(map(len, (await consumer.getmany(timeout_ms=200)).values()))
        finally:
            # No time for the final commit: it is dropped (and logged); the
            # consumer still leaves the group and closes.
            await consumer.stop(timeout_ms=0)
        with pytest.raises(ValueError, match="timeout_ms"):
            await AsyncConsumer(bootstrap_servers=cluster.bootstrap).stop(timeout_ms=-1)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {}
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.describe_consumer_groups([group])[group].members == []


def _poll_in_thread(consumer: Consumer) -> tuple[threading.Thread, dict[str, BaseException]]:
    """A poll with a long timeout in another thread, started and waiting."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            consumer.poll(timeout_ms=120_000)
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not consumer._in_poll:
        assert time.monotonic() < deadline, "the poll did not start"
        time.sleep(0.01)
    time.sleep(0.2)  # into its wait
    return thread, outcome


def test_a_wakeup_in_a_group_keeps_the_membership_and_close_from_another_thread_leaves(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """wakeup() interrupts a group member's poll (and, pending, its next
    commit()) without a rebalance: same partitions, no revocation, commits
    accepted (a fenced member's are refused), reading goes on where it was.
    close() from another thread wakes the poll (ClosedError) and leaves
    the group with what was read committed."""
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 3)
    calls: list[tuple[str, set]] = []

    class Listener:
        def on_partitions_revoked(self, partitions: set) -> None:
            calls.append(("revoked", partitions))

        def on_partitions_assigned(self, partitions: set) -> None:
            calls.append(("assigned", partitions))

        def on_partitions_lost(self, partitions: set) -> None:
            calls.append(("lost", partitions))

    consumer = Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
    try:
        consumer.subscribe([topic], listener=Listener())
        assert len(read(consumer, 6)) == 6
        assigned = consumer.assignment()
        assert len(assigned) == 2 and calls == [("assigned", assigned)]

        thread, outcome = _poll_in_thread(consumer)
        consumer.wakeup()
        thread.join(30)
        assert not thread.is_alive(), "the poll slept on after wakeup()"
        assert isinstance(outcome.get("error"), WakeupError), outcome

        consumer.wakeup()
        with pytest.raises(WakeupError):
            consumer.commit()
        consumer.commit()  # still a member of the same generation
        assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 3, 1: 3}
        produce(cluster, topic, 2, 2)
        assert sorted((r.partition, r.offset) for r in read(consumer, 4)) == [
            (0, 3),
            (0, 4),
            (1, 3),
            (1, 4),
        ]
        assert consumer.assignment() == assigned and calls == [("assigned", assigned)]

        thread, outcome = _poll_in_thread(consumer)
        consumer.close()
        thread.join(30)
        assert not thread.is_alive(), "the poll slept on after close()"
        assert isinstance(outcome.get("error"), ClosedError), outcome
        # It left as a closing member does: revoked, committed what it read.
        assert calls[-1] == ("revoked", assigned)
        assert asyncio.run(committed_offsets(cluster.bootstrap, group)) == {0: 5, 1: 5}
    finally:
        consumer.close()


def test_a_wakeup_interrupts_a_commit_waiting_for_the_coordinator(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """A commit() waiting (its coordinator frozen: SIGSTOP, undone in a
    `finally`) raises WakeupError on wakeup(), well before its timeout, as
    Kafka's commitSync does; once the coordinator answers, commits work."""
    topic, group = names
    create_topic(cluster, topic, 1)
    tp = TopicPartition(topic, 0)
    (coordinator,) = cluster.coordinators
    options = dict(OPTIONS, request_timeout_ms=120_000)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **options) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: 1})  # connected: the commit below waits on the coordinator alone
        os.kill(coordinator.pid, signal.SIGSTOP)
        try:
            outcome: dict[str, BaseException] = {}

            def commit() -> None:
                try:
                    consumer.commit({tp: 2})
                except BaseException as exc:  # handed to the test
                    outcome["error"] = exc

            thread = threading.Thread(target=commit, daemon=True)
            thread.start()
            time.sleep(0.5)  # sent, waiting for the answer
            consumer.wakeup()
            thread.join(30)
            assert not thread.is_alive(), "the commit slept on after wakeup()"
            assert isinstance(outcome.get("error"), WakeupError), outcome
        finally:
            os.kill(coordinator.pid, signal.SIGCONT)
        consumer.commit({tp: 3})
        assert consumer.committed(tp) == 3
