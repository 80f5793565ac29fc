"""InitProducerId in cluster mode: a coordinator allocates from etcd, and a
broker forwards the call to it."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, NewTopic
from tidelog.records import encode_batch
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.cluster import start_cluster
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(90)


def init(address: str, key: str = "") -> tuple[int, int]:
    with grpc.insecure_channel(address) as channel:
        reply = cluster_pb2_grpc.ClusterStub(channel).InitProducerId(
            cluster_pb2.InitProducerIdRequest(producer_key=key), timeout=10
        )
    return reply.producer_id, reply.producer_epoch


def test_ids_from_the_coordinator_directly_and_through_a_broker(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    cluster = start_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1)
    try:
        coordinator = cluster.coordinators[0].address
        broker = cluster.brokers[0].address
        assert init(coordinator) == (0, 0)
        assert init(broker) == (1, 0)  # forwarded: the same counter in etcd
        keyed = init(coordinator, "billing writer/1")
        assert keyed == (2, 0)
        # The same key: the same id, one epoch up (fencing the older instance).
        assert init(broker, "billing writer/1") == (2, 1)
        assert init(coordinator, "billing writer/1") == (2, 2)
        assert init(broker) == (3, 0)
    finally:
        cluster.stop()


def _produce(address: str, topic: str, data: bytes) -> log_pb2.PartitionProduceResult:
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=1,
        partitions=[log_pb2.PartitionRecords(topic=topic, partition=0, records=data)],
    )
    with grpc.insecure_channel(address) as channel:
        (response,) = list(log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=10))
    return response.partitions[0]


def _batch(pid: int, epoch: int, seq: int) -> bytes:
    return encode_batch(
        [b"%d-%d" % (epoch, seq)], producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )


def test_a_broker_accepts_only_epochs_the_coordinators_handed_out(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # Issue 16 item 5, cluster mode: the broker learns epochs from etcd.
    cluster = start_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=1)
    try:
        broker = cluster.brokers[0].address
        with AdminClient(broker) as admin:
            admin.create_topics([NewTopic("epochs", num_partitions=1)])
        deadline = time.monotonic() + 20
        while True:  # until the broker has taken up its leadership
            first = _produce(broker, "epochs", encode_batch([b"plain"]))
            if not first.HasField("error") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not first.HasField("error"), first
        plain_pid, _ = init(broker)
        assert _produce(broker, "epochs", _batch(plain_pid, 0, 0)).base_offset == 1
        forged = _produce(broker, "epochs", _batch(plain_pid, 1, 0))
        assert forged.error.code == common_pb2.INVALID_PRODUCER_EPOCH, forged
        assert "epoch 1 was never handed out" in forged.error.message
        assert _produce(broker, "epochs", _batch(plain_pid, 0, 1)).base_offset == 2
        # A keyed producer: its next epoch, handed out by a coordinator
        # directly, is accepted by the broker at once (it re-reads etcd).
        coordinator = cluster.coordinators[0].address
        pid, epoch = init(coordinator, "epoch-writer")
        assert _produce(broker, "epochs", _batch(pid, epoch, 0)).base_offset == 3
        early = _produce(broker, "epochs", _batch(pid, epoch + 1, 0))
        assert early.error.code == common_pb2.INVALID_PRODUCER_EPOCH, early
        assert init(coordinator, "epoch-writer") == (pid, epoch + 1)
        granted = _produce(broker, "epochs", _batch(pid, epoch + 1, 0))
        assert not granted.HasField("error") and granted.base_offset == 4, granted
    finally:
        cluster.stop()
