"""A real gateway process for tests, on a free loopback port, stopped by PID.

`start_gateway(etcd_endpoint, log_dir, prefix=...)` runs `python -m
tidelog_gateway` with the test's interpreter, waits until its health check
answers SERVING (it does once it has listed the cluster in etcd) and returns
a `GatewayProcess`. Output goes to `<log_dir>/gateway-<port>.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.processes import free_port, wait_serving

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


class GatewayProcess:
    """One gateway. Not thread-safe; one owner."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int:
        """SIGTERM (drain), then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_gateway(
    etcd_endpoint: str, log_dir: Path, *, prefix: str, extra_args: Sequence[str] = ()
) -> GatewayProcess:
    port = free_port()
    address = f"127.0.0.1:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"gateway-{port}.log"
    args = [
        sys.executable, "-m", "tidelog_gateway",
        "--listen", address,
        "--etcd", etcd_endpoint,
        "--prefix", prefix,
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
        raise RuntimeError(f"gateway did not start: {exc}; see {log_path}") from exc
    return GatewayProcess(proc, address, log_path)
