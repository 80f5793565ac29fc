"""A blocking Consumer handles its fetch answers on its loop's thread, never
in the thread that polls, whether it shares the loop with another client or
is alone on it (tidelog._loop_thread says why the loop is no longer lent to
poll()); every record arrives either way."""

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
#: Between two sends: most answers come to a waiting poll.
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


@pytest.mark.parametrize("shared", [True, False], ids=["shared-loop", "private-loop"])
def test_a_consumers_answers_are_handled_on_its_loops_thread(
    broker: BrokerProcess, answers_by_thread: Counter[str], shared: bool
) -> None:
    topic = f"loop-{'shared' if shared else 'private'}"
    with (
        Producer(broker.address, linger_ms=0, shared_loop_thread=shared) as producer,
        Consumer(bootstrap_servers=broker.address, shared_loop_thread=shared) as consumer,
    ):
        producer.send(topic, b"create").get(30)
        _tail(consumer, producer, topic)
    loop_thread = "tidelog-loop" if shared else "tidelog-consumer-tidelog-python"
    assert set(answers_by_thread) == {loop_thread}, dict(answers_by_thread)
