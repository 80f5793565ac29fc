"""Partitions placed together in their fetch session (one FetchRequest for
all the partitions a reset, an assignment, the seeks or the resumes of one
turn of the loop place) still consume every record once, in order, each from
its own position: against a real broker, with a Consumer and an
AsyncConsumer, after assign + seek_to_end, a pause and resume of every
partition, and a seek of some partitions back to the start.

The counts of FetchRequests are checked against a stand-in broker
(tests/unit/sdk/test_fetch_placement_batching.py): the broker has no metric
of stream messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition

from tests.support.processes import BrokerProcess, start_broker

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 120
#: Records already in each partition before the consumer seeks to the end.
OLD = 2
#: Records produced after seek_to_end, then after the resume.
NEW = 3
#: Generous: bounds a broken test only.
DEADLINE_S = 60.0


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(tmp_path_factory.mktemp("placement") / "data")
    try:
        yield process
    finally:
        process.stop()


def produce(address: str, topic: str, tag: str, count: int) -> None:
    with Producer(address, linger_ms=5) as producer:
        for p in range(PARTITIONS):
            for i in range(count):
                producer.send(topic, f"{tag}-{p}-{i}".encode(), partition=p)
        producer.flush()


def values(tag: str, count: int, partition: int) -> list[bytes]:
    return [f"{tag}-{partition}-{i}".encode() for i in range(count)]


def create(address: str, topic: str) -> list[TopicPartition]:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    produce(address, topic, "old", OLD)
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


def test_consumer_reads_every_record_once_in_order(broker: BrokerProcess) -> None:
    partitions = create(broker.address, "placed")
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}

    def drain(consumer: Consumer, total: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while sum(map(len, got.values())) < total and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    got[record.partition].append((record.offset, record.value))

    with Consumer(bootstrap_servers=broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign(partitions)
        consumer.seek_to_end()
        for tp in partitions:
            assert consumer.position(tp, timeout=DEADLINE_S) == OLD
        produce(broker.address, "placed", "new", NEW)
        drain(consumer, PARTITIONS * NEW)
        consumer.pause(*partitions)
        produce(broker.address, "placed", "more", NEW)
        assert consumer.poll(timeout_ms=300) == {}
        consumer.resume(*partitions)
        # Half the partitions read again from the start.
        for tp in partitions[::2]:
            consumer.seek(tp, 0)
        drain(consumer, PARTITIONS * (2 * NEW) + len(partitions[::2]) * (OLD + NEW))
        assert consumer.poll(timeout_ms=300) == {}
    for p in range(PARTITIONS):
        later = values("new", NEW, p) + values("more", NEW, p)
        expected = values("new", NEW, p)
        expected += values("old", OLD, p) + later if p % 2 == 0 else values("more", NEW, p)
        assert [value for _, value in got[p]] == expected, p
        offsets = [offset for offset, _ in got[p]]
        if p % 2:
            assert offsets == list(range(OLD, OLD + 2 * NEW))


def test_async_consumer_reads_every_record_once_in_order(broker: BrokerProcess) -> None:
    partitions = create(broker.address, "placed-async")

    async def consume() -> dict[int, list[tuple[int, bytes]]]:
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        async with AsyncConsumer(
            bootstrap_servers=broker.address, auto_offset_reset="earliest"
        ) as consumer:
            consumer.assign(partitions)
            await consumer.seek_to_end()
            async with asyncio.timeout(DEADLINE_S):
                for tp in partitions:
                    assert await consumer.position(tp) == OLD
                await asyncio.to_thread(produce, broker.address, "placed-async", "new", NEW)
                while sum(map(len, got.values())) < PARTITIONS * NEW:
                    batches = await consumer.getmany(timeout_ms=500)
                    for records in batches.values():
                        for record in records:
                            got[record.partition].append((record.offset, record.value))
            assert await consumer.getmany(timeout_ms=300) == {}
        return got

    got = asyncio.run(consume())
    for p in range(PARTITIONS):
        assert got[p] == [(OLD + i, value) for i, value in enumerate(values("new", NEW, p))]
