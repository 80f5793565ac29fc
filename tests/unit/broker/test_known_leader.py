"""The leader a broker knows of a partition it hosts (ReplicaManager.
known_leader), which its own DescribeTopics answer carries: itself only
while it leads, the broker it follows, -1 when it knows none."""

from __future__ import annotations

from pathlib import Path

from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import ManualClock
from tidelog_broker.topic_store import TopicSpec


def test_the_known_leader_follows_the_applied_role(tmp_path: Path) -> None:
    manager = PartitionManager(
        BrokerConfig(broker_id=1, data_dir=tmp_path), ManualClock(), cluster_mode=True
    )
    manager.open()
    try:
        manager.logs.host_partitions(TopicSpec("t", 1, {}), [0])
        # Hosted, no state applied yet.
        assert manager.replicas.known_leader("t", 0) == -1
        states = (
            (Role.FOLLOWER, 0, 0),
            (Role.LEADER, 1, 1),
            (Role.NONE, -1, -1),
            # Named leader, but not leading yet (its registration is older
            # than the state): it serves as no leader.
            (Role.NONE, 1, -1),
        )
        for revision, (role, leader, known) in enumerate(states, start=1):
            manager.replicas.set_role(
                "t", 0, role=role, leader_id=leader, leader_epoch=revision,
                replicas=[0, 1], isr=[0, 1], revision=revision,
            )  # fmt: skip
            assert manager.replicas.known_leader("t", 0) == known, (role, leader)
        # Not hosted here at all.
        assert manager.replicas.known_leader("t", 1) == -1
    finally:
        manager.close()
