"""Real service processes for tests: a broker on a free loopback port, and
the process wrapper that the coordinator's and the gateway's share.

`start_broker(data_dir, port)` runs `python -m tidelog_broker` with the
test's interpreter, waits until its gRPC health check (service "") answers
SERVING, and returns a `BrokerProcess`. Every process is stopped through its
own PID (SIGTERM, then SIGKILL), never by name, so tests can run beside other
brokers on the machine. The broker's output goes to `<data_dir>.log`, which a
failing start names in its error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog.security import PLAINTEXT, ChannelSecurity

# free_port, free_ports_in_a_row and start_on_free_ports re-exported: the tests and the other
# support modules import them from here.
from tests.support.ports import PortTakenError, listens_on
from tests.support.ports import free_port as free_port
from tests.support.ports import free_ports_in_a_row as free_ports_in_a_row
from tests.support.ports import start_on_free_ports as start_on_free_ports

#: Generous: on a loaded 2-core CI machine a coordinator had not even finished importing
#: Python after 20 s. A process that exits fails at once; only a slow start waits this long.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def security_of(args: Sequence[str]) -> ChannelSecurity:
    """How to reach a service started with `args`: over TLS when they give
    it a certificate (presented back as the client certificate, which a
    listener requiring one accepts: the dev certificates serve both ways)."""
    args = list(args)
    if "--tls-certfile" not in args:
        return PLAINTEXT

    def value(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    return ChannelSecurity.from_options(
        "SSL", value("--tls-cafile"), value("--tls-certfile"), value("--tls-keyfile")
    )


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def wait_serving(
    address: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    security: ChannelSecurity = PLAINTEXT,
) -> None:
    """Wait until the gRPC health check at `address` answers SERVING."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    with security.channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the process exited with {proc.returncode} before serving")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                serving = reply.status == health_pb2.HealthCheckResponse.SERVING
                # Answered by our process, not another on a port ours lost.
                if serving and (proc is None or listens_on(proc.pid, _port_of(address))):
                    return
                last = reply.status
            except grpc.RpcError as exc:
                last = exc.code()
            time.sleep(0.05)
    raise TimeoutError(f"{address} did not answer SERVING within {timeout_s} s (last: {last})")


class ServiceProcess:
    """A started service (coordinator, gateway): its process, the address it
    serves and its log. Not thread-safe; one owner."""

    #: How long SIGTERM may take before SIGKILL (a gateway drains first).
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int:
        """SIGTERM (a clean shutdown), then SIGKILL if it does not exit in
        time; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except OSError:
        return 0


def port_taken(log_path: Path, since: int) -> bool:
    """Whether what a process logged after byte `since` says its address was
    taken: free_port() closes the port it found, and another test's process
    can bind it first. Starting again on new ports is the remedy."""
    try:
        with open(log_path, "rb") as log:
            log.seek(since)
            return b"address already in use" in log.read().lower()
    except OSError:
        return False


def spawn_service(
    what: str, args: Sequence[str], address: str, log_path: Path, timeout_s: float
) -> subprocess.Popen[bytes]:
    """Run `args` with output to `log_path` and wait until `address` answers
    SERVING; a process that does not is killed and named in the error
    (PortTakenError when its address was taken meanwhile)."""
    since = _log_size(log_path)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(address, timeout_s, proc, security_of(args))
    except Exception as exc:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        error = PortTakenError if port_taken(log_path, since) else RuntimeError
        raise error(f"{what} did not start: {exc}; see {log_path}") from exc
    return proc


class BrokerProcess:
    """One broker process. Not thread-safe; one owner (a test or fixture)."""

    def __init__(
        self, data_dir: Path, port: int, extra_args: Sequence[str], broker_id: int = 0
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra_args = tuple(extra_args)
        self.broker_id = broker_id
        #: The internal listener (replication, cluster mode): fixed here so
        #: that a restarted broker keeps it, as it keeps its client port.
        self.internal_port = free_port()
        self.log_path = data_dir.with_name(data_dir.name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None
        #: RLIMIT_NOFILE (soft and hard) the process starts with; None: inherited.
        self.open_file_limit: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def internal_address(self) -> str:
        """Where other brokers fetch from this one (tidelog.internal.Replica)."""
        return f"127.0.0.1:{self.internal_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the broker is not running"
        return self.proc.pid

    def spawn(self, timeout_s: float = START_TIMEOUT_S) -> None:
        args = [
            sys.executable,
            "-m",
            "tidelog_broker",
            "--listen",
            self.address,
            "--data-dir",
            str(self.data_dir),
            "--broker-id",
            str(self.broker_id),
            "--internal-port",
            str(self.internal_port),
            *self.extra_args,
        ]
        if self.open_file_limit is not None:
            # The interpreter lowers its own limit, then execs the broker (same
            # PID): preexec_fn is not safe in a process with threads.
            limit = self.open_file_limit
            args = [
                sys.executable,
                "-c",
                "import os, resource, sys; "
                f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
                "os.execv(sys.argv[1], sys.argv[1:])",
                *args,
            ]
        since = _log_size(self.log_path)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_serving(self.address, timeout_s, self.proc, security_of(self.extra_args))
        except (RuntimeError, TimeoutError) as exc:
            self.kill()
            error = PortTakenError if port_taken(self.log_path, since) else RuntimeError
            raise error(
                f"broker did not start: {exc}; the end of {self.log_path}:\n{self.log_tail()}"
            ) from exc

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; the exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Stop, then start again on the same port and data dir."""
        self.stop()
        self.spawn(timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_broker(
    data_dir: Path,
    port: int | None = None,
    extra_args: Sequence[str] = ("--auto-create-topics",),
    *,
    broker_id: int = 0,
    timeout_s: float = START_TIMEOUT_S,
    open_file_limit: int | None = None,
) -> BrokerProcess:
    """Start a broker and wait until it serves. Port None: a free one (and
    new ones if it was taken meanwhile)."""
    data_dir.mkdir(parents=True, exist_ok=True)

    def start() -> BrokerProcess:
        chosen = free_port() if port is None else port
        broker = BrokerProcess(data_dir, chosen, extra_args, broker_id)
        broker.open_file_limit = open_file_limit
        broker.spawn(timeout_s)
        return broker

    if port is not None:
        return start()
    return start_on_free_ports(start)
