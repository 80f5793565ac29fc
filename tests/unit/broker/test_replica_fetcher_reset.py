"""ReplicaFetcher._apply: a follower whose log ends below the leader's log
start offset resets its log there and refetches at once; other errors back off."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tidelog.records import encode_batch, iter_batches
from tidelog.v1 import common_pb2
from tidelog_broker.replica_fetcher import ReplicaFetcher
from tidelog_broker.replica_state import PartitionReplication, Role
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog
from tidelog_server.internal import replica_pb2

TOPIC, PARTITION, EPOCH = "orders", 0, 4
KEY = (TOPIC, PARTITION)


class _Manager:
    """The PartitionManager methods _apply uses, around one real log."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.resets: list[int] = []
        self.state = PartitionReplication(TOPIC, PARTITION, Role.FOLLOWER, 1, EPOCH, [1, 2], [1], 0)

    def replication(self, topic: str, partition: int) -> PartitionReplication:
        return self.state

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        return self.log

    def reset_replica(self, topic: str, partition: int, offset: int) -> None:
        self.resets.append(offset)
        self.log.reset_to(offset)


def _apply(manager: _Manager, code: int, leader_log_start: int) -> ReplicaFetcher:
    fetcher = ReplicaFetcher(1, manager, None, lambda _: None)  # type: ignore[arg-type]
    fetcher.partitions = {KEY: EPOCH}
    response = replica_pb2.ReplicaFetchResponse()
    data = response.partitions.add(
        topic=TOPIC, partition=PARTITION, log_start_offset=leader_log_start
    )
    data.error.code = code  # type: ignore[assignment]

    async def run() -> None:
        fetcher._apply(response, {KEY: EPOCH})

    asyncio.run(run())
    return fetcher


def _log(tmp_path: Path) -> PartitionLog:
    log = PartitionLog.open(tmp_path / "orders-0", TOPIC, PARTITION, LogConfig(), ManualClock())
    for _ in range(5):
        records = bytearray(encode_batch([b"v"]))
        log.append(records, list(iter_batches(records)))
    return log


def test_out_of_range_below_the_leader_start_resets_and_refetches(tmp_path: Path) -> None:
    manager = _Manager(_log(tmp_path))
    fetcher = _apply(manager, common_pb2.OFFSET_OUT_OF_RANGE, 500)
    assert manager.resets == [500]
    assert (manager.log.log_start_offset, manager.log.log_end_offset) == (500, 500)
    assert KEY not in fetcher._retry_at  # asked again at once


def test_other_cases_back_off_without_reset(tmp_path: Path) -> None:
    cases: list[tuple[Any, int]] = [
        (common_pb2.OFFSET_OUT_OF_RANGE, 5),  # leader start not above our end
        (common_pb2.OFFSET_OUT_OF_RANGE, 3),
        (common_pb2.NOT_LEADER_OR_FOLLOWER, 500),
    ]
    manager = _Manager(_log(tmp_path))
    for code, leader_log_start in cases:
        fetcher = _apply(manager, code, leader_log_start)
        assert manager.resets == []
        assert KEY in fetcher._retry_at
    assert manager.log.log_end_offset == 5
