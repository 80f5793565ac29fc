"""The SDK through a gateway whose --max-partitions-per-request (50) is lower
than what it places or sends at once (a few hundred partitions): a Consumer
and an AsyncConsumer that assign, reset and seek every partition at once read
every record once and in order, and a Producer and an AsyncProducer (plain and
idempotent) with every partition ready at once have every record acknowledged
once, none lost or written twice, and the application sees no error.

The gateway names its limit in each stream's initial metadata and in its
refusals (tidelog._partition_limits); the SDK splits its Fetch, Produce and
ListOffsets requests by it. Before, the first placement (a ListOffsets of
every partition, then a FetchRequest of every position) and the first
produce request of every partition were refused, and the application got
InvalidRequestError."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
from tidelog import (
    AdminClient,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
)
from tidelog.errors import MAX_PARTITIONS_METADATA_KEY
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, gateway_of

pytestmark = pytest.mark.timeout(300)

LIMIT = 50
PARTITIONS = 240
#: Records per partition.
RECORDS = 4
#: Generous: bounds a broken test only.
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def limited(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway in front of the module's cluster taking at most LIMIT
    partitions per request."""
    with gateway_of(
        cluster,
        tmp_path_factory.mktemp("gateway-limit"),
        "--max-partitions-per-request", str(LIMIT),
    ) as process:  # fmt: skip
        yield process


def create(gateway: GatewayProcess, topic: str) -> list[TopicPartition]:
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


def value(partition: int, i: int) -> bytes:
    return f"{partition}-{i}".encode()


def expected() -> dict[int, list[tuple[int, bytes]]]:
    return {p: [(i, value(p, i)) for i in range(RECORDS)] for p in range(PARTITIONS)}


def write_directly(cluster: ClusterProcesses, topic: str) -> None:
    """RECORDS records in every partition, through the brokers themselves."""
    with Producer(cluster.brokers[0].address, linger_ms=20) as producer:
        futures = [
            producer.send(topic, value(p, i), partition=p)
            for i in range(RECORDS)
            for p in range(PARTITIONS)
        ]
        producer.flush()
        for future in futures:
            future.get(timeout=DEADLINE_S)


def drain(consumer: Consumer, total: int) -> dict[int, list[tuple[int, bytes]]]:
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + DEADLINE_S
    while sum(map(len, got.values())) < total and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                got[record.partition].append((record.offset, record.value))
    assert consumer.poll(timeout_ms=300) == {}
    return got


def stored(cluster: ClusterProcesses, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of the topic, read from the brokers themselves."""
    with Consumer(
        bootstrap_servers=cluster.brokers[0].address, auto_offset_reset="earliest"
    ) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return drain(consumer, PARTITIONS * RECORDS)


def test_the_gateway_names_its_limit_when_a_stream_opens_and_when_it_refuses(
    limited: GatewayProcess,
) -> None:
    with grpc.insecure_channel(limited.address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        too_many = log_pb2.ListOffsetsRequest(
            partitions=[
                log_pb2.ListOffsetsPartition(topic="absent", partition=p, timestamp_ms=-1)
                for p in range(LIMIT + 1)
            ]
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListOffsets(too_many, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"limit of {LIMIT} (--max-partitions-per-request)" in refused.value.details()
        assert (MAX_PARTITIONS_METADATA_KEY, str(LIMIT)) in refused.value.trailing_metadata()
        fetch = stub.Fetch(
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
        assert (MAX_PARTITIONS_METADATA_KEY, str(LIMIT)) in fetch.initial_metadata()
        with pytest.raises(grpc.RpcError) as ended:
            list(fetch)
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"limit of {LIMIT} (--max-partitions-per-request)" in ended.value.details()
        assert (MAX_PARTITIONS_METADATA_KEY, str(LIMIT)) in ended.value.trailing_metadata()


def test_a_produce_request_over_the_limit_is_refused_whole_and_nothing_after_it_is_read(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    """What makes sending it again safe: the requests before it are
    answered, then the stream ends; none of it, nor of what followed it on
    the stream, is written."""
    topic = "limited-refused-produce"
    create(limited, topic)
    # Every partition's log open (the producer retries until it is).
    with Producer(cluster.brokers[0].address) as producer:
        for p in range(PARTITIONS):
            producer.send(topic, f"warm-{p}".encode(), partition=p)
        producer.flush()

    def request(correlation_id: int, partitions: range, tag: str) -> log_pb2.ProduceRequest:
        return log_pb2.ProduceRequest(
            correlation_id=correlation_id,
            acks=-1,
            timeout_ms=30_000,
            partitions=[
                log_pb2.PartitionRecords(
                    topic=topic, partition=p, records=encode_batch([f"{tag}-{p}".encode()])
                )
                for p in partitions
            ],
        )

    requests = [
        request(1, range(LIMIT), "before"),
        request(2, range(LIMIT + 1), "refused"),
        request(3, range(1), "after"),
    ]
    with grpc.insecure_channel(limited.address) as channel:
        call = log_pb2_grpc.LogStub(channel).Produce(iter(requests), timeout=DEADLINE_S)
        assert (MAX_PARTITIONS_METADATA_KEY, str(LIMIT)) in call.initial_metadata()
        answers = []
        with pytest.raises(grpc.RpcError) as ended:
            for answer in call:
                answers.append(answer)
    assert [a.correlation_id for a in answers] == [1]
    assert [p.error for p in answers[0].partitions if p.error.code] == []
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        f"names {LIMIT + 1} partitions, over the limit of {LIMIT} (--max-partitions-per-request)"
        in ended.value.details()
    )
    assert (MAX_PARTITIONS_METADATA_KEY, str(LIMIT)) in ended.value.trailing_metadata()
    with Consumer(
        bootstrap_servers=cluster.brokers[0].address, auto_offset_reset="earliest"
    ) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        got = drain(consumer, PARTITIONS + LIMIT)
    assert {p: [v for _, v in records] for p, records in got.items()} == {
        p: [f"warm-{p}".encode()] + ([f"before-{p}".encode()] if p < LIMIT else [])
        for p in range(PARTITIONS)
    }


def test_consumer_places_more_partitions_than_the_limit(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    partitions = create(limited, "limited-consumer")
    write_directly(cluster, "limited-consumer")
    # Positions given: the first FetchRequest names every partition, before
    # the client can know the limit (refused, then placed again split).
    with Consumer(bootstrap_servers=limited.address) as consumer:
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        assert drain(consumer, PARTITIONS * RECORDS) == expected()
        # Every partition sought back at once, the limit known: split at once.
        for tp in partitions:
            consumer.seek(tp, 0)
        assert drain(consumer, PARTITIONS * RECORDS) == expected()
    # No positions: every partition reset by one ListOffsets, then placed.
    with Consumer(bootstrap_servers=limited.address, auto_offset_reset="earliest") as consumer:
        consumer.assign(partitions)
        assert drain(consumer, PARTITIONS * RECORDS) == expected()
        consumer.seek_to_beginning()
        assert drain(consumer, PARTITIONS * RECORDS) == expected()


def test_async_consumer_places_more_partitions_than_the_limit(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    partitions = create(limited, "limited-async-consumer")
    write_directly(cluster, "limited-async-consumer")

    async def drain_async(consumer: AsyncConsumer) -> dict[int, list[tuple[int, bytes]]]:
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        async with asyncio.timeout(DEADLINE_S):
            while sum(map(len, got.values())) < PARTITIONS * RECORDS:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        got[record.partition].append((record.offset, record.value))
        assert await consumer.getmany(timeout_ms=300) == {}
        return got

    async def consume() -> list[dict[int, list[tuple[int, bytes]]]]:
        out = []
        async with AsyncConsumer(bootstrap_servers=limited.address) as consumer:
            consumer.assign(partitions)
            for tp in partitions:
                consumer.seek(tp, 0)
            out.append(await drain_async(consumer))
        async with AsyncConsumer(
            bootstrap_servers=limited.address, auto_offset_reset="earliest"
        ) as consumer:
            consumer.assign(partitions)
            out.append(await drain_async(consumer))
            await consumer.seek_to_beginning()
            out.append(await drain_async(consumer))
        return out

    assert asyncio.run(consume()) == [expected()] * 3


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_producer_sends_more_ready_partitions_than_the_limit(
    cluster: ClusterProcesses, limited: GatewayProcess, idempotent: bool
) -> None:
    topic = f"limited-producer-{idempotent}"
    create(limited, topic)
    # A long linger: every partition's batch is ready in the same drain.
    options = {"enable_idempotence": True, "acks": "all"} if idempotent else {}
    with Producer(limited.address, linger_ms=200, **options) as producer:
        for i in range(RECORDS):
            futures = [producer.send(topic, value(p, i), partition=p) for p in range(PARTITIONS)]
            producer.flush()
            offsets = [future.get(timeout=DEADLINE_S).offset for future in futures]
            assert offsets == [i] * PARTITIONS
    assert stored(cluster, topic) == expected()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_async_producer_sends_more_ready_partitions_than_the_limit(
    cluster: ClusterProcesses, limited: GatewayProcess, idempotent: bool
) -> None:
    topic = f"limited-async-producer-{idempotent}"
    create(limited, topic)

    async def produce() -> list[list[int]]:
        out = []
        options = {"enable_idempotence": True, "acks": "all"} if idempotent else {}
        async with AsyncProducer(limited.address, linger_ms=200, **options) as producer:
            for i in range(RECORDS):
                futures = [
                    await producer.send(topic, value(p, i), partition=p) for p in range(PARTITIONS)
                ]
                await producer.flush()
                async with asyncio.timeout(DEADLINE_S):
                    out.append([(await future).offset for future in futures])
        return out

    assert asyncio.run(produce()) == [[i] * PARTITIONS for i in range(RECORDS)]
    assert stored(cluster, topic) == expected()


def test_a_consumer_of_more_topics_than_the_limit_reads_them_all(
    cluster: ClusterProcesses, limited: GatewayProcess
) -> None:
    """The gateway takes at most LIMIT topics in one Metadata request too: the
    SDK's refresh of every topic it follows is asked in pieces (before, the
    refusal reached the application as InvalidRequestError)."""
    topics = [f"limited-many-{i:03d}" for i in range(LIMIT + 10)]
    with AdminClient(cluster.brokers[0].address) as admin:
        admin.create_topics([NewTopic(t, 1, 1) for t in topics])
    with Producer(cluster.brokers[0].address) as producer:
        futures = [producer.send(t, t.encode(), partition=0) for t in topics]
        producer.flush()
        for future in futures:
            future.get(timeout=DEADLINE_S)
    with Consumer(bootstrap_servers=limited.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(t, 0) for t in topics])
        got: dict[str, list[bytes]] = {}
        deadline = time.monotonic() + DEADLINE_S
        while sum(map(len, got.values())) < len(topics) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got.setdefault(tp.topic, []).extend(r.value for r in records)
    assert got == {t: [t.encode()] for t in topics}
