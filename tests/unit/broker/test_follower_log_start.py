"""A follower and the leader's log start offset (DeleteRecords): its log
start follows the leader's, and a replica whose empty log starts inside the
leader's first batch (the leader's start moved mid-batch) starts at that
batch rather than refusing it forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.topic_store import TopicSpec


def _manager(path: Path) -> PartitionManager:
    manager = PartitionManager(BrokerConfig(data_dir=path), cluster_mode=True)
    manager.open()
    manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])
    return manager


def _leader_batches(path: Path) -> bytes:
    """Ten records in one batch at offsets 0-9, as a leader stores them."""
    leader = _manager(path)
    data = bytearray(encode_batch([b"v%d" % i for i in range(10)]))
    leader.partition_log("t", 0).append(data, list(iter_batches(data)))
    return leader.partition_log("t", 0).read(0, 1 << 20).records


def test_an_empty_replica_starting_mid_batch_takes_the_whole_batch(tmp_path: Path) -> None:
    data = _leader_batches(tmp_path / "leader")
    follower = _manager(tmp_path / "follower")
    log = follower.partition_log("t", 0)
    log.reset_to(4)  # the leader's log start, inside the batch 0-9

    async def apply() -> None:
        follower.replicas.append_replicated("t", 0, data, 10)
        follower.replicas.follow_log_start("t", 0, 4)

    asyncio.run(apply())
    assert (log.log_start_offset, log.log_end_offset) == (4, 10)


def test_the_log_start_follows_the_leader_up_to_the_log_end(tmp_path: Path) -> None:
    data = _leader_batches(tmp_path / "leader")
    follower = _manager(tmp_path / "follower")
    log = follower.partition_log("t", 0)

    async def apply() -> None:
        follower.replicas.append_replicated("t", 0, data, 10)
        follower.replicas.follow_log_start("t", 0, 7)
        follower.replicas.follow_log_start("t", 0, 3)  # never backwards
        follower.replicas.follow_log_start("t", 0, 50)  # not past our end

    asyncio.run(apply())
    assert (log.log_start_offset, log.log_end_offset) == (10, 10)
