"""Position resets of a consumer with many partitions, against a real broker:
auto_offset_reset (earliest, latest), seek_to_end and seek_to_beginning of
1,200 partitions answer position() right for every one, in a few ListOffsets
requests (counted by the broker's tidelog_rpc_requests_total).

The consumer used to send one ListOffsets per partition, all at once: past
~1,000 calls waiting for the broker's loop, gRPC drops the rest with
CANCELLED, which position() raised as ClosedError('CANCELLED')."""

from __future__ import annotations

import asyncio
import math
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.request_limits import MAX_LIST_OFFSETS_ENTRIES

from tests.support.processes import BrokerProcess, free_port, start_broker

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 1200
TOPIC = "wide"
#: Generous: a position waits for one round of ListOffsets (~0.1 s here).
POSITION_TIMEOUT_S = 60.0
#: ListOffsets requests one reset of every partition may take: one per
#: MAX_LIST_OFFSETS_ENTRIES partitions, twice (a round asked again after a
#: retriable error). One per partition, as before, was 1,200.
REQUESTS_PER_RESET = 2 * math.ceil(PARTITIONS / MAX_LIST_OFFSETS_ENTRIES)


def records_of(partition: int) -> int:
    return partition % 4 + 1


def start_of(partition: int) -> int:
    """The log start offset: records below 1 deleted in even partitions."""
    return 1 if partition % 2 == 0 else 0


@dataclass
class WideTopic:
    broker: BrokerProcess
    metrics_url: str
    partitions: list[TopicPartition]
    #: tp -> log start offset (what earliest answers).
    starts: dict[TopicPartition, int]
    #: tp -> the offset the next record gets (what latest answers).
    ends: dict[TopicPartition, int]

    def list_offsets_calls(self) -> float:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "tidelog_rpc_requests_total"
            and sample.labels.get("method") == "/tidelog.v1.Log/ListOffsets"
        )


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WideTopic]:
    metrics_port = free_port()
    broker = start_broker(
        tmp_path_factory.mktemp("resets") / "data",
        extra_args=("--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"),
    )
    try:
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
            with Producer(broker.address, linger_ms=20) as producer:
                for tp in partitions:
                    for i in range(records_of(tp.partition)):
                        producer.send(TOPIC, b"v%d" % i, partition=tp.partition)
                producer.flush()
            admin.delete_records({tp: 1 for tp in partitions if start_of(tp.partition)})
        yield WideTopic(
            broker,
            f"http://127.0.0.1:{metrics_port}/metrics",
            partitions,
            starts={tp: start_of(tp.partition) for tp in partitions},
            ends={tp: records_of(tp.partition) for tp in partitions},
        )
    finally:
        broker.stop()


def positions(consumer: Consumer, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    return {tp: consumer.position(tp, timeout=POSITION_TIMEOUT_S) for tp in partitions}


@pytest.mark.parametrize("strategy", ["earliest", "latest"])
def test_auto_offset_reset_of_every_partition(wide: WideTopic, strategy: str) -> None:
    before = wide.list_offsets_calls()
    with Consumer(bootstrap_servers=wide.broker.address, auto_offset_reset=strategy) as consumer:
        consumer.assign(wide.partitions)
        expected = wide.starts if strategy == "earliest" else wide.ends
        assert positions(consumer, wide.partitions) == expected
    assert wide.list_offsets_calls() - before <= REQUESTS_PER_RESET


def test_seek_to_end_and_to_beginning_of_every_partition(wide: WideTopic) -> None:
    before = wide.list_offsets_calls()
    with Consumer(bootstrap_servers=wide.broker.address, auto_offset_reset="earliest") as consumer:
        # As reported: the assignment's resets are still under way.
        consumer.assign(wide.partitions)
        consumer.seek_to_end()
        assert positions(consumer, wide.partitions) == wide.ends
        consumer.seek_to_beginning()
        assert positions(consumer, wide.partitions) == wide.starts
        # Some partitions named: only they move.
        consumer.seek_to_end(*wide.partitions[:10])
        assert positions(consumer, wide.partitions) == {
            **wide.starts,
            **{tp: wide.ends[tp] for tp in wide.partitions[:10]},
        }
    # Four resets: the assignment's, two of every partition, one of ten.
    assert wide.list_offsets_calls() - before <= 4 * REQUESTS_PER_RESET


def test_async_consumer_seek_to_end_of_every_partition(wide: WideTopic) -> None:
    async def seek_and_ask() -> dict[TopicPartition, int]:
        async with AsyncConsumer(
            bootstrap_servers=wide.broker.address, auto_offset_reset="earliest"
        ) as consumer:
            consumer.assign(wide.partitions)
            await consumer.seek_to_end()
            found = {}
            for tp in wide.partitions:
                found[tp] = await asyncio.wait_for(consumer.position(tp), POSITION_TIMEOUT_S)
            return found

    before = wide.list_offsets_calls()
    assert asyncio.run(seek_and_ask()) == wide.ends
    assert wide.list_offsets_calls() - before <= 2 * REQUESTS_PER_RESET
