"""Prometheus metrics of a live cluster: etcd, a coordinator, two brokers and a
gateway, each started with `--metrics-port`, scraped over HTTP while records
are produced, consumed by a group through the gateway, committed, and while
a broker dies. Each metric is seen to move, not only to exist.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tidelog import AdminClient, Consumer, NewTopic, Producer

from tests.support.cluster import BROKER_SESSION_TTL_S, ClusterProcesses
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess
from tests.support.processes import free_port, start_broker

PREFIX = "/metrics"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tidelog.json"
DEADLINE_S = 30.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wait_for(url: str, check: Callable[[Samples], bool], what: str, shown: str = "") -> Samples:
    """Scrape `url` until `check` holds; the failure lists the last samples
    whose names start with `shown` (what the check was looking at)."""
    deadline = time.monotonic() + DEADLINE_S
    samples = scrape(url)
    while not check(samples):
        if time.monotonic() > deadline:
            seen = sorted(
                (name, dict(labels), v) for (name, labels), v in samples.items()
                if shown and name.startswith(shown)
            )  # fmt: skip
            raise AssertionError(f"{what} not seen within {DEADLINE_S} s at {url}; last: {seen}")
        time.sleep(0.2)
        samples = scrape(url)
    return samples


@dataclass
class MeteredCluster:
    processes: ClusterProcesses
    gateway: GatewayProcess
    #: service name -> metrics URL.
    urls: dict[str, str]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeteredCluster]:
    root: Path = tmp_path_factory.mktemp("metrics")
    etcd = EtcdProcess.start(root / "etcd")
    urls: dict[str, str] = {}

    def metrics_args(name: str) -> list[str]:
        port = free_port()
        urls[name] = f"http://127.0.0.1:{port}/metrics"
        return ["--metrics-port", str(port)]

    try:
        with ClusterProcesses(etcd, PREFIX) as processes:
            processes.add_coordinator(
                root, [*metrics_args("coordinator"), "--metrics-interval-ms", "200"]
            )
            for broker_id in range(2):
                processes.add_broker(root, metrics_args(f"broker-{broker_id}"))
            processes.wait_registered(2)
            gateway = processes.add_gateway(root, metrics_args("gateway"))
            yield MeteredCluster(processes, gateway, urls)
    finally:
        etcd.stop()


def test_metrics_move_with_produce_consume_commit_and_a_broker_death(
    cluster: MeteredCluster,
) -> None:
    urls = cluster.urls
    topic, group, count = "metered", "metered-group", 50
    before = {name: scrape(url) for name, url in urls.items()}
    assert value(before["coordinator"], "tidelog_coordinator_active_controller") is not None
    assert total(before["broker-0"], "tidelog_broker_produce_requests_total", topic=topic) == 0

    metadata = "/tidelog.v1.Admin/CreateTopics"
    timed = total(before["broker-0"], "tidelog_rpc_duration_seconds_count", method=metadata)
    with AdminClient(bootstrap_servers=cluster.processes.brokers[0].address) as admin:
        admin.create_topics([NewTopic(topic, 2, 2)])
        admin.list_topics()
    # Unary calls are counted and timed per method.
    assert (
        total(scrape(urls["broker-0"]), "tidelog_rpc_duration_seconds_count", method=metadata)
        > timed
    )
    with Producer(bootstrap_servers=cluster.processes.bootstrap, acks="all") as producer:
        for i in range(count):
            producer.send(topic, f"record-{i}".encode(), partition=i % 2)
        producer.flush(timeout=30)

    # Brokers: requests, bytes and latency counted; log end offsets per partition.
    after = {name: scrape(urls[name]) for name in ("broker-0", "broker-1")}
    produced = sum(
        total(s, "tidelog_broker_produce_requests_total", topic=topic) for s in after.values()
    )
    assert produced >= 2  # each partition's leader appended at least one request
    assert sum(
        total(s, "tidelog_broker_produce_bytes_total", topic=topic) for s in after.values()
    ) > count * len("record-0")
    assert (
        sum(
            total(s, "tidelog_broker_produce_duration_seconds_count", acks="all")
            for s in after.values()
        )
        >= 2
    )
    for samples in after.values():
        # Both brokers host both partitions (replication factor 2).
        ends = [
            value(samples, "tidelog_broker_log_end_offset", topic=topic, partition=str(p))
            for p in (0, 1)
        ]
        assert ends == [count / 2, count / 2]
        assert total(samples, "tidelog_broker_log_size_bytes", topic=topic) > 0
    leaders = sum(total(s, "tidelog_broker_leader_partitions") for s in after.values())
    assert leaders == 2

    # The coordinator, as controller: the cluster as etcd says it is.
    coordinator = wait_for(
        urls["coordinator"],
        lambda s: (
            value(s, "tidelog_cluster_partitions") == 2 and value(s, "tidelog_cluster_brokers") == 2
        ),
        "the new topic's partitions",
    )
    assert value(coordinator, "tidelog_coordinator_active_controller") == 1
    assert value(coordinator, "tidelog_cluster_offline_partitions") == 0
    assert value(coordinator, "tidelog_cluster_offline_replicas") == 0
    assert total(coordinator, "tidelog_cluster_partition_leaders") == 2

    # A group through the gateway: members, a rebalance, fetches, then lag.
    consumer = Consumer(
        topic,
        group_id=group,
        bootstrap_servers=cluster.gateway.address,
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    try:
        seen = 0
        for seen, _record in enumerate(consumer, 1):
            if seen == count // 2:
                break
        # Iteration also ends after consumer_timeout_ms without a record.
        assert seen == count // 2, f"the group's consumer read {seen} of {count // 2} records"
        consumer.commit()
        coordinator = wait_for(
            urls["coordinator"],
            lambda s: (
                value(s, "tidelog_group_members", group=group) == 1
                and total(s, "tidelog_group_rebalances_total", group=group) >= 1
                and total(s, "tidelog_group_committed_offset", group=group) == count // 2
                and total(s, "tidelog_group_lag_records", group=group) == count - count // 2
            ),
            "the group's members, committed offsets and lag",
            shown="tidelog_group_",
        )
    finally:
        consumer.close()
    fetched = sum(
        total(scrape(urls[name]), "tidelog_broker_fetch_bytes_total", topic=topic)
        for name in ("broker-0", "broker-1")
    )
    assert fetched > 0
    gateway = scrape(urls["gateway"])
    assert total(gateway, "tidelog_rpc_requests_total", method="/tidelog.v1.Log/Fetch") >= 1
    assert total(gateway, "tidelog_rpc_requests_total", method="/tidelog.v1.Group/Heartbeat") >= 1
    assert value(gateway, "tidelog_gateway_streams") is not None

    # The group left: no members; lag stays, computed from the committed offsets.
    wait_for(
        urls["coordinator"],
        lambda s: not value(s, "tidelog_group_members", group=group),
        "the group emptied",
    )

    # A broker dies: under-replicated partitions, an ISR shrink on the survivor.
    shrinks_before = total(scrape(urls["broker-0"]), "tidelog_broker_isr_shrinks_total")
    cluster.processes.brokers[1].kill()
    coordinator = wait_for(
        urls["coordinator"],
        lambda s: (
            value(s, "tidelog_cluster_under_replicated_partitions") == 2
            and value(s, "tidelog_cluster_brokers") == 1
        ),
        f"both partitions under-replicated (session TTL {BROKER_SESSION_TTL_S} s)",
    )
    assert total(coordinator, "tidelog_cluster_partition_leaders", broker_id="0") == 2
    # Its replica of each partition is offline, as Kafka reports a dead broker's.
    coordinator = wait_for(
        urls["coordinator"],
        lambda s: value(s, "tidelog_cluster_offline_replicas") == 2,
        "the dead broker's two replicas offline",
        shown="tidelog_cluster_",
    )
    survivor = wait_for(
        urls["broker-0"],
        lambda s: value(s, "tidelog_broker_under_replicated_partitions", broker_id="0") == 2,
        "the survivor leading both partitions under-replicated",
    )
    assert total(survivor, "tidelog_broker_leader_partitions") == 2
    assert total(survivor, "tidelog_broker_isr_shrinks_total") > shrinks_before

    # The Grafana dashboard queries only metrics that the services serve.
    served = {
        name
        for service in ("coordinator", "broker-0", "gateway")
        for name, _labels in scrape(urls[service])
    }
    queried = set(re.findall(r"tidelog_[a-z_]+", DASHBOARD.read_text()))
    assert queried and queried <= served, sorted(queried - served)


def test_metrics_port_zero_takes_a_free_port_and_logs_it(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "broker", extra_args=("--metrics-port", "0"))
    try:
        deadline = time.monotonic() + DEADLINE_S
        found = None
        while found is None and time.monotonic() < deadline:
            found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", broker.log_tail())
            time.sleep(0.1)
        assert found is not None, broker.log_tail()
        samples = scrape(found.group(1))
        assert value(samples, "tidelog_broker_partitions", broker_id="0") == 0
    finally:
        broker.stop()
