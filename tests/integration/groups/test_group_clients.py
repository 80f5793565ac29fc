"""Group paths of the SDK and the CLI against a real cluster (etcd, coordinator,
3 brokers): AsyncConsumer as a group member, commit_async on both consumers,
subscribe(pattern=...), and `tidelog consume --group`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from tidelog import (
    AdminClient,
    AsyncConsumer,
    Consumer,
    ConsumerRecord,
    OffsetAndMetadata,
    TopicPartition,
)
from tidelog.errors import UnknownTopicOrPartitionError

from tests.integration.groups.conftest import committed_offsets, create_topic, produce, wait_until
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(120)

#: Short sessions, so that a member that stops is gone quickly.
OPTIONS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "enable_auto_commit": False}


def test_async_consumers_share_a_topic_and_commit_what_they_returned(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 4)

    async def scenario() -> None:
        members = [
            AsyncConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS)
            for _ in range(2)
        ]
        for member in members:
            await member.start()
        got: list[list[ConsumerRecord]] = [[], []]

        async def poll_all() -> None:
            for i, member in enumerate(members):
                for batch in (await member.getmany(timeout_ms=100)).values():
                    got[i].extend(batch)

        def state() -> list[tuple[int, dict[int, tuple[int | None, int | None]]]]:
            """Per member: records got, and (position, high watermark) by partition."""
            return [
                (
                    len(records),
                    {
                        tp.partition: (member._subs.position(tp), member.highwater(tp))
                        for tp in member.assignment()
                    },
                )
                for records, member in zip(got, members, strict=True)
            ]

        try:
            # Rebalance events are applied inside getmany(): poll until settled.
            # Settling and consuming each get their own generous deadline, so
            # that a slow settle under load does not shorten the wait for records.
            deadline = time.monotonic() + 60
            while [len(m.assignment()) for m in members] != [2, 2]:
                assert time.monotonic() < deadline, [m.assignment() for m in members]
                await poll_all()
            owned = [m.assignment() for m in members]
            assert owned[0].isdisjoint(owned[1])
            await asyncio.to_thread(produce, cluster, topic, 4, 10)
            deadline = time.monotonic() + 60
            while sum(map(len, got)) < 40:
                assert time.monotonic() < deadline, state()
                await poll_all()
            for records, mine in zip(got, owned, strict=True):
                assert {TopicPartition(r.topic, r.partition) for r in records} == mine
            everything = {(r.partition, r.offset) for records in got for r in records}
            assert everything == {(p, o) for p in range(4) for o in range(10)}
            assert sum(map(len, got)) == 40  # each record to one member, once
            for member in members:
                await member.commit()
            assert await committed_offsets(cluster.bootstrap, group) == {p: 10 for p in range(4)}
        finally:
            for member in members:
                await member.stop()

        # A new member continues from the committed offsets.
        await asyncio.to_thread(produce, cluster, topic, 4, 1)
        async with AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as later:
            seen: list[ConsumerRecord] = []
            deadline = time.monotonic() + 60
            while len(seen) < 4:
                assert time.monotonic() < deadline, seen
                for batch in (await later.getmany(timeout_ms=200)).values():
                    seen.extend(batch)
            assert sorted((r.partition, r.offset) for r in seen) == [(p, 10) for p in range(4)]

    asyncio.run(scenario())


def test_commit_async_commits_and_calls_back_in_a_later_poll(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 5)
    calls: list[tuple[dict[TopicPartition, OffsetAndMetadata], BaseException | None]] = []
    with Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS) as c:
        got: list[ConsumerRecord] = []
        wait_until(
            lambda: (
                got.extend(r for rs in c.poll(timeout_ms=200).values() for r in rs)
                or len(got) == 10
            ),
            60,
            "10 records",
        )
        future = c.commit_async(callback=lambda offsets, error: calls.append((offsets, error)))
        assert future.result(timeout=30) is None
        assert calls == []  # callbacks run in the caller's thread, in a later call
        c.poll(timeout_ms=0)
        assert calls == [
            ({TopicPartition(topic, p): OffsetAndMetadata(5, "") for p in range(2)}, None)
        ]
        assert c.committed(TopicPartition(topic, 0)) == 5
        # A commit the coordinator refuses (a topic that does not exist) fails
        # through the callback and the future, not in the caller; explicit offsets.
        failing = c.commit_async(
            {TopicPartition(f"{topic}-other", 0): 1},
            callback=lambda offsets, error: calls.append((offsets, error)),
        )
        with pytest.raises(UnknownTopicOrPartitionError) as raised:
            failing.result(timeout=30)
        c.commit_async({TopicPartition(topic, 1): 3}).result(timeout=30)
        c.poll(timeout_ms=0)
        assert calls[1][1] is raised.value
        assert c.committed(TopicPartition(topic, 1)) == 3

    async def async_side() -> None:
        async with AsyncConsumer(
            topic, bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS
        ) as consumer:
            seen: list[ConsumerRecord] = []
            deadline = time.monotonic() + 60
            while len(seen) < 2:  # partition 1 from 3: offsets 3 and 4
                assert time.monotonic() < deadline, seen
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    seen.extend(batch)
            assert sorted((r.partition, r.offset) for r in seen) == [(1, 3), (1, 4)]
            async_calls: list[object] = []
            task = consumer.commit_async(callback=lambda o, e: async_calls.append((o, e)))
            await task
            await consumer.getmany(timeout_ms=0)
            expected = {TopicPartition(topic, p): OffsetAndMetadata(5, "") for p in range(2)}
            assert async_calls == [(expected, None)]
            assert await consumer.committed(TopicPartition(topic, 1)) == 5

    asyncio.run(async_side())


def test_subscribe_to_a_pattern_follows_topics_that_match(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    base, group = names
    create_topic(cluster, f"{base}-a", 2)
    create_topic(cluster, f"{base}-b", 1)
    create_topic(cluster, f"{base}_not", 1)
    for topic, partitions in ((f"{base}-a", 2), (f"{base}-b", 1), (f"{base}_not", 1)):
        produce(cluster, topic, partitions, 3)
    pattern = f"{base}-[a-z]"
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, **OPTIONS) as consumer:
        consumer.subscribe(pattern=pattern)
        assert consumer.subscription() == {pattern}
        got: set[tuple[str, int, int]] = set()

        def take() -> None:
            for records in consumer.poll(timeout_ms=200).values():
                got.update((r.topic, r.partition, r.offset) for r in records)

        expected = {(f"{base}-a", p, o) for p in range(2) for o in range(3)}
        expected |= {(f"{base}-b", 0, o) for o in range(3)}
        wait_until(lambda: take() or got >= expected, 60, "the matching topics' records")
        # A topic created later that matches joins the subscription.
        create_topic(cluster, f"{base}-c", 1)
        produce(cluster, f"{base}-c", 1, 2)
        expected |= {(f"{base}-c", 0, 0), (f"{base}-c", 0, 1)}
        wait_until(lambda: take() or got >= expected, 60, "the new matching topic's records")
        assert got == expected  # nothing of the topic that does not match
        assert {tp.topic for tp in consumer.assignment()} == {f"{base}-{x}" for x in "abc"}


def test_cli_consume_with_a_group_continues_where_it_stopped(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 3)
    produce(cluster, topic, 3, 5)

    def consume(*extra: str) -> list[str]:
        result = subprocess.run(
            [
                sys.executable, "-m", "tidelog.cli", "consume", topic, "--group", group,
                "--print-offset", "--timeout-ms", "5000", *extra,
                "--bootstrap-server", cluster.bootstrap,
            ],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return sorted(line.split("\t")[0] for line in result.stdout.splitlines())

    first = consume("--from-beginning")
    assert first == sorted(f"{p}:{o}" for p in range(3) for o in range(5))
    with AdminClient(cluster.bootstrap) as admin:
        offsets = admin.list_consumer_group_offsets(group)
    assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 5, 1: 5, 2: 5}
    # --from-beginning applies only where the group has no committed offset.
    assert consume("--from-beginning") == []
    produce(cluster, topic, 3, 1)
    assert consume() == sorted(f"{p}:5" for p in range(3))
    refused = subprocess.run(
        [
            sys.executable, "-m", "tidelog.cli", "consume", topic, "--group", group,
            "--partition", "0", "--bootstrap-server", cluster.bootstrap,
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0 and "--group" in refused.stderr
