"""A follower's reset that fails part-way (EIO from an fsync, while the
broker keeps running) takes the partition offline, as Kafka does with a
failed log directory: every request path (the fetcher's next fetch, a
consumer's read, list offsets, produce) gets StorageError for it instead
of its half-reset log, the fetcher stops asking the leader for it (its
half-reset end must not count as progress), and the next open of the data
directory (a restart) finishes the reset.

Real logs on disk behind the broker's real managers; the fault is the
storage crash tests' seam (os.fsync)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog.errors import StorageError
from tidelog.records import encode_batch, iter_batches, set_base_offset
from tidelog.v1 import common_pb2
from tidelog_broker.config import BrokerConfig
from tidelog_broker.metrics import BrokerMetrics
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_fetcher import ReplicaFetcher
from tidelog_broker.replica_state import Role
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.internal import replica_pb2

TOPIC, PARTITION, EPOCH, LEADER = "t", 0, 4, 1
KEY = (TOPIC, PARTITION)


def _follower(path: Path) -> PartitionManager:
    manager = PartitionManager(BrokerConfig(data_dir=path, broker_id=2), cluster_mode=True)
    manager.open()
    manager.logs.host_partitions(TopicSpec(TOPIC, 1, {}), [PARTITION])
    manager.replicas.set_role(
        TOPIC,
        PARTITION,
        role=Role.FOLLOWER,
        leader_id=LEADER,
        leader_epoch=EPOCH,
        replicas=[LEADER, 2],
        isr=[LEADER, 2],
        revision=1,
    )
    return manager


@pytest.fixture
def managers() -> Iterator[list[PartitionManager]]:
    opened: list[PartitionManager] = []
    yield opened
    for manager in opened:
        manager.close()


def _fail_fsync(monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    """The `fail_at`-th os.fsync from now (1 is the next) fails with EIO."""
    real = os.fsync
    countdown = [fail_at]

    def fsync(fd: int) -> None:
        countdown[0] -= 1
        if countdown[0] == 0:
            raise OSError(errno.EIO, "Input/output error (injected)")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _fetcher(manager: PartitionManager) -> ReplicaFetcher:
    fetcher = ReplicaFetcher(LEADER, manager.replicas, manager._config, lambda _: None)
    fetcher.partitions = {KEY: EPOCH}
    return fetcher


def _apply(fetcher: ReplicaFetcher, response: replica_pb2.ReplicaFetchResponse) -> None:
    async def run() -> None:
        fetcher._apply(response, {KEY: EPOCH})

    asyncio.run(run())


def _answer(leader_log_start: int, code: Any = common_pb2.NONE, records: bytes = b"") -> Any:
    response = replica_pb2.ReplicaFetchResponse()
    data = response.partitions.add(
        topic=TOPIC,
        partition=PARTITION,
        log_start_offset=leader_log_start,
        high_watermark=leader_log_start,
        records=records,
    )
    data.error.code = code
    return response


def _assert_offline(manager: PartitionManager, fetcher: ReplicaFetcher) -> None:
    """Every path refuses the partition, and the fetcher leaves it out."""
    for refused in (
        lambda: manager.partition_log(TOPIC, PARTITION),
        lambda: manager.replicas.partition_log(TOPIC, PARTITION),
        lambda: manager.read(TOPIC, PARTITION, 0, 1 << 20),
        lambda: manager.list_offset(TOPIC, PARTITION, -1),
    ):
        with pytest.raises(StorageError, match="offline"):
            refused()
    fetcher._retry_at.clear()
    request = fetcher._request({KEY: EPOCH}, 100.0)
    assert list(request.partitions) == []
    assert fetcher._retry_at[KEY] > 100.0  # left alone a while
    samples = {
        sample.name: sample.value
        for family in BrokerMetrics(2)._partitions(manager)
        for sample in family.samples
    }
    assert samples["tidelog_broker_offline_partitions"] == 1
    assert "tidelog_broker_log_end_offset" not in samples  # half a reset: not shown


def test_a_reset_behind_the_leader_start_that_fails_takes_the_partition_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, managers: list[PartitionManager]
) -> None:
    follower = _follower(tmp_path)
    managers.append(follower)
    log = follower.partition_log(TOPIC, PARTITION)
    for _ in range(5):
        records = bytearray(encode_batch([b"v"]))
        log.append(records, list(iter_batches(records)))
    log.flush()
    fetcher = _fetcher(follower)
    # Past the commit point: the reset-offset file's two fsyncs went through.
    _fail_fsync(monkeypatch, 3)
    _apply(fetcher, _answer(500, common_pb2.OFFSET_OUT_OF_RANGE))
    monkeypatch.undo()
    assert KEY in fetcher._retry_at  # backed off, not refetched at once
    _assert_offline(follower, fetcher)
    assert log.offline is not None
    # A later answer (the leader's records at its start) is not applied.
    batch = bytearray(encode_batch([b"w"]))
    set_base_offset(batch, 0, 500)
    _apply(fetcher, _answer(500, records=bytes(batch)))
    _assert_offline(follower, fetcher)

    managers.remove(follower)
    follower.close()
    restarted = _follower(tmp_path)
    managers.append(restarted)
    reopened = restarted.partition_log(TOPIC, PARTITION)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 500)
    request = _fetcher(restarted)._request({KEY: EPOCH}, 0.0)
    assert [p.fetch_offset for p in request.partitions] == [500]


def test_a_reset_inside_the_leaders_first_batch_that_fails_takes_the_partition_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, managers: list[PartitionManager]
) -> None:
    """`ReplicaManager.append_replicated`'s own reset: an empty replica that
    starts inside the leader's first batch restarts at the batch."""
    follower = _follower(tmp_path)
    managers.append(follower)
    log = follower.partition_log(TOPIC, PARTITION)
    log.reset_to(4)  # the leader's log start, inside its batch 0-9
    fetcher = _fetcher(follower)
    batch = bytes(encode_batch([b"v%d" % i for i in range(10)]))
    _fail_fsync(monkeypatch, 3)
    _apply(fetcher, _answer(4, records=batch))
    monkeypatch.undo()
    _assert_offline(follower, fetcher)
    assert log.offline is not None

    managers.remove(follower)
    follower.close()
    restarted = _follower(tmp_path)
    managers.append(restarted)
    reopened = restarted.partition_log(TOPIC, PARTITION)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 0)
