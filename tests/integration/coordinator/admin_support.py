"""Helpers of the partition-admin tests (issue 13): a cluster with a
coordinator that never moves leaders back by itself (so that tests decide
when elections happen), polling, and what one broker holds of a partition."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from tidelog import AdminClient, TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog_server.forwarding import LOCAL_METADATA_KEY

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess


def start_admin_cluster(
    etcd: EtcdProcess, root: Path, prefix: str, brokers: int = 3
) -> ClusterProcesses:
    """A coordinator (automatic preferred-leader election off) and brokers;
    as a context manager, stopped after the block."""
    return start_cluster(
        root,
        etcd=etcd,
        prefix=prefix,
        brokers=brokers,
        coordinator_args=("--leader-imbalance-check-interval-ms", "0"),
    )


#: `with running_admin_cluster(...) as cluster:` (see running_cluster).
running_admin_cluster = start_admin_cluster


@contextmanager
def admin_client(cluster: ClusterProcesses) -> Iterator[AdminClient]:
    """An AdminClient once every broker of `cluster` is registered: the tests
    of a module share its cluster, and one that stopped a broker leaves it
    restarting (its old session must expire first); a test that then names
    that broker in an assignment was refused ("not a live broker")."""
    cluster.wait_registered(len(cluster.brokers))
    with AdminClient(bootstrap_servers=cluster.bootstrap) as client:
        yield client


def wait_until(check: Callable[[], object], what: str, timeout_s: float = 40) -> object:
    """Poll `check` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a broker restarting, a leader moving
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def local_partition(address: str, tp: TopicPartition) -> admin_pb2.PartitionDescription | None:
    """What the broker at `address` holds of `tp` in its own log (None: no log)."""
    with grpc.insecure_channel(address) as channel:
        answer = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[tp.topic]),
            timeout=5,
            metadata=((LOCAL_METADATA_KEY, "1"),),
        )
    for topic in answer.topics:
        for p in topic.partitions:
            if p.partition == tp.partition:
                return p
    return None


def partition(admin: AdminClient, tp: TopicPartition):  # type: ignore[no-untyped-def]
    """The partition as describe_topics shows it."""
    (topic,) = admin.describe_topics([tp.topic])
    return topic.partitions[tp.partition]
