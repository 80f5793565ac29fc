"""Fixtures any test directory can use, started only by a test that asks:
one real etcd, one cluster on it (a coordinator and three brokers) and one
gateway in front of it, each once per test module and stopped by PID after
it. Tests isolate themselves by topic, group or key prefix. A directory or
module that needs another shape (more brokers, TLS, a fresh etcd per test)
defines a fixture of the same name, which pytest prefers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import ClusterProcesses, running_cluster
from tests.support.etcd import EtcdProcess, running_etcd
from tests.support.gateway import GatewayProcess, running_gateway


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as process:
        yield process


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), etcd=etcd) as processes:
        yield processes


@pytest.fixture(scope="module")
def gateway(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with running_gateway(
        cluster.etcd.endpoint, tmp_path_factory.mktemp("gateway"), prefix=cluster.prefix
    ) as process:
        yield process
