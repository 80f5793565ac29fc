"""The ports `tidelog dev` picks itself, how a child says it found one taken,
and whether a port's listener is that child's.

`free_port()` binds port 0 and closes the socket: until the child binds the
port, any other process (another `tidelog dev`, a test's server under
pytest-xdist, an outgoing connection given that ephemeral port) can take it,
and the child exits at start. `tidelog dev` then starts it again on newly
picked ports (dev.py); this module recognises that cause precisely from what
the child logged, so that no other failure is retried: each picked port
carries the exact line its child writes when the port was taken (the
service's `--metrics-port` message from tidelog_server.metrics, gRPC's
"Failed to bind to address" for a listener, etcd's "bind: address already in
use"). Ports the user gave are never picked here, so never retried.

Until the child exits, the process that took its port answers on it: a
readiness probe that gets SERVING (or etcd's healthy) from it would take it
for ours. `listens_on` tells them apart from /proc (Linux; elsewhere it
cannot tell, and the probe's answer is trusted as before).

Not thread-safe: one `tidelog dev` process uses it from its main thread.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Starts of one child at start-up, each on newly picked ports, before its
#: error is reported: another process taking a just-freed port is rare, twice
#: in a row rarer still; a port that is never free is not this problem.
PORT_RACE_ATTEMPTS = 3

#: Picks a port that is free now (free_port; tests inject their own).
PortPicker = Callable[[], int]

_PROC = Path("/proc")
#: /proc/net/tcp's state column for a listening socket.
_TCP_LISTEN = "0A"


def free_port() -> int:
    """A loopback TCP port that is free right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_pattern(text: str, port: int) -> re.Pattern[str]:
    """`text` naming `port` ({port} in it), not a longer port it prefixes."""
    before, _, after = text.partition("{port}")
    return re.compile(re.escape(before) + str(port) + r"(?!\d)" + re.escape(after), re.IGNORECASE)


@dataclass(frozen=True)
class PickedPort:
    """A port picked by `tidelog dev` for one child, and the line that child
    logs when another process had bound it first."""

    #: What the port is for, as the child's flag or etcd's URL names it.
    role: str
    port: int
    taken: re.Pattern[str]

    def __str__(self) -> str:
        return f"{self.role} {self.port}"


def metrics_port(port: int, host: str = "127.0.0.1") -> PickedPort:
    """A service's `--metrics-port` (tidelog_server.metrics.MetricsEndpoint's message)."""
    return PickedPort(
        "--metrics-port",
        port,
        _port_pattern(
            f"cannot serve metrics on {host}:{{port}} (--metrics-port): address already in use",
            port,
        ),
    )


def listen_port(port: int, host: str = "127.0.0.1") -> PickedPort:
    """A service's gRPC `--listen` port. grpcio raises "Failed to bind to
    address H:P;" when the server cannot bind (our services' own "cannot
    listen on H:P" is for a grpcio that returns 0 instead); neither says why,
    but a loopback port that was free a moment ago and no longer binds was
    taken meanwhile."""
    return PickedPort(
        "--listen",
        port,
        re.compile(
            _port_pattern(f"Failed to bind to address {host}:{{port}};", port).pattern
            + "|"
            + _port_pattern(f"cannot listen on {host}:{{port}}", port).pattern
            + "$",
            re.IGNORECASE | re.MULTILINE,
        ),
    )


def etcd_port(role: str, port: int, host: str = "127.0.0.1") -> PickedPort:
    """One of etcd's listeners (client, peer, metrics URL): etcd logs
    `listen tcp H:P: bind: address already in use` and exits."""
    return PickedPort(
        role, port, _port_pattern(f"listen tcp {host}:{{port}}: bind: address already in use", port)
    )


def taken_port(logged: str, picked: list[PickedPort]) -> PickedPort | None:
    """Which of `picked` the child's log (of this start only) says was taken."""
    for port in picked:
        if port.taken.search(logged):
            return port
    return None


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process `pid` has a listening TCP socket on `port`; None
    where this cannot be told (no /proc, or not allowed to read it)."""
    if not (_PROC / "self" / "fd").is_dir():
        return None
    fd_dir = _PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return False  # the process is gone
    except PermissionError:
        return None
    sockets = set()
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    tables = []
    for table in ("tcp", "tcp6"):
        try:
            tables.append((_PROC / str(pid) / "net" / table).read_text().splitlines()[1:])
        except OSError:
            continue  # no IPv6, say
    if not tables:
        # Neither table: a process that exited (a zombie until reaped has
        # none), unless no process's can be read here (then: cannot tell).
        return False if (_PROC / "self" / "net" / "tcp").is_file() else None
    for lines in tables:
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            if int(fields[1].rpartition(":")[2], 16) == port and fields[9] in sockets:
                return True
    return False
