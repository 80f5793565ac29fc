"""The public API is pinned: changing it must be a decision, made here."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tidelog

pytestmark = pytest.mark.timeout(10)

SDK = Path(__file__).resolve().parents[3] / "sdk"

EXPECTED = [
    "AdminClient",
    "AdminConfig",
    "AlterConfigOp",
    "AlterConfigOpType",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncProducer",
    "ClusterDescription",
    "CompressionType",
    "ConfigResource",
    "ConfigResourceType",
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "ListOffsetsResultInfo",
    "NewPartitions",
    "NewTopic",
    "Node",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetSpec",
    "PartitionInfo",
    "PartitionReassignment",
    "Producer",
    "ProducerConfig",
    "RebalanceListener",
    "RecordMetadata",
    "ReplicaProgress",
    "TidelogError",
    "TopicDescription",
    "TopicPartition",
    "__version__",
    "errors",
]


def test_export_list_is_pinned() -> None:
    assert sorted(tidelog.__all__) == EXPECTED


def test_every_export_exists() -> None:
    for name in tidelog.__all__:
        assert hasattr(tidelog, name), name


def test_version_is_the_installed_distributions() -> None:
    """The version sdk/pyproject.toml declares, not the fallback used when
    the package's metadata cannot be found."""
    declared = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]["version"]
    assert tidelog.__version__ == declared
    assert tidelog.__version__ != "0.0.0+unknown"
