"""The shared service fixtures, built for a pytest scope: one real etcd, one
cluster on it (a coordinator and three brokers) and one gateway in front of
it, each started only when a test asks and stopped by PID after the scope.

tests/conftest.py takes them once per module; a directory whose tests share
one cluster for longer (tests/integration/clients: once per package) takes
them with its own scope. A module that needs another shape of one of them
defines a fixture of that name, which pytest prefers; the others then build
on it (a module's own `cluster` gets the shared `gateway` in front of it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from tests.support.cluster import ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess, running_etcd
from tests.support.gateway import GatewayProcess, gateway_of

Scope = Literal["module", "package", "session"]


def service_fixtures(scope: Scope) -> tuple[Callable[..., object], ...]:
    """The fixtures `etcd`, `cluster` and `gateway` with `scope`; bind them
    to those names in a conftest: `etcd, cluster, gateway = service_fixtures(...)`."""

    @pytest.fixture(scope=scope)
    def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
        with running_etcd(tmp_path_factory.mktemp("etcd")) as process:
            yield process

    @pytest.fixture(scope=scope)
    def cluster(
        etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ClusterProcesses]:
        with running_cluster(tmp_path_factory.mktemp("cluster"), etcd=etcd) as processes:
            yield processes

    @pytest.fixture(scope=scope)
    def gateway(
        cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[GatewayProcess]:
        with gateway_of(cluster, tmp_path_factory.mktemp("gateway")) as process:
            yield process

    return etcd, cluster, gateway
