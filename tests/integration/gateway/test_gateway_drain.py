"""SIGTERM drains a gateway: what it forwarded is answered, its streams end
with UNAVAILABLE, and SDK clients given two gateways carry on through the
other one, losing and duplicating nothing (the gateway is stateless)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import start_gateway

pytestmark = pytest.mark.timeout(120)


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
        assert isinstance(ended, grpc.RpcError)
        assert ended.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (ended.details() or "")
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
