"""Processes the bench starts, and how it meters them.

The broker is started with the tests' helper (tests/support/processes.py: a free loopback
port, a health-checked start, stop by PID). `Meter` takes CPU and memory figures of a broker
PID and of this process (the client: the SDK's threads run here) around one workload.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/...` as well as `python -m bench`
    sys.path.insert(0, str(ROOT))

from tests.support.cluster import ClusterProcesses, start_cluster  # noqa: E402
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.processes import BrokerProcess, free_port, start_broker  # noqa: E402

__all__ = [
    "BrokerProcess",
    "ClusterProcesses",
    "Meter",
    "free_port",
    "hwm_mb",
    "rss_mb",
    "service_environment",
    "tidelog_broker",
    "tidelog_cluster",
    "tmpdir",
]


def service_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a service the bench runs as ``python -m bench.<tool>`` (the traced
    broker of bench.e2e_trace): `environ` with gRPC's transport as the services' own
    ``__main__`` chooses it (tidelog_server.grpc_transport). The bench package imports
    tidelog, and with it gRPC, before such a child could choose; without this it would serve
    on gRPC's default listener, one thread hand-off per received message more than the real
    service."""
    from tidelog_server.grpc_transport import GRPC_EXPERIMENTS, completed

    env = dict(environ)
    env[GRPC_EXPERIMENTS] = completed(env.get(GRPC_EXPERIMENTS, ""))
    return env


@contextlib.contextmanager
def tmpdir(prefix: str) -> Iterator[Path]:
    """A temporary directory, removed on exit whatever happens."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def tidelog_cluster(brokers: int = 3) -> Iterator[ClusterProcesses]:
    """etcd, a coordinator and `brokers` brokers in cluster mode, with temporary
    data directories; every process stopped by PID on exit."""
    with tmpdir("tidelog-bench-cluster-") as root:
        etcd = EtcdProcess.start(root / "etcd")
        try:
            cluster = start_cluster(root, etcd=etcd, brokers=brokers)
            try:
                yield cluster
            finally:
                cluster.stop()
        finally:
            etcd.stop()


@contextlib.contextmanager
def tidelog_broker(*extra: str) -> Iterator[BrokerProcess]:
    """One Tidelog broker on 127.0.0.1 with a temporary data directory; stopped by PID."""
    with tmpdir("tidelog-bench-") as root:
        broker = start_broker(root / "broker", extra_args=("--auto-create-topics", *extra))
        try:
            yield broker
        finally:
            broker.stop()


def _status_kb(pid: int, field: str) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def hwm_mb(pid: int) -> float | None:
    """Peak resident set (VmHWM) of a live process since it started, in MiB."""
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else round(kb / 1024, 1)


def rss_mb(pid: int) -> float | None:
    """Resident set (VmRSS) right now, in MiB."""
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else round(kb / 1024, 1)


def cpu_s(process: psutil.Process | int) -> float:
    """CPU seconds (user + system) a process (or PID) has used so far; 0.0
    once it is gone."""
    try:
        proc = process if isinstance(process, psutil.Process) else psutil.Process(process)
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


class Meter:
    """CPU seconds of the server PID and of this process (the client) over one workload,
    and the server's peak RSS afterwards."""

    def __init__(self, server_pid: int | None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None
        self.client = psutil.Process()
        self.server_pid = server_pid
        self.server0 = cpu_s(self.server) if self.server else 0.0
        self.client0 = cpu_s(self.client)
        self.t0 = time.perf_counter()

    def done(self) -> dict[str, float | None]:
        return {
            "wall_s": time.perf_counter() - self.t0,
            "server_cpu_s": (cpu_s(self.server) - self.server0) if self.server else None,
            "client_cpu_s": cpu_s(self.client) - self.client0,
            "rss_mb": hwm_mb(self.server_pid) if self.server_pid else None,
        }


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; by this process's own PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Wait until something listens on 127.0.0.1:`port` (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")
