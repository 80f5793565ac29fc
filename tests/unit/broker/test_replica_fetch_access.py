"""Who may fetch as a follower (issue 16 item 10): only a replica assigned to
the partition and registered live; anyone else gets NotLeaderOrFollowerError
naming the replica and the partition, and leaves no trace in the progress
the leader keeps (which decides the HW and the ISR)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog.errors import NotLeaderOrFollowerError
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import PartitionReplication, Role
from tidelog_broker.storage import ManualClock
from tidelog_broker.topic_store import TopicSpec


def _leader(tmp_path: Path) -> tuple[PartitionManager, PartitionReplication]:
    manager = PartitionManager(
        BrokerConfig(broker_id=0, data_dir=tmp_path), ManualClock(), cluster_mode=True
    )
    manager.open()
    manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])
    replication = manager.replicas.set_role(
        "t",
        0,
        role=Role.LEADER,
        leader_id=0,
        leader_epoch=1,
        replicas=[0, 1, 2],
        isr=[0, 1],
        revision=1,
    )
    manager.replicas.registration_of = {0: 5, 1: 7}.get  # broker 2 is not registered
    return manager, replication


def test_only_a_live_assigned_replica_may_fetch(tmp_path: Path) -> None:
    manager, replication = _leader(tmp_path)
    try:
        assert manager.replicas.follower_registration(replication, 1) == 7
        with pytest.raises(NotLeaderOrFollowerError, match=r"replica 99 is not a follower of t-0"):
            manager.replicas.follower_registration(replication, 99)
        with pytest.raises(NotLeaderOrFollowerError, match=r"replica 2 of t-0 is not registered"):
            manager.replicas.follower_registration(replication, 2)
        with pytest.raises(NotLeaderOrFollowerError, match=r"replica 0 is not a follower"):
            manager.replicas.follower_registration(replication, 0)  # the leader itself
    finally:
        manager.close()


def test_a_refused_fetch_records_no_progress(tmp_path: Path) -> None:
    manager, replication = _leader(tmp_path)
    try:
        for replica in (99, 2):
            with pytest.raises(NotLeaderOrFollowerError):
                manager.replicas.on_follower_fetch("t", 0, replica, 0)
        assert 99 not in replication.followers
        assert replication.followers[2].log_end_offset == -1
        assert replication.isr == [0, 1]
    finally:
        manager.close()
