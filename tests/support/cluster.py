"""A whole Tidelog cluster for tests: etcd, one coordinator, N brokers in
cluster mode, and a gateway if asked.

`start_cluster(tmp_path, etcd=etcd, brokers=3)` starts real processes on free
loopback ports (on an etcd from tests/support/etcd.py; the coordinator, the
brokers and the gateway as `python -m ...` with the test's interpreter),
waits until every broker is registered, and returns a `ClusterProcesses`
whose `stop()` (or the end of its `with` block) stops each one by PID.
Services use a short session TTL so that tests of failures stay fast. A test
that needs its own shape starts an empty `ClusterProcesses` and calls
`add_coordinator` / `add_broker` / `add_gateway` with its own arguments.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from tidelog import AdminClient, NewTopic, Producer
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdCluster, EtcdProcess
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.processes import BrokerProcess, start_broker

BROKER_SESSION_TTL_S = 3
REGISTER_TIMEOUT_S = 20.0
#: Generous: a produce acknowledged by every replica on a loaded machine.
PRODUCE_TIMEOUT_S = 60.0


@dataclass
class ClusterProcesses:
    #: One member, or several (`endpoint` is then every member's address).
    etcd: EtcdProcess | EtcdCluster
    prefix: str
    coordinators: list[CoordinatorProcess] = field(default_factory=list)
    brokers: list[BrokerProcess] = field(default_factory=list)
    gateways: list[GatewayProcess] = field(default_factory=list)
    #: Added to every broker's command line (e.g. --config FILE).
    extra_broker_args: list[str] = field(default_factory=list)

    def __enter__(self) -> ClusterProcesses:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def services(self) -> list[CoordinatorProcess | BrokerProcess | GatewayProcess]:
        """Every process of the cluster but etcd, in the order they start."""
        return [*self.coordinators, *self.brokers, *self.gateways]

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

    def add_coordinator(self, root: Path, extra_args: Sequence[str] = ()) -> CoordinatorProcess:
        """A coordinator (`c0`, `c1`, ...) logging under `root`/logs."""
        coordinator = start_coordinator(
            self.etcd.endpoint,
            root / "logs",
            prefix=self.prefix,
            coordinator_id=f"c{len(self.coordinators)}",
            session_ttl_s=BROKER_SESSION_TTL_S,
            extra_args=tuple(extra_args),
        )
        self.coordinators.append(coordinator)
        return coordinator

    def add_broker(self, data_root: Path, extra_args: Sequence[str] = ()) -> BrokerProcess:
        """The next broker (ids from 0), its data under `data_root`/broker-ID."""
        broker_id = len(self.brokers)
        broker = start_broker(
            data_root / f"broker-{broker_id}",
            extra_args=[*self.broker_args(broker_id), *extra_args],
            broker_id=broker_id,
        )
        self.brokers.append(broker)
        return broker

    def add_gateway(self, root: Path, extra_args: Sequence[str] = ()) -> GatewayProcess:
        """A gateway logging under `root`/gateway."""
        gateway = start_gateway(
            self.etcd.endpoint, root / "gateway", prefix=self.prefix, extra_args=extra_args
        )
        self.gateways.append(gateway)
        return gateway

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
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
    coordinator_args: Sequence[str] = (),
    gateway_args: Sequence[str] | None = None,
) -> ClusterProcesses:
    """Start a coordinator and `brokers` brokers on `etcd` under `prefix`
    (`coordinator_args` and `broker_args` added to their command lines), and
    a gateway with `gateway_args` unless they are None. Also a context
    manager: every process is stopped after the `with` block."""
    cluster = ClusterProcesses(etcd, prefix, extra_broker_args=list(broker_args))
    try:
        cluster.add_coordinator(root, coordinator_args)
        for _ in range(brokers):
            cluster.add_broker(root)
        cluster.wait_registered(brokers)
        if gateway_args is not None:
            cluster.add_gateway(root, gateway_args)
    except BaseException:
        cluster.stop()
        raise
    return cluster


#: `with running_cluster(...) as cluster:` reads as what it does; the same
#: function, since the ClusterProcesses it returns stops itself after the block.
running_cluster = start_cluster


def produce_through_each(cluster: ClusterProcesses, topic: str) -> None:
    """Create `topic` (one partition, one replica) and produce one record
    through each broker and then each gateway, acknowledged at successive
    offsets: every service reached etcd (the coordinator created the topic,
    the brokers registered, the gateways learned the topic)."""
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    entries = [b.address for b in cluster.brokers] + [g.address for g in cluster.gateways]
    for offset, bootstrap in enumerate(entries):
        with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
            record = producer.send(topic, b"stored").get(timeout=PRODUCE_TIMEOUT_S)
            assert record.offset == offset, (bootstrap, record.offset)


def start_checked_cluster(
    root: Path, *, etcd: EtcdProcess, prefix: str, service_args: Sequence[str], topic: str
) -> ClusterProcesses:
    """A coordinator, a broker and a gateway, each with `service_args` (how
    to reach a secured etcd), checked by `produce_through_each` on `topic`."""
    cluster = start_cluster(
        root,
        etcd=etcd,
        prefix=prefix,
        brokers=1,
        coordinator_args=service_args,
        broker_args=service_args,
        gateway_args=service_args,
    )
    try:
        produce_through_each(cluster, topic)
    except BaseException:
        cluster.stop()
        raise
    return cluster
