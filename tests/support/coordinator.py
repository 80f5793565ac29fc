"""Real coordinator processes for tests, on free loopback ports, stopped by PID.

`start_coordinator(etcd_endpoint, log_dir, prefix=..., coordinator_id=...)`
runs `python -m tidelog_coordinator` with the test's interpreter, waits for
its health check to answer SERVING and returns a `CoordinatorProcess`.
Output goes to `<log_dir>/coordinator-<id>.log`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.processes import (
    ServiceProcess,
    free_port,
    spawn_service,
    start_on_free_ports,
)

#: Generous: on a loaded 2-core CI machine a coordinator had not even finished importing
#: Python after 20 s. A process that exits fails at once; only a slow start waits this long.
START_TIMEOUT_S = 60.0


class CoordinatorProcess(ServiceProcess):
    """One coordinator replica (SIGTERM revokes its session)."""


def start_coordinator(
    etcd_endpoint: str,
    log_dir: Path,
    *,
    prefix: str,
    coordinator_id: str,
    session_ttl_s: int = 2,
    extra_args: tuple[str, ...] = (),
) -> CoordinatorProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"coordinator-{coordinator_id}.log"

    def start() -> CoordinatorProcess:
        address = f"127.0.0.1:{free_port()}"
        args = [
            sys.executable, "-m", "tidelog_coordinator",
            "--listen", address,
            "--etcd", etcd_endpoint,
            "--prefix", prefix,
            "--id", coordinator_id,
            "--session-ttl-s", str(session_ttl_s),
            *extra_args,
        ]  # fmt: skip
        proc = spawn_service("coordinator", args, address, log_path, START_TIMEOUT_S)
        return CoordinatorProcess(proc, address, log_path)

    return start_on_free_ports(start)
