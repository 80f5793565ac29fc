"""Producer and Consumer against a real broker process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from tidelog import AdminClient, Consumer, ConsumerRecord, NewTopic, Producer, TopicPartition
from tidelog.errors import (
    GroupsNotSupportedError,
    IllegalStateError,
    MessageTooLargeError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from tidelog.partitioner import partition_for_key

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    with Producer(broker.address, linger_ms=2) as p:
        yield p


@pytest.fixture
def consumer(broker_address: str) -> Iterator[Consumer]:
    with Consumer(bootstrap_servers=broker_address, consumer_timeout_ms=1000) as c:
        yield c


def create(address: str, name: str, partitions: int = 1, **configs: str) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions, topic_configs=configs)])


def consume(consumer: Consumer, count: int, timeout_s: float = 10) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(records)
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_keys_values_headers_nulls(
    broker_address: str, topic_name: str, codec: str
) -> None:
    create(broker_address, topic_name)
    sent = [
        (b"k%d" % i if i % 3 else None, None if i % 5 == 4 else b"value-%d" % i, i)
        for i in range(50)
    ]
    with Producer(broker_address, compression_type=codec) as producer:
        futures = [
            producer.send(
                topic_name,
                value,
                key=key,
                partition=0,
                headers=[("i", str(i).encode()), ("none", None)] if i % 2 else None,
                timestamp_ms=1_700_000_000_000 + i,
            )
            for key, value, i in sent
        ]
        producer.flush(10)
    assert [f.get(0).offset for f in futures] == list(range(50))
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        records = consume(consumer, 50)
    assert [(r.key, r.value) for r in records] == [(k, v) for k, v, _ in sent]
    assert [r.offset for r in records] == list(range(50))
    assert [r.timestamp for r in records] == [1_700_000_000_000 + i for i in range(50)]
    assert records[1].headers == [("i", b"1"), ("none", None)]
    assert list(records[2].headers) == []


def test_futures_resolve_with_offsets_and_callbacks(producer: Producer, topic_name: str) -> None:
    done: list[int] = []
    futures = [producer.send(topic_name, b"x", partition=0) for _ in range(20)]
    futures[-1].add_callback(lambda md: done.append(md.offset))
    offsets = [f.get(10).offset for f in futures]
    assert offsets == list(range(20))
    assert all(f.done() and f.exception() is None for f in futures)
    assert done == [19]
    md = producer.send_and_wait(topic_name, b"y", partition=0, timeout=10)
    assert md.offset == 20 and md.topic == topic_name and md.partition == 0


def test_explicit_and_key_partitioning(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    create(broker_address, topic_name, partitions=4)
    assert producer.partitions_for(topic_name) == {0, 1, 2, 3}
    keys = [b"user-%d" % i for i in range(40)]
    mds = [f.get(10) for f in [producer.send(topic_name, b"v", key=k) for k in keys]]
    assert [md.partition for md in mds] == [partition_for_key(k, 4) for k in keys]
    assert producer.send(topic_name, b"v", partition=3).get(10).partition == 3
    with pytest.raises(UnknownTopicOrPartitionError):
        producer.send(topic_name, b"v", partition=9)


def test_keyless_records_stick_to_one_partition_per_batch(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    create(broker_address, topic_name, partitions=3)
    futures = [producer.send(topic_name, b"v") for _ in range(10)]
    producer.flush(10)
    assert len({f.get(0).partition for f in futures}) == 1


def test_auto_created_topic(producer: Producer, topic_name: str) -> None:
    assert producer.send(topic_name, b"v").get(10).offset == 0


def test_record_too_large_fails_its_future(producer: Producer, topic_name: str) -> None:
    future = producer.send(topic_name, b"x" * (2 * 1024 * 1024))
    with pytest.raises(MessageTooLargeError):
        future.get(5)


def test_broker_rejects_batch_over_topic_max_message_bytes(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    create(broker_address, topic_name, **{"max.message.bytes": "1000"})
    with pytest.raises(MessageTooLargeError):
        producer.send(topic_name, b"x" * 5000).get(10)
    assert producer.send(topic_name, b"small").get(10).offset == 0


def test_flush_and_close_deliver_everything(broker_address: str, topic_name: str) -> None:
    producer = Producer(broker_address, linger_ms=10_000)
    futures = [producer.send(topic_name, b"%d" % i, partition=0) for i in range(1000)]
    producer.flush(10)  # does not wait for the 10 s linger
    assert all(f.done() for f in futures)
    late = producer.send(topic_name, b"late", partition=0)
    producer.close(10)
    assert late.get(0).offset == 1000
    producer.close()  # idempotent


def test_seek_rewind_and_consume_again(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    for i in range(30):
        producer.send(topic_name, b"%d" % i, partition=0)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    consumer.assign([tp])
    assert [r.value for r in consume(consumer, 30)] == [b"%d" % i for i in range(30)]
    assert consumer.position(tp) == 30
    consumer.seek(tp, 10)
    assert consumer.position(tp) == 10
    again = consume(consumer, 20)
    assert [r.offset for r in again] == list(range(10, 30))
    consumer.seek_to_beginning(tp)
    assert consumer.position(tp) == 0
    assert consume(consumer, 30)[0].offset == 0


def test_seek_to_end_then_new_records(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    for _ in range(10):
        producer.send(topic_name, b"old", partition=0)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    assert consumer.position(tp) == 10
    producer.send(topic_name, b"new", partition=0).get(10)
    records = consume(consumer, 1)
    assert [(r.offset, r.value) for r in records] == [(10, b"new")]


#: A deadline no poll in these tests comes near unless it waits for something
#: it should not (a loaded machine is slow, never this slow).
GENEROUS_S = 20


def test_poll_waits_up_to_its_timeout_and_returns_empty(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    producer.send(topic_name, b"v", partition=0).get(10)
    consumer.assign([TopicPartition(topic_name, 0)])
    consumer.seek_to_end()
    start = time.monotonic()
    assert consumer.poll(timeout_ms=300) == {}
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < GENEROUS_S  # it waited its timeout, and no longer than a deadline
    assert consumer.poll(timeout_ms=0) == {}  # does not block (the test's timeout would end it)


# The deadline: a poll that waited out its 600 s timeout fails here.
@pytest.mark.timeout(60)
def test_poll_returns_as_soon_as_a_record_arrives(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    """A long timeout is an upper bound, not a wait: a record produced while
    poll() waits ends the wait, long before the timeout."""
    tp = TopicPartition(topic_name, 0)
    producer.send(topic_name, b"old", partition=0).get(10)
    consumer.assign([tp])
    consumer.seek_to_end()
    assert consumer.poll(timeout_ms=0) == {}
    later = threading.Timer(0.5, lambda: producer.send(topic_name, b"new", partition=0))
    later.start()
    try:
        polled = consumer.poll(timeout_ms=600_000)
    finally:
        later.cancel()
    assert [r.value for r in polled[tp]] == [b"new"]


def test_max_records_and_position_tracking(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    for i in range(100):
        producer.send(topic_name, b"%d" % i, partition=0)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[ConsumerRecord] = []
    while len(got) < 100:
        batch = consumer.poll(timeout_ms=2000, max_records=7)
        assert batch and len(batch[tp]) <= 7
        got.extend(batch[tp])
        assert consumer.position(tp) == got[-1].offset + 1
    assert [r.offset for r in got] == list(range(100))
    assert consumer.highwater(tp) == 100


def test_offsets_for_times_and_beginning_end_offsets(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    base = 1_600_000_000_000
    for i in range(10):
        producer.send(topic_name, b"v", partition=0, timestamp_ms=base + i * 1000)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 10}
    found = consumer.offsets_for_times({tp: base + 3500})
    assert found[tp] is not None
    assert found[tp].offset == 4 and found[tp].timestamp == base + 4000
    assert consumer.offsets_for_times({tp: base + 99_000}) == {tp: None}


def test_auto_offset_reset_earliest_and_latest(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    for _ in range(5):
        producer.send(topic_name, b"v", partition=0)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap_servers=broker_address, auto_offset_reset="latest") as latest:
        latest.assign([tp])
        assert latest.position(tp) == 5
        # Out of range -> reset by the policy (latest).
        latest.seek(tp, 1000)
        assert latest.poll(timeout_ms=500) == {}
        assert latest.position(tp) == 5
    with Consumer(bootstrap_servers=broker_address, auto_offset_reset="earliest") as earliest:
        earliest.assign([tp])
        assert earliest.position(tp) == 0
        earliest.seek(tp, 1000)
        assert [r.offset for r in consume(earliest, 5)] == [0, 1, 2, 3, 4]


def test_auto_offset_reset_none_raises(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    producer.send(topic_name, b"v", partition=0).get(10)
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap_servers=broker_address, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(NoOffsetForPartitionError):
            consumer.position(tp)
        consumer.seek(tp, 50)
        with pytest.raises(OffsetOutOfRangeError) as out_of_range:
            consume(consumer, 1, timeout_s=5)
        # The error says which partition it is about, as attributes.
        assert (out_of_range.value.topic, out_of_range.value.partition) == (topic_name, 0)
        consumer.seek(tp, 0)
        assert [r.value for r in consume(consumer, 1)] == [b"v"]


def test_iterator_stops_after_consumer_timeout(
    producer: Producer, consumer: Consumer, topic_name: str
) -> None:
    for i in range(25):
        producer.send(topic_name, b"%d" % i, partition=0)
    producer.flush(10)
    consumer.assign([TopicPartition(topic_name, 0)])
    # consumer_timeout_ms=1000: iteration ends (the test's timeout would end it otherwise).
    assert [r.value for r in consumer] == [b"%d" % i for i in range(25)]


def test_restarted_consumer_continues_from_a_given_offset(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    for i in range(40):
        producer.send(topic_name, b"%d" % i, partition=0)
    producer.flush(10)
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap_servers=broker_address) as first:
        first.assign([tp])
        seen = consume(first, 15)[:15]
        resume_at = seen[-1].offset + 1
    with Consumer(bootstrap_servers=broker_address) as second:
        second.assign([tp])
        second.seek(tp, resume_at)
        rest = consume(second, 40 - resume_at)
    assert [r.offset for r in seen + rest] == list(range(40))


def test_multiple_partitions_in_one_consumer(
    broker_address: str, producer: Producer, topic_name: str
) -> None:
    create(broker_address, topic_name, partitions=3)
    for p in range(3):
        for i in range(10):
            producer.send(topic_name, b"%d-%d" % (p, i), partition=p)
    producer.flush(10)
    with Consumer(bootstrap_servers=broker_address) as consumer:
        consumer.assign([TopicPartition(topic_name, p) for p in range(3)])
        records = consume(consumer, 30)
    for p in range(3):
        assert [r.value for r in records if r.partition == p] == [
            b"%d-%d" % (p, i) for i in range(10)
        ]


def test_deserializers(broker_address: str, producer: Producer, topic_name: str) -> None:
    producer.send(topic_name, b"7", key=b"k", partition=0).get(10)
    with Consumer(
        bootstrap_servers=broker_address,
        key_deserializer=bytes.decode,
        value_deserializer=int,
    ) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        (record,) = consume(consumer, 1)
    assert (record.key, record.value) == ("k", 7)


def test_serializers_and_type_checks(broker_address: str, topic_name: str) -> None:
    with Producer(broker_address, value_serializer=str.encode) as producer:
        assert producer.send(topic_name, "text").get(10).offset == 0
    with Producer(broker_address) as producer, pytest.raises(TypeError):
        producer.send(topic_name, "not bytes")  # type: ignore[arg-type]


def test_groups_need_a_cluster(broker_address: str) -> None:
    # A standalone broker (no --etcd) has no coordinator: subscribing says so.
    with pytest.raises(GroupsNotSupportedError, match="standalone"):
        Consumer("some-topic", bootstrap_servers=broker_address, group_id="g")
    with (
        Consumer(bootstrap_servers=broker_address, group_id="g") as consumer,
        pytest.raises(GroupsNotSupportedError),
    ):
        consumer.subscribe(["some-topic"])
    with pytest.raises(IllegalStateError, match="group_id"):
        Consumer("some-topic", bootstrap_servers=broker_address)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_a_stored_batch_larger_than_fetch_max_bytes_is_still_read(
    broker_address: str, topic_name: str, codec: str
) -> None:
    """The paper's consumer test: 200 KB fetches of a log written in the
    producer's default 256 KiB batches. fetch.max.bytes is not an absolute
    maximum (as in Kafka): a larger batch is returned whole and decoded."""
    create(broker_address, topic_name)
    with Producer(broker_address, batch_size=262_144, linger_ms=50, compression_type=codec) as p:
        for i in range(2_000):
            p.send(topic_name, b"%06d" % i + bytes(194))
    with Consumer(
        bootstrap_servers=broker_address,
        max_partition_fetch_bytes=204_800,
        fetch_max_bytes=204_800,
    ) as c:
        tp = TopicPartition(topic_name, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        got = consume(c, 2_000)
    assert [int(r.value[:6]) for r in got] == list(range(2_000))


def test_acks_0_records_written_before_close_all_reach_the_broker(
    broker: BrokerProcess, topic_name: str
) -> None:
    """close() right after fire-and-forget sends: what was written to the
    stream reaches the broker (close used to cancel the call, which can drop
    requests still in gRPC's buffers)."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    rounds, per_round = 5, 3000
    for _ in range(rounds):
        producer = Producer(bootstrap_servers=broker.address, acks=0, batch_size=4096)
        for i in range(per_round):
            producer.send(topic_name, b"v%06d" % i)
        producer.close()
    with Consumer(bootstrap_servers=broker.address, consumer_timeout_ms=3000) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_beginning()
        assert sum(1 for _ in consumer) == rounds * per_round
