"""A member the coordinator refuses when it joins again, against a real
cluster (etcd, a coordinator with --group-max-members 1, 3 brokers).

The first member (a Consumer in its own process) owns the group's
partitions; it is frozen (SIGSTOP) past its session, a second consumer
takes its place (the group's one seat), then the first is continued: its
session is gone, it reports its partitions lost and joins again, and the
coordinator refuses (the group is full). That refusal is raised from its
next poll(), as Kafka raises GroupMaxSizeReachedException; the consumer
stays subscribed, owning nothing, and each later poll() tries the join
again: once the seat is free it joins and consumes.

On main the refusal was only logged by the membership, which went on
rejoining once a second; poll() returned {} for ever."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog import Consumer
from tidelog.errors import InvalidRequestError

from tests.integration.groups.conftest import (
    ConsumerProcess,
    create_topic,
    produce,
    wait_until,
)
from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcesses]:
    root: Path = tmp_path_factory.mktemp("cluster")
    etcd = EtcdProcess.start(root)
    try:
        with start_cluster(
            root, etcd=etcd, brokers=3, coordinator_args=["--group-max-members", "1"]
        ) as processes:
            yield processes
    finally:
        etcd.stop()


def _subscribe_once_there_is_room(consumer: Consumer, topic: str) -> None:
    """The one seat is the frozen member's until its session expires."""
    deadline = time.monotonic() + 60
    while True:
        try:
            consumer.subscribe([topic])
            return
        except InvalidRequestError as exc:
            assert "at most 1" in str(exc), exc
            assert time.monotonic() < deadline, "the frozen member's session never expired"
            time.sleep(0.5)


def test_a_rejoin_the_coordinator_refuses_is_raised_from_poll_and_retried_by_the_next(
    cluster: ClusterProcesses,
    names: tuple[str, str],
    consumers: Callable[..., ConsumerProcess],
) -> None:
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, 5)
    first = consumers(group, topic, "--report-errors")
    everything = set(range(PARTITIONS))
    wait_until(lambda: first.assignment() == everything, 60, "the first member owns everything")
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        with Consumer(
            bootstrap_servers=cluster.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            request_timeout_ms=5_000,
        ) as second:
            _subscribe_once_there_is_room(second, topic)
            wait_until(lambda: _owns(second, everything), 60, "the second member owns everything")
            os.kill(first.proc.pid, signal.SIGCONT)
            wait_until(lambda: _poll_errors(first), 60, "the refusal raised from poll()")
            (refusal, *_) = _poll_errors(first)
            assert refusal["type"] == "InvalidRequestError", refusal
            assert "at most 1 (--group-max-members)" in refusal["message"], refusal
            failed_commits = [e for e in _errors(first) if e["during"] == "commit"]
            assert all(e["type"] == "UnknownMemberIdError" for e in failed_commits), failed_commits
            # Its partitions were reported lost before (the session ended).
            assert first.count("lost") == 1
            assert first.assignment() == set()
            # Still refused while the seat is taken: every poll says so.
            wait_until(lambda: len(_poll_errors(first)) >= 3, 60, "later polls raising it too")
            assert first.assignment() == set()
        # The second left: the first's next poll joins, and it reads again.
        wait_until(lambda: first.assignment() == everything, 60, "the first member back in")
        wait_until(lambda: first.count("records") > 0, 60, "the first member reading again")
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)


def _owns(consumer: Consumer, partitions: set[int]) -> bool:
    consumer.poll(timeout_ms=100)
    return {tp.partition for tp in consumer.assignment()} == partitions


def _errors(consumer: ConsumerProcess) -> list[dict[str, Any]]:
    return [e for e in consumer.snapshot() if e["event"] == "error"]


def _poll_errors(consumer: ConsumerProcess) -> list[dict[str, Any]]:
    """What its poll() raised. A commit may fail too, and is not counted:
    frozen between a poll and its commit, it commits as a member whose
    session is gone once it goes on (UnknownMemberIdError)."""
    return [e for e in _errors(consumer) if e["during"] == "poll"]
