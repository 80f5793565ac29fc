"""A deleted incarnation's directory that a log opening renames aside is
removed in a worker thread, by the LogManager's sweep, not where the open
runs.

A topic deleted while its directory could not even be renamed aside (a
failing disk) leaves it under its name, with the old topic id; once it can
be moved, the new incarnation's open renames it `<topic>-<p>.<id>-delete`
so that the new topic never sees the old records. Before, that open then
removed it inline, and the open runs ON the event loop for a standalone
CreateTopics (`LogManager.create_topic`), at a standalone start
(`LogManager.open`) and, in cluster mode, for topics of up to
INLINE_OPEN_MAX partitions: removing a multi-GB directory stalled every
produce and fetch of the broker for as long (~0.3-0.5 s for 1 GB on the CI
machine). Now the open only renames; the LogManager has its sweep
(`delete_renamed_dirs`, a worker thread) remove it at once.

A real LogManager / standalone BrokerServer on a temporary data directory,
and a real ClusterLink over a real etcd for the cluster paths, on a real
asyncio loop. The removal is observed by wrapping the real
`files.remove_renamed` (it still removes) to record which thread ran it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from pathlib import Path

import pytest
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import INLINE_OPEN_MAX, LogManager
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import LogConfig, PartitionLog, files
from tidelog_broker.topic_store import TopicSpec, TopicStore
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.metadata import MetadataManager
from tidelog_server.clock import SYSTEM_CLOCK

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually
from tests.unit.broker.removal_spy import RemovalSpy, install, renamed_aside

pytestmark = pytest.mark.timeout(120)

TOPIC = "t"
OLD = [b"old-%d" % i for i in range(10)]
NEW = [b"new-%d" % i for i in range(3)]
#: Generous: a loaded 2-core CI machine.
WAIT_S = 30.0
#: `eventually`, within WAIT_S.
until = functools.partial(eventually, within_s=WAIT_S)
AN_HOUR_MS = 3_600_000


@pytest.fixture
def removals(monkeypatch: pytest.MonkeyPatch) -> RemovalSpy:
    return install(monkeypatch)


def stale_directory(data_dir: Path, partition: int = 0) -> None:
    """The log of a deleted incarnation of TOPIC (another topic id) under
    the partition's name, with OLD in it: what a deletion that could not
    rename it aside leaves."""
    directory = files.log_dir(data_dir, TOPIC, partition)
    old = PartitionLog.open(directory, TOPIC, partition, LogConfig(), topic_id=uuid.uuid4().hex)
    try:
        data = bytearray(encode_batch(OLD))
        old.append(data, list(iter_batches(data)))
        old.flush()
    finally:
        old.close()


def serves_new_records(logs: LogManager, partition: int) -> None:
    """The partition's log starts empty and takes and serves NEW."""
    partition_log = logs.partition_log(TOPIC, partition)
    assert partition_log.log_end_offset == 0
    assert bytes(partition_log.read(0, 1 << 20).records) == b""
    data = bytearray(encode_batch(NEW))
    partition_log.append(data, list(iter_batches(data)))
    kept = bytes(partition_log.read(0, 1 << 20).records)
    assert b"new-0" in kept and b"old-" not in kept
    assert partition_log.log_end_offset == len(NEW)


def test_create_topic_over_a_stale_directory_removes_it_off_the_loop(
    tmp_path: Path, removals: RemovalSpy
) -> None:
    """Standalone CreateTopics: the LogManager's create_topic, on the loop."""
    stale_directory(tmp_path)

    async def run() -> None:
        logs = LogManager(
            BrokerConfig(data_dir=tmp_path, retention_check_interval_ms=AN_HOUR_MS),
            SYSTEM_CLOCK,
            cluster_mode=False,
        )
        logs.open()
        try:
            logs.create_topic(TOPIC, partitions=2)
            serves_new_records(logs, 0)
            serves_new_records(logs, 1)
            await until(lambda: renamed_aside(tmp_path) == [], "the stale directory goes")
            # The sweep left the new incarnation's logs alone.
            assert logs.partition_log(TOPIC, 0).log_end_offset == len(NEW)
        finally:
            logs.close()

    asyncio.run(run())
    loop_thread = threading.current_thread()
    assert len(removals.calls) == 1, removals.calls
    assert removals.on(loop_thread) == [], "removed on the event loop's thread"


def test_a_standalone_start_over_a_stale_directory_removes_it_off_the_loop(
    tmp_path: Path, removals: RemovalSpy
) -> None:
    """A real standalone broker whose topics.json names an incarnation
    whose directory holds another's log (the disk repaired, the broker
    restarted): the start renames it aside and serves an empty log; the
    removal runs in a worker thread."""
    stale_directory(tmp_path)
    TopicStore(tmp_path).save({TOPIC: TopicSpec(TOPIC, 1, {}, uuid.uuid4().hex)})

    async def run() -> None:
        broker = BrokerServer(
            BrokerConfig(data_dir=tmp_path, port=0, retention_check_interval_ms=AN_HOUR_MS)
        )
        await broker.start()
        try:
            serves_new_records(broker.manager.logs, 0)
            await until(lambda: renamed_aside(tmp_path) == [], "the stale directory goes")
        finally:
            await broker.stop()

    asyncio.run(run())
    assert len(removals.calls) >= 1, removals.calls
    assert removals.on(threading.current_thread()) == [], "removed on the event loop's thread"


@pytest.mark.parametrize(
    "partitions",
    [2, INLINE_OPEN_MAX * 2],
    ids=["opened-on-the-loop", "opened-in-worker-threads"],
)
def test_cluster_hosting_over_a_stale_directory_removes_it_off_the_loop(
    etcd: EtcdProcess, tmp_path: Path, removals: RemovalSpy, partitions: int
) -> None:
    """Cluster mode, a topic created through the coordinator's real
    MetadataManager over etcd, hosted by the real ClusterLink: a topic of
    up to INLINE_OPEN_MAX partitions is opened on the loop, a bigger one
    in worker threads (which hand the sweep to the loop). Either way the
    stale directory is renamed aside, removed in a worker thread (the
    InProcessBroker runs no retention checks: the hosting's own sweep is
    what removes it), and the new logs start empty. (Before, the worker
    threads' opens removed it themselves, off the loop too: that case
    guards the hand-over, `_sweep_soon` being the loop's.)"""
    prefix = f"/stale-{uuid.uuid4().hex}"

    # A log of a topic etcd does not have: the broker's check for strays
    # deletes it once it knows the cluster id.
    stray = files.log_dir(tmp_path, "stray", 0)
    PartitionLog.open(stray, "stray", 0, LogConfig()).close()

    async def run() -> None:
        broker = InProcessBroker(etcd, prefix, tmp_path, 0)
        logs = broker.manager.logs
        try:
            await broker.start()
            # That check would take the stale directories for strays too
            # (TOPIC is not in etcd yet): they are made once it ran.
            await until(lambda: not stray.exists(), "the stray check runs")
            await until(lambda: renamed_aside(tmp_path) == [], "the stray goes")
            removals.calls.clear()
            stale_directory(tmp_path, 0)
            stale_directory(tmp_path, 1)
            metadata = MetadataManager(broker.link.client, broker.link.keys, CoordinatorConfig())
            await metadata.create_topic(TOPIC, partitions, 1, {})
            await until(
                lambda: logs.hosted_partitions(TOPIC) == list(range(partitions)),
                f"broker 0 hosts {TOPIC} {list(range(partitions))}",
            )
            for partition in (0, 1):
                partition_log = logs.hosted_log(TOPIC, partition)
                assert partition_log.offline is None
                assert partition_log.log_end_offset == 0
                assert bytes(partition_log.read(0, 1 << 20).records) == b""
            await until(lambda: renamed_aside(tmp_path) == [], "the stale directories go")
        finally:
            await broker.stop()

    asyncio.run(run())
    assert len(removals.calls) >= 2, removals.calls
    assert removals.on(threading.current_thread()) == [], "removed on the event loop's thread"
