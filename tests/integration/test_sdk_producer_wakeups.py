"""The producer's sender is woken only when it sleeps (tidelog._accumulator): with
linger 0 and several sending threads, every record is still delivered, in each
thread's order, without a flush, and close() still drains what is buffered."""

from __future__ import annotations

import threading
import time

import pytest
from tidelog import AdminClient, Consumer, FutureRecordMetadata, NewTopic, Producer, TopicPartition

pytestmark = pytest.mark.timeout(90)

THREADS = 4
PER_THREAD = 2_000
#: Each thread pauses every this many records (see `send`).
PAUSE_EVERY = 500
#: Records buffered at once before close().
BUFFERED = 5_000
#: Generous, on a loaded machine: reading everything back; one record's acknowledgement.
READ_DEADLINE_S = 30
ACK_DEADLINE_S = 30


def _create(address: str, topic: str) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=1)])


def _read_all(address: str, topic: str, count: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(bootstrap_servers=address) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value or b"" for r in records)
    return values


def test_linger_0_records_from_many_threads_are_delivered_in_order_without_flush(
    broker_address: str, topic_name: str
) -> None:
    _create(broker_address, topic_name)
    futures: list[list[FutureRecordMetadata]] = [[] for _ in range(THREADS)]
    with Producer(broker_address, linger_ms=0) as producer:

        def send(n: int) -> None:
            for i in range(PER_THREAD):
                futures[n].append(producer.send(topic_name, b"%d:%d" % (n, i)))
                if i % PAUSE_EVERY == 0:
                    time.sleep(0.01)  # let the sender fall asleep now and then

        threads = [threading.Thread(target=send, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # No flush: a wake-up lost between the sender's drain and its sleep
        # would leave records unsent and these futures unresolved.
        offsets = [[f.get(timeout=ACK_DEADLINE_S).offset for f in per] for per in futures]
    for per in offsets:
        assert per == sorted(per)
    values = _read_all(broker_address, topic_name, THREADS * PER_THREAD)
    assert len(values) == THREADS * PER_THREAD
    for n in range(THREADS):
        mine = [v for v in values if v.startswith(b"%d:" % n)]
        assert mine == [b"%d:%d" % (n, i) for i in range(PER_THREAD)]


def test_close_delivers_records_buffered_while_the_sender_was_busy(
    broker_address: str, topic_name: str
) -> None:
    _create(broker_address, topic_name)
    producer = Producer(broker_address, linger_ms=0)
    futures = [producer.send(topic_name, b"%d" % i) for i in range(BUFFERED)]
    assert producer.close(timeout=ACK_DEADLINE_S) == {}
    assert all(f.get(timeout=0).offset == i for i, f in enumerate(futures))
    assert _read_all(broker_address, topic_name, BUFFERED) == [b"%d" % i for i in range(BUFFERED)]
