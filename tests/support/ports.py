"""Free loopback ports for the processes tests start, and starting again on
new ones when a port was taken meanwhile.

free_port() closes the port it found, so another test's process (under
pytest-xdist, several run at once) can bind it before ours does; the process
then fails with "address already in use". `start_on_free_ports` runs a
start function again, which picks new ports, when it raised PortTakenError.
Until ours exits, the other process answers on that port, so "it answers"
is not "it is ours": `listens_on` says whether it is.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

#: Starts on new ports before giving up (a race lost twice in a row is rare).
PORT_RACE_ATTEMPTS = 3
MAX_PORT = 65535
#: Where the kernel's ephemeral ports start (free_port() and every outgoing
#: connection get theirs there), and the lowest port free_ports_in_a_row uses.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOW_PORTS_FLOOR = 10_000


class PortTakenError(RuntimeError):
    """A process could not bind a port picked for it (taken in the meantime)."""


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` has a listening TCP socket on `port`. A readiness
    probe that got its answer from another test's process on a port ours
    failed to bind would otherwise take that process for ours (a test then
    SIGSTOPped its own, dead, etcd while its coordinator used another's)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def _ports_of_this_worker() -> range:
    """Ports below the kernel's ephemeral range, a slice of them per
    pytest-xdist worker: no outgoing connection is given one (the kernel
    picks those from the ephemeral range), nor is free_port()'s answer, nor
    another worker's pick; the tests of one worker run one at a time."""
    try:
        low = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default start
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    span = (low - LOW_PORTS_FLOOR) // workers
    start = LOW_PORTS_FLOOR + index * span
    return range(start, start + span)


def free_ports_in_a_row(count: int) -> int:
    """The first of `count` consecutive loopback ports that are all free
    right now (`tidelog dev --port P` serves brokers and the gateway on
    P, P+1, ...: a port taken by another test made one of them exit). Taken
    from `_ports_of_this_worker`: with free_port()'s ports the gateway, which
    `tidelog dev` starts last, some 15 s later under load, found its port
    taken by another process in CI."""
    ports = _ports_of_this_worker()
    while True:
        if len(ports) > count:
            base = random.randrange(ports.start, ports.stop - count)
        else:  # a range too small to share: the kernel's choice, as before
            base = free_port()
        if base + count > MAX_PORT + 1:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()


def start_on_free_ports(start: Callable[[], T]) -> T:
    """`start()`, which picks its ports with free_port(), again on new ports
    when one was taken before the process bound it."""
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        try:
            return start()
        except PortTakenError:
            if attempt == PORT_RACE_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
