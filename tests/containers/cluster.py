"""A Tidelog cluster in containers for tests: etcd, a coordinator, brokers and a gateway,
each a container of the images tools/images.py built (nothing is pulled).

Every container runs with host networking and its service listens on 127.0.0.1 at a free
port (so a container is only ever addressed as 127.0.0.1:port); each is started with
testcontainers and counted ready when its "serving" log line appears. The Tidelog services
run with a read-only root file system (as the Helm chart runs them). A broker keeps its
partition logs in a named volume of its own, which outlives its container: `recreate_broker`
starts a new container on it. Container and volume names carry the test run's id and the
cluster's (never shared between tests), both carry the label RUN_LABEL, and `stop()` removes
every container and volume the cluster made.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field

import docker
import grpc
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc, log_pb2, log_pb2_grpc

from tests.support.ports import PortTakenError
from tests.support.processes import free_port

#: Label on every container and volume the tests make, valued with the run's id.
RUN_LABEL = "tidelog.test.run"
#: The broker image's data volume (deploy/docker/Dockerfile).
BROKER_DATA = "/var/lib/tidelog"
#: Short sessions keep fail-over quick (2 s is the least etcd allows).
SESSION_TTL_S = 2
#: Followers that stop fetching leave the ISR after this.
REPLICA_LAG_MS = 3000
START_TIMEOUT_S = 60.0
REGISTER_TIMEOUT_S = 30.0
#: Starts of one container on a new port after its port was taken (see `_run`).
PORT_ATTEMPTS = 3
#: What a service (grpc) or etcd logs when its listen address is taken.
_BIND_FAILED = re.compile(r"Failed to bind to address|address already in use", re.IGNORECASE)
#: Bytes of a failed container's log shown in the error.
LOG_TAIL_BYTES = 4000


def _log_tail(container: DockerContainer) -> str:
    """The end of a container's output (stdout and stderr), for an error."""
    try:
        stdout, stderr = container.get_logs()
    except docker.errors.DockerException as exc:
        return f"(its log could not be read: {exc})"
    return (stdout + stderr).decode(errors="replace")[-LOG_TAIL_BYTES:]


@dataclass
class Service:
    """One service's container and the address it serves on."""

    role: str
    container: DockerContainer
    address: str

    @property
    def docker(self) -> docker.models.containers.Container:
        return self.container.get_wrapped_container()

    def logs(self) -> str:
        stdout, stderr = self.container.get_logs()
        return (stdout + stderr).decode(errors="replace")


@dataclass
class ContainerCluster:
    images: dict[str, str]
    run_id: str
    cluster_id: str
    prefix: str = "/tidelog"
    client: docker.DockerClient = field(default_factory=docker.from_env)
    etcd: Service | None = None
    coordinator: Service | None = None
    gateway: Service | None = None
    brokers: dict[int, Service] = field(default_factory=dict)
    _started: list[DockerContainer] = field(default_factory=list)
    _volumes: list[str] = field(default_factory=list)
    _generation: int = 0

    # --- Life cycle ----------------------------------------------------------------------

    def start(self, brokers: int = 3) -> None:
        self.etcd = self._start_etcd()
        self.coordinator = self._run(
            "coordinator",
            [
                "--etcd", self.etcd_endpoint,
                "--prefix", self.prefix,
                "--id", "c0",
                "--session-ttl-s", str(SESSION_TTL_S),
            ],
            "coordinator c0 serving on",
        )  # fmt: skip
        for broker_id in range(brokers):
            self.start_broker(broker_id)
        self.wait_registered(brokers)
        self.gateway = self._run(
            "gateway", ["--etcd", self.etcd_endpoint, "--prefix", self.prefix], "gateway serving on"
        )

    def stop(self) -> None:
        """Remove every container and volume this cluster made (whatever state they are in)."""
        for container in reversed(self._started):
            with contextlib.suppress(docker.errors.NotFound):
                container.stop()  # force-removes, with its anonymous volumes
        for name in self._volumes:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.volumes.get(name).remove(force=True)
        self.client.close()

    @property
    def etcd_endpoint(self) -> str:
        assert self.etcd is not None
        return self.etcd.address

    def _name(self, role: str) -> str:
        self._generation += 1
        return f"tidelog-test-{self.run_id}-{self.cluster_id}-{role}-{self._generation}"

    def _labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.run_id}

    def _run(
        self,
        role: str,
        args: list[str],
        ready_line: str,
        *,
        image: str | None = None,
        volume: str | None = None,
    ) -> Service:
        """Start a container of the role's image (`image`: another one) with `args` and,
        for a Tidelog service, `--listen 127.0.0.1:<free port>`; ready at `ready_line`.

        The host's network is shared, and free_port() closes the port it found: another
        test's process may bind it first. A service that then cannot bind it is started
        again on a new port (as tests/support/processes does for processes); any other
        early exit is raised with the end of the container's log."""
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._run_once(role, args, ready_line, image=image, volume=volume)
            except PortTakenError:
                continue
        return self._run_once(role, args, ready_line, image=image, volume=volume)

    def _run_once(
        self,
        role: str,
        args: list[str],
        ready_line: str,
        *,
        image: str | None,
        volume: str | None,
    ) -> Service:
        image = image or role.split("-")[0]
        address = f"127.0.0.1:{free_port()}"
        if image != "etcd":
            args = [*args, "--listen", address]
        container = (
            DockerContainer(self.images[image])
            .with_name(self._name(role))
            .with_command(args)
            # A read-only root file system, as the Helm chart runs them: a service writes
            # only to its volume. (etcd writes its data directory in the image.)
            .with_kwargs(network_mode="host", labels=self._labels(), read_only=image != "etcd")
            .waiting_for(
                LogMessageWaitStrategy(re.compile(ready_line))
                .with_poll_interval(0.1)
                .with_startup_timeout(START_TIMEOUT_S)
            )
        )
        if volume is not None:
            container.with_volume_mapping(volume, BROKER_DATA, "rw")
        self._started.append(container)
        try:
            container.start()
        except RuntimeError as exc:  # it exited before `ready_line`
            logged = _log_tail(container)
            error = PortTakenError if _BIND_FAILED.search(logged) else RuntimeError
            raise error(f"{role} container did not start: {exc}\nits log ends:\n{logged}") from exc
        return Service(role, container, address)

    def _start_etcd(self) -> Service:
        client, peer = free_port(), free_port()
        args = [
            "--name=e0",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=e0=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # test data: latency matters, durability does not
        ]
        service = self._run("etcd", args, "ready to serve client requests")
        service.address = f"127.0.0.1:{client}"
        return service

    # --- Brokers -------------------------------------------------------------------------

    def volume(self, broker_id: int) -> str:
        return f"tidelog-test-{self.run_id}-{self.cluster_id}-broker-{broker_id}"

    def start_broker(self, broker_id: int) -> Service:
        """A broker container on the broker's volume (made on first use)."""
        volume = self.volume(broker_id)
        if volume not in self._volumes:
            self.client.volumes.create(volume, labels=self._labels())
            self._volumes.append(volume)
        broker = self._run(
            f"broker-{broker_id}",
            [
                "--broker-id", str(broker_id),
                "--etcd", self.etcd_endpoint,
                "--etcd-prefix", self.prefix,
                "--session-ttl-s", str(SESSION_TTL_S),
                "--set", f"replica.lag.time.max.ms={REPLICA_LAG_MS}",
            ],
            rf"broker {broker_id} serving on",
            volume=volume,
        )  # fmt: skip
        self.brokers[broker_id] = broker
        return broker

    def remove_broker(self, broker_id: int) -> None:
        """Kill the broker's container and remove it; its volume stays."""
        broker = self.brokers.pop(broker_id)
        broker.docker.remove(force=True)

    def recreate_broker(self, broker_id: int) -> Service:
        """A new container for a removed broker, on its volume, at a new free port."""
        assert broker_id not in self.brokers, f"broker {broker_id} still has a container"
        return self.start_broker(broker_id)

    # --- Cluster state -------------------------------------------------------------------

    def wait_registered(self, count: int, timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        """Until `count` brokers are registered with the coordinator."""
        assert self.coordinator is not None
        deadline = time.monotonic() + timeout_s
        last: object = None
        with grpc.insecure_channel(self.coordinator.address) as channel:
            stub = cluster_pb2_grpc.ClusterStub(channel)
            while time.monotonic() < deadline:
                try:
                    reply = stub.DescribeCluster(cluster_pb2.DescribeClusterRequest(), timeout=5)
                    if len(reply.brokers) == count:
                        return
                    last = reply
                except grpc.RpcError as exc:
                    last = exc.code()
                time.sleep(0.1)
        raise TimeoutError(f"{count} brokers did not register within {timeout_s} s: {last}")

    def metadata(self, topic: str, skip: tuple[int, ...] = ()) -> log_pb2.MetadataResponse | None:
        """The topic's metadata as a broker sees it (the first that answers)."""
        for broker_id, broker in sorted(self.brokers.items()):
            if broker_id in skip:
                continue
            try:
                with grpc.insecure_channel(broker.address) as channel:
                    return log_pb2_grpc.LogStub(channel).Metadata(
                        log_pb2.MetadataRequest(topics=[topic]), timeout=2
                    )
            except grpc.RpcError:
                continue
        return None

    def leaders(self, topic: str, skip: tuple[int, ...] = ()) -> dict[int, int]:
        reply = self.metadata(topic, skip)
        if reply is None or not reply.topics:
            return {}
        return {p.partition: p.leader_id for p in reply.topics[0].partitions}

    def isr(self, topic: str, skip: tuple[int, ...] = ()) -> dict[int, list[int]]:
        reply = self.metadata(topic, skip)
        if reply is None or not reply.topics:
            return {}
        return {p.partition: sorted(p.isr) for p in reply.topics[0].partitions}

    def wait_isr(self, topic: str, members: list[int], timeout_s: float) -> dict[int, list[int]]:
        """Until every partition of `topic` has exactly `members` in sync and a leader."""
        deadline = time.monotonic() + timeout_s
        isr: dict[int, list[int]] = {}
        while time.monotonic() < deadline:
            isr = self.isr(topic)
            leaders = self.leaders(topic)
            if (
                isr
                and all(m == sorted(members) for m in isr.values())
                and all(leader >= 0 for leader in leaders.values())
            ):
                return isr
            time.sleep(0.1)
        raise TimeoutError(f"the ISR of {topic} is not {members} after {timeout_s} s: {isr}")
