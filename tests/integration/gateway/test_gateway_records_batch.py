"""Records.Produce's batch path (each request's records grouped by topic and
partition and queued as columns, `AsyncProducer.send_batch`) against real
processes: every record answered in request order at the partition and
offset where it can be read back, keys in their murmur2 partition, several
topics and refused records in one request, and, with ACKS_ALL, batches the
gateway's producer sends again after a lost answer written once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, TopicPartition
from tidelog.partitioner import partition_for_key
from tidelog.v1 import common_pb2, records_pb2, records_pb2_grpc

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = pytest.mark.timeout(180)


def read_all(address: str, topic: str, partitions: int) -> dict[tuple[int, int], tuple]:
    """(partition, offset) -> (key, value, headers, timestamp) of every record."""
    out: dict[tuple[int, int], tuple] = {}
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=address, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while not all(consumer.position(tp) >= ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic back"
            for batch in consumer.poll(timeout_ms=500, max_records=100_000).values():
                for r in batch:
                    out[(r.partition, r.offset)] = (r.key, r.value, list(r.headers), r.timestamp)
    return out


def test_mixed_topics_keys_partitions_and_refusals_in_one_request(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    other = f"{topic}-other"
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 3), NewTopic(other, 2)])
    records: list[records_pb2.ProduceRecord] = []
    for i in range(600):
        kind = i % 6
        if kind == 0:  # keyed, with a header
            records.append(
                records_pb2.ProduceRecord(
                    topic=topic,
                    key=b"key-%d" % i,
                    value=b"v%d" % i,
                    headers=[records_pb2.RecordHeader(key="i", value=b"%d" % i)],
                )
            )
        elif kind == 1:  # keyless, the other topic, its own timestamp
            records.append(
                records_pb2.ProduceRecord(topic=other, value=b"v%d" % i, timestamp_ms=1_000 + i)
            )
        elif kind == 2:  # an explicit partition wins over the key
            records.append(
                records_pb2.ProduceRecord(
                    topic=topic, partition=1, key_text=f"k{i}", value_text=f"v{i}"
                )
            )
        elif kind == 3:  # a partition that does not exist: refused alone
            records.append(records_pb2.ProduceRecord(topic=topic, partition=7, value=b"v%d" % i))
        elif kind == 4:  # keyless, null value
            records.append(records_pb2.ProduceRecord(topic=topic))
        else:  # a topic that does not exist: refused alone
            records.append(records_pb2.ProduceRecord(topic=f"{topic}-missing", value=b"x"))
    request = records_pb2.RecordsProduceRequest(
        correlation_id=9, acks=records_pb2.ACKS_ALL, records=records
    )
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        (answer,) = list(stub.Produce(iter([request]), timeout=60))
    assert answer.correlation_id == 9
    assert len(answer.results) == len(records)
    stored = {
        topic: read_all(gateway.address, topic, 3),
        other: read_all(gateway.address, other, 2),
    }
    written: Counter[str] = Counter()
    for i, (record, result) in enumerate(zip(records, answer.results, strict=True)):
        kind = i % 6
        assert result.topic == record.topic
        if kind in (3, 5):
            assert result.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, (i, result)
            assert result.offset == -1
            continue
        assert not result.HasField("error"), (i, result)
        key, value, headers, timestamp = stored[record.topic][(result.partition, result.offset)]
        assert timestamp == result.timestamp_ms
        written[record.topic] += 1
        if kind == 0:
            assert result.partition == partition_for_key(b"key-%d" % i, 3)
            assert (key, value, headers) == (b"key-%d" % i, b"v%d" % i, [("i", b"%d" % i)])
        elif kind == 1:
            assert (key, value, timestamp) == (None, b"v%d" % i, 1_000 + i)
        elif kind == 2:
            assert result.partition == 1
            assert (key, value) == (f"k{i}".encode(), f"v{i}".encode())
        else:
            assert (key, value) == (None, None)
    # Nothing else was written: each stored record is one that was answered.
    assert {t: len(s) for t, s in stored.items()} == dict(written)


def test_plain_keyed_records_land_in_their_murmur2_partition_in_order(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    """A request of plain keyed records (the fast path, `_plain_records`):
    each record in its key's murmur2 partition, the records of a partition
    in request order, all answered in request order."""
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 3)])
    requests = [
        records_pb2.RecordsProduceRequest(
            correlation_id=r,
            records=[
                records_pb2.ProduceRecord(topic=topic, key=b"user-%d" % (i % 37), value=b"%d" % i)
                for i in range(r * 400, (r + 1) * 400)
            ],
        )
        for r in range(3)
    ]
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        answers = list(stub.Produce(iter(requests), timeout=60))
    assert [a.correlation_id for a in answers] == [0, 1, 2]
    results = [r for answer in answers for r in answer.results]
    assert len(results) == 1200
    stored = read_all(gateway.address, topic, 3)
    assert len(stored) == 1200
    last: dict[int, int] = {}
    for i, result in enumerate(results):
        key = b"user-%d" % (i % 37)
        assert not result.HasField("error"), result
        assert result.partition == partition_for_key(key, 3)
        assert stored[(result.partition, result.offset)][:2] == (key, b"%d" % i)
        assert result.offset > last.get(result.partition, -1)  # request order kept
        last[result.partition] = result.offset


# ---------------------------------------------------------------- retries


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[ClusterProcesses, GatewayProcess]]:
    """One broker this test may pause, and a gateway whose producer gives up
    waiting for an answer after 500 ms (and sends the batch again)."""
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        cluster = start_cluster(tmp_path / "cluster", etcd=etcd, brokers=1)
        try:
            gateway = start_gateway(
                etcd.endpoint,
                tmp_path / "gateway",
                prefix=cluster.prefix,
                extra_args=["--producer-request-timeout-ms", "500"],
            )
            try:
                yield cluster, gateway
            finally:
                gateway.stop()
        finally:
            cluster.stop()
    finally:
        etcd.stop()


def produce_while_paused(
    cluster: ClusterProcesses, gateway: GatewayProcess, topic: str, acks: int, count: int
) -> list[records_pb2.RecordsProduceResponse]:
    """Produce `count` records (values "%08d") in requests of 500 through the
    gateway, SIGSTOPping the broker for 1.5 s a third of the way in."""
    per_request = 500
    sent = threading.Event()
    progress = [0]

    def requests() -> Iterator[records_pb2.RecordsProduceRequest]:
        for r in range(count // per_request):
            yield records_pb2.RecordsProduceRequest(
                correlation_id=r,
                acks=acks,
                records=[
                    records_pb2.ProduceRecord(topic=topic, value=b"%08d" % i)
                    for i in range(r * per_request, (r + 1) * per_request)
                ],
            )
            progress[0] = (r + 1) * per_request
            time.sleep(0.01)  # spread the requests over the pause
        sent.set()

    broker = cluster.brokers[0]

    def pause() -> None:
        while progress[0] < count // 3 and not sent.is_set():
            time.sleep(0.005)
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            time.sleep(1.5)
        finally:
            os.kill(broker.pid, signal.SIGCONT)

    pauser = threading.Thread(target=pause)
    pauser.start()
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = records_pb2_grpc.RecordsStub(channel)
            return list(stub.Produce(requests(), timeout=120))
    finally:
        pauser.join()


@pytest.mark.parametrize(
    ("acks", "idempotent"), [(records_pb2.ACKS_ALL, True), (records_pb2.ACKS_LEADER, False)]
)
def test_batches_sent_again_after_a_lost_answer_are_written_once_with_acks_all(
    own_cluster: tuple[ClusterProcesses, GatewayProcess], acks: int, idempotent: bool
) -> None:
    """The broker is paused longer than the gateway producer's request
    timeout: the requests in flight are given up and their batches sent
    again, and the broker appends the first copies when it resumes. With
    ACKS_ALL (idempotent) the copies are recognized: every record once, at
    the offset it was answered with. ACKS_LEADER is the control that shows
    the fault does make the producer send batches twice."""
    cluster, gateway = own_cluster
    topic = f"retries-{acks}"
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    count = 15_000
    answers = produce_while_paused(cluster, gateway, topic, acks, count)
    results = [r for answer in answers for r in answer.results]
    assert len(results) == count
    assert all(not r.HasField("error") for r in results), next(
        r for r in results if r.HasField("error")
    )
    stored = read_all(gateway.address, topic, 1)
    values = Counter(value for _, value, _, _ in stored.values())
    twice = sum(1 for n in values.values() if n > 1)
    assert len(values) == count
    if idempotent:
        assert twice == 0
        assert len(stored) == count
        for i, result in enumerate(results):
            assert stored[(0, result.offset)][1] == b"%08d" % i
    else:
        assert twice > 0, "no batch was sent twice: the pause missed the requests"
