"""Fixtures of the Spark tests: one SparkSession and one Tidelog cluster per run.

Every test here is marked `xdist_group("spark")` (by `pytest_collection_
modifyitems` below), so under pytest-xdist they all run in one worker, which
starts Spark once: a cold session takes ~20 s, a warm one ~5 s, and the first
micro-batch of a run a few more while Python workers start. The tests that
run their Spark drivers as processes of their own and use no session
(`spark_runnable`, not `spark`) are `xdist_group("spark-drivers")` instead:
they are the longest here (minutes together), and beside the session's tests
in one worker they made that worker the last to finish.

- `spark_runnable`: skips, naming what is missing, without Java or pyspark.
- `spark`: a local[2] SparkSession bound to 127.0.0.1 with its UI off, its
  Python workers running this interpreter (the venv's), scratch space under
  the test run's tmp dir. Skipped, naming what is missing, without Java.
- `cluster`: etcd, a coordinator and one broker (tests/support), the broker
  applying retention every 200 ms so that tests of data loss need not wait.
- `tidelog_bootstrap`, `admin`, `produce`, `new_topic`: what tests use.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tidelog import AdminClient, NewTopic, Producer

from tests.spark.session import spark_builder_config, spark_environment
from tests.support.cluster import ClusterProcesses
from tests.support.coordinator import start_coordinator
from tests.support.etcd import EtcdProcess

_names = itertools.count()

#: The broker applies retention this often (ms) in these tests.
RETENTION_CHECK_MS = 200


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: before tests/conftest.py's hook and pytest-xdist's read the marks.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            names = getattr(item, "fixturenames", ())
            own_drivers = "spark_runnable" in names and "spark" not in names
            item.add_marker(pytest.mark.xdist_group("spark-drivers" if own_drivers else "spark"))


@pytest.fixture(scope="session")
def spark_runnable() -> Any:
    """pyspark.sql, once Java and pyspark are known to be there (else a skip)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17 or later: apt-get install openjdk-17-jre-headless")
    return pytest.importorskip(
        "pyspark.sql", reason="pyspark is missing: `make install` installs tidelog[spark]"
    )


@pytest.fixture(scope="session")
def spark(spark_runnable: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pyspark_sql = spark_runnable
    os.environ.update(spark_environment())
    builder = pyspark_sql.SparkSession.builder.appName("tidelog-tests")
    for key, value in spark_builder_config(tmp_path_factory.mktemp("spark")).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


class _FastRetentionCluster(ClusterProcesses):
    def broker_args(self, broker_id: int) -> list[str]:
        return [
            *super().broker_args(broker_id),
            "--set", f"log.retention.check.interval.ms={RETENTION_CHECK_MS}",
        ]  # fmt: skip


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcesses]:
    root = tmp_path_factory.mktemp("spark-cluster")
    etcd = EtcdProcess.start(root / "etcd")
    try:
        processes = _FastRetentionCluster(etcd, "/tidelog")
        processes.coordinators.append(
            start_coordinator(
                etcd.endpoint,
                root / "logs",
                prefix="/tidelog",
                coordinator_id="c0",
                session_ttl_s=3,
            )
        )
        processes.add_broker(root)
        processes.wait_registered(1)
        try:
            yield processes
        finally:
            processes.stop()
    finally:
        etcd.stop()


@pytest.fixture(scope="session")
def tidelog_bootstrap(cluster: ClusterProcesses) -> str:
    return cluster.bootstrap


@pytest.fixture(scope="session")
def admin(tidelog_bootstrap: str) -> Iterator[AdminClient]:
    client = AdminClient(tidelog_bootstrap)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def new_topic(admin: AdminClient, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Create a topic named after the test: new_topic(partitions=1, **configs)."""

    def create(partitions: int = 1, suffix: str = "", **configs: str) -> str:
        base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
        name = f"{base}{suffix}-{next(_names)}"
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, topic_configs=configs)]
        )
        return name

    return create


@pytest.fixture
def produce(tidelog_bootstrap: str) -> Callable[..., None]:
    """produce(topic, values, partition=None, keys=None, headers=None)."""

    def send(
        topic: str,
        values: Sequence[bytes],
        partition: int | None = None,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[list[tuple[str, bytes | None]] | None] | None = None,
        timestamps: Sequence[int] | None = None,
    ) -> None:
        with Producer(tidelog_bootstrap, acks="all", linger_ms=5) as producer:
            futures = [
                producer.send(
                    topic,
                    value,
                    key=None if keys is None else keys[i],
                    partition=partition,
                    headers=None if headers is None else headers[i],
                    timestamp_ms=None if timestamps is None else timestamps[i],
                )
                for i, value in enumerate(values)
            ]
            for future in futures:
                future.get(timeout=30)

    return send
