"""A real gateway process for tests, on a free loopback port, stopped by PID.

`start_gateway(etcd_endpoint, log_dir, prefix=...)` runs `python -m
tidelog_gateway` with the test's interpreter, waits until its health check
answers SERVING (it does once it has listed the cluster in etcd) and returns
a `GatewayProcess`. Output goes to `<log_dir>/gateway-<port>.log`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from tests.support.processes import (
    ServiceProcess,
    free_port,
    spawn_service,
    start_on_free_ports,
)

#: Generous: on a loaded 2-core CI machine a coordinator had not even finished importing
#: Python after 20 s. A process that exits fails at once; only a slow start waits this long.
START_TIMEOUT_S = 60.0


class GatewayProcess(ServiceProcess):
    """One gateway; SIGTERM drains it first, so stopping may take longer."""

    stop_timeout_s = 20.0


def start_gateway(
    etcd_endpoint: str, log_dir: Path, *, prefix: str, extra_args: Sequence[str] = ()
) -> GatewayProcess:
    log_dir.mkdir(parents=True, exist_ok=True)

    def start() -> GatewayProcess:
        port = free_port()
        address = f"127.0.0.1:{port}"
        log_path = log_dir / f"gateway-{port}.log"
        args = [
            sys.executable, "-m", "tidelog_gateway",
            "--listen", address,
            "--etcd", etcd_endpoint,
            "--prefix", prefix,
            *extra_args,
        ]  # fmt: skip
        proc = spawn_service("gateway", args, address, log_path, START_TIMEOUT_S)
        return GatewayProcess(proc, address, log_path)

    return start_on_free_ports(start)


@contextmanager
def running_gateway(
    etcd_endpoint: str, log_dir: Path, *, prefix: str, extra_args: Sequence[str] = ()
) -> Iterator[GatewayProcess]:
    """`start_gateway` for the duration of the block; stopped (drained) after it."""
    process = start_gateway(etcd_endpoint, log_dir, prefix=prefix, extra_args=extra_args)
    try:
        yield process
    finally:
        process.stop()


class _Etcd(Protocol):
    @property
    def endpoint(self) -> str: ...


class Cluster(Protocol):
    """What a gateway needs of a test cluster (ClusterProcesses, the fault
    tests' ReplicatedCluster): its etcd and key prefix."""

    @property
    def etcd(self) -> _Etcd: ...

    @property
    def prefix(self) -> str: ...


@contextmanager
def gateway_of(cluster: Cluster, log_dir: Path, *extra_args: str) -> Iterator[GatewayProcess]:
    """`running_gateway` in front of `cluster` (its etcd and prefix), with
    `extra_args` (limits, budgets) on its command line."""
    with running_gateway(
        cluster.etcd.endpoint, log_dir, prefix=cluster.prefix, extra_args=extra_args
    ) as process:
        yield process
