"""Real coordinator processes for tests, on free loopback ports, stopped by PID.

`start_coordinator(etcd_endpoint, log_dir, prefix=..., coordinator_id=...)`
runs `python -m tidelog_coordinator` with the test's interpreter, waits for
its health check to answer SERVING and returns a `CoordinatorProcess`.
Output goes to `<log_dir>/coordinator-<id>.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import free_port, wait_serving

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


class CoordinatorProcess:
    """One coordinator replica. Not thread-safe; one owner."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM (clean shutdown: revokes its session), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def start_coordinator(
    etcd_endpoint: str,
    log_dir: Path,
    *,
    prefix: str,
    coordinator_id: str,
    session_ttl_s: int = 2,
    extra_args: tuple[str, ...] = (),
) -> CoordinatorProcess:
    port = free_port()
    address = f"127.0.0.1:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"coordinator-{coordinator_id}.log"
    args = [
        sys.executable, "-m", "tidelog_coordinator",
        "--listen", address,
        "--etcd", etcd_endpoint,
        "--prefix", prefix,
        "--id", coordinator_id,
        "--session-ttl-s", str(session_ttl_s),
        *extra_args,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(address, START_TIMEOUT_S, proc)
    except Exception as exc:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise RuntimeError(f"coordinator did not start: {exc}; see {log_path}") from exc
    return CoordinatorProcess(proc, address, log_path)
