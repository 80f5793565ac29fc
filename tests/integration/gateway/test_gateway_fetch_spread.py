"""The SDK through a gateway whose --max-partitions-per-fetch (20) is lower
than the partitions a consumer is assigned (50): a Consumer (poll and
poll_arrow) and an AsyncConsumer read every record of every partition, once
and in order per partition, and seek, pause and resume keep working.

The gateway names the limit (`tidelog-max-partitions-per-fetch`) in each
Fetch stream's initial metadata and in the trailing metadata of a refusal
for it; the SDK spreads the partitions it reads through one address over
several Fetch streams of at most that many partitions each
(tidelog._fetcher). Before, the gateway ended the consumer's one stream
INVALID_ARGUMENT, and poll() raised InvalidRequestError naming
--max-partitions-per-fetch for every partition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
from tidelog import AdminClient, AsyncConsumer, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import MAX_PARTITIONS_PER_FETCH_METADATA_KEY
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, gateway_of

pytestmark = pytest.mark.timeout(300)

LIMIT = 20
PARTITIONS = 50
#: Records per partition.
RECORDS = 6
#: Generous: bounds a broken test only.
DEADLINE_S = 120.0

Got = dict[int, list[tuple[int, bytes]]]


@pytest.fixture(scope="module")
def limited(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway in front of the module's cluster reading at most LIMIT
    partitions per Fetch stream."""
    with gateway_of(
        cluster,
        tmp_path_factory.mktemp("gateway-fetch-spread"),
        "--max-partitions-per-fetch", str(LIMIT),
    ) as process:  # fmt: skip
        yield process


def value(partition: int, i: int) -> bytes:
    return f"{partition}-{i}".encode()


def expected(first: int = 0) -> Got:
    return {p: [(i, value(p, i)) for i in range(first, RECORDS)] for p in range(PARTITIONS)}


def create_and_fill(cluster: ClusterProcesses, topic: str) -> list[TopicPartition]:
    """The topic, RECORDS records in each partition, written through the
    brokers themselves."""
    with AdminClient(cluster.brokers[0].address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    with Producer(cluster.brokers[0].address, linger_ms=20) as producer:
        futures = [
            producer.send(topic, value(p, i), partition=p)
            for i in range(RECORDS)
            for p in range(PARTITIONS)
        ]
        producer.flush()
        for future in futures:
            future.get(timeout=DEADLINE_S)
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


def drain(consumer: Consumer, total: int, *, arrow: bool = False) -> Got:
    """What the consumer reads until `total` records, then a quiet poll."""
    got: Got = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + DEADLINE_S
    while sum(map(len, got.values())) < total and time.monotonic() < deadline:
        if arrow:
            for tp, batches in consumer.poll_arrow(timeout_ms=500).items():
                for batch in batches:
                    rows = batch.to_pydict()
                    got[tp.partition] += list(zip(rows["offset"], rows["value"], strict=True))
            continue
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                got[record.partition].append((record.offset, record.value))
    assert consumer.poll(timeout_ms=300) == {}
    return got


def test_the_gateway_names_its_stream_limit_when_a_stream_opens_and_when_it_refuses(
    limited: GatewayProcess,
) -> None:
    key = MAX_PARTITIONS_PER_FETCH_METADATA_KEY
    with grpc.insecure_channel(limited.address) as channel:
        fetch = log_pb2_grpc.LogStub(channel).Fetch(
            iter(
                [
                    log_pb2.FetchRequest(
                        positions=[
                            log_pb2.FetchPosition(topic="absent", partition=p, fetch_offset=0)
                            for p in range(LIMIT + 1)
                        ],
                        credit_bytes=1024,
                    )
                ]
            ),
            timeout=30,
        )
        assert (key, str(LIMIT)) in fetch.initial_metadata()
        with pytest.raises(grpc.RpcError) as ended:
            list(fetch)
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"over the limit of {LIMIT} (--max-partitions-per-fetch)" in ended.value.details()
    assert (key, str(LIMIT)) in ended.value.trailing_metadata()


def test_a_consumer_reads_more_partitions_than_one_stream_may(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    partitions = create_and_fill(cluster, "spread-consumer")
    # Reset by auto_offset_reset: one placement of every partition at once.
    with Consumer(bootstrap_servers=limited.address, auto_offset_reset="earliest") as consumer:
        consumer.assign(partitions)
        assert drain(consumer, PARTITIONS * RECORDS) == expected()
        assert all(consumer.position(tp) == RECORDS for tp in partitions)
        # Every partition sought at once, the limit known.
        for tp in partitions:
            consumer.seek(tp, 2)
        assert drain(consumer, PARTITIONS * (RECORDS - 2)) == expected(2)
        # Paused partitions are read again once resumed, from where they were.
        consumer.seek_to_beginning()
        paused = partitions[::2]
        consumer.pause(*paused)
        got = drain(consumer, (PARTITIONS - len(paused)) * RECORDS)
        assert got == {p: expected()[p] if p % 2 else [] for p in range(PARTITIONS)}
        consumer.resume(*paused)
        got = drain(consumer, len(paused) * RECORDS)
        assert got == {p: [] if p % 2 else expected()[p] for p in range(PARTITIONS)}
        # A smaller assignment, then all of them again: the streams follow.
        consumer.assign(partitions[: LIMIT // 2])
        consumer.seek_to_beginning()
        got = drain(consumer, LIMIT // 2 * RECORDS)
        assert got == {p: expected()[p] if p < LIMIT // 2 else [] for p in range(PARTITIONS)}
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        assert drain(consumer, PARTITIONS * RECORDS) == expected()


def test_a_consumer_with_positions_given_reads_them_all_in_columns(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    partitions = create_and_fill(cluster, "spread-columns")
    with Consumer(bootstrap_servers=limited.address) as consumer:
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        assert drain(consumer, PARTITIONS * RECORDS, arrow=True) == expected()


def test_an_async_consumer_reads_more_partitions_than_one_stream_may(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    partitions = create_and_fill(cluster, "spread-async-consumer")

    async def drain_async(consumer: AsyncConsumer, total: int) -> Got:
        got: Got = {p: [] for p in range(PARTITIONS)}
        async with asyncio.timeout(DEADLINE_S):
            while sum(map(len, got.values())) < total:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        got[record.partition].append((record.offset, record.value))
        assert await consumer.getmany(timeout_ms=300) == {}
        return got

    async def consume() -> list[Got]:
        async with AsyncConsumer(
            bootstrap_servers=limited.address, auto_offset_reset="earliest"
        ) as consumer:
            consumer.assign(partitions)
            out = [await drain_async(consumer, PARTITIONS * RECORDS)]
            await consumer.seek_to_beginning()
            out.append(await drain_async(consumer, PARTITIONS * RECORDS))
        return out

    assert asyncio.run(consume()) == [expected()] * 2


def test_a_consumer_group_member_reads_every_partition_it_is_given(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    create_and_fill(cluster, "spread-group")
    with Consumer(
        "spread-group",
        bootstrap_servers=limited.address,
        group_id="spread-group-g",
        auto_offset_reset="earliest",
    ) as consumer:
        assert drain(consumer, PARTITIONS * RECORDS) == expected()
