"""A topic deleted while one of its logs on this broker is offline (a
storage failure took it offline), then created again under the same name.

Before, a log whose directory could not be removed (the failing disk that
took it offline) made the deletion raise part-way: the broker's registration
kept listing the old (topic, partition) as offline, so the controller and
Metadata took the NEW topic's replica for offline too; the topic's other
logs were left open and on disk; and the directory stayed under its name,
so that once it could be read again (the disk repaired, the broker
restarted) the new topic's partition opened it and served the deleted
topic's records: data of one topic under another's name.

Now a deleted log's directory is renamed aside (`<dir>.<id>-delete`, as
Kafka does) before its files are removed, and what cannot be removed yet
is retried; a directory that cannot even be renamed keeps its topic id
(`topic-id`), and a new incarnation of the topic refuses it, then renames
it aside once it can. The registration drops the entry either way.

A real ClusterLink and PartitionManager (broker 0) on a real etcd, with the
coordinator's real MetadataManager creating and deleting the topic. The log
goes offline through the real reset path (a directory where the reset
writes its commit point); the directory that cannot be removed is made so
with the file system's immutable flag (`chattr +i`: the tests run as root,
so permissions would not stop the removal).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import files
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.metadata import MetadataManager
from tidelog_server.atomic_files import TEMP_SUFFIX
from tidelog_server.clock import SYSTEM_CLOCK

from tests.support.etcd import EtcdProcess
from tests.support.immutable_files import immutable, pin, unpin
from tests.unit.broker.in_process_broker import InProcessBroker, eventually

TOPIC = "t"
ME = 0
OLD = [b"old-%d" % i for i in range(10)]


class Broker(InProcessBroker):
    """Broker 0 in process: manager and cluster link on `data_dir`."""

    def __init__(self, etcd: EtcdProcess, prefix: str, data_dir: Path) -> None:
        super().__init__(etcd, prefix, data_dir, ME)
        self.metadata = MetadataManager(self.link.client, self.link.keys, CoordinatorConfig())

    async def leads(self, partitions: range) -> None:
        def leading() -> bool:
            for p in partitions:
                replication = self.manager.replicas.replication(TOPIC, p)
                if replication is None or replication.role is not Role.LEADER:
                    return False
            return True

        await eventually(leading, f"broker {ME} leads {TOPIC} {list(partitions)}")

    async def hosts(self, partitions: range) -> None:
        """After a restart: hosted (leading waits for the controller to
        confirm the leadership, see ClusterLink.registration_revision)."""

        def hosting() -> bool:
            return self.manager.logs.hosted_partitions(TOPIC) == list(partitions)

        await eventually(hosting, f"broker {ME} hosts {TOPIC} {list(partitions)}")

    def hosted_records(self, partition: int) -> bytes:
        partition_log = self.manager.logs.hosted_log(TOPIC, partition)
        assert partition_log.offline is None
        return partition_log.read(0, 1 << 20).records

    def records(self, partition: int) -> bytes:
        return self.manager.partition_log(TOPIC, partition).read(0, 1 << 20).records


async def create_with_offline_log(broker: Broker) -> Path:
    """TOPIC with two partitions led here; OLD in partition 0, whose log
    then goes offline (a reset whose commit point cannot be written).
    Returns that log's directory."""
    await broker.metadata.create_topic(TOPIC, 2, 1, {})
    await broker.leads(range(2))
    partition_log = broker.manager.partition_log(TOPIC, 0)
    data = bytearray(encode_batch(OLD))
    partition_log.append(data, list(iter_batches(data)))
    partition_log.flush()
    (partition_log.directory / (files.RESET_OFFSET_FILE + TEMP_SUFFIX)).mkdir()
    with pytest.raises(StorageError, match="offline until the broker restarts"):
        broker.manager.replicas.reset_replica(TOPIC, 0, 50)
    await broker.until_listed(((TOPIC, 0),))
    return partition_log.directory


def renamed_aside(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if files.is_renamed_for_deletion(p.name))


def test_an_offline_log_whose_files_cannot_be_removed_is_renamed_aside(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Its directory leaves its name at once; the new topic gets an empty,
    online log, served and not listed offline; the files go once they can."""
    prefix = f"/offdel-{uuid.uuid4().hex}"

    async def run() -> None:
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            directory = await create_with_offline_log(broker)
            segment = next(directory.glob("*" + files.LOG_SUFFIX))
            pin(segment)
            pinned = [segment]
            try:
                await broker.metadata.delete_topic(TOPIC)
                await eventually(
                    lambda: broker.manager.logs.topic_names() == [], "the topic is dropped"
                )
                await broker.until_listed(())
                assert broker.manager.logs.offline_partitions() == []
                assert not directory.exists()
                assert not (tmp_path / f"{TOPIC}-1").exists()
                [left] = renamed_aside(tmp_path)
                assert left.startswith(f"{TOPIC}-0.")
                pinned = [tmp_path / left / segment.name]

                await broker.metadata.create_topic(TOPIC, 2, 1, {})
                await broker.leads(range(2))
                assert broker.records(0) == b""
                assert broker.manager.partition_log(TOPIC, 0).log_end_offset == 0
                assert await broker.listed_offline() == ()
                assert not broker.link.view.lists_offline(ME, TOPIC, 0)
                # Still there: its segment cannot be unlinked yet.
                assert await broker.manager.logs.delete_renamed_dirs() == 0
            finally:
                for path in pinned:
                    unpin(path)
            assert await broker.manager.logs.delete_renamed_dirs() == 1
            assert renamed_aside(tmp_path) == []
        finally:
            await broker.stop()

        # A restart opens the new topic's (empty) logs.
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            await broker.hosts(range(2))
            assert broker.hosted_records(0) == b""
            assert await broker.listed_offline() == ()
        finally:
            await broker.stop()

    asyncio.run(run())


def test_an_offline_log_that_cannot_be_renamed_is_never_opened_by_the_new_topic(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Its directory keeps its name (and its topic id): the new topic's
    partition here refuses it, before and after a restart, and never serves
    its records (the partition is hosted offline, listed so in the
    registration; the topic's other partition is hosted); once the
    directory can be moved, a restart renames it aside and opens an empty
    log."""
    prefix = f"/offdel-{uuid.uuid4().hex}"

    async def run() -> None:
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            directory = await create_with_offline_log(broker)
            with immutable(directory):
                await broker.metadata.delete_topic(TOPIC)
                await eventually(
                    lambda: broker.manager.logs.topic_names() == [], "the topic is dropped"
                )
                await broker.until_listed(())
                assert directory.exists()
                assert not (tmp_path / f"{TOPIC}-1").exists()

                await broker.metadata.create_topic(TOPIC, 2, 1, {})
                # Its partition here is hosted offline, listed so (the
                # controller elects no leader on this broker for it), never
                # the old log opened; the other partition is hosted.
                await broker.until_listed(((TOPIC, 0),))
                with pytest.raises(StorageError, match="cannot be renamed aside"):
                    broker.records(0)
                await broker.hosts(range(2))
                assert broker.hosted_records(1) == b""
        finally:
            await broker.stop()

        # Restarted while it still cannot be moved: refused again.
        broker = Broker(etcd, prefix, tmp_path)
        try:
            with immutable(directory):
                await broker.start()
                await broker.until_listed(((TOPIC, 0),))
                with pytest.raises(StorageError, match="cannot be renamed aside"):
                    broker.records(0)
        finally:
            await broker.stop()

        # The disk repaired: the next start renames it aside, opens empty.
        broker = Broker(etcd, prefix, tmp_path)
        try:
            await broker.start()
            await broker.hosts(range(2))
            assert broker.hosted_records(0) == b""
            assert await broker.listed_offline() == ()
            # Renamed aside by the open, removed by the sweep it started.
            await eventually(lambda: renamed_aside(tmp_path) == [], "the old directory goes")
        finally:
            await broker.stop()

    asyncio.run(run())


def test_standalone_delete_and_create_again_with_an_unremovable_offline_log(
    tmp_path: Path,
) -> None:
    """Standalone: delete_topic does not raise, its other logs go, and the
    topic created again under the name starts empty."""
    config = BrokerConfig(data_dir=tmp_path)
    logs = LogManager(config, SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    try:
        logs.create_topic(TOPIC, partitions=2)
        partition_log = logs.partition_log(TOPIC, 0)
        data = bytearray(encode_batch(OLD))
        partition_log.append(data, list(iter_batches(data)))
        partition_log.flush()
        directory = partition_log.directory
        (directory / (files.RESET_OFFSET_FILE + TEMP_SUFFIX)).mkdir()
        with pytest.raises(StorageError, match="offline"):
            partition_log.reset_to(50)
        with immutable(directory):
            logs.delete_topic(TOPIC)
            assert logs.topic_names() == []
            assert not (tmp_path / f"{TOPIC}-1").exists()
            with pytest.raises(StorageError, match="cannot be renamed aside"):
                logs.create_topic(TOPIC, partitions=2)
        logs.create_topic(TOPIC, partitions=2)
        assert logs.partition_log(TOPIC, 0).log_end_offset == 0
        assert logs.partition_log(TOPIC, 0).read(0, 1 << 20).records == b""
    finally:
        logs.close()
