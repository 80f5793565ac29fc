"""Clients survive a broker restart: streams reconnect, batches are retried."""

from __future__ import annotations

import time

import pytest
from tidelog import Consumer, Producer, TopicPartition

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)


def test_producer_and_consumer_reconnect_after_restart(
    broker: BrokerProcess, topic_name: str
) -> None:
    tp = TopicPartition(topic_name, 0)
    with (
        Producer(broker.address, retry_backoff_ms=50) as producer,
        Consumer(bootstrap_servers=broker.address, retry_backoff_ms=50) as consumer,
    ):
        for i in range(10):
            producer.send(topic_name, b"%d" % i, partition=0)
        producer.flush(10)
        consumer.assign([tp])
        got = []
        while len(got) < 10:
            got.extend(consumer.poll(timeout_ms=500).get(tp, []))
        # A crash (SIGKILL) rather than stop(): a graceful stop also works but
        # waits out the broker's shutdown grace while streams are open.
        broker.kill()
        broker.spawn()
        futures = [producer.send(topic_name, b"%d" % i, partition=0) for i in range(10, 20)]
        assert [f.get(20).offset for f in futures] == list(range(10, 20))
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500).get(tp, []))
        assert [r.value for r in got] == [b"%d" % i for i in range(20)]
