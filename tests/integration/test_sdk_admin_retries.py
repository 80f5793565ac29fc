"""The admin client sends a call again on retriable errors until
default_api_timeout_ms (tidelog._admin_retry), against real etcd, brokers
and coordinators.

Seen in CI: an admin call made while the coordinator was (re)starting
raised CoordinatorNotAvailableError ("no coordinator is registered") at
once. Now a read waits for the coordinator, and so does a write that the
broker refused before acting (it could forward it to no coordinator); a
cluster that never gets one fails after the api timeout, naming it; an
error that is no passing state is raised at once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from tidelog import AdminClient, NewTopic
from tidelog.errors import (
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
)

from tests.support.cluster import ClusterProcesses
from tests.support.etcd import EtcdProcess
from tests.support.processes import free_port, start_broker

pytestmark = pytest.mark.timeout(240)

#: How long after the call the coordinator starts.
COORDINATOR_LATE_S = 3.0
#: Generous: only bounds a broken test.
API_TIMEOUT_MS = 120_000


def brokers_without_coordinator(etcd: EtcdProcess, root: Path, prefix: str) -> ClusterProcesses:
    cluster = ClusterProcesses(etcd, prefix)
    try:
        cluster.add_broker(root)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def test_calls_made_before_the_coordinator_starts_succeed_once_it_has(
    etcd: EtcdProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tidelog.admin")
    with brokers_without_coordinator(etcd, tmp_path, "/late-coordinator") as cluster:
        timer = threading.Timer(COORDINATOR_LATE_S, cluster.add_coordinator, (tmp_path,))
        timer.start()
        try:
            with AdminClient(cluster.bootstrap, default_api_timeout_ms=API_TIMEOUT_MS) as admin:
                # A read: nothing to find the group service with yet.
                assert admin.list_consumer_groups() == []
                assert admin.list_consumer_group_offsets("g") == {}
        finally:
            timer.join()
        assert "no coordinator is registered" in caplog.text, caplog.text


def test_a_write_the_broker_could_not_forward_is_sent_again(
    etcd: EtcdProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tidelog.admin")
    with brokers_without_coordinator(etcd, tmp_path, "/late-write") as cluster:
        timer = threading.Timer(COORDINATOR_LATE_S, cluster.add_coordinator, (tmp_path,))
        timer.start()
        try:
            with AdminClient(cluster.bootstrap, default_api_timeout_ms=API_TIMEOUT_MS) as admin:
                # The broker refuses it before acting (no coordinator to
                # forward it to) and says so: sent again, created once.
                assert admin.create_topics([NewTopic("late", 1, 1)]) == {"late": None}
                assert "late" in admin.list_topics()
        finally:
            timer.join()
        assert "no coordinator is registered in etcd" in caplog.text, caplog.text


def test_a_cluster_without_coordinator_fails_after_the_api_timeout_naming_it(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    with (
        brokers_without_coordinator(etcd, tmp_path, "/never-a-coordinator") as cluster,
        AdminClient(
            cluster.bootstrap, default_api_timeout_ms=3_000, request_timeout_ms=2_000
        ) as admin,
    ):
        with pytest.raises(CoordinatorNotAvailableError) as read:
            admin.list_consumer_groups()
        with pytest.raises(CoordinatorNotAvailableError) as write:
            admin.create_topics([NewTopic("never", 1, 1)])
    for raised in (read, write):
        message = raised.value.message
        assert "no coordinator is registered" in message, message
        assert "default_api_timeout_ms=3000 ran out" in message, message
        assert "attempts" in message, message


def test_errors_that_are_answers_are_raised_at_once(
    cluster: ClusterProcesses, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tidelog.admin")
    # Were they retried, these would wait out this long (the test's timeout).
    with AdminClient(cluster.bootstrap, default_api_timeout_ms=600_000) as admin:
        results = admin.create_topics([NewTopic("bad name!", 1, 1)], raise_errors=False)
        assert isinstance(results["bad name!"], InvalidTopicError)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topics(["no-such-topic-here"])
    assert "retrying" not in caplog.text, caplog.text


def test_addresses_that_never_answered_fail_at_once_a_cluster_once_reached_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bootstrap list none of whose addresses ever answered is most likely
    wrong: raised at once, saying to check it (were it retried, the call
    would wait out this test's timeout). A client that reached its broker
    once retries while the broker is away, as Kafka's does."""
    caplog.set_level(logging.INFO, "tidelog.admin")
    nobody = f"127.0.0.1:{free_port()}"
    with AdminClient(nobody, default_api_timeout_ms=600_000) as admin:
        for call in (admin.list_topics, admin.list_consumer_groups, admin.describe_cluster):
            with pytest.raises(BrokerNotAvailableError, match="check bootstrap_servers") as raised:
                call()
            assert nobody in raised.value.message
    assert "retrying" not in caplog.text, caplog.text

    broker = start_broker(tmp_path / "broker")
    with AdminClient(broker.address, default_api_timeout_ms=3000) as admin:
        admin.list_topics()
        broker.stop()
        with pytest.raises(BrokerNotAvailableError, match="default_api_timeout_ms=3000 ran out"):
            admin.list_topics()
    assert "retrying" in caplog.text, caplog.text
