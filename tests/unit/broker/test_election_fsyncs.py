"""An election costs no fsync on the broker's event loop.

A broker that died leaving 3,000 partitions made every survivor record each
new epoch in the partition's epoch history, two fsyncs each, back to back on
its loop (bench.replication_bench's wide fail-over). The history now reaches
the disk with the log's flush (storage/leader_epoch.py says why that is
safe); these tests count the fsyncs of a fail-over on a real broker's
ReplicaManager and logs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog.records import encode_batch, set_partition_leader_epoch
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_broker.topic_store import TopicSpec

TOPIC = "failover"
PARTITIONS = 50
ME = 1
DEAD = 2


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[PartitionManager]:
    """A cluster-mode broker hosting TOPIC, following DEAD on every partition."""
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    manager.logs.host_partitions(TopicSpec(TOPIC, PARTITIONS, {}), list(range(PARTITIONS)))
    for p in range(PARTITIONS):
        set_role(manager, p, Role.FOLLOWER, leader=DEAD, epoch=0)
    yield manager
    manager.close()


def set_role(manager: PartitionManager, p: int, role: Role, leader: int, epoch: int) -> None:
    manager.replicas.set_role(
        TOPIC,
        p,
        role=role,
        leader_id=leader,
        leader_epoch=epoch,
        replicas=[ME, DEAD],
        isr=[ME] if role is Role.LEADER else [DEAD, ME],
        revision=epoch + 1,  # a new epoch is a newer state
    )


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fsync from now on (its file descriptor)."""
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return calls


def test_taking_over_every_partition_does_no_fsync(
    manager: PartitionManager, fsyncs: list[int]
) -> None:
    for p in range(PARTITIONS):
        set_role(manager, p, Role.LEADER, leader=ME, epoch=1)
    assert fsyncs == []
    for p in range(PARTITIONS):
        partition_log = manager.partition_log(TOPIC, p)
        assert partition_log.leader_epochs.entries == [(1, 0)]
        partition_log.flush()  # the log's own flush writes the history
        assert LeaderEpochCache.load(partition_log.directory).entries == [(1, 0)]


def test_a_follower_replicating_a_new_epoch_does_no_fsync(
    manager: PartitionManager, fsyncs: list[int]
) -> None:
    data = bytearray(encode_batch([b"a", b"b"]))
    set_partition_leader_epoch(data, 0, 3)
    for p in range(PARTITIONS):
        set_role(manager, p, Role.FOLLOWER, leader=DEAD + 1, epoch=3)
        manager.replicas.append_replicated(TOPIC, p, bytes(data), 0)
    assert fsyncs == []
    for p in range(PARTITIONS):
        assert manager.partition_log(TOPIC, p).leader_epochs.entries == [(3, 0)]
