"""commit() without offsets commits exactly the records handed to the caller
(issue 17): a consumer that commits after each record and is killed between
records loses nothing on restart, however much it had fetched ahead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog import AsyncConsumer, Consumer, TopicPartition

from tests.integration.groups.conftest import create_topic, produce, wait_until
from tests.support.cluster import ClusterProcesses

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 2
PER_PARTITION = 60
#: Records processed (and committed one by one) before the kill: far fewer
#: than one internal fetch holds, so most fetched records were never returned.
STOP_AFTER = 7


class AsyncConsumerProcess:
    """tests/integration/groups/async_consumer_proc.py in a subprocess."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.groups.async_consumer_proc", *args],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    def processed(self) -> set[tuple[int, int]]:
        return {(e["partition"], e["offset"]) for e in self.of("record")}

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def async_consumers(cluster: ClusterProcesses, tmp_path: Path) -> Iterator[Any]:
    started: list[AsyncConsumerProcess] = []

    def start(*args: str) -> AsyncConsumerProcess:
        process = AsyncConsumerProcess(
            [cluster.bootstrap, *args], tmp_path / f"async-consumer-{len(started)}.log"
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.kill()


@pytest.mark.parametrize("read", ["iter", "getone"])
def test_async_consumer_killed_between_records_skips_nothing_on_restart(
    cluster: ClusterProcesses, async_consumers: Any, names: tuple[str, str], read: str
) -> None:
    topic, group = names
    create_topic(cluster, topic, PARTITIONS)
    produce(cluster, topic, PARTITIONS, PER_PARTITION)

    first = async_consumers(group, topic, "--read", read, "--stop-after", str(STOP_AFTER))
    wait_until(lambda: first.of("stopped"), 60, "the first consumer to process its records")
    first.kill()  # between records: the last one returned was also committed
    assert len(first.processed()) == STOP_AFTER

    second = async_consumers(group, topic, "--read", read)
    everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    wait_until(
        lambda: first.processed() | second.processed() >= everything,
        60,
        "every record processed by one consumer or the other",
    )
    # At-least-once, and exactly what was committed: the restart begins at
    # the record after the last one processed (of each partition), not after
    # the records the killed consumer had fetched but not returned.
    assert first.processed() | second.processed() == everything
    assert not first.processed() & second.processed()


def _handed_out_then_commit_sync(bootstrap: str, group: str, tp: TopicPartition) -> int:
    with Consumer(bootstrap_servers=bootstrap, group_id=group) as consumer:
        consumer.assign([tp])
        for _, record in zip(range(3), consumer, strict=False):
            assert record.offset < 3
        consumer.commit()
        committed = consumer.committed(tp)
    assert committed is not None
    return int(committed)


async def _handed_out_then_commit_async(bootstrap: str, group: str, tp: TopicPartition) -> int:
    async with AsyncConsumer(bootstrap_servers=bootstrap, group_id=group) as consumer:
        consumer.assign([tp])
        for _ in range(3):
            assert (await consumer.getone()).offset < 3
        await consumer.commit()
        committed = await consumer.committed(tp)
    assert committed is not None
    return int(committed)


def test_assigned_consumer_with_a_group_id_commits_only_what_iteration_returned(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    """assign() with a group id (no membership): commit() after taking three
    records by iteration commits offset 3, not the end of the fetched chunk."""
    import asyncio

    topic, group = names
    create_topic(cluster, topic, 1)
    produce(cluster, topic, 1, 50)
    tp = TopicPartition(topic, 0)
    assert _handed_out_then_commit_sync(cluster.bootstrap, group, tp) == 3
    assert asyncio.run(_handed_out_then_commit_async(cluster.bootstrap, group + "-a", tp)) == 3
