"""Value types that users of the SDK see: partitions, records, metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, cast

from tidelog.errors import TidelogError
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
    record, and a tuple is built in C from columns (see
    `records.decode_records_at` and tidelog._crecords) with no Python frame
    per record. As
    a tuple subclass it stays tracked by the garbage collector (CPython
    untracks exact tuples only): the consumer moves new records straight to
    the oldest generation so young collections do not traverse them (see
    `_subscription._gc_paused`).

    The serialized key and value sizes are properties, not fields: without a
    deserializer they are the lengths of `key` and `value`, so building a
    record costs nothing for them (as two more columns zipped per record they
    cost 5-13% of building records, 100-byte values). With a deserializer
    the consumer builds a `_DeserializedRecord`, which keeps the sizes read
    from the batch.
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

    @property
    def serialized_key_size(self) -> int:
        """Size in bytes of the key as stored (before the deserializer), -1
        for a null, as kafka-python's."""
        key = self.key
        return -1 if key is None else len(key)

    @property
    def serialized_value_size(self) -> int:
        """Size in bytes of the value as stored (before the deserializer),
        -1 for a null, as kafka-python's."""
        value = self.value
        return -1 if value is None else len(value)


def _record_asdict(record: ConsumerRecord) -> dict[str, Any]:
    """The fields plus the two sizes (kafka-python's _asdict has them)."""
    out = dict(zip(record._fields, record, strict=False))
    out["serialized_key_size"] = record.serialized_key_size
    out["serialized_value_size"] = record.serialized_value_size
    return out


# NamedTuple refuses _asdict in the class body.
ConsumerRecord._asdict = _record_asdict  # type: ignore[method-assign,assignment]
_FIELD_COUNT = len(ConsumerRecord._fields)


class _DeserializedRecord(ConsumerRecord):
    """A ConsumerRecord whose key or value went through a deserializer, so
    their lengths are no longer the stored sizes: those are kept as two
    unnamed tuple items after the fields (`len()` counts them; indexing and
    unpacking of the named fields are unchanged). Only the consumer builds
    these, with `tuple.__new__(_DeserializedRecord, (*fields, key_size,
    value_size))`.
    """

    __slots__ = ()

    @property
    def serialized_key_size(self) -> int:
        return cast(int, tuple.__getitem__(self, _FIELD_COUNT))

    @property
    def serialized_value_size(self) -> int:
        return cast(int, tuple.__getitem__(self, _FIELD_COUNT + 1))

    def __repr__(self) -> str:
        return repr(ConsumerRecord._make(self[:_FIELD_COUNT]))

    def __reduce__(self) -> tuple[Any, ...]:
        # The generated __getnewargs__ would pass the sizes to __new__ too.
        return (_rebuild_deserialized, (tuple(self),))

    def _replace(self, /, **changes: Any) -> _DeserializedRecord:
        fields = ConsumerRecord._make(self[:_FIELD_COUNT])._replace(**changes)
        return tuple.__new__(_DeserializedRecord, (*fields, *self[_FIELD_COUNT:]))


def _rebuild_deserialized(items: tuple[Any, ...]) -> _DeserializedRecord:
    return tuple.__new__(_DeserializedRecord, items)


@dataclass(frozen=True)
class NewTopic:
    """A topic to create (AdminClient.create_topics).

    `replica_assignments` (kafka-python's name): partition -> broker ids of
    its replicas, the preferred leader first, used instead of the
    coordinator's placement. With it, pass num_partitions=-1 and
    replication_factor=-1 as in kafka-python (taken from the assignment), or
    the values the assignment has; anything else is refused. Pass it by
    keyword: the fourth positional field is topic_configs here."""

    name: str
    num_partitions: int = 1
    replication_factor: int = 1
    topic_configs: dict[str, str] = field(default_factory=dict)
    replica_assignments: Mapping[int, Sequence[int]] | None = None


@dataclass(frozen=True)
class NewPartitions:
    """Partitions to add to a topic (AdminClient.create_partitions), as
    kafka-python's: the count after the change, and optionally the replicas
    of each new partition (a list per new partition, in order, the
    preferred leader first). Records with a key may map to another partition
    once a topic has more partitions."""

    total_count: int
    new_assignments: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True)
class ReplicaProgress:
    """How far a replica being added by a reassignment has come."""

    broker_id: int
    #: False when its broker could not be asked (the figures and lags are
    #: then -1, unknown; older servers answer 0).
    reachable: bool
    log_end_offset: int
    size_bytes: int
    #: Records and bytes it still has to copy from the leader; -1 when the
    #: leader's figures are unknown (PartitionReassignment.
    #: leader_log_end_offset; older servers answer 0, as if caught up).
    lag_records: int
    lag_bytes: int
    in_sync: bool
    #: StorageError when its broker answered but its log is offline (a
    #: storage failure, or it could not be opened): it copies nothing until
    #: that broker restarts, and the figures are -1 (unknown). None
    #: otherwise, and from servers older than this field.
    error: TidelogError | None = None


@dataclass(frozen=True)
class PartitionReassignment:
    """A replica move in progress (AdminClient.list_partition_reassignments)."""

    #: Every replica while it lasts: the target, then the leaving ones.
    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]
    #: What a cancel restores.
    original_replicas: list[int]
    throttle_bytes_per_s: int
    #: Wall-clock ms since the epoch when it started.
    started_ms: int
    leader: int
    isr: list[int]
    #: -1 (unknown) when the partition has no leader, or its leader could
    #: not be asked, or its log is offline; the lags of `progress` are then
    #: -1 too. Older servers answer 0 then.
    leader_log_end_offset: int
    #: Adding replica -> its progress.
    progress: dict[int, ReplicaProgress]


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of a topic as AdminClient.describe_topics shows it.

    The log figures (offsets, size, segments) are its leader's. When they
    could not be had (no leader, or its leader is down, did not answer in
    time, or refused, or its log is offline), `error` holds the typed
    exception saying so, naming the leader (NotLeaderOrFollowerError or
    RequestTimedOutError, both retriable; StorageError for an offline log;
    or what the leader refused with), and the figures are -1 (unknown).
    A partition without a live leader that none of its replicas can lead
    (each ISR member in `offline_replicas` or not among `replicas`, and no
    unclean election allowed) is offline until one of them is back: its
    error's message says "<topic>-<partition> is offline", names them and
    what brings each back; a StorageError when their logs are offline (fix
    the disk and restart the broker), a NotLeaderOrFollowerError when a
    broker is down (start it again): both retriable, as Kafka's KAFKA_STORAGE_ERROR and
    LEADER_NOT_AVAILABLE are (a produce waits for it within its timeout),
    but it comes back only when one of those replicas does, not by waiting
    for an election. describe_topics does not raise for any of these, nor
    retry: the other partitions are described as usual."""

    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segment_count: int
    #: While a reassignment moves it (`replicas` then lists every replica
    #: of the move): the replicas being added, and those leaving.
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)
    #: Why the figures are unknown (-1); None when they are the leader's
    #: (and from a broker older than this field, which never says).
    error: TidelogError | None = None
    #: Replicas that cannot serve, in the order of `replicas`, as Kafka's
    #: offline replicas: their broker is down (not registered), or it lists
    #: their log offline (a storage failure took it offline until that
    #: broker restarts). Never elected leader, out of the ISR. Empty when
    #: none is; older servers list offline logs of live brokers only, or
    #: nothing.
    offline_replicas: list[int] = field(default_factory=list)
    #: Replicas whose log may have lost its tail when their broker restarted
    #: after a crash (or recovery cut damage) and has neither caught up with
    #: a leader nor led since, in the order
    #: of `replicas`: they stay in the ISR but are not elected while another
    #: ISR member may return, so a partition whose other ISR members are
    #: down waits leaderless for them (when every ISR member is back and
    #: torn, the one holding the most leads). Empty when none is, and from
    #: servers older than this field.
    torn_replicas: list[int] = field(default_factory=list)
    #: Eligible leader replicas (Kafka's KIP-966), in the order of
    #: `replicas`: removed from the ISR while it was below the topic's
    #: min.insync.replicas, so each holds every acknowledged record. When
    #: no untorn ISR member can lead, an untorn one of them leads; a torn
    #: ISR member is not elected while one of them is away. Empty when none
    #: is, and from servers older than this field.
    eligible_leader_replicas: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TopicDescription:
    """A topic as AdminClient.describe_topics shows it."""

    name: str
    partitions: list[PartitionInfo]
    configs: dict[str, str]


# --------------------------------------------------------------------------- admin


class OffsetSpec:
    """What AdminClient.list_offsets looks up for a partition (Kafka's
    OffsetSpec): `earliest()`, `latest()` or `for_timestamp(ms)`.

    Kafka's `max_timestamp()` (the offset of the record with the largest
    timestamp) is not offered: the broker's ListOffsets cannot answer it.
    """

    __slots__ = ("timestamp",)

    #: The ListOffsets wire values of the two special specs.
    EARLIEST = -2
    LATEST = -1

    def __init__(self, timestamp: int) -> None:
        if timestamp < 0 and timestamp not in (self.EARLIEST, self.LATEST):
            raise ValueError(
                f"an offset spec is a time in ms (>= 0), -1 (latest) or -2 (earliest), "
                f"got {timestamp}"
            )
        self.timestamp = timestamp

    @classmethod
    def earliest(cls) -> OffsetSpec:
        return cls(cls.EARLIEST)

    @classmethod
    def latest(cls) -> OffsetSpec:
        """The offset the next record will get (the high watermark)."""
        return cls(cls.LATEST)

    @classmethod
    def for_timestamp(cls, timestamp_ms: int) -> OffsetSpec:
        """The first offset whose record's timestamp is at or after `timestamp_ms`."""
        if timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be >= 0, got {timestamp_ms}")
        return cls(timestamp_ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetSpec) and other.timestamp == self.timestamp

    def __hash__(self) -> int:
        return hash(self.timestamp)

    def __repr__(self) -> str:
        names = {self.EARLIEST: "earliest()", self.LATEST: "latest()"}
        return f"OffsetSpec.{names.get(self.timestamp, f'for_timestamp({self.timestamp})')}"


class ListOffsetsResultInfo(NamedTuple):
    """One partition's answer to AdminClient.list_offsets (a tuple: unpacks
    as (offset, timestamp)). `offset` is -1 when a time lookup finds no
    record that late; `timestamp` is -1 for earliest and latest."""

    offset: int
    timestamp: int


class ConfigResourceType(Enum):
    """Kinds of config resources (Kafka's numbering)."""

    TOPIC = 2
    BROKER = 4


@dataclass(frozen=True)
class ConfigResource:
    """A thing that has configs, as kafka-python's ConfigResource: its type
    (a ConfigResourceType or its name, "TOPIC"/"BROKER"), its name, and for
    the alter calls the configs to apply. Hashable (by type and name), so
    describe_configs answers with it as the key.

    Tidelog's Admin API serves topic configs only: a broker's are set in
    its config file, and a BROKER resource is refused naming that.
    """

    resource_type: ConfigResourceType | str
    name: str
    #: alter_configs: key -> value (the whole set of overrides).
    #: incremental_alter_configs: key -> value (set), None (delete) or an
    #: AlterConfigOp (set, delete, append to or subtract from a list).
    configs: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        kind = self.resource_type
        if isinstance(kind, str):
            try:
                kind = ConfigResourceType[kind.upper()]
            except KeyError:
                raise ValueError(
                    f"resource_type must be TOPIC or BROKER, got {self.resource_type!r}"
                ) from None
            object.__setattr__(self, "resource_type", kind)


class AlterConfigOpType(Enum):
    """incremental_alter_configs operations (Kafka's AlterConfigOp.OpType)."""

    SET = 0
    DELETE = 1
    #: Add values to a list config (comma-separated, e.g. cleanup.policy).
    APPEND = 2
    #: Remove values from a list config.
    SUBTRACT = 3


class AlterConfigOp(NamedTuple):
    """One change of incremental_alter_configs (Kafka's AlterConfigOp)."""

    op_type: AlterConfigOpType
    value: str | None = None


@dataclass(frozen=True)
class Node:
    """A broker as AdminClient.describe_cluster lists it."""

    id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class ClusterDescription:
    """AdminClient.describe_cluster's answer. A standalone broker (no etcd)
    has no cluster id, controller or coordinators: those are None / empty."""

    cluster_id: str | None
    #: The id of the coordinator replica acting as controller (Kafka's
    #: controller is a broker; here it is a coordinator replica).
    controller_id: str | None
    brokers: list[Node]
    #: Live coordinator replicas: (id, "host:port").
    coordinators: list[tuple[str, str]]
