"""Partition counts bounded by what brokers can hold (issue 16, item 7).

Brokers start with a low open-file limit (RLIMIT_NOFILE, set before exec),
report the partition replicas it allows in their etcd registration, and the
coordinator refuses a topic beyond it with INVALID_PARTITIONS naming the
limit; the brokers keep serving the topics they have. A deleted topic's
directories leave every broker, also one that was down during the delete.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from tidelog import records
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.helpers import etcd_client
from tests.support.cluster import ClusterProcesses
from tests.support.etcd import EtcdProcess
from tests.support.processes import BrokerProcess, start_broker

pytestmark = pytest.mark.timeout(120)

OPEN_FILE_LIMIT = 300
# resources.partition_capacity: (limit - 128 reserved) // 4 per partition.
CAPACITY = (OPEN_FILE_LIMIT - 128) // 4


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def create(address: str, name: str, partitions: int, rf: int) -> admin_pb2.CreateTopicResult:
    with grpc.insecure_channel(address) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[admin_pb2.NewTopic(name=name, partitions=partitions, replication_factor=rf)]
            ),
            timeout=30,
        )
    return reply.topics[0]


def delete(address: str, name: str) -> None:
    with grpc.insecure_channel(address) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).DeleteTopics(
            admin_pb2.DeleteTopicsRequest(names=[name]), timeout=30
        )
    assert not reply.topics[0].HasField("error"), reply


def produce_to_leader(brokers: list[BrokerProcess], topic: str, partition: int) -> bool:
    """One batch to the partition's leader; True once acknowledged."""
    for broker in brokers:
        if broker.proc is None:
            continue
        with grpc.insecure_channel(broker.address) as channel:
            request = log_pb2.ProduceRequest(
                acks=1,
                partitions=[
                    log_pb2.PartitionRecords(
                        topic=topic, partition=partition, records=records.encode_batch([b"x"])
                    )
                ],
            )
            try:
                (response,) = list(
                    log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=10)
                )
            except grpc.RpcError:
                continue
            if not response.partitions[0].HasField("error"):
                return True
    return False


def topic_dirs(broker: BrokerProcess, topic: str) -> list[Path]:
    return sorted(broker.data_dir.glob(f"{topic}-*"))


def registrations(endpoint: str, prefix: str) -> dict[int, dict[str, object]]:
    async def read() -> dict[int, dict[str, object]]:
        async with etcd_client(endpoint) as client:
            listing = await client.get_prefix(f"{prefix}/brokers/ids/".encode())
            return {int(json.loads(kv.value)["id"]): json.loads(kv.value) for kv in listing}

    return asyncio.run(read())


def test_topics_beyond_the_brokers_limits_are_refused_and_deleted_topics_leave_disk(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator, tmp_path: Path
) -> None:
    coordinator = coordinators()
    cluster = ClusterProcesses(etcd, prefix, coordinators=[coordinator])
    try:
        for broker_id in (0, 1):
            cluster.brokers.append(
                start_broker(
                    tmp_path / f"broker-{broker_id}",
                    extra_args=cluster.broker_args(broker_id),
                    broker_id=broker_id,
                    open_file_limit=OPEN_FILE_LIMIT,
                )
            )
        cluster.wait_registered(2)
        reported = registrations(etcd.endpoint, prefix)
        assert {b: (r["max_partitions"], r["open_file_limit"]) for b, r in reported.items()} == {
            0: (CAPACITY, OPEN_FILE_LIMIT),
            1: (CAPACITY, OPEN_FILE_LIMIT),
        }

        kept = CAPACITY - 10
        assert not create(coordinator.address, "kept", kept, 2).HasField("error")
        # Every partition: the brokers host a new topic's partitions one by
        # one as their states arrive, without holding their event loops.
        wait_until(
            lambda: all(produce_to_leader(cluster.brokers, "kept", p) for p in range(kept)),
            "every partition of kept to take writes",
        )

        # 20 more partitions on each broker: past its limit.
        refused = create(coordinator.address, "beyond", 20, 2)
        assert refused.error.code == common_pb2.INVALID_PARTITIONS, refused
        assert f"over its limit of {CAPACITY}" in refused.error.message
        assert "max.partitions" in refused.error.message
        assert all(topic_dirs(b, "beyond") == [] for b in cluster.brokers)
        # What still fits is created.
        assert not create(coordinator.address, "fits", 10, 2).HasField("error")
        # The brokers keep serving what they host.
        assert produce_to_leader(cluster.brokers, "kept", kept - 1)
        wait_until(lambda: produce_to_leader(cluster.brokers, "fits", 0), "fits-0 to take writes")

        # Deleting a topic removes its directories from every broker...
        assert len(topic_dirs(cluster.brokers[0], "kept")) == kept
        delete(coordinator.address, "kept")
        wait_until(
            lambda: all(topic_dirs(b, "kept") == [] for b in cluster.brokers),
            "kept's directories to go",
        )
        # ...also from a broker that was down during the delete, when it starts.
        down = cluster.brokers[1]
        down.stop()
        assert topic_dirs(down, "fits")
        delete(coordinator.address, "fits")
        wait_until(lambda: topic_dirs(cluster.brokers[0], "fits") == [], "fits to go from 0")
        down.spawn()
        wait_until(lambda: topic_dirs(down, "fits") == [], "fits to go from the restarted broker")
    finally:
        cluster.stop()


def test_a_standalone_broker_refuses_partitions_beyond_its_limit(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", open_file_limit=OPEN_FILE_LIMIT)
    try:
        assert not create(broker.address, "kept", CAPACITY - 5, 0).HasField("error")
        refused = create(broker.address, "beyond", 10, 0)
        assert refused.error.code == common_pb2.INVALID_PARTITIONS, refused
        assert f"at most {CAPACITY}" in refused.error.message
        assert f"open-file limit of {OPEN_FILE_LIMIT}" in refused.error.message
        assert produce_to_leader([broker], "kept", 0)
        assert broker.proc is not None and broker.proc.poll() is None
    finally:
        broker.stop()
