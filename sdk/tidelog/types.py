"""Value types that users of the SDK see: partitions, records, metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from tidelog.records import Header


class TopicPartition(NamedTuple):
    """A partition of a topic (hashable, usable as a dict key)."""

    topic: str
    partition: int


class OffsetAndTimestamp(NamedTuple):
    """An offset found by time (Consumer.offsets_for_times)."""

    offset: int
    timestamp: int


class RecordMetadata(NamedTuple):
    """Where a produced record was written."""

    topic: str
    partition: int
    offset: int
    #: The record's timestamp: its create time, or the broker's append time
    #: when the topic uses LogAppendTime.
    timestamp: int


class ConsumerRecord:
    """One record as a consumer sees it.

    A slotted class rather than a dataclass or namedtuple: consumers build
    one per record, so construction cost matters (~2x cheaper).
    """

    __slots__ = (
        "headers",
        "key",
        "offset",
        "partition",
        "timestamp",
        "timestamp_type",
        "topic",
        "value",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[Header],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        #: 0 CreateTime, 1 LogAppendTime.
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return (
            f"ConsumerRecord(topic={self.topic!r}, partition={self.partition}, "
            f"offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConsumerRecord):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class NewTopic:
    """A topic to create (AdminClient.create_topics)."""

    name: str
    num_partitions: int = 1
    replication_factor: int = 1
    topic_configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of a topic as AdminClient.describe_topics shows it."""

    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segment_count: int


@dataclass(frozen=True)
class TopicDescription:
    """A topic as AdminClient.describe_topics shows it."""

    name: str
    partitions: list[PartitionInfo]
    configs: dict[str, str]
