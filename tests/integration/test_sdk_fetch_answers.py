"""Several fetch answers in one gRPC message (ConsumerConfig.fetch_answers_per_message)
against a real broker: the consumer asks for them, takes each answer as its own fetch
(poll_arrow: one RecordBatch each), and returns every record once, in order, across a seek
made while bundled answers for the old position are still arriving."""

from __future__ import annotations

import pytest
from tidelog import Consumer, Producer, TopicPartition

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(120)

RECORDS = 3_000
VALUE = b"v" * 100
#: ~1.1 KiB stored batches (10 records), and answers of ~4 of them.
BATCH_SIZE = 10 * len(VALUE)
ANSWER_BYTES = 4096
#: Messages fetch-total may count beyond the answers read: the long poll's
#: empty answers at the log end, one per fetch_max_wait_ms, between the last
#: records read and the metrics read (seen: one, in CI).
EMPTY_ANSWERS_MAX = 3


def _produce(address: str, topic: str) -> None:
    with Producer(address, batch_size=BATCH_SIZE, linger_ms=50) as producer:
        for i in range(RECORDS):
            producer.send(topic, VALUE, key=b"%d" % i, partition=0)
        producer.flush(30)


def _consumer(address: str, answers: int) -> Consumer:
    return Consumer(
        bootstrap_servers=address,
        max_partition_fetch_bytes=ANSWER_BYTES,
        fetch_max_bytes=ANSWER_BYTES,
        fetch_answers_per_message=answers,
    )


def _read_arrow(consumer: Consumer, tp: TopicPartition) -> tuple[list[int], int]:
    """Offsets of every record from the start, and the RecordBatches (answers) they came in."""
    offsets: list[int] = []
    answers = 0
    for _ in range(1_000):
        for batch in consumer.poll_arrow(timeout_ms=2000).get(tp, []):
            answers += 1
            offsets += batch.column("offset").to_pylist()
        if len(offsets) >= RECORDS:
            break
    return offsets, answers


@pytest.mark.parametrize("answers_per_message", [1, 8])
def test_each_answer_of_a_message_is_returned_once_in_order(
    broker: BrokerProcess, topic_name: str, answers_per_message: int
) -> None:
    _produce(broker.address, topic_name)
    tp = TopicPartition(topic_name, 0)
    with _consumer(broker.address, answers_per_message) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        offsets, answers = _read_arrow(consumer, tp)
        messages = consumer.metrics()["consumer-fetch-manager-metrics"]["fetch-total"]
    assert offsets == list(range(RECORDS))
    assert answers >= RECORDS * len(VALUE) // ANSWER_BYTES
    if answers_per_message == 1:
        # One answer per message. fetch-total also counts what arrived after
        # the last records were read: the long poll's empty answer at the log
        # end (no RecordBatch), one every fetch_max_wait_ms (seen once in CI).
        assert answers <= messages <= answers + EMPTY_ANSWERS_MAX
    else:
        # A consumer catching up gets several answers per message.
        assert messages < answers / 2


def test_a_seek_while_bundled_answers_arrive_returns_from_the_new_position(
    broker: BrokerProcess, topic_name: str
) -> None:
    _produce(broker.address, topic_name)
    tp = TopicPartition(topic_name, 0)
    with _consumer(broker.address, 16) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        first = consumer.poll(timeout_ms=5000, max_records=5)[tp]
        assert [r.offset for r in first] == list(range(5))
        # Answers for the old position are in flight (a window of them): none
        # may be returned after the seek.
        consumer.seek(tp, 1234)
        got: list[int] = []
        for _ in range(1_000):
            for records in consumer.poll(timeout_ms=2000).values():
                got += [r.offset for r in records]
            if len(got) >= RECORDS - 1234:
                break
        assert got == list(range(1234, RECORDS))
        # And back to an earlier offset, which answers already passed.
        consumer.seek(tp, 10)
        again = consumer.poll(timeout_ms=5000, max_records=3)[tp]
        assert [r.offset for r in again] == [10, 11, 12]
