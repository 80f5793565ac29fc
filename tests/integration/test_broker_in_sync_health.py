"""A broker's health service "tidelog.broker.InSync" (the Helm chart's
readiness probe) against real processes: SERVING on every broker once an RF-3
topic is replicated, and, for a broker restarted after the others wrote on
without it, SERVING only once the leaders have taken it back into every ISR.
(When exactly it is NOT_SERVING is the unit test of
`ClusterView.out_of_sync`, tests/unit/server/test_etcd_cluster_view.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog import AdminClient, NewTopic, Producer

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.processes import start_broker

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

IN_SYNC = "tidelog.broker.InSync"
DEADLINE_S = 60.0


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


def in_sync(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=IN_SYNC), timeout=5
        )
    return int(reply.status)


def wait_status(address: str, status: int, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    last = None
    while time.monotonic() < deadline:
        last = in_sync(address)
        if last == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: {IN_SYNC} of {address} still {last} after {DEADLINE_S} s")


def test_a_broker_is_in_sync_only_once_back_in_every_isr(
    cluster: ClusterProcesses, tmp_path: Path
) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("rolled", 3, 3)])
    for broker in cluster.brokers:
        wait_status(broker.address, serving, "every replica in sync")

    # Broker 2 stops (SIGTERM revokes its registration): the controller
    # drops it from every ISR, and the others write on without it.
    victim = cluster.brokers[2]
    victim.stop()
    wait_isr(cluster.bootstrap, lambda isrs: all(2 not in isr for isr in isrs), "2 left")
    alive = ",".join(b.address for b in cluster.brokers[:2])
    with Producer(alive, acks="all") as producer:
        for i in range(300):
            producer.send("rolled", b"x" * 1000, key=b"%d" % i)
        producer.flush()

    # Back on the same data dir: it reports in sync only once the leaders
    # have taken it back into the ISR of all three partitions.
    restarted = start_broker(victim.data_dir, extra_args=cluster.broker_args(2), broker_id=2)
    cluster.brokers[2] = restarted
    wait_status(restarted.address, serving, "caught up after the restart")
    isrs = partition_isrs(alive)
    assert all(2 in isr for isr in isrs), isrs


def partition_isrs(bootstrap: str) -> list[list[int]]:
    with AdminClient(bootstrap) as admin:
        (topic,) = admin.describe_topics(["rolled"])
    return [list(p.isr) for p in topic.partitions]


def wait_isr(bootstrap: str, check: Callable[[list[list[int]]], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    isrs: list[list[int]] = []
    while time.monotonic() < deadline:
        isrs = partition_isrs(bootstrap)
        if check(isrs):
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: ISRs still {isrs} after {DEADLINE_S} s")
