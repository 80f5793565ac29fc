"""FetchSession skips idle partitions: a partition whose read at its position
found nothing is not read again until a wake of it (LogManager.wake) or a new
position, so an answer costs the partitions with something to read.

Every event that can make such a read answer differently must make the
partition readable again, or a consumer at the tail stalls for good: an
append, the high watermark passing records appended with acks=all, a new
position (a seek back), a log start moving past the position (retention),
a role change, the topic going. Each test parks a session at the tail (its
first read found nothing: the response is still pending), makes the event
happen, and waits, with a generous deadline, for the answer it must bring.

Real PartitionManagers over real logs (standalone, or cluster mode driven
through ReplicaManager.set_role and on_follower_fetch, as the broker's
ClusterLink and ReplicaServicer drive them); reads are counted by wrapping
the manager's `read`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog.records import encode_batch
from tidelog.v1 import common_pb2, log_pb2
from tidelog_broker.config import BrokerConfig
from tidelog_broker.fetch_session import FetchSession
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.topic_store import TopicSpec

DEADLINE_S = 30.0
RECORDS_PER_BATCH = 10
BATCH = encode_batch([b"x" * 90] * RECORDS_PER_BATCH)
ME, FOLLOWER = 0, 1


class Reader:
    """A fetch session over `positions` ({partition: offset} of topic t),
    read as the servicer reads it."""

    def __init__(self, manager: PartitionManager, positions: dict[int, int]) -> None:
        self.session = FetchSession(manager)
        self.session.apply(
            log_pb2.FetchRequest(
                positions=[
                    log_pb2.FetchPosition(topic="t", partition=p, fetch_offset=offset)
                    for p, offset in positions.items()
                ],
                credit_bytes=1 << 24,
                max_wait_ms=100,
            )
        )
        self.responses = self.session.responses()
        self.pending: asyncio.Future[bytes] | None = None

    async def park(self) -> None:
        """Ask for the next response, which must not come yet: the session
        has read everything and found nothing, and now waits."""
        assert self.pending is None
        self.pending = asyncio.ensure_future(anext(self.responses))
        await self.still_waiting()

    async def still_waiting(self) -> None:
        """Let the session run what is ready to run: it must not answer."""
        for _ in range(5):
            await asyncio.sleep(0)
        assert self.pending is not None and not self.pending.done(), (
            "answered with nothing new to read"
        )

    async def answer(self) -> list[log_pb2.PartitionData]:
        """The response the parked request brings (or the next one)."""
        pending = self.pending if self.pending is not None else anext(self.responses)
        self.pending = None
        async with asyncio.timeout(DEADLINE_S):
            message = await pending
        return list(log_pb2.FetchResponse.FromString(message).partitions)

    async def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            await asyncio.wait([self.pending])
        await self.responses.aclose()


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[PartitionManager]:
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path))
    manager.open()
    try:
        yield manager
    finally:
        manager.close()


def counted_reads(manager: PartitionManager) -> Counter[int]:
    """Reads of each partition by the manager from now on."""
    reads: Counter[int] = Counter()
    read = manager.read

    def counting_read(
        topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[object, int, object]:
        reads[partition] += 1
        return read(topic, partition, offset, max_bytes)

    manager.read = counting_read  # type: ignore[assignment,method-assign]
    return reads


# ---------------------------------------------------------------- standalone


def test_one_busy_partition_among_a_thousand_idle_ones_is_the_only_one_read(
    standalone: PartitionManager,
) -> None:
    partitions, busy, appends = 1000, 7, 20
    standalone.logs.create_topic("t", partitions)
    reads = counted_reads(standalone)

    async def test() -> list[tuple[int, int, int]]:
        reader = Reader(standalone, dict.fromkeys(range(partitions), 0))
        got = []
        try:
            await reader.park()
            for _ in range(appends):
                standalone.append("t", busy, BATCH)
                got += [(p.partition, p.fetch_offset, p.next_offset) for p in await reader.answer()]
                await reader.park()
        finally:
            await reader.close()
        return got

    got = asyncio.run(test())
    # Every record, in order, from the busy partition only.
    assert got == [
        (busy, n * RECORDS_PER_BATCH, (n + 1) * RECORDS_PER_BATCH) for n in range(appends)
    ]
    # Each idle partition was read once, when the session started (it was
    # read twice per answer before: 41 times each here).
    assert {p: n for p, n in reads.items() if p != busy} == dict.fromkeys(
        (p for p in range(partitions) if p != busy), 1
    )


def test_a_new_position_behind_the_tail_is_read_at_once(standalone: PartitionManager) -> None:
    standalone.logs.create_topic("t", 2)
    for _ in range(3):
        standalone.append("t", 0, BATCH)
    end = 3 * RECORDS_PER_BATCH

    async def test() -> list[tuple[int, int]]:
        reader = Reader(standalone, {0: end, 1: 0})
        try:
            await reader.park()
            # A seek back: the same partition, an offset with records.
            reader.session.apply(
                log_pb2.FetchRequest(
                    positions=[log_pb2.FetchPosition(topic="t", partition=0, fetch_offset=0)]
                )
            )
            return [(p.partition, p.fetch_offset) for p in await reader.answer()]
        finally:
            await reader.close()

    assert asyncio.run(test()) == [(0, 0)]


def test_a_deleted_topic_answers_its_error(standalone: PartitionManager) -> None:
    standalone.logs.create_topic("t", 2)

    async def test() -> list[tuple[int, int]]:
        reader = Reader(standalone, {0: 0, 1: 0})
        try:
            await reader.park()
            standalone.logs.delete_topic("t")
            return sorted((p.partition, p.error.code) for p in await reader.answer())
        finally:
            await reader.close()

    unknown = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    assert asyncio.run(test()) == [(0, unknown), (1, unknown)]


def test_a_wake_of_a_partition_no_longer_read_is_ignored(standalone: PartitionManager) -> None:
    standalone.logs.create_topic("t", 2)

    async def test() -> list[int]:
        reader = Reader(standalone, {0: 0, 1: 0})
        try:
            await reader.park()
            reader.session.apply(
                log_pb2.FetchRequest(remove=[common_pb2.TopicPartition(topic="t", partition=0)])
            )
            standalone.append("t", 0, BATCH)
            standalone.append("t", 1, BATCH)
            return [p.partition for p in await reader.answer()]
        finally:
            await reader.close()

    assert asyncio.run(test()) == [1]
    # The session's watches ended with it.
    assert not standalone.logs._watchers


# ---------------------------------------------------------------- cluster mode


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[PartitionManager]:
    """Broker ME leading t-0, replicas ME and FOLLOWER, both in the ISR; a
    segment per batch, and retention that keeps no closed segment (applied
    only when a test calls apply_retention)."""
    manager = PartitionManager(BrokerConfig(broker_id=ME, data_dir=tmp_path), cluster_mode=True)
    manager.open()
    try:
        configs = {"segment.bytes": "1024", "retention.bytes": "1"}
        manager.logs.host_partitions(TopicSpec("t", 1, configs), [0])
        set_role(manager, Role.LEADER, leader_id=ME, epoch=1)
        manager.replicas.registration_of = {FOLLOWER: 7}.get
        yield manager
    finally:
        manager.close()


def set_role(manager: PartitionManager, role: Role, leader_id: int, epoch: int) -> None:
    manager.replicas.set_role(
        "t",
        0,
        role=role,
        leader_id=leader_id,
        leader_epoch=epoch,
        replicas=[ME, FOLLOWER],
        isr=[ME, FOLLOWER],
        revision=epoch + 1,  # a new epoch is a newer state
    )


def test_records_appended_with_acks_all_are_read_when_the_high_watermark_passes_them(
    leader: PartitionManager,
) -> None:
    async def test() -> list[tuple[int, int]]:
        reader = Reader(leader, {0: 0})
        try:
            await reader.park()
            leader.append("t", 0, BATCH, acks=-1)
            # Not committed: the append's wake reads nothing, the wait goes on.
            await reader.still_waiting()
            assert leader.high_watermark(leader.partition_log("t", 0)) == 0
            leader.replicas.on_follower_fetch("t", 0, FOLLOWER, RECORDS_PER_BATCH)
            return [(p.fetch_offset, p.next_offset) for p in await reader.answer()]
        finally:
            await reader.close()

    assert asyncio.run(test()) == [(0, RECORDS_PER_BATCH)]


def test_a_position_that_retention_deletes_answers_offset_out_of_range(
    leader: PartitionManager,
) -> None:
    for _ in range(3):
        leader.append("t", 0, BATCH, acks=-1)
    partition_log = leader.partition_log("t", 0)
    assert partition_log.segment_count > 1

    async def test() -> list[tuple[int, int]]:
        # At the high watermark (0: the follower has fetched nothing), in a
        # closed segment that retention deletes.
        reader = Reader(leader, {0: 0})
        try:
            await reader.park()
            await leader.logs.apply_retention()
            assert partition_log.log_start_offset > 0
            return [(p.fetch_offset, p.error.code) for p in await reader.answer()]
        finally:
            await reader.close()

    assert asyncio.run(test()) == [(0, common_pb2.OFFSET_OUT_OF_RANGE)]


def test_a_partition_that_stops_being_led_here_answers_not_leader(
    leader: PartitionManager,
) -> None:
    async def test() -> list[tuple[int, int]]:
        reader = Reader(leader, {0: 0})
        try:
            await reader.park()
            set_role(leader, Role.FOLLOWER, leader_id=FOLLOWER, epoch=2)
            return [(p.fetch_offset, p.error.code) for p in await reader.answer()]
        finally:
            await reader.close()

    assert asyncio.run(test()) == [(0, common_pb2.NOT_LEADER_OR_FOLLOWER)]
