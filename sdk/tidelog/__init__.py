"""Tidelog's Python SDK: producers, consumers and topic administration.

The public API is what this module exports (`__all__`, pinned by a test);
modules starting with an underscore are implementation details::

    from tidelog import Producer, Consumer, TopicPartition

    with Producer("127.0.0.1:9392") as producer:
        producer.send("orders", b"hello").get(timeout=10)
"""

from __future__ import annotations

# First: gRPC reads its transport settings when it is first imported.
from tidelog import _grpc_setup  # noqa: F401  isort: skip

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from tidelog import errors
from tidelog._futures import FutureRecordMetadata
from tidelog.admin import AdminClient, AsyncAdminClient
from tidelog.compression import CompressionType
from tidelog.config import AdminConfig, ConsumerConfig, ProducerConfig
from tidelog.consumer import AsyncConsumer, Consumer
from tidelog.errors import TidelogError
from tidelog.group import OffsetAndMetadata, RebalanceListener
from tidelog.producer import AsyncProducer, Producer
from tidelog.types import (
    AlterConfigOp,
    AlterConfigOpType,
    ClusterDescription,
    ConfigResource,
    ConfigResourceType,
    ConsumerRecord,
    ListOffsetsResultInfo,
    NewPartitions,
    NewTopic,
    Node,
    OffsetAndTimestamp,
    OffsetSpec,
    PartitionInfo,
    PartitionReassignment,
    RecordMetadata,
    ReplicaProgress,
    TopicDescription,
    TopicPartition,
)

try:
    __version__ = _version("tidelog")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
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
