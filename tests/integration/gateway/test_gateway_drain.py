"""SIGTERM drains a gateway: what it forwarded is answered, its Produce and
Fetch streams end with UNAVAILABLE and `tidelog-error-code:
NOT_LEADER_OR_FOLLOWER` (a client in any language reads "go elsewhere"), and
SDK clients given two gateways, blocking and asyncio, carry on through the
other one, losing and duplicating nothing (the gateway is stateless)."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

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
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    NotLeaderOrFollowerError,
    TidelogError,
    error_from_rpc,
)
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import start_gateway

pytestmark = pytest.mark.timeout(120)


def assert_ended_for_another_gateway(ended: object, what_to_do: str) -> None:
    """The end of a stream the stopping gateway drained: the status of a
    broker's own drain, the retriable code in the trailer, read by the SDK's
    error mapping as "refresh metadata and go where the partition is"."""
    assert isinstance(ended, grpc.RpcError), ended
    assert ended.code() == grpc.StatusCode.UNAVAILABLE, ended
    assert ended.details() == f"the gateway is shutting down: {what_to_do}", ended
    trailing = ended.trailing_metadata() or ()
    trailer = [value for key, value in trailing if key == ERROR_CODE_METADATA_KEY]
    assert trailer == ["NOT_LEADER_OR_FOLLOWER"], ended.trailing_metadata()
    error = error_from_rpc(ended)
    assert isinstance(error, NotLeaderOrFollowerError) and error.retriable, error


def test_sigterm_drains_and_clients_move_to_another_gateway(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, _ = names
    first = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    second = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    try:
        bootstrap = f"{first.address},{second.address}"
        with AdminClient(bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 3, 3)])
        acked: list[bytes] = []
        failed: list[BaseException] = []
        read: list[bytes] = []
        stop_reading = threading.Event()

        def consume() -> None:
            with Consumer(bootstrap_servers=bootstrap) as consumer:
                tps = [TopicPartition(topic, p) for p in range(3)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, 0)
                while not stop_reading.is_set():
                    for records in consumer.poll(timeout_ms=200).values():
                        read.extend(r.value or b"" for r in records)

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:
            for i in range(4000):
                value = b"%d" % i
                future = producer.send(topic, value, key=value)
                future.add_callback(lambda _md, v=value: acked.append(v))
                future.add_errback(failed.append)
                if i == 1500:
                    # Everything so far went through the first gateway (it
                    # answered Metadata first): drain it mid-stream.
                    assert first.stop() == 0, first.log_tail()
                time.sleep(0.0005)
            producer.flush()
        deadline = time.monotonic() + 60
        while len(read) < len(acked) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop_reading.set()
        reader.join(30)
        assert failed == []
        assert sorted(acked, key=int) == [b"%d" % i for i in range(4000)]
        assert sorted(read, key=int) == sorted(acked, key=int), "lost or duplicated"
    finally:
        first.kill()
        second.stop()


def test_a_produce_request_in_flight_at_sigterm_is_answered_then_unavailable(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, _ = names
    gateway = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
        (description,) = admin.describe_topics([topic])
    (partition,) = description.partitions
    follower = next(b for b in partition.replicas if b != partition.leader)
    frozen = cluster.brokers[follower].pid
    requests: queue.Queue[log_pb2.ProduceRequest | None] = queue.Queue()

    def request_stream() -> Iterator[log_pb2.ProduceRequest]:
        while (request := requests.get()) is not None:
            yield request

    channel = grpc.insecure_channel(gateway.address)
    try:
        answers = log_pb2_grpc.LogStub(channel).Produce(request_stream(), timeout=60)
        # A frozen follower holds the acks=all answer (until it leaves the
        # ISR or the request times out): the request is in flight.
        os.kill(frozen, signal.SIGSTOP)
        requests.put(
            log_pb2.ProduceRequest(
                correlation_id=1,
                acks=-1,
                timeout_ms=4000,
                partitions=[
                    log_pb2.PartitionRecords(topic=topic, records=encode_batch([b"in flight"]))
                ],
            )
        )
        received: list[tuple[float, object]] = []

        def read_answers() -> None:
            try:
                for answer in answers:
                    received.append((time.monotonic(), answer))
            except grpc.RpcError as exc:
                received.append((time.monotonic(), exc))

        reader = threading.Thread(target=read_answers, daemon=True)
        reader.start()
        time.sleep(0.5)
        sigterm_at = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        reader.join(30)
        (answered_at, answer), (_, ended) = received
        # Answered after the SIGTERM (it was in flight then), then the end.
        assert answered_at > sigterm_at
        assert isinstance(answer, log_pb2.ProduceResponse) and answer.correlation_id == 1
        assert_ended_for_another_gateway(ended, "send unanswered requests again")
        assert gateway.proc.wait(30) == 0
    finally:
        os.kill(frozen, signal.SIGCONT)
        requests.put(None)
        channel.close()
        gateway.kill()


def test_a_group_member_carries_on_through_another_gateway(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, group = names
    first = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    second = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    try:
        bootstrap = f"{first.address},{second.address}"
        with AdminClient(bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 3)])
        with (
            Producer(bootstrap, linger_ms=2) as producer,
            Consumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=6000,
            ) as consumer,
        ):
            seen: set[bytes] = set()

            def consume_until(count: int) -> None:
                deadline = time.monotonic() + 60
                while len(seen) < count and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=200).values():
                        seen.update(r.value or b"" for r in records)
                consumer.commit()

            for i in range(100):
                producer.send(topic, b"%d" % i)
            producer.flush()
            consume_until(100)
            # The membership and the commits went through the first gateway
            # (the first to answer); it goes away.
            assert first.stop() == 0
            for i in range(100, 200):
                producer.send(topic, b"%d" % i)
            producer.flush()
            consume_until(200)
        assert seen == {b"%d" % i for i in range(200)}
        with AdminClient(second.address) as admin:
            offsets = admin.list_consumer_group_offsets(group)
        assert sum(o.offset for o in offsets.values()) == 200
    finally:
        first.kill()
        second.stop()


def test_a_fetch_stream_at_sigterm_ends_with_a_code_to_fetch_elsewhere(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, _ = names
    gateway = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()

    def request_stream() -> Iterator[log_pb2.FetchRequest]:
        while (request := requests.get()) is not None:
            yield request

    channel = grpc.insecure_channel(gateway.address)
    try:
        with AdminClient(gateway.address) as admin:
            admin.create_topics([NewTopic(topic, 1, 3)])
        with Producer(gateway.address, acks="all") as producer:
            producer.send(topic, b"before").get(timeout=30)
        answers = log_pb2_grpc.LogStub(channel).Fetch(request_stream(), timeout=60)
        requests.put(
            log_pb2.FetchRequest(
                positions=[log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=0)],
                credit_bytes=1 << 20,
            )
        )
        # The stream reads through the gateway, then waits at the end of
        # the log (long-polling) when the gateway is stopped.
        first = next(answers)
        assert [p.high_watermark for p in first.partitions] == [1], first
        gateway.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as raised:
            next(answers)
        assert_ended_for_another_gateway(raised.value, "fetch again from your positions")
        assert gateway.proc.wait(30) == 0
    finally:
        requests.put(None)
        channel.close()
        gateway.kill()


def test_asyncio_clients_move_to_another_gateway(
    cluster: ClusterProcesses, tmp_path: Path, names: tuple[str, str]
) -> None:
    topic, _ = names
    first = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    second = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    count = 3000
    bootstrap = f"{first.address},{second.address}"

    async def scenario() -> tuple[list[bytes], list[bytes], list[BaseException]]:
        acked: list[bytes] = []
        failed: list[BaseException] = []
        read: list[bytes] = []
        stop_reading = asyncio.Event()

        async def consume() -> None:
            async with AsyncConsumer(bootstrap_servers=bootstrap) as consumer:
                tps = [TopicPartition(topic, p) for p in range(3)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, 0)
                while not stop_reading.is_set():
                    batches = await consumer.getmany(timeout_ms=200)
                    for records in batches.values():
                        read.extend(r.value or b"" for r in records)

        async def delivered(value: bytes, future: asyncio.Future[object]) -> None:
            try:
                await future
            except TidelogError as exc:
                failed.append(exc)
            else:
                acked.append(value)

        reader = asyncio.ensure_future(consume())
        deliveries = []
        # Idempotent (acks=all): a batch retried through the second gateway
        # after the first wrote it is not written twice.
        async with AsyncProducer(
            bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000
        ) as producer:
            for i in range(count):
                value = b"%d" % i
                future = await producer.send(topic, value, key=value)
                deliveries.append(asyncio.ensure_future(delivered(value, future)))
                if i == count // 3:
                    # Everything so far went through the first gateway (it
                    # answered Metadata first): drain it mid-stream.
                    assert await asyncio.to_thread(first.stop) == 0, first.log_tail()
                await asyncio.sleep(0.0005)
            await producer.flush()
        await asyncio.gather(*deliveries)
        deadline = time.monotonic() + 60
        while len(read) < len(acked) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop_reading.set()
        await asyncio.wait_for(reader, 30)
        return acked, read, failed

    try:
        with AdminClient(bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 3, 3)])
        acked, read, failed = asyncio.run(scenario())
        assert failed == []
        assert sorted(acked, key=int) == [b"%d" % i for i in range(count)]
        assert sorted(read, key=int) == sorted(acked, key=int), "lost or duplicated"
    finally:
        first.kill()
        second.stop()
