"""Value types that users of the SDK see: partitions, records, metadata."""

from __future__ import annotations

from collections.abc import Sequence
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


class ConsumerRecord(NamedTuple):
    """One record as a consumer sees it (a named tuple, as in kafka-python).

    A tuple rather than a class with __init__: a consumer builds one per
    record, and a tuple is built in C from columns (see `records_from_columns`)
    with no Python frame per record. A tuple of plain values is also
    untracked by the garbage collector after its first pass, so millions of
    them do not make collections slower.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    #: 0 CreateTime, 1 LogAppendTime.
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]
    #: The epoch of the partition leader that appended the record (-1 when
    #: unknown). As in kafka-python, but last: positional code written
    #: against the first eight fields keeps working.
    leader_epoch: int = -1
    #: Size in bytes of the key and value as stored (before the
    #: deserializer), -1 for a null, as kafka-python's.
    serialized_key_size: int = -1
    serialized_value_size: int = -1


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
