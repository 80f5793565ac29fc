"""Fixtures for the other-language clients: one real cluster for the whole
directory (etcd, a coordinator, three brokers, a gateway), and the tools and
example programs built by the project's own scripts.

A build script that exits 3 says the toolchain it needs (go, java, mvn) is not
installed: the test is skipped with that reason, which `pytest -ra` (the
project's default) prints. Any other build failure fails the test. Builds are
cached (tools/go-tools.sh's .cache/go-bin, Go's build cache, ~/.m2 and the
Java build's up-to-date check), so a run with nothing changed builds nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fixtures import service_fixtures

REPO = Path(__file__).resolve().parents[3]
# The first build of grpcurl takes minutes on a shared 2-core machine.
BUILD_TIMEOUT_S = 900
TOOL_MISSING = 3


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One xdist worker runs this directory: its tests share one cluster."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("clients"))


def build(script: str, *args: str) -> Path:
    """Run a build script of the repository and return the path it prints.

    Builds write generated code into the repository: a lock file keeps two
    test processes (xdist workers) from building at the same time."""
    lock_path = REPO / ".cache" / "build.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(script, *args)


def _build_locked(script: str, *args: str) -> Path:
    started = time.monotonic()
    result = subprocess.run(
        [str(REPO / script), *args],
        cwd=REPO,
        # The Go example's code generation runs grpc_tools with this interpreter.
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode == TOOL_MISSING:
        pytest.skip(f"{script}: {result.stderr.strip()}")
    if result.returncode != 0:
        pytest.fail(f"{script} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    print(f"{script}: {time.monotonic() - started:.1f} s")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def go_bin() -> Path:
    """The directory of grpcurl and the Go protoc plugins (tools/go-tools.sh)."""
    return build("tools/go-tools.sh")


@pytest.fixture(scope="session")
def grpcurl(go_bin: Path) -> Path:
    return go_bin / "grpcurl"


# tests/conftest.py's fixtures, once for the whole directory rather than per
# module: every example shares one cluster (and one xdist worker).
etcd, cluster, gateway = service_fixtures("package")
