"""The blocking Producer and Consumer of a process share one loop thread by
default (tidelog._loop_thread): records still flow both ways through it, a
poll() waiting in one thread is woken by a record the other client produced,
closing one client leaves the other working, and `shared_loop_thread=False`
gives a client a loop of its own (for delivery callbacks that block on
another client)."""

from __future__ import annotations

import threading
import time

import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog._loop_thread import shared_loop_users
from tidelog.types import ConsumerRecord

pytestmark = pytest.mark.timeout(90)

#: Longer than the test's own timeout: a poll() that was not woken by the
#: record it waits for fails the test instead of returning late.
POLL_WAIT_MS = 120_000
DEADLINE_S = 30


def _create(address: str, topic: str) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=1)])


def _poll_in_thread(consumer: Consumer) -> tuple[threading.Thread, list[ConsumerRecord]]:
    """poll() once with a long timeout in a thread of its own; started once it waits."""
    got: list[ConsumerRecord] = []
    polling = threading.Event()

    def poll() -> None:
        polling.set()
        for records in consumer.poll(timeout_ms=POLL_WAIT_MS).values():
            got.extend(records)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    assert polling.wait(DEADLINE_S)
    time.sleep(0.2)  # into its wait (returning earlier would pass just the same)
    return thread, got


def _at_end(address: str, topic: str) -> Consumer:
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap_servers=address)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    return consumer


def test_producer_and_consumer_share_one_loop_thread(broker_address: str, topic_name: str) -> None:
    _create(broker_address, topic_name)
    before = shared_loop_users()
    with (
        Producer(broker_address, linger_ms=0) as producer,
        _at_end(broker_address, topic_name) as consumer,
    ):
        assert producer._loop_thread.thread is consumer._loop_thread.thread
        assert shared_loop_users() == before + 2
        thread, got = _poll_in_thread(consumer)
        producer.send(topic_name, b"while polling").get(DEADLINE_S)
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "poll() was not woken by the record it waited for"
        assert [r.value for r in got] == [b"while polling"]
    assert shared_loop_users() == before


def test_closing_one_client_leaves_the_other_working(broker_address: str, topic_name: str) -> None:
    _create(broker_address, topic_name)
    consumer = _at_end(broker_address, topic_name)
    try:
        thread, got = _poll_in_thread(consumer)
        first = Producer(broker_address, linger_ms=0)
        first.close()  # while the consumer waits on the loop they shared
        with Producer(broker_address, linger_ms=0) as second:
            assert second._loop_thread.thread is consumer._loop_thread.thread
            second.send(topic_name, b"after a close").get(DEADLINE_S)
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "poll() was not woken after another client closed"
        assert [r.value for r in got] == [b"after a close"]
    finally:
        consumer.close()


def test_many_threads_send_through_the_shared_loop(broker_address: str, topic_name: str) -> None:
    _create(broker_address, topic_name)
    threads, per_thread = 4, 500
    with (
        Producer(broker_address, linger_ms=0) as producer,
        _at_end(broker_address, topic_name) as consumer,
    ):

        def send(n: int) -> None:
            for i in range(per_thread):
                producer.send(topic_name, b"%d:%d" % (n, i))

        senders = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
        for t in senders:
            t.start()
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < threads * per_thread and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value or b"" for r in records)
        for t in senders:
            t.join()
    assert len(values) == threads * per_thread
    for n in range(threads):
        mine = [v for v in values if v.startswith(b"%d:" % n)]
        assert mine == [b"%d:%d" % (n, i) for i in range(per_thread)]


@pytest.mark.parametrize("shared", [True, False])
def test_a_delivery_callback_may_block_on_a_client_with_a_private_loop(
    broker_address: str, topic_name: str, shared: bool
) -> None:
    _create(broker_address, topic_name)
    outcome: list[object] = []
    done = threading.Event()
    with (
        Producer(broker_address, linger_ms=0) as producer,
        Producer(broker_address, shared_loop_thread=shared) as other,
    ):

        def on_delivery(_metadata: object) -> None:
            try:
                outcome.append(other.partitions_for(f"{topic_name}-other"))
            except RuntimeError as exc:
                outcome.append(exc)
            done.set()

        producer.send(topic_name, b"x").add_callback(on_delivery)
        assert done.wait(DEADLINE_S)
    if shared:
        # The callback runs on the loop `other` needs: refused, not a deadlock.
        assert isinstance(outcome[0], RuntimeError)
    else:
        assert outcome == [{0}]
