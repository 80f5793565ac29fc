"""SIGTERM drains a broker of a replicated cluster: its Log Produce and
Fetch streams end with UNAVAILABLE and `tidelog-error-code:
NOT_LEADER_OR_FOLLOWER` (a client in any language reads "this partition is
led elsewhere now"), after answering what they took; and SDK clients
carry on with the partitions' new leaders, losing and duplicating nothing,
with no error reaching the application.

Before, the streams ended with gRPC's bare "Cancelling all calls" after the
grace, and the broker left the cluster before draining them, so acks=all
requests it had appended were never answered (a follower may not fetch from
a broker without a live registration)."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import ERROR_CODE_METADATA_KEY, NotLeaderOrFollowerError, error_from_rpc
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.processes import BrokerProcess

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

#: Generous: bounds a broken test only.
DEADLINE_S = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcesses]:
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        processes = start_cluster(tmp_path / "cluster", etcd=etcd, brokers=3)
        try:
            yield processes
        finally:
            processes.stop()
    finally:
        etcd.stop()


def leader_of(cluster: ClusterProcesses, topic: str, partition: int = 0) -> BrokerProcess:
    with AdminClient(cluster.bootstrap) as admin:
        (description,) = admin.describe_topics([topic])
    leader = description.partitions[partition].leader
    return next(b for b in cluster.brokers if b.broker_id == leader)


def assert_ended_for_another_leader(ended: object, broker_id: int, what_to_do: str) -> None:
    """The end of a stream the stopping broker drained: UNAVAILABLE, as
    gRPC's own cancel, and the retriable code in the trailer, which the
    SDK reads as "refresh metadata and go where the partition is"."""
    assert isinstance(ended, grpc.RpcError), ended
    assert ended.code() == grpc.StatusCode.UNAVAILABLE, ended
    assert ended.details() == f"broker {broker_id} is shutting down: {what_to_do}", ended
    trailing = ended.trailing_metadata() or ()
    trailer = [value for key, value in trailing if key == ERROR_CODE_METADATA_KEY]
    assert trailer == ["NOT_LEADER_OR_FOLLOWER"], ended.trailing_metadata()
    error = error_from_rpc(ended)
    assert isinstance(error, NotLeaderOrFollowerError) and error.retriable, error


def produce_request(topic: str, n: int) -> log_pb2.ProduceRequest:
    return log_pb2.ProduceRequest(
        correlation_id=n,
        acks=-1,
        partitions=[log_pb2.PartitionRecords(topic=topic, records=encode_batch([b"%d" % n]))],
    )


def test_a_produce_stream_at_sigterm_is_answered_then_ends_with_a_code(
    cluster: ClusterProcesses,
) -> None:
    topic = "drained-produce"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    leader = leader_of(cluster, topic)
    requests: queue.Queue[log_pb2.ProduceRequest | None] = queue.Queue()

    def request_stream() -> Iterator[log_pb2.ProduceRequest]:
        while (request := requests.get()) is not None:
            yield request

    channel = grpc.insecure_channel(leader.address)
    try:
        answers = log_pb2_grpc.LogStub(channel).Produce(request_stream(), timeout=DEADLINE_S)
        for n in range(3):
            requests.put(produce_request(topic, n))
        taken = [next(answers) for _ in range(3)]
        assert [a.correlation_id for a in taken] == [0, 1, 2]
        assert all(not p.error.code for a in taken for p in a.partitions), taken
        leader.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as raised:
            next(answers)
        assert_ended_for_another_leader(
            raised.value, leader.broker_id, "send unanswered requests again"
        )
        assert leader.proc.wait(DEADLINE_S) == 0
    finally:
        requests.put(None)
        channel.close()


def test_a_fetch_stream_at_sigterm_ends_with_a_code(cluster: ClusterProcesses) -> None:
    topic = "drained-fetch"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(topic, b"before").get(timeout=DEADLINE_S)
    leader = leader_of(cluster, topic)
    requests: queue.Queue[log_pb2.FetchRequest | None] = queue.Queue()

    def request_stream() -> Iterator[log_pb2.FetchRequest]:
        while (request := requests.get()) is not None:
            yield request

    channel = grpc.insecure_channel(leader.address)
    try:
        answers = log_pb2_grpc.LogStub(channel).Fetch(request_stream(), timeout=DEADLINE_S)
        requests.put(
            log_pb2.FetchRequest(
                positions=[log_pb2.FetchPosition(topic=topic, partition=0, fetch_offset=0)],
                credit_bytes=1 << 20,
            )
        )
        # The stream reads the record, then waits at the end of the log
        # (long-polling) when the broker is stopped.
        first = next(answers)
        assert [p.high_watermark for p in first.partitions] == [1], first
        leader.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as raised:
            next(answers)
        assert_ended_for_another_leader(
            raised.value, leader.broker_id, "fetch again from your positions"
        )
        assert leader.proc.wait(DEADLINE_S) == 0
    finally:
        requests.put(None)
        channel.close()


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_clients_carry_on_through_a_leader_drain(
    cluster: ClusterProcesses, idempotent: bool
) -> None:
    topic = "rolled"
    count = 4000
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, 3, {"min.insync.replicas": "2"})])
    drained = leader_of(cluster, topic)
    acked: list[bytes] = []
    failed: list[BaseException] = []
    read: list[bytes] = []
    stop_reading = threading.Event()

    def consume() -> None:
        with Consumer(bootstrap_servers=cluster.bootstrap) as consumer:
            tps = [TopicPartition(topic, p) for p in range(3)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            while not stop_reading.is_set():
                for records in consumer.poll(timeout_ms=200).values():
                    read.extend(r.value or b"" for r in records)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    with Producer(
        cluster.bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=2,
        delivery_timeout_ms=90_000,
    ) as producer:
        for i in range(count):
            value = b"%d" % i
            future = producer.send(topic, value, key=value)
            future.add_callback(lambda _md, v=value: acked.append(v))
            future.add_errback(failed.append)
            if i == count // 3:
                # Mid-stream: the producer and the consumer have streams
                # open to the leader of partition 0 (and of others).
                assert drained.stop() == 0, drained.log_tail()
            time.sleep(0.0005)
        producer.flush()
    deadline = time.monotonic() + DEADLINE_S
    while len(read) < len(acked) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_reading.set()
    reader.join(30)
    assert failed == []
    assert sorted(acked, key=int) == [b"%d" % i for i in range(count)]
    assert sorted(read, key=int) == sorted(acked, key=int), "lost or duplicated"
