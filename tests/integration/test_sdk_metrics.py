"""Producer.metrics() and Consumer.metrics() (and the asyncio twins) against a
real broker: kafka-python's shape, and values that follow what was sent,
acknowledged, fetched and consumed."""

from __future__ import annotations

import asyncio

from tidelog import AsyncConsumer, AsyncProducer, Consumer, Producer, TopicPartition

from tests.support.processes import BrokerProcess

COUNT = 200


def test_producer_metrics_count_what_was_acknowledged(
    broker: BrokerProcess, topic_name: str
) -> None:
    with Producer(bootstrap_servers=broker.address, linger_ms=0) as producer:
        empty = producer.metrics()["producer-metrics"]
        assert empty["record-send-total"] == 0 and empty["request-total"] == 0
        for i in range(COUNT):
            producer.send(topic_name, b"value-%03d" % i, partition=0)
        producer.flush()
        metrics = producer.metrics()
    overall = metrics["producer-metrics"]
    assert overall["record-send-total"] == COUNT
    assert overall["record-send-rate"] > 0
    assert overall["record-error-total"] == 0
    assert overall["byte-total"] >= COUNT * len(b"value-000")
    assert 0 < overall["batch-size-avg"] <= overall["batch-size-max"]
    assert overall["request-total"] >= 1
    assert 0 < overall["request-latency-avg"] <= overall["request-latency-max"]
    assert overall["records-per-request-avg"] == COUNT / overall["request-total"]
    assert overall["record-queue-time-max"] >= overall["record-queue-time-avg"] >= 0
    topic = metrics[f"producer-topic-metrics.{topic_name}"]
    assert topic["record-send-total"] == COUNT and topic["byte-total"] == overall["byte-total"]


def test_consumer_metrics_follow_fetches_consumption_and_lag(
    broker: BrokerProcess, topic_name: str
) -> None:
    with Producer(bootstrap_servers=broker.address) as producer:
        for i in range(COUNT):
            producer.send(topic_name, b"value-%03d" % i, partition=0)
        producer.flush()
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap_servers=broker.address, max_poll_records=50) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        first = consumer.poll(timeout_ms=10_000)
        assert sum(len(records) for records in first.values()) == 50
        metrics = consumer.metrics()
        fetch = metrics["consumer-fetch-manager-metrics"]
        # Fetched ahead of what poll() returned: lag counts from the position.
        assert fetch["records-lag-max"] == COUNT - 50
        assert metrics[f"consumer-fetch-manager-metrics.{topic_name}-0"]["records-lag"] == 150
        assert metrics["consumer-coordinator-metrics"]["assigned-partitions"] == 1
        read = 50
        while read < COUNT:
            read += sum(len(r) for r in consumer.poll(timeout_ms=10_000).values())
        fetch = consumer.metrics()["consumer-fetch-manager-metrics"]
    assert fetch["records-consumed-total"] == COUNT
    assert fetch["bytes-consumed-total"] >= COUNT * len(b"value-000")
    assert fetch["fetch-total"] >= 1 and fetch["fetch-rate"] > 0
    assert fetch["fetch-size-avg"] > 0
    assert fetch["fetch-latency-max"] >= fetch["fetch-latency-avg"] >= 0
    assert fetch["records-lag-max"] == 0


def test_the_async_twins_offer_the_same(broker: BrokerProcess, topic_name: str) -> None:
    async def main() -> None:
        async with AsyncProducer(bootstrap_servers=broker.address) as producer:
            for i in range(COUNT):
                await producer.send(topic_name, b"v%d" % i, partition=0)
            await producer.flush()
            sent = producer.metrics()["producer-metrics"]
        assert sent["record-send-total"] == COUNT and sent["request-latency-avg"] > 0
        tp = TopicPartition(topic_name, 0)
        async with AsyncConsumer(bootstrap_servers=broker.address) as consumer:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            read = 0
            while read < COUNT:
                batch = await consumer.getmany(timeout_ms=10_000)
                read += sum(len(records) for records in batch.values())
            fetch = consumer.metrics()["consumer-fetch-manager-metrics"]
        assert fetch["records-consumed-total"] == COUNT and fetch["records-lag-max"] == 0

    asyncio.run(asyncio.wait_for(main(), 60))
