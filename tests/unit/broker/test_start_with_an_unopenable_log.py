"""Opening logs when a broker alone (no etcd) starts, or hosts a topic
through its LogManager: a log that cannot be opened is hosted offline
(`UnopenedLog`) and the rest are opened and served.

Before, one log that failed to open stopped the broker from starting at all
(`LogManager.open` raised), and in cluster mode stopped every partition of
its topic from being hosted. Kafka starts and marks the failed log
directory offline.

Standalone start-up goes through a real BrokerServer over real gRPC; the
LogManager tests inject each way an open fails that root cannot bypass:
an unreadable checkpoint, a file where the directory should be, and a
deleted incarnation's directory that cannot be renamed aside (`chattr +i`:
skipped where the file system has no immutable flag or we are not root).
Running out of descriptors (a real RLIMIT_NOFILE) is no fault of a
directory: the hosting still fails as a whole, and is retried.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from tidelog.errors import StorageError
from tidelog.records import encode_batch, iter_batches
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import INLINE_OPEN_MAX, LogManager
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import UnopenedLog, files
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.clock import SYSTEM_CLOCK

from tests.support.immutable_files import pin, unpin_if_pinned

TOPIC = "t"
ME = 7
CALL_TIMEOUT_S = 30.0
GARBAGE = "not a checkpoint\n"


def append(logs: LogManager, partition: int, value: bytes) -> None:
    data = bytearray(encode_batch([value]))
    logs.partition_log(TOPIC, partition).append(data, list(iter_batches(data)))


def values(logs: LogManager, partition: int) -> bytes:
    return bytes(logs.partition_log(TOPIC, partition).read(0, 1 << 20).records)


def test_a_lone_broker_starts_with_an_unreadable_log_and_serves_the_rest(tmp_path: Path) -> None:
    async def run() -> None:
        broker = BrokerServer(BrokerConfig(broker_id=ME, port=0, data_dir=tmp_path))
        await broker.start()
        try:
            broker.manager.logs.create_topic(TOPIC, 3)
            for partition in range(3):
                append(broker.manager.logs, partition, b"v%d" % partition)
        finally:
            await broker.stop()
        spoiled = tmp_path / files.log_dir_name(TOPIC, 1) / files.CLEANER_CHECKPOINT_FILE
        spoiled.write_text(GARBAGE)

        broker = BrokerServer(BrokerConfig(broker_id=ME, port=0, data_dir=tmp_path))
        await broker.start()
        try:
            logs = broker.manager.logs
            assert logs.offline_partitions() == [(TOPIC, 1)]
            assert b"v0" in values(logs, 0) and b"v2" in values(logs, 2)
            with pytest.raises(StorageError, match=r"opening it failed.*cleaner-checkpoint"):
                values(logs, 1)
            append(logs, 2, b"more")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.bound_port}") as channel:
                metadata = await log_pb2_grpc.LogStub(channel).Metadata(
                    log_pb2.MetadataRequest(topics=[TOPIC]), timeout=CALL_TIMEOUT_S
                )
                described = await admin_pb2_grpc.AdminStub(channel).DescribeTopics(
                    admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=CALL_TIMEOUT_S
                )
            assert {
                p.partition: list(p.offline_replicas) for p in metadata.topics[0].partitions
            } == {0: [], 1: [ME], 2: []}
            assert {
                p.partition: (list(p.offline_replicas), p.log_end_offset)
                for p in described.topics[0].partitions
            } == {0: ([], 1), 1: ([ME], -1), 2: ([], 2)}
            # Described as offline, why, and with no figures: 0s (what it
            # said before) read as an empty log.
            unopened = described.topics[0].partitions[1]
            assert unopened.error.code == common_pb2.STORAGE_ERROR, unopened
            assert re.fullmatch(
                rf"the log of {TOPIC}-1 on broker {ME} is offline \(opening it failed: .*"
                r"cleaner-checkpoint.*\): restart the broker to open it again",
                unopened.error.message,
            ), unopened.error.message
            figures = (
                unopened.log_start_offset,
                unopened.log_end_offset,
                unopened.high_watermark,
                unopened.size_bytes,
                unopened.segment_count,
            )
            assert figures == (-1, -1, -1, -1, -1)
            assert not described.topics[0].partitions[0].HasField("error")
        finally:
            await broker.stop()
        # Nothing of it was touched, and once repaired the next start opens it.
        assert spoiled.read_text() == GARBAGE
        spoiled.unlink()
        broker = BrokerServer(BrokerConfig(broker_id=ME, port=0, data_dir=tmp_path))
        await broker.start()
        try:
            assert broker.manager.logs.offline_partitions() == []
            assert b"v1" in values(broker.manager.logs, 1)
        finally:
            await broker.stop()

    asyncio.run(run())


def _garbage_checkpoint(directory: Path) -> None:
    directory.mkdir()
    (directory / files.RESET_OFFSET_FILE).write_text(GARBAGE)


def _file_in_place_of_the_directory(directory: Path) -> None:
    directory.write_text("a file, not a log directory\n")


def _deleted_incarnation_pinned(directory: Path) -> None:
    """A deleted incarnation's log (another topic id), which open renames
    aside: made immutable, so that it cannot be."""
    directory.mkdir()
    files.write_topic_id(directory, uuid.uuid4().hex)
    pin(directory)


@pytest.mark.parametrize(
    "spoil",
    [_garbage_checkpoint, _file_in_place_of_the_directory, _deleted_incarnation_pinned],
    ids=["unreadable-checkpoint", "not-a-directory", "stale-directory-not-renamable"],
)
def test_hosting_a_topic_with_one_unopenable_log_hosts_the_others_offline_listed(
    tmp_path: Path, spoil: Callable[[Path], None]
) -> None:
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=True)
    logs.open()
    told: list[list[tuple[str, int]]] = []
    logs.on_offline_changed = lambda: told.append(logs.offline_partitions())
    broken = tmp_path / files.log_dir_name(TOPIC, 2)
    spec = TopicSpec(TOPIC, 4, {}, uuid.uuid4().hex)
    try:
        spoil(broken)
        logs.host_partitions(spec, [0, 1, 2, 3])
        assert logs.hosted_partitions(TOPIC) == [0, 1, 2, 3]
        assert logs.offline_partitions() == [(TOPIC, 2)]
        assert told == [[(TOPIC, 2)]]
        assert isinstance(logs.hosted_log(TOPIC, 2), UnopenedLog)
        with pytest.raises(StorageError, match=r"offline.*opening it failed"):
            logs.partition_log(TOPIC, 2)
        for partition in (0, 1, 3):
            append(logs, partition, b"ok")
            assert logs.partition_log(TOPIC, partition).offline is None
        # The same hosting again (an etcd replay) opens nothing again:
        # offline until a restart.
        logs.host_partitions(spec, [0, 1, 2, 3])
        assert isinstance(logs.hosted_log(TOPIC, 2), UnopenedLog)
        # Handed to another broker: closed, and no longer listed.
        logs.host_partitions(spec, [0, 1, 3])
        assert logs.offline_partitions() == []
        assert told[-1] == []
    finally:
        unpin_if_pinned(broken)
        logs.close()


def test_opening_in_worker_threads_records_the_leader_epochs_of_the_logs_that_open(
    tmp_path: Path,
) -> None:
    """More partitions than are opened on the loop (INLINE_OPEN_MAX): the
    slices opened in worker threads host the unopenable one offline too, and
    the others, about to be led, have their epoch in their history."""
    count = INLINE_OPEN_MAX * 3
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=True)
    logs.open()
    told: list[list[tuple[str, int]]] = []
    logs.on_offline_changed = lambda: told.append(logs.offline_partitions())
    try:
        _garbage_checkpoint(tmp_path / files.log_dir_name(TOPIC, 5))
        spec = TopicSpec(TOPIC, count, {}, uuid.uuid4().hex)
        asyncio.run(
            logs.host_partitions_off_loop(spec, range(count), dict.fromkeys(range(count), 9))
        )
        assert logs.hosted_partitions(TOPIC) == list(range(count))
        assert logs.offline_partitions() == [(TOPIC, 5)] and told == [[(TOPIC, 5)]]
        for partition in range(count):
            if partition != 5:
                assert logs.partition_log(TOPIC, partition).leader_epochs.entries == [(9, 0)]
    finally:
        logs.close()


def test_a_deleted_topic_with_an_unopened_log_is_deleted(tmp_path: Path) -> None:
    """Deleting the topic renames its unopened log's directory aside, as any
    other's, and drops it from the offline listing."""
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=True)
    logs.open()
    try:
        _garbage_checkpoint(tmp_path / files.log_dir_name(TOPIC, 0))
        logs.host_partitions(TopicSpec(TOPIC, 2, {}, uuid.uuid4().hex), [0, 1])
        assert logs.offline_partitions() == [(TOPIC, 0)]
        logs.drop_topic(TOPIC, delete_data=True)
        assert logs.offline_partitions() == []
        # Nothing but the data directory's lock file.
        assert sorted(os.listdir(tmp_path)) == [".lock"]
    finally:
        logs.close()


def test_standalone_create_topic_stays_all_or_none(tmp_path: Path) -> None:
    """CreateTopics on a lone broker: a log that cannot be created fails the
    request (the client learns it), rather than create a topic born offline."""
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    try:
        _file_in_place_of_the_directory(tmp_path / files.log_dir_name(TOPIC, 1))
        with pytest.raises(StorageError):
            logs.create_topic(TOPIC, partitions=3)
        assert logs.topic_names() == []
    finally:
        logs.close()


def test_out_of_descriptors_fails_the_hosting_as_a_whole(tmp_path: Path) -> None:
    """No fault of a directory, and gone once descriptors are freed: no log
    is taken offline for it; the hosting fails (ClusterLink logs it, lists the
    partitions offline and tries again with a backoff: see
    test_a_failed_hosting_is_retried), every log opened so far closed."""
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=True)
    logs.open()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    spec = TopicSpec(TOPIC, 8, {}, uuid.uuid4().hex)
    try:
        # Room for a log or two, not for eight: three descriptor numbers
        # free below the limit (a new descriptor takes the lowest free one,
        # and those in use may lie above it).
        taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
        free = [fd for fd in range(max(taken) + 5) if fd not in taken]
        resource.setrlimit(resource.RLIMIT_NOFILE, (free[3], hard))
        try:
            with pytest.raises(StorageError, match="Too many open files"):
                logs.host_partitions(spec, range(8))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert logs.hosted_partitions(TOPIC) == []
        assert logs.offline_partitions() == []
        assert len(os.listdir("/proc/self/fd")) <= in_use
        logs.host_partitions(spec, range(8))
        assert logs.hosted_partitions(TOPIC) == list(range(8))
        assert logs.offline_partitions() == []
    finally:
        logs.close()


def test_a_standalone_open_out_of_descriptors_closes_the_topics_it_opened(
    tmp_path: Path,
) -> None:
    """A lone broker's LogManager.open() raises when out of descriptors (no
    log is taken offline for it), here at a later topic than the first: the
    first topic's logs are closed, not left open (a broker exits then, but
    an embedding such as this test, an in-process broker or a retry goes
    on). Before, they kept their descriptors and, having taken their
    clean-shutdown markers at open, were recovered at the next open."""
    config = BrokerConfig(data_dir=tmp_path)
    logs = LogManager(config, SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    try:
        for name in ("a", "b"):
            logs.create_topic(name, 4)
            for partition in range(4):
                log_ = logs.partition_log(name, partition)
                data = bytearray(encode_batch([b"%s%d" % (name.encode(), partition)]))
                log_.append(data, list(iter_batches(data)))
    finally:
        logs.close()
    # Descriptors a log holds open (its segment's files), measured.
    in_use = len(os.listdir("/proc/self/fd"))
    logs = LogManager(config, SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    per_log = (len(os.listdir("/proc/self/fd")) - in_use) // 8
    logs.close()
    assert per_log >= 1 and len(os.listdir("/proc/self/fd")) == in_use

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    logs = LogManager(config, SYSTEM_CLOCK, cluster_mode=False)
    # Room for topic a's four logs and a little more, not for b's too (a
    # new descriptor takes the lowest free number: see the test above).
    taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
    free = [fd for fd in range(max(taken) + 8 * per_log + 8) if fd not in taken]
    resource.setrlimit(resource.RLIMIT_NOFILE, (free[4 * per_log + 2], hard))
    try:
        with pytest.raises(StorageError, match=r"opening b-\d .*Too many open files"):
            logs.open()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(os.listdir("/proc/self/fd")) <= in_use
    assert logs.topic_names() == []
    # Closed cleanly: the next open trusts them, no recovery.
    for partition in range(4):
        marker = tmp_path / files.log_dir_name("a", partition) / files.CLEAN_SHUTDOWN_FILE
        assert marker.exists(), marker

    logs = LogManager(config, SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    try:
        assert logs.topic_names() == ["a", "b"]
        for name in ("a", "b"):
            for partition in range(4):
                read = logs.partition_log(name, partition).read(0, 1 << 20).records
                assert b"%s%d" % (name.encode(), partition) in bytes(read)
    finally:
        logs.close()
