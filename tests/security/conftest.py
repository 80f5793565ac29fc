"""Fixtures for the hostile-input tests: one real cluster per module (etcd, a
coordinator, three brokers, a gateway), every process stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess, start_gateway


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    process = EtcdProcess.start(tmp_path_factory.mktemp("etcd"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterProcesses]:
    processes = start_cluster(tmp_path_factory.mktemp("cluster"), etcd=etcd, brokers=3)
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture(scope="module")
def gateway(
    cluster: ClusterProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    process = start_gateway(
        cluster.etcd.endpoint, tmp_path_factory.mktemp("gateway"), prefix=cluster.prefix
    )
    try:
        yield process
    finally:
        process.stop()
