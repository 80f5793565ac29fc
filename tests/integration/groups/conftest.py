"""Fixtures for consumer-group tests: one real cluster per module (etcd, a
coordinator, three brokers in cluster mode), consumers as real processes.

Tests isolate themselves by topic and group names, so one cluster serves a
module; every process started is stopped by PID at the end.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog import AdminClient, AsyncAdminClient, NewTopic, Producer

from tests.support.cluster import ClusterProcesses, start_cluster
from tests.support.etcd import EtcdProcess

_names = itertools.count()
SESSION_MS = 3000
#: How much of each consumer's log a failed test shows.
LOG_TAIL_CHARS = 4000


class ConsumerProcess:
    """tests/integration/groups/consumer_proc.py in a subprocess; its events
    are collected by a reader thread."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.groups.consumer_proc", *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def assignment(self) -> set[int]:
        owned: set[int] = set()
        for event in self.snapshot():
            if event["event"] == "assigned":
                owned |= set(event["partitions"])
            elif event["event"] in ("revoked", "lost"):
                owned -= set(event["partitions"])
        return owned

    def processed(self) -> set[tuple[int, int]]:
        return {(p, o) for e in self.snapshot() if e["event"] == "records" for p, o in e["records"]}

    def count(self, kind: str) -> int:
        return sum(1 for e in self.snapshot() if e["event"] == kind)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcesses]:
    root = tmp_path_factory.mktemp("cluster")
    etcd = EtcdProcess.start(root)
    try:
        processes = start_cluster(root, etcd=etcd, brokers=3)
        try:
            yield processes
        finally:
            processes.stop()
    finally:
        etcd.stop()


@pytest.fixture
def names(request: pytest.FixtureRequest) -> tuple[str, str]:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    n = next(_names)
    return f"{base}-t{n}", f"{base}-g{n}"


@pytest.fixture
def consumers(
    cluster: ClusterProcesses, tmp_path: Path
) -> Iterator[Callable[..., ConsumerProcess]]:
    started: list[ConsumerProcess] = []
    ids = itertools.count()

    def start(group: str, topic: str, *extra: str, session_ms: int = SESSION_MS) -> ConsumerProcess:
        process = ConsumerProcess(
            [cluster.bootstrap, group, topic, str(session_ms), *extra],
            tmp_path / f"consumer-{next(ids)}.log",
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.kill()
            # Shown by pytest when the test failed: what each consumer
            # logged (a traceback that ended it early, say).
            log = process.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            print(f"--- {process.log_path.name} (last {LOG_TAIL_CHARS} chars)\n{log}")


def create_topic(cluster: ClusterProcesses, topic: str, partitions: int) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions)])


def produce(cluster: ClusterProcesses, topic: str, partitions: int, per_partition: int) -> None:
    """`per_partition` records to each partition, every one acknowledged
    (flush() returns once each send is done, failed ones too: a record that
    was never written must fail here, not look like a consumer that missed it)."""
    with Producer(cluster.bootstrap, linger_ms=2) as producer:
        sent = [
            producer.send(topic, value=b"%d-%d" % (p, i), partition=p)
            for i in range(per_partition)
            for p in range(partitions)
        ]
        producer.flush()
        for future in sent:
            future.get(timeout=60)


async def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    """The group's committed offsets, by partition (as an administrator reads them)."""
    async with AsyncAdminClient(bootstrap) as admin:
        offsets = await admin.list_consumer_group_offsets(group)
    return {tp.partition: om.offset for tp, om in offsets.items()}
