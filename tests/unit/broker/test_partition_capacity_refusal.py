"""A broker at its partition limit refuses new replicas (issue 16, item 7):
a typed error naming the limit, nothing opened, what it hosts untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog.errors import InvalidPartitionsError, StorageError
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.topic_store import TopicSpec

from tests.unit.broker.storage.test_partition_log_descriptors import open_descriptors_under


def test_hosting_past_max_partitions_is_refused(tmp_path: Path) -> None:
    manager = PartitionManager(
        BrokerConfig(data_dir=tmp_path, max_partitions=3, broker_id=4), cluster_mode=True
    )
    manager.open()
    try:
        manager.logs.host_partitions(TopicSpec("kept", 2, {}), [0, 1])
        with pytest.raises(
            InvalidPartitionsError, match=r"hosts 2 of at most 3 \(max\.partitions=3\)"
        ):
            manager.logs.host_partitions(TopicSpec("beyond", 2, {}), [0, 1])
        # (Besides the data directory's lock file.)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".lock") == [
            "kept-0",
            "kept-1",
        ]
        # Within the limit, and the partitions it has, still fine.
        manager.logs.host_partitions(TopicSpec("beyond", 2, {}), [1])
        assert manager.logs.hosted_partition_count() == 3
        assert manager.partition_log("kept", 0).log_end_offset == 0
    finally:
        manager.close()


def test_a_log_that_fails_to_open_keeps_no_descriptors(tmp_path: Path) -> None:
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path), cluster_mode=True)
    manager.open()
    # Partition 2's directory is a file: its open fails after 0 and 1 opened.
    # It is hosted offline (`UnopenedLog`, holding no file), the others open.
    (tmp_path / "t-2").write_text("in the way")
    manager.logs.host_partitions(TopicSpec("t", 3, {}), [0, 1, 2])
    assert manager.logs.offline_partitions() == [("t", 2)]
    with pytest.raises(StorageError, match="opening it failed"):
        manager.partition_log("t", 2)
    assert open_descriptors_under(tmp_path / "t-2") == 0
    manager.close()
    assert open_descriptors_under(tmp_path) == 0
