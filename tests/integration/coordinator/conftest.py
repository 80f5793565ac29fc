"""Fixtures for coordinator tests: one real etcd per module, a fresh key prefix per test.

Tests isolate themselves by prefix (each cluster lives under its own prefix),
so one etcd serves the whole module; tests that restart etcd start their own.
Coordinators run as real processes (`coordinators` starts them on demand and
stops every one by PID at the end of the test).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess

_prefixes = itertools.count()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"/t{next(_prefixes)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")


StartCoordinator = Callable[..., CoordinatorProcess]


@pytest.fixture
def coordinators(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[StartCoordinator]:
    started: list[CoordinatorProcess] = []
    ids = itertools.count()

    def start(etcd_endpoint: str | None = None, **kwargs: object) -> CoordinatorProcess:
        process = start_coordinator(
            etcd_endpoint or etcd.endpoint,
            tmp_path / "logs",
            prefix=prefix,
            coordinator_id=f"c{next(ids)}",
            **kwargs,  # type: ignore[arg-type]
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
