"""The public API is pinned: changing it must be a decision, made here."""

from __future__ import annotations

import pytest
import tidelog

pytestmark = pytest.mark.timeout(10)

EXPECTED = [
    "AdminClient",
    "AdminConfig",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncProducer",
    "CompressionType",
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionInfo",
    "Producer",
    "ProducerConfig",
    "RebalanceListener",
    "RecordMetadata",
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


def test_version_is_a_string() -> None:
    assert isinstance(tidelog.__version__, str) and tidelog.__version__
