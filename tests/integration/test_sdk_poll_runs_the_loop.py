"""A blocking Consumer alone on its loop handles its fetch answers in the
thread that polls (the loop is lent to poll(): tidelog._loop_thread,
tidelog._poll_wait), one thread hand-off less per answer; a Consumer that
shares its loop with another client leaves the loop to the loop's thread.

Before, every answer was handled on the loop's thread and the polling thread
was woken after it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from tidelog import Consumer, Producer, TopicPartition
from tidelog._fetcher import Fetcher

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(120)

RECORDS = 300
#: Between two sends: slower than a poll, so most answers come to a waiting poll.
SEND_INTERVAL_S = 0.002
DEADLINE_S = 60


@pytest.fixture
def answers_by_thread(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many fetch answers each thread handled (Fetcher.on_response runs
    wherever the consumer's loop runs)."""
    seen: Counter[str] = Counter()
    handle = Fetcher.on_response

    def counted(self: Fetcher, *args: Any) -> None:
        seen[threading.current_thread().name] += 1
        handle(self, *args)

    monkeypatch.setattr(Fetcher, "on_response", counted)
    return seen


def _tail(consumer: Consumer, producer: Producer, topic: str) -> None:
    """Poll the tail of `topic` while `producer` sends RECORDS one at a time
    from another thread; every record must arrive."""
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)

    def send() -> None:
        for i in range(RECORDS):
            producer.send(topic, b"%d" % i, partition=0)
            time.sleep(SEND_INTERVAL_S)
        producer.flush()

    sender = threading.Thread(target=send)
    sender.start()
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    try:
        while got < RECORDS:
            assert time.monotonic() < deadline, f"{got} of {RECORDS} records in {DEADLINE_S} s"
            got += sum(len(r) for r in consumer.poll(timeout_ms=100).values())
    finally:
        sender.join(DEADLINE_S)
    assert got == RECORDS


def test_a_consumer_alone_on_its_loop_handles_answers_in_the_polling_thread(
    broker: BrokerProcess, answers_by_thread: Counter[str]
) -> None:
    with (
        Producer(broker.address, linger_ms=0, shared_loop_thread=False) as producer,
        Consumer(bootstrap_servers=broker.address, shared_loop_thread=False) as consumer,
    ):
        producer.send("alone", b"create").get(30)
        _tail(consumer, producer, "alone")
    polling = answers_by_thread[threading.current_thread().name]
    # Some may come while the application is between polls (the loop's
    # thread takes the loop back then): a loaded machine decides how many.
    assert polling > 0, f"no answer handled by the polling thread: {dict(answers_by_thread)}"


def test_a_consumer_sharing_its_loop_leaves_it_to_the_loops_thread(
    broker: BrokerProcess, answers_by_thread: Counter[str]
) -> None:
    with (
        Producer(broker.address, linger_ms=0) as producer,
        Consumer(bootstrap_servers=broker.address) as consumer,
    ):
        producer.send("shared", b"create").get(30)
        _tail(consumer, producer, "shared")
    assert set(answers_by_thread) == {"tidelog-loop"}, dict(answers_by_thread)
