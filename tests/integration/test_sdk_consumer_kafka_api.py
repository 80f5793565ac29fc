"""The consumer calls users of Kafka's Python clients reach for (issue 17),
against a real broker: pause/resume, reads of named partitions, topics(),
partitions_for_topic() and the record's epoch and sizes. (The calls that need
a coordinator are in tests/integration/groups/test_consumer_kafka_api.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import IllegalStateError

pytestmark = pytest.mark.timeout(60)


def create(address: str, name: str, partitions: int) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])


def produce(address: str, topic: str, partition: int, values: list[bytes]) -> None:
    with Producer(address, linger_ms=2) as producer:
        for value in values:
            producer.send(topic, value, partition=partition)
        producer.flush()


def poll_until(
    consumer: Consumer, done: Callable[[dict[TopicPartition, list]], bool], timeout_s: float = 15
) -> dict[TopicPartition, list]:
    """Poll, gathering records by partition, until `done(gathered)`."""
    got: dict[TopicPartition, list] = {}
    deadline = time.monotonic() + timeout_s
    while not done(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s; got {got}")
        for tp, records in consumer.poll(timeout_ms=200).items():
            got.setdefault(tp, []).extend(records)
    return got


def test_a_paused_partition_is_not_read_and_resumes_where_it_stopped(
    broker_address: str, topic_name: str
) -> None:
    create(broker_address, topic_name, 2)
    p0, p1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    produce(broker_address, topic_name, 0, [b"a0", b"a1"])
    produce(broker_address, topic_name, 1, [b"b0"])
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([p0, p1])
        first = poll_until(consumer, lambda got: len(got.get(p0, [])) == 2 and p1 in got)
        assert [r.value for r in first[p0]] == [b"a0", b"a1"]

        consumer.pause(p0)
        assert consumer.paused() == {p0}
        produce(broker_address, topic_name, 0, [b"a2", b"a3"])
        produce(broker_address, topic_name, 1, [b"b1"])
        # p1's new record arrives; p0's, produced before it, does not.
        later = poll_until(consumer, lambda got: p1 in got)
        assert p0 not in later
        assert [r.value for r in later[p1]] == [b"b1"]
        assert consumer.position(p0) == 2
        # Not fetched at all: the high watermark seen for p0 did not move.
        assert consumer.highwater(p0) == 2
        assert consumer.poll(timeout_ms=300) == {}

        consumer.resume(p0)
        assert consumer.paused() == set()
        resumed = poll_until(consumer, lambda got: len(got.get(p0, [])) == 2)
        assert [(r.offset, r.value) for r in resumed[p0]] == [(2, b"a2"), (3, b"a3")]

        # Pausing a partition not assigned is refused; a new assignment
        # without the partition forgets its pause.
        with pytest.raises(IllegalStateError, match="not assigned"):
            consumer.pause(TopicPartition(topic_name, 7))
        consumer.pause(p0)
        consumer.assign([p1])
        consumer.assign([p0, p1])
        assert consumer.paused() == set()


def test_records_fetched_before_a_pause_wait_for_resume(
    broker_address: str, topic_name: str
) -> None:
    create(broker_address, topic_name, 1)
    tp = TopicPartition(topic_name, 0)
    produce(broker_address, topic_name, 0, [b"%d" % i for i in range(30)])
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([tp])
        head = poll_until(consumer, lambda got: tp in got)
        taken = len(head[tp])
        if taken < 30:  # the rest may already be fetched: it must wait
            consumer.pause(tp)
            assert consumer.poll(timeout_ms=300) == {}
            assert consumer.position(tp) == taken
            consumer.resume(tp)
        rest = poll_until(consumer, lambda got: taken + len(got.get(tp, [])) == 30)
        offsets = [r.offset for r in head[tp]] + [r.offset for r in rest.get(tp, [])]
        assert offsets == list(range(30))


def test_iteration_then_poll_skips_nothing(broker_address: str, topic_name: str) -> None:
    # Iteration takes records in chunks; poll() after it starts with the
    # chunk's records iteration had not returned yet.
    create(broker_address, topic_name, 1)
    tp = TopicPartition(topic_name, 0)
    produce(broker_address, topic_name, 0, [b"%d" % i for i in range(20)])
    with Consumer(bootstrap_servers=broker_address, consumer_timeout_ms=10_000) as consumer:
        consumer.assign([tp])
        seen = [next(consumer).offset for _ in range(3)]
        rest = poll_until(consumer, lambda got: len(got.get(tp, [])) == 17)
        assert seen + [r.offset for r in rest[tp]] == list(range(20))


def test_async_consumer_reads_named_partitions_and_pauses(
    broker_address: str, topic_name: str
) -> None:
    create(broker_address, topic_name, 2)
    p0, p1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    produce(broker_address, topic_name, 0, [b"a%d" % i for i in range(5)])
    produce(broker_address, topic_name, 1, [b"b%d" % i for i in range(5)])

    async def main() -> None:
        async with AsyncConsumer(bootstrap_servers=broker_address) as consumer:
            consumer.assign([p0, p1])
            # getone() takes a chunk of both partitions; a read of p1 only
            # comes next and leaves p0's unreturned records in place.
            first = await consumer.getone()
            other = p1 if first.partition == 0 else p0
            mine = TopicPartition(topic_name, first.partition)
            got = []
            while len(got) < 5:
                batch = await consumer.getmany(other, timeout_ms=500)
                assert set(batch) <= {other}
                got.extend(r.offset for r in batch.get(other, []))
            assert got == list(range(5))
            one = await consumer.getone(mine)
            assert (one.partition, one.offset) == (first.partition, 1)
            assert await consumer.position(mine) == 2

            consumer.pause(mine)
            assert consumer.paused() == {mine}
            assert await consumer.getmany(timeout_ms=300) == {}
            consumer.resume(mine)
            rest = []
            while len(rest) < 3:
                batch = await consumer.getmany(mine, timeout_ms=500)
                rest.extend(r.offset for r in batch.get(mine, []))
            assert rest == [2, 3, 4]
            with pytest.raises(IllegalStateError, match="not assigned"):
                await consumer.getmany(TopicPartition(topic_name, 9))

            assert topic_name in await consumer.topics()
            assert await consumer.partitions_for_topic(topic_name) == {0, 1}
            assert await consumer.partitions_for_topic(topic_name + "-none") is None

    asyncio.run(asyncio.wait_for(main(), 50))


def test_topics_and_partitions_for_topic(broker_address: str, topic_name: str) -> None:
    create(broker_address, topic_name, 3)
    with Consumer(bootstrap_servers=broker_address) as consumer:
        assert topic_name in consumer.topics()
        assert consumer.partitions_for_topic(topic_name) == {0, 1, 2}


def test_records_carry_the_leader_epoch_and_their_serialized_sizes(
    broker_address: str, topic_name: str
) -> None:
    create(broker_address, topic_name, 1)
    tp = TopicPartition(topic_name, 0)
    with Producer(broker_address) as producer:
        producer.send(topic_name, b"v" * 300, key=b"key-1", partition=0)
        producer.send(topic_name, None, key=None, partition=0)
        producer.send(topic_name, b"", key=b"", partition=0)
        producer.flush()
    expected = [(5, 300), (-1, -1), (0, 0)]
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([tp])
        records = poll_until(consumer, lambda got: len(got.get(tp, [])) == 3)[tp]
        assert [(r.serialized_key_size, r.serialized_value_size) for r in records] == expected
        # A standalone broker does not replicate, so it stamps no leader
        # epoch: -1, Kafka's "unknown" (a cluster's leader stamps its epoch:
        # tests/integration/groups/test_consumer_kafka_api.py).
        assert [r.leader_epoch for r in records] == [-1, -1, -1]
    # The sizes are those of the stored bytes, not of what a deserializer made.
    with Consumer(
        bootstrap_servers=broker_address,
        key_deserializer=lambda k: k.decode() * 2,
        value_deserializer=len,
    ) as consumer:
        consumer.assign([tp])
        records = poll_until(consumer, lambda got: len(got.get(tp, [])) == 3)[tp]
        assert [r.value for r in records] == [300, None, 0]
        assert [(r.serialized_key_size, r.serialized_value_size) for r in records] == expected
