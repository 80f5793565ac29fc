"""The producer calls of issue 17 against a real broker: a `partitioner`
callable (kafka-python's signature), partitions_for(), and close(timeout)
reporting the records it could not deliver."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tidelog import AdminClient, AsyncProducer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import ClosedError, UnknownTopicOrPartitionError

from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(60)


def create(address: str, name: str, partitions: int) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])


def _encode(key: str | None) -> bytes | None:
    return None if key is None else key.encode()


def test_a_partitioner_chooses_the_partition_of_records_sent_without_one(
    broker_address: str, topic_name: str
) -> None:
    create(broker_address, topic_name, 3)
    calls: list[tuple[bytes | None, list[int], list[int]]] = []

    def last_partition(key: bytes | None, every: list[int], available: list[int]) -> int:
        calls.append((key, every, available))
        return available[-1]

    with Producer(broker_address, partitioner=last_partition, key_serializer=_encode) as p:
        assert p.partitions_for(topic_name) == {0, 1, 2}
        keyed = p.send(topic_name, b"a", key="k1").get(10)
        keyless = p.send(topic_name, b"b").get(10)
        explicit = p.send(topic_name, b"c", key="k2", partition=0).get(10)
    assert (keyed.partition, keyless.partition, explicit.partition) == (2, 2, 0)
    # Called with the serialized key (None without one); never for an
    # explicit partition.
    assert calls == [(b"k1", [0, 1, 2], [0, 1, 2]), (None, [0, 1, 2], [0, 1, 2])]

    with Consumer(bootstrap_servers=broker_address) as consumer:
        tp = TopicPartition(topic_name, 2)
        consumer.assign([tp])
        assert consumer.end_offsets([tp]) == {tp: 2}

    with (
        Producer(broker_address, partitioner=lambda key, every, available: 7) as p,
        pytest.raises(UnknownTopicOrPartitionError, match="partitioner returned 7"),
    ):
        p.send(topic_name, b"x")
    with pytest.raises(TypeError, match="partitioner must be callable"):
        Producer(broker_address, partitioner="murmur2")


def test_the_async_producer_takes_a_partitioner(broker_address: str, topic_name: str) -> None:
    create(broker_address, topic_name, 2)

    async def main() -> None:
        async with AsyncProducer(broker_address, partitioner=lambda k, a, v: 1) as producer:
            assert await producer.partitions_for(topic_name) == {0, 1}
            metadata = await producer.send_and_wait(topic_name, b"v")
            assert metadata.partition == 1
            assert await producer.stop() == {}

    asyncio.run(asyncio.wait_for(main(), 30))


def test_close_reports_the_records_it_could_not_deliver(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        create(broker.address, "orders", 2)
        producer = Producer(broker.address, linger_ms=0, retry_backoff_ms=50)
        try:
            delivered = producer.send("orders", b"first", partition=0)
            delivered.get(10)
            broker.stop()
            futures = [producer.send("orders", b"%d" % i, partition=i % 2) for i in range(5)]
        finally:
            undelivered = producer.close(timeout=1)
        assert undelivered == {TopicPartition("orders", 0): 3, TopicPartition("orders", 1): 2}
        for future in futures:
            with pytest.raises(ClosedError):
                future.get(1)
        assert producer.close() == {}  # idempotent
    finally:
        broker.stop()

    # Everything delivered: nothing to report.
    broker = start_broker(tmp_path / "data")
    try:
        with Producer(broker.address) as producer:
            producer.send("orders", b"again", partition=1)
            assert producer.close(timeout=10) == {}
    finally:
        broker.stop()
