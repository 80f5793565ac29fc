"""Directories of deleted topics that a previous run left renamed aside
(`<topic>-<partition>.<id>-delete`: it stopped between their rename and
their removal, or could not remove them) go shortly after the broker
starts, standalone or in a cluster, and the live logs stay as they were.

Before, they waited for the first retention pass, one
log.retention.check.interval.ms (5 minutes by default) after start: the
space of a deleted topic stayed taken for minutes after every restart, and
an operator who restarted the broker to free it saw nothing happen. Kafka
deletes them shortly after start-up.

A real BrokerServer over real gRPC on a temporary data directory (cluster
mode: on a real etcd, the topic created by the coordinator's real
MetadataManager); the retention interval is an hour, so no retention pass
is what removes them. Also: two sweeps at once each remove a directory once
(the second lists what the first left), on a real LogManager; and one that
cannot be removed at start is retried at the retention checks.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import ClusterConfig
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import files
from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.metadata import MetadataManager
from tidelog_server.clock import SYSTEM_CLOCK

from tests.support.etcd import EtcdProcess
from tests.support.immutable_files import pin, unpin, unpin_if_pinned
from tests.unit.broker.in_process_broker import eventually
from tests.unit.broker.removal_spy import renamed_aside

pytestmark = pytest.mark.timeout(120)

LIVE = "live"
KEPT = b"kept-record"
#: Generous: a loaded 2-core CI machine.
WAIT_S = 30.0
#: No retention pass during a test.
AN_HOUR_MS = 3_600_000


def config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        broker_id=0, port=0, data_dir=data_dir, retention_check_interval_ms=AN_HOUR_MS
    )


def leave_deleted_dirs(data_dir: Path, count: int = 2) -> list[Path]:
    """Directories of a deleted topic as a previous run leaves them: renamed
    aside (the suffix `rename_for_deletion` gives), segments and a
    subdirectory (a cleaner's leftover, say) still in them."""
    left = []
    for partition in range(count):
        directory = data_dir / f"gone-{partition}.{uuid.uuid4().hex}{files.DELETE_DIR_SUFFIX}"
        (directory / "sub").mkdir(parents=True)
        for base in (0, 4096):
            (directory / files.segment_file_name(base, files.LOG_SUFFIX)).write_bytes(b"x" * 65536)
        (directory / "sub" / "leftover").write_bytes(b"y" * 1024)
        left.append(directory)
    return left


async def until_none_renamed_aside(data_dir: Path) -> None:
    await eventually(
        lambda: not renamed_aside(data_dir), "none renamed aside after start", within_s=WAIT_S
    )


def append(broker: BrokerServer, partition: int, value: bytes) -> None:
    partition_log = broker.manager.logs.hosted_log(LIVE, partition)
    data = bytearray(encode_batch([value]))
    partition_log.append(data, list(iter_batches(data)))
    partition_log.flush()


def records(broker: BrokerServer, partition: int) -> bytes:
    return bytes(broker.manager.logs.hosted_log(LIVE, partition).read(0, 1 << 20).records)


def live_segments(data_dir: Path) -> dict[str, bytes]:
    """The segments of the live topic's logs (their records), by path, with
    their content (the other files a start may rewrite: checkpoints, the
    leader epochs of a new term)."""
    return {
        str(path.relative_to(data_dir)): path.read_bytes()
        for partition in range(2)
        for path in sorted((data_dir / files.log_dir_name(LIVE, partition)).glob("*"))
        if path.name.endswith(files.LOG_SUFFIX)
    }


def test_a_lone_broker_removes_leftover_deleted_dirs_at_start(tmp_path: Path) -> None:
    async def run() -> None:
        broker = BrokerServer(config(tmp_path))
        await broker.start()
        try:
            broker.manager.logs.create_topic(LIVE, 2)
            append(broker, 0, KEPT)
        finally:
            await broker.stop()
        left = leave_deleted_dirs(tmp_path)
        before = live_segments(tmp_path)

        broker = BrokerServer(config(tmp_path))
        await broker.start()
        try:
            await until_none_renamed_aside(tmp_path)
            assert not any(directory.exists() for directory in left)
            assert KEPT in records(broker, 0) and records(broker, 1) == b""
            assert broker.manager.logs.offline_partitions() == []
        finally:
            await broker.stop()
        assert live_segments(tmp_path) == before

    asyncio.run(run())


def test_a_cluster_broker_removes_leftover_deleted_dirs_at_start(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    prefix = f"/leftdel-{uuid.uuid4().hex}"

    async def started() -> BrokerServer:
        broker = BrokerServer(config(tmp_path), ClusterConfig(etcd.endpoint, prefix))
        await broker.start()
        assert broker.link is not None
        async with asyncio.timeout(WAIT_S):
            await broker.link.registered.wait()
        await broker.link.wait_synced(WAIT_S)
        return broker

    async def hosts_live(broker: BrokerServer) -> None:
        async with asyncio.timeout(WAIT_S):
            while broker.manager.logs.hosted_partitions(LIVE) != [0, 1]:
                await asyncio.sleep(0.05)

    async def run() -> None:
        broker = await started()
        try:
            assert broker.link is not None
            metadata = MetadataManager(broker.link.client, broker.link.keys, CoordinatorConfig())
            await metadata.create_topic(LIVE, 2, 1, {})
            await hosts_live(broker)
            append(broker, 0, KEPT)
        finally:
            await broker.stop()
        left = leave_deleted_dirs(tmp_path)
        before = live_segments(tmp_path)

        broker = await started()
        try:
            await until_none_renamed_aside(tmp_path)
            assert not any(directory.exists() for directory in left)
            await hosts_live(broker)
            assert KEPT in records(broker, 0) and records(broker, 1) == b""
            assert broker.manager.logs.offline_partitions() == []
        finally:
            await broker.stop()
        assert live_segments(tmp_path) == before

    asyncio.run(run())


def test_two_sweeps_at_once_remove_each_directory_once(tmp_path: Path) -> None:
    """The second sweep waits for the first, then finds nothing left: no two
    workers remove the same directory (before, both listed every directory,
    and each counted it removed)."""
    logs = LogManager(BrokerConfig(data_dir=tmp_path), SYSTEM_CLOCK, cluster_mode=False)
    logs.open()
    try:
        left = leave_deleted_dirs(tmp_path, count=4)
        for directory in left:
            for i in range(200):
                (directory / f"f{i}").write_bytes(b"z")

        async def both() -> list[int]:
            sweeps = (logs.delete_renamed_dirs(), logs.delete_renamed_dirs())
            return list(await asyncio.gather(*sweeps))

        assert asyncio.run(both()) == [4, 0]
        assert renamed_aside(tmp_path) == []
    finally:
        logs.close()


def test_a_leftover_that_cannot_be_removed_at_start_is_retried_at_retention_checks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The start-up sweep logs the failure and the broker serves on; a
    retention check removes it once it can be (a file made immutable,
    `chattr +i`, then released: skipped where the file system has no
    immutable flag or we are not root)."""
    [left] = leave_deleted_dirs(tmp_path, count=1)
    pinned = left / "sub" / "leftover"
    pin(pinned)

    async def run() -> None:
        broker = BrokerServer(
            BrokerConfig(broker_id=0, port=0, data_dir=tmp_path, retention_check_interval_ms=200)
        )
        await broker.start()
        try:
            async with asyncio.timeout(WAIT_S):
                while f"cannot remove {left} yet" not in caplog.text:
                    await asyncio.sleep(0.05)
            broker.manager.logs.create_topic(LIVE, 1)
            append(broker, 0, KEPT)
            assert left.exists()
            unpin(pinned)
            await until_none_renamed_aside(tmp_path)
            assert KEPT in records(broker, 0)
        finally:
            await broker.stop()

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(run())
    finally:
        unpin_if_pinned(pinned)
