"""A whole Tidelog cluster for tests: etcd, one coordinator, N brokers in cluster mode.

`start_cluster(tmp_path, brokers=3)` starts real processes on free loopback
ports (etcd from tests/support/etcd.py, the coordinator and the brokers as
`python -m ...` with the test's interpreter), waits until every broker is
registered, and returns a `ClusterProcesses` whose `stop()` stops each one by
PID. Brokers use a short session TTL so that tests of failures stay fast.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdCluster, EtcdProcess
from tests.support.processes import BrokerProcess, start_broker

BROKER_SESSION_TTL_S = 3
REGISTER_TIMEOUT_S = 20.0


@dataclass
class ClusterProcesses:
    #: One member, or several (`endpoint` is then every member's address).
    etcd: EtcdProcess | EtcdCluster
    prefix: str
    coordinators: list[CoordinatorProcess] = field(default_factory=list)
    brokers: list[BrokerProcess] = field(default_factory=list)
    #: Added to every broker's command line (e.g. --config FILE).
    extra_broker_args: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        """Every broker's address, comma separated (what clients are given)."""
        return ",".join(b.address for b in self.brokers if b.proc is not None)

    def describe(self, address: str | None = None) -> cluster_pb2.DescribeClusterResponse:
        with grpc.insecure_channel(address or self.brokers[0].address) as channel:
            return cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                cluster_pb2.DescribeClusterRequest(), timeout=5
            )

    def wait_registered(self, count: int, timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        """Until `count` brokers and a coordinator are registered."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                reply = self.describe(self.coordinators[0].address)
                if len(reply.brokers) == count and reply.coordinators:
                    return
                last = reply
            except grpc.RpcError as exc:
                last = exc.code()
            time.sleep(0.05)
        raise TimeoutError(f"{count} brokers did not register within {timeout_s} s: {last}")

    def broker_args(self, broker_id: int) -> list[str]:
        return [
            "--etcd", self.etcd.endpoint,
            "--etcd-prefix", self.prefix,
            "--session-ttl-s", str(BROKER_SESSION_TTL_S),
            *self.extra_broker_args,
        ]  # fmt: skip

    def add_broker(self, data_root: Path) -> BrokerProcess:
        broker_id = len(self.brokers)
        broker = start_broker(
            data_root / f"broker-{broker_id}",
            extra_args=self.broker_args(broker_id),
            broker_id=broker_id,
        )
        self.brokers.append(broker)
        return broker

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        for coordinator in self.coordinators:
            coordinator.stop()


def start_cluster(
    root: Path,
    *,
    etcd: EtcdProcess | EtcdCluster,
    prefix: str = "/tidelog",
    brokers: int = 3,
    broker_args: Sequence[str] = (),
) -> ClusterProcesses:
    """Start a coordinator and `brokers` brokers on `etcd` under `prefix`
    (`broker_args` added to each broker's command line)."""
    cluster = ClusterProcesses(etcd, prefix, extra_broker_args=list(broker_args))
    try:
        cluster.coordinators.append(
            start_coordinator(
                etcd.endpoint, root / "logs", prefix=prefix, coordinator_id="c0", session_ttl_s=3
            )
        )
        for _ in range(brokers):
            cluster.add_broker(root)
        cluster.wait_registered(brokers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextmanager
def running_cluster(
    root: Path,
    *,
    etcd: EtcdProcess | EtcdCluster,
    prefix: str = "/tidelog",
    brokers: int = 3,
    broker_args: Sequence[str] = (),
) -> Iterator[ClusterProcesses]:
    """`start_cluster` for the duration of the block; every process stopped after it."""
    processes = start_cluster(
        root, etcd=etcd, prefix=prefix, brokers=brokers, broker_args=broker_args
    )
    try:
        yield processes
    finally:
        processes.stop()
