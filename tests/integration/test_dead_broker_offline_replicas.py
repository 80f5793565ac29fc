"""A stopped broker's replicas are offline replicas, as Kafka reports them
(a replica whose broker is not alive, as well as one whose log directory is
offline): in Metadata from every live broker and from the gateway, in the
coordinator's DescribeTopics (and so AdminClient.describe_topics and
`tidelog topics describe`), and in the controller's
`tidelog_cluster_offline_replicas` gauge; none once it is back.

Before, only a live broker's offline log was listed: a dead broker's
registration, gone with its lease, said nothing, so its replicas looked
fine wherever an operator looked.

Real etcd, a real coordinator (with metrics), three real brokers and a
gateway, over gRPC and HTTP on loopback.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tidelog import AdminClient, NewTopic
from tidelog.v1 import admin_pb2, admin_pb2_grpc, log_pb2, log_pb2_grpc

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess
from tests.support.polling import read_until
from tests.support.processes import free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

TOPIC = "stranded"
PARTITIONS = 2
#: Generous: bounds a broken test only.
DEADLINE_S = 60.0
GAUGE = "tidelog_cluster_offline_replicas"

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ClusterProcesses, str]]:
    """Three brokers, a gateway, and the coordinator's metrics URL."""
    port = free_port()
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        with start_cluster(
            tmp_path / "cluster",
            etcd=etcd,
            brokers=3,
            coordinator_args=["--metrics-port", str(port), "--metrics-interval-ms", "200"],
            gateway_args=[],
        ) as processes:
            yield processes, f"http://127.0.0.1:{port}/metrics"
    finally:
        etcd.stop()


def eventually(read: Callable[[], T], check: Callable[[T], bool], what: str) -> T:
    return read_until(read, check, what, DEADLINE_S)


def offline_in_metadata(address: str) -> list[list[int]]:
    """Each partition's offline replicas in the Metadata answer of `address`."""
    with grpc.insecure_channel(address) as channel:
        answer = log_pb2_grpc.LogStub(channel).Metadata(
            log_pb2.MetadataRequest(topics=[TOPIC]), timeout=DEADLINE_S
        )
    return [list(p.offline_replicas) for p in answer.topics[0].partitions]


def offline_in_describe(coordinator: str) -> list[list[int]]:
    """Each partition's offline replicas in the coordinator's own
    DescribeTopics answer (no broker in between)."""
    with grpc.insecure_channel(coordinator) as channel:
        answer = admin_pb2_grpc.AdminStub(channel).DescribeTopics(
            admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=DEADLINE_S
        )
    return [list(p.offline_replicas) for p in answer.topics[0].partitions]


def gauge(url: str) -> float | None:
    """The controller's offline replicas gauge (None: not served)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == GAUGE:
                return float(sample.value)
    return None


def describe_cli(bootstrap: str, *flags: str) -> list[list[str]]:
    """The rows (cells split on spaces) `tidelog topics describe TOPIC` prints."""
    result = subprocess.run(
        [
            sys.executable, "-m", "tidelog.cli", "topics", "describe", TOPIC, *flags,
            "--bootstrap-server", bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [line.split() for line in result.stdout.splitlines()[1:]]


def test_a_stopped_brokers_replicas_are_reported_offline_until_it_returns(
    cluster: tuple[ClusterProcesses, str],
) -> None:
    processes, metrics_url = cluster
    (gateway,) = processes.gateways
    coordinator = processes.coordinators[0].address
    with AdminClient(processes.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
    nothing = [[]] * PARTITIONS
    assert offline_in_describe(coordinator) == nothing

    stopped = processes.brokers[2]
    stopped.stop()
    survivors = [b.address for b in processes.brokers[:2]] + [gateway.address]
    dead = [[stopped.broker_id]] * PARTITIONS
    for address in survivors:
        eventually(
            lambda a=address: offline_in_metadata(a),  # type: ignore[misc]
            lambda got: got == dead,
            f"Metadata from {address} lists stopped broker {stopped.broker_id}'s replicas",
        )
    assert offline_in_describe(coordinator) == dead
    bootstrap = ",".join(b.address for b in processes.brokers[:2])
    with AdminClient(bootstrap) as admin:
        (described,) = admin.describe_topics([TOPIC])
    assert [p.offline_replicas for p in described.partitions] == dead

    header, *rows = describe_cli(bootstrap)
    assert header[-1] == "offline"
    assert [row[-1] for row in rows] == [str(stopped.broker_id)] * PARTITIONS
    # Under-replicated (out of the ISR, or not yet), but each has a live leader.
    under = describe_cli(bootstrap, "--under-replicated-partitions")
    assert sorted(row[0] for row in under[1:]) == [str(p) for p in range(PARTITIONS)]
    assert describe_cli(bootstrap, "--unavailable-partitions") == []

    # The controller counts them (one replica of each partition).
    eventually(lambda: gauge(metrics_url), lambda v: v == PARTITIONS, f"{GAUGE} {PARTITIONS}")

    # Back: registered again, nothing offline anywhere.
    stopped.spawn()
    for address in survivors:
        eventually(
            lambda a=address: offline_in_metadata(a),  # type: ignore[misc]
            lambda got: got == nothing,
            f"Metadata from {address} lists nothing offline after the restart",
        )
    assert offline_in_describe(coordinator) == nothing
    eventually(lambda: gauge(metrics_url), lambda v: v == 0, f"{GAUGE} back to 0")
    header, *_ = describe_cli(bootstrap)
    assert "offline" not in header
