"""A topic whose hosting failed as a whole on a broker that is its replica
(out of descriptors: `LogManager._open_logs` raises rather than take a log
offline for no fault of its directory) is hosted again once the shortage
ends, without any change of the topic in etcd; meanwhile its partitions are
listed offline in the broker's registration (the controller elects
elsewhere), and a topic deleted meanwhile is no longer retried. The retries
wait twice as long each time; a change of the topic in etcd is tried at
once and starts the waits over (new input, as Kafka resets its backoff).

Before, nothing tried again: the topic was hosted only at its next change in
etcd or a broker restart, and the broker, a replica hosting nothing of it,
did not list those partitions offline, so the controller could keep it in
the ISR or elect it leader of a partition it could not serve.

A real ClusterLink and PartitionManager (broker 0) on a real etcd; the
shortage is a real RLIMIT_NOFILE, lowered while the topic's logs open
(existing connections, the etcd client's, keep their descriptors).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import HOSTING_RETRY_INITIAL_S, _FailedHosting
from tidelog_broker.replica_state import Role
from tidelog_server.etcd.records import PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
ME = 0
PARTITIONS = 8  # more than INLINE_OPEN_MAX: opened in worker threads
#: Past the due times of a failed hosting's first two retries (after the
#: first wait, then twice as long), with half a second to spare.
PAST_TWO_RETRIES_S = HOSTING_RETRY_INITIAL_S * (1 + 2) + 0.5


@contextmanager
def few_descriptors() -> Iterator[None]:
    """Room for a log or two, not for PARTITIONS: three descriptor numbers
    free below the limit (a new descriptor takes the lowest free one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
    free = [fd for fd in range(max(taken) + 5) if fd not in taken]
    resource.setrlimit(resource.RLIMIT_NOFILE, (free[3], hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Broker(InProcessBroker):
    def __init__(self, etcd: EtcdProcess, tmp_path: Path, **config: Any) -> None:
        super().__init__(etcd, f"/hostretry-{uuid.uuid4().hex}", tmp_path, ME, **config)

    async def create_topic(self, name: str = TOPIC, partitions: int = PARTITIONS) -> None:
        replicas = tuple((ME,) for _ in range(partitions))
        topic = TopicAssignment(name, uuid.uuid4().hex, replicas, {})
        await self.client.put(self.keys.topic(name), topic.encode())
        for partition in range(partitions):
            await self.client.put(
                self.keys.partition_state(name, partition), PartitionState(ME, 1, (ME,)).encode()
            )

    async def refused_again(self, name: str, before: _FailedHosting) -> _FailedHosting:
        """The record of `name`'s next failed hosting after `before`."""
        await eventually(
            lambda: self.link._hosting_failed.get(name, before) is not before,
            f"hosting {name} failed again",
        )
        return self.link._hosting_failed[name]

    async def delete_topic(self, name: str) -> None:
        await self.client.delete_prefix(self.keys.partition_states(name))
        await self.client.delete(self.keys.topic(name))
        await eventually(lambda: name not in self.link.view.topics, f"{name} deleted")


def test_a_hosting_that_ran_out_of_descriptors_is_retried_once_they_are_back(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        broker = Broker(etcd, tmp_path)
        try:
            await broker.start()
            with few_descriptors():
                await broker.create_topic()
                await broker.hosting_failed(TOPIC)
                # A replica hosting none of them lists them offline, so the
                # controller elects no leader here meanwhile.
                await broker.until_listed(tuple((TOPIC, p) for p in range(PARTITIONS)))
                assert broker.manager.logs.hosted_partitions(TOPIC) == []
            # The limit is back; the topic is not touched in etcd.
            await eventually(
                lambda: broker.manager.logs.hosted_partitions(TOPIC) == list(range(PARTITIONS)),
                f"{TOPIC} hosted again without a change in etcd",
            )
            await eventually(
                lambda: all(broker.role(TOPIC, p) is Role.LEADER for p in range(PARTITIONS)),
                "roles applied as the normal path does",
            )
            assert TOPIC not in broker.link._hosting_failed
            await broker.until_listed(())
            for partition in range(PARTITIONS):
                partition_log = broker.manager.partition_log(TOPIC, partition)
                data = bytearray(encode_batch([b"v%d" % partition]))
                assert partition_log.append(data, list(iter_batches(data))).last_offset == 0
                assert b"v%d" % partition in bytes(partition_log.read(0, 1 << 20).records)
        finally:
            await broker.stop()

    asyncio.run(run())


def test_a_topic_deleted_while_its_hosting_failed_is_not_retried(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        broker = Broker(etcd, tmp_path)
        try:
            await broker.start()
            with few_descriptors():
                await broker.create_topic()
                await broker.hosting_failed(TOPIC)
                await broker.until_listed(tuple((TOPIC, p) for p in range(PARTITIONS)))
                await broker.delete_topic(TOPIC)
            await broker.until_listed(())
            assert TOPIC not in broker.link._hosting_failed
            # Past the first retries' due times: none hosts the deleted topic
            # again, nor leaves a directory of it.
            await asyncio.sleep(PAST_TWO_RETRIES_S)
            assert TOPIC not in broker.manager.logs.topic_names()
            assert broker.manager.logs.local_topics() == {}
            assert await broker.listed_offline() == ()
        finally:
            await broker.stop()

    asyncio.run(run())


@pytest.mark.parametrize("change", ["a_state_appears", "its_record_changes"])
def test_a_change_of_a_failing_topic_in_etcd_starts_its_backoff_over(
    etcd: EtcdProcess, tmp_path: Path, change: str
) -> None:
    """Past max.partitions (room for another topic's two partitions only):
    once the retries wait 4 s, a change of TOPIC in etcd (a partition's
    state appears, or its record's configs change) is tried at once and,
    refused again, waits HOSTING_RETRY_INITIAL_S, not 8 s; the retries after
    it double from there. Before, the change's attempt doubled the wait as a
    retry does."""

    async def run() -> None:
        broker = Broker(etcd, tmp_path, max_partitions=2)
        try:
            await broker.start()
            await broker.create_topic("kept", 2)
            await eventually(
                lambda: broker.manager.logs.hosted_partitions("kept") == [0, 1], "kept hosted"
            )
            # Two partitions, only the first with a state: the other's comes
            # later, a change of the states alone.
            record = TopicAssignment(TOPIC, uuid.uuid4().hex, ((ME,), (ME,)), {})
            await broker.client.put(broker.keys.topic(TOPIC), record.encode())
            await broker.client.put(
                broker.keys.partition_state(TOPIC, 0), PartitionState(ME, 1, (ME,)).encode()
            )
            await broker.hosting_failed(TOPIC)
            # The retries alone: 1 s, 2 s, then 4 s. The change below takes
            # milliseconds, so the next retry is seconds away when it comes.
            await eventually(
                lambda: broker.link._hosting_failed[TOPIC].delay_s >= 4 * HOSTING_RETRY_INITIAL_S,
                "the retries' waits doubled to 4 s",
            )
            before = broker.link._hosting_failed[TOPIC]
            if change == "a_state_appears":
                await broker.client.put(
                    broker.keys.partition_state(TOPIC, 1), PartitionState(ME, 1, (ME,)).encode()
                )
            else:
                changed = dataclasses.replace(record, configs={"retention.ms": "60000"})
                await broker.client.put(broker.keys.topic(TOPIC), changed.encode())
            after_change = await broker.refused_again(TOPIC, before)
            assert after_change.delay_s == HOSTING_RETRY_INITIAL_S, after_change
            # The timer's retries double again from there.
            retried = await broker.refused_again(TOPIC, after_change)
            assert retried.delay_s == 2 * HOSTING_RETRY_INITIAL_S, retried
            assert broker.manager.logs.hosted_partitions(TOPIC) == []
            await broker.delete_topic("kept")
            hosted = [0, 1] if change == "a_state_appears" else [0]
            await eventually(
                lambda: broker.manager.logs.hosted_partitions(TOPIC) == hosted,
                f"{TOPIC} hosted once room freed up",
            )
        finally:
            await broker.stop()

    asyncio.run(run())


def test_a_topic_refused_past_max_partitions_is_hosted_once_room_frees_up(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A refusal past max.partitions is retried too: another topic deleted
    frees room, and the refused one is hosted with no change of its own."""

    async def run() -> None:
        broker = Broker(etcd, tmp_path, max_partitions=2)
        try:
            await broker.start()
            await broker.create_topic("kept", 2)
            await eventually(
                lambda: broker.manager.logs.hosted_partitions("kept") == [0, 1], "kept hosted"
            )
            await broker.create_topic(TOPIC, 1)
            await broker.hosting_failed(TOPIC)
            await broker.until_listed(((TOPIC, 0),))
            assert broker.manager.logs.hosted_partitions(TOPIC) == []
            await broker.delete_topic("kept")
            await eventually(
                lambda: broker.manager.logs.hosted_partitions(TOPIC) == [0],
                f"{TOPIC} hosted once room freed up",
            )
            await eventually(lambda: broker.role(TOPIC, 0) is Role.LEADER, f"{TOPIC}-0 led")
            await broker.until_listed(())
        finally:
            await broker.stop()

    asyncio.run(run())
