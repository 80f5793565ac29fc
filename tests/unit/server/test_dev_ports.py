"""`tidelog dev` starts a child again on new ports when another process took
a port it picked for it (tidelog_server.dev.Launcher, dev_ports), with real
children: a standalone broker and etcd, started through dev's own start-up
code, and a picker whose first answer is a port the test holds (the race CI
lost, made certain).

Only that cause is retried: a port the user gave, or any other exit, is an
error at once. And a readiness probe answered by the process that took the
port is not taken for the child's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from tidelog_server.dev import (
    Launcher,
    Plan,
    etcd_plan,
    service_plan,
    spawner,
    stop_children,
)
from tidelog_server.dev_ports import (
    PORT_RACE_ATTEMPTS,
    PortPicker,
    etcd_port,
    free_port,
    listen_port,
    listens_on,
    metrics_port,
    taken_port,
)
from tidelog_server.metrics import MetricsEndpoint

pytestmark = pytest.mark.timeout(120)


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port this test listens on: what another process that took
    a port dev picked looks like to the child."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def foreign_grpc_server() -> Iterator[int]:
    """Another process's gRPC server on a port dev might pick, answering
    SERVING to every health check (as another test's broker would)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


def picker(first: list[int]) -> PortPicker:
    """Answers `first` in order, then free ports."""
    queue = list(first)
    return lambda: queue.pop(0) if queue else free_port()


class CountingSpawn:
    """dev's own spawn, counting the starts."""

    def __init__(self) -> None:
        self._spawn = spawner()
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        self.argvs.append(argv)
        return self._spawn(argv, log_path)


@contextmanager
def launched(pick_port: PortPicker) -> Iterator[tuple[Launcher, CountingSpawn]]:
    spawn = CountingSpawn()
    launcher = Launcher(spawn, pick_port)
    try:
        yield launcher, spawn
    finally:
        stop_children(launcher.children)


def standalone_broker(
    tmp_path: Path, port: int = 0, metrics: bool = True
) -> Callable[[PortPicker], Plan]:
    log_path = tmp_path / "broker.log"
    command = [sys.executable, "-m", "tidelog_broker", "--data-dir", str(tmp_path / "broker")]
    return lambda pick: service_plan(pick, command, log_path, port=port, metrics=metrics)


def metrics_answer(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


@pytest.mark.parametrize("taken", ["--listen", "--metrics-port"])
def test_a_service_that_lost_a_picked_port_is_started_again_on_new_ones(
    tmp_path: Path, taken: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # service_plan picks --listen first, then --metrics-port.
    with held_port() as port:
        first = [port] if taken == "--listen" else [free_port(), port]
        with launched(picker(first)) as (launcher, spawn):
            child = launcher.start("broker 0", standalone_broker(tmp_path), tmp_path / "broker.log")
            launcher.wait_ready(child)

            assert len(spawn.argvs) == 2, "started again once, on new ports"
            assert port not in [picked.port for picked in child.plan.picked]
            log = child.log_path.read_text()
            if taken == "--listen":
                assert f"Failed to bind to address 127.0.0.1:{port}" in log
            else:
                assert f"cannot serve metrics on 127.0.0.1:{port}" in log
            assert "another process took its port" in capsys.readouterr().err
            # The ports it serves on now are its own, and the banner's.
            listen_at = int(child.plan.address.rpartition(":")[2])
            assert child.plan.metrics_url is not None
            metrics_at = int(child.plan.metrics_url.split(":")[2].split("/")[0])
            assert listens_on(child.process.pid, listen_at)
            assert listens_on(child.process.pid, metrics_at)
            assert "tidelog_" in metrics_answer(child.plan.metrics_url)


def test_a_probe_answered_by_the_process_that_took_the_port_is_not_readiness(
    tmp_path: Path,
) -> None:
    """The port picked for --listen is another's gRPC server that answers
    SERVING: dev must not take that for the child (which is about to exit on
    it), but start the child again on a port of its own."""
    with foreign_grpc_server() as port, launched(picker([port])) as (launcher, spawn):
        child = launcher.start("broker 0", standalone_broker(tmp_path), tmp_path / "broker.log")
        launcher.wait_ready(child)

        assert len(spawn.argvs) == 2
        assert child.plan.address != f"127.0.0.1:{port}"
        assert child.process.poll() is None
        assert listens_on(child.process.pid, int(child.plan.address.rpartition(":")[2]))


def test_etcd_that_lost_a_picked_port_is_started_again_on_new_ones(tmp_path: Path) -> None:
    with held_port() as port, launched(picker([port])) as (launcher, spawn):
        etcd = launcher.start(
            "etcd", lambda pick: etcd_plan(pick, tmp_path / "etcd"), tmp_path / "etcd.log"
        )
        launcher.wait_ready(etcd)

        assert len(spawn.argvs) == 2
        assert f"listen tcp 127.0.0.1:{port}: bind: address already in use" in (
            etcd.log_path.read_text()
        )
        client_port = int(etcd.plan.address.rpartition(":")[2])
        assert client_port != port
        assert listens_on(etcd.process.pid, client_port)
        with socket.create_connection(("127.0.0.1", client_port), timeout=5) as conn:
            conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            assert b'"health":"true"' in conn.recv(4096)


def test_a_port_the_user_gave_is_not_retried(tmp_path: Path) -> None:
    with held_port() as port, launched(free_port) as (launcher, spawn):
        child = launcher.start(
            "broker 0", standalone_broker(tmp_path, port=port), tmp_path / "broker.log"
        )
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
            launcher.wait_ready(child)
        assert len(spawn.argvs) == 1


def test_another_exit_at_start_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "broker").write_text("a file where the data directory should be")
    with launched(free_port) as (launcher, spawn):
        child = launcher.start("broker 0", standalone_broker(tmp_path), tmp_path / "broker.log")
        with pytest.raises(RuntimeError, match="exited with code"):
            launcher.wait_ready(child)
        assert len(spawn.argvs) == 1


def test_a_port_taken_on_every_start_is_an_error_after_the_last(tmp_path: Path) -> None:
    with held_port() as a, held_port() as b, held_port() as c:
        assert PORT_RACE_ATTEMPTS == 3
        with launched(picker([a, b, c])) as (launcher, spawn):
            # Without metrics, each start picks one port: its --listen.
            child = launcher.start(
                "broker 0", standalone_broker(tmp_path, metrics=False), tmp_path / "broker.log"
            )
            with pytest.raises(RuntimeError, match="started 3 times") as raised:
                launcher.wait_ready(child)
            assert f"127.0.0.1:{c}" in str(raised.value)
            assert len(spawn.argvs) == 3


def test_no_port_is_picked_twice_in_one_run() -> None:
    repeated = picker([5000, 5000, 5001])
    launcher = Launcher(spawner(), repeated)
    assert [launcher.pick(), launcher.pick()] == [5000, 5001]


def test_the_recognised_lines_are_what_the_services_raise() -> None:
    """The patterns against the real messages: MetricsEndpoint's and grpcio's
    (a traceback's last line), and none matches a longer port it prefixes."""
    with held_port() as port:
        with pytest.raises(OSError) as metrics_error:
            MetricsEndpoint(CollectorRegistry(), "127.0.0.1", port)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        with pytest.raises(RuntimeError) as grpc_error:
            server.add_insecure_port(f"127.0.0.1:{port}")
    metrics_line = f"OSError: {metrics_error.value}"
    grpc_line = f"RuntimeError: {grpc_error.value}"
    assert taken_port(metrics_line, [metrics_port(port)]) == metrics_port(port)
    assert taken_port(grpc_line, [listen_port(port)]) == listen_port(port)
    assert taken_port(f"OSError: cannot listen on 127.0.0.1:{port}\n", [listen_port(port)])
    longer = port * 10 + 1
    assert taken_port(metrics_line.replace(str(port), str(longer)), [metrics_port(port)]) is None
    assert taken_port(grpc_line.replace(str(port), str(longer)), [listen_port(port)]) is None
    etcd_line = f'"error":"listen tcp 127.0.0.1:{longer}: bind: address already in use"'
    assert taken_port(etcd_line, [etcd_port("etcd client port", port)]) is None
    assert taken_port(metrics_line, [listen_port(port), etcd_port("etcd peer port", port)]) is None


@pytest.mark.skipif(not Path("/proc/self/net/tcp").is_file(), reason="needs Linux's /proc")
def test_a_child_that_exited_but_is_not_reaped_listens_on_nothing() -> None:
    """A zombie has no fds and no net tables to read: that is "not
    listening", not "cannot tell" (for which dev trusts the probe). Before,
    a child that lost its port and exited between dev's look at it and a
    probe another process answered was taken for ready (this module's
    foreign-server test failed 2 runs of 3 beside the other tests)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # The child holds the listening socket (inherited) until it is killed.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(listener.fileno(),)
        )
        try:
            assert listens_on(child.pid, port) is True
            child.kill()
            # Exited, not reaped: WNOWAIT leaves it a zombie.
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
            assert listens_on(child.pid, port) is False
        finally:
            child.kill()
            child.wait()
