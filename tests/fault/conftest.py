"""Fault tests: `soak` tests run only when chosen (`pytest -m soak`).

`cluster` here is a fresh replicated cluster per test (the tests kill its
processes), on the module's etcd (tests/conftest.py) under the test's own
key prefix; `gateway` is one in front of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault.replication_support import ReplicatedCluster, running_replicated_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess, gateway_of


@pytest.fixture
def cluster(
    etcd: EtcdProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ReplicatedCluster]:
    with running_replicated_cluster(etcd, tmp_path, f"/{request.node.name[:40]}") as processes:
        yield processes


@pytest.fixture
def gateway(cluster: ReplicatedCluster, tmp_path: Path) -> Iterator[GatewayProcess]:
    with gateway_of(cluster, tmp_path / "logs") as g:
        yield g


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "soak" in (config.getoption("markexpr") or ""):
        return
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("soak") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
