"""A Python child process's output, for settings a module reads once per process (gRPC reads
GRPC_EXPERIMENTS when first imported): run `code` in a fresh interpreter with a chosen
environment."""

from __future__ import annotations

import os
import subprocess
import sys


def child_output(code: str, *, unset: str = "", **env: str) -> str:
    """What `python -c code` prints (stripped), with this environment less `unset`, plus `env`;
    fails the test when the child fails."""
    environ = {k: v for k, v in os.environ.items() if k != unset}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
