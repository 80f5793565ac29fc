"""DescribeTopics of a partition no replica can lead: its only in-sync
replica's log cannot be opened, so the controller leaves it leaderless with
that replica in its ISR, until its broker restarts with the log repaired.

Every service that answers DescribeTopics (a broker, the gateway, the
coordinator called directly) said "has no leader right now ...; retry", a
retriable NOT_LEADER_OR_FOLLOWER, and `tidelog topics describe` printed it
as "? = unknown": an operator waited for an election that never came. It
now says the partition is offline (STORAGE_ERROR), names the replica and
its broker, and what brings it back (fix the disk and restart the broker,
the runbook); doing that does.

Real etcd, a real coordinator, two real brokers and a gateway as processes;
the log goes offline through the real path (a damaged `reset-offset` file
the broker will not guess around, read as it opens the log at start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.errors import StorageError
from tidelog.types import PartitionInfo
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from tidelog_broker.storage import files

from tests.support.cluster import PRODUCE_TIMEOUT_S, running_cluster
from tests.support.etcd import EtcdProcess
from tests.support.polling import read_until

pytestmark = pytest.mark.timeout(180)

TOPIC = "lonely"
#: Generous: a cluster settling on a loaded 2-core machine.
SETTLE_S = 60.0
SAID = (
    f"{TOPIC}-1 is offline: no in-sync replica can serve (broker 1: its log is offline) and no "
    "other replica can either, so it has no leader until one of them is back: fix the disk of "
    "broker 1 and restart it (see docs/operations.md, \"A partition's log goes offline "
    '(STORAGE_ERROR)"); its log figures are unknown'
)


def _partition_1(entry: str) -> PartitionInfo:
    with AdminClient(bootstrap_servers=entry) as admin:
        (topic,) = admin.describe_topics([TOPIC])
    return topic.partitions[1]


def _raw_partition_1(address: str) -> admin_pb2.PartitionDescription:
    """Partition 1 as the service at `address` describes it over gRPC (a
    coordinator completes the figures itself for a client's call)."""
    with grpc.insecure_channel(address) as channel:
        answer = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=SETTLE_S
        )
    return answer.topics[0].partitions[1]


def _describe_cli(entry: str, *flags: str) -> str:
    shown = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "topics", "describe", TOPIC, *flags,
         "--bootstrap-server", entry],
        capture_output=True, text=True, timeout=SETTLE_S,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_a_partition_whose_only_in_sync_replica_s_log_is_offline_is_described_offline(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    with running_cluster(tmp_path, etcd=etcd, prefix=prefix, brokers=2, gateway_args=[]) as cluster:
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [0], 1: [1]})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for partition in (0, 1):
                for _ in range(3):
                    producer.send(TOPIC, b"v", partition=partition).get(PRODUCE_TIMEOUT_S)
        entry = cluster.brokers[0].address
        broker1 = cluster.brokers[1]
        broker1.stop()
        damaged = broker1.data_dir / files.log_dir_name(TOPIC, 1) / files.RESET_OFFSET_FILE
        damaged.write_text("not a checkpoint\n")
        broker1.spawn()
        # Broker 1 is back, registered, listing the log offline; the
        # controller keeps the partition leaderless with it in the ISR.
        read_until(
            lambda: _partition_1(entry),
            lambda p: (
                (p.leader, p.isr, p.offline_replicas) == (-1, [1], [1])
                and p.error is not None
                and "is offline" in p.error.message
            ),
            "partition 1 leaderless, broker 1's log offline",
            SETTLE_S,
        )
        services = [entry, cluster.gateways[0].address, cluster.coordinators[0].address]
        for address in services:
            p1 = _raw_partition_1(address)
            assert p1.leader_id == -1 and list(p1.offline_replicas) == [1], (address, p1)
            assert p1.error.code == common_pb2.STORAGE_ERROR, (address, p1)
            assert p1.error.message == SAID, (address, p1.error.message)
            figures = (p1.log_start_offset, p1.log_end_offset, p1.high_watermark)
            assert (*figures, p1.size_bytes, p1.segment_count) == (-1,) * 5, (address, p1)
        p1_sdk = _partition_1(cluster.gateways[0].address)
        assert isinstance(p1_sdk.error, StorageError) and p1_sdk.error.message == SAID
        # The CLI: offline, and what to do, under the table; also among the
        # unavailable partitions.
        for flags in ((), ("--unavailable-partitions",)):
            shown = _describe_cli(entry, *flags)
            assert f"  partition 1: ? = offline: {SAID}\n" in shown, shown
            # No leader: none in its column (kafka-topics' "Leader: none"), not -1.
            (row,) = [line.split() for line in shown.splitlines() if line.split()[:1] == ["1"]]
            assert row[1:4] == ["none", "1", "1"], shown
            assert "retry" not in shown, shown

        # The remedy it names: the disk fixed, the broker restarted.
        broker1.stop()
        damaged.unlink()
        broker1.spawn()
        back = read_until(
            lambda: _partition_1(entry),
            lambda p: p.leader == 1 and p.error is None,
            "broker 1 leads partition 1 again",
            SETTLE_S,
        )
        assert (back.log_end_offset, back.offline_replicas) == (3, [])
