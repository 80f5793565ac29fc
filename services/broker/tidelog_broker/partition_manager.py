"""The broker's request paths: produce, fetch, offsets and describe, which
need both the logs (log_manager) and, in cluster mode, the replicas' roles
and high watermarks (replica_manager).

The servicers validate requests and map errors; these managers do the work
and raise typed `tidelog.errors` exceptions; the storage engine persists.
None of them knows anything of gRPC. Every method runs on the broker's one
asyncio event loop (log_manager says what runs in worker threads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidelog import records
from tidelog.compression import CompressionType
from tidelog.errors import (
    InvalidRequestError,
    NotEnoughReplicasError,
    StorageError,
    UnknownTopicOrPartitionError,
)

from tidelog_broker import record_policy
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager, Topic, TopicPartitionKey
from tidelog_broker.replica_manager import ReplicaManager
from tidelog_broker.replica_state import PartitionReplication
from tidelog_broker.storage import SYSTEM_CLOCK, Clock, PartitionLog

# Earliest/latest sentinels of ListOffsets, as in Kafka.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True)
class ProduceResult:
    """The outcome of appending one partition's batches."""

    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    #: Offset of the last record appended (acks=all waits until the HW passes it).
    last_offset: int = -1


@dataclass(frozen=True)
class PartitionView:
    """A snapshot of one hosted partition for describe responses."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segment_count: int
    #: Set while its log is offline (what its reads answer): the figures
    #: are then -1, unknown, as Kafka's offline replicas have none. (0s
    #: would read as an empty log, and an operator may act on that.)
    offline: StorageError | None = None


class PartitionManager:
    """Serves produce, read and offset requests over the broker's logs
    (`logs`) and, in cluster mode, its replicas (`replicas`)."""

    def __init__(
        self, config: BrokerConfig, clock: Clock = SYSTEM_CLOCK, *, cluster_mode: bool = False
    ) -> None:
        self._config = config
        #: Topics, their logs and configs, the background loops.
        self.logs = LogManager(config, clock, cluster_mode=cluster_mode)
        #: Cluster mode: roles, ISR, high watermarks, follower fetching.
        self.replicas = ReplicaManager(config, clock, self.logs, cluster_mode=cluster_mode)
        #: The highest epoch InitProducerId handed out per producer id
        #: (producer_epochs.py); None: epochs are not checked. Set by the server.
        self.highest_producer_epoch: Callable[[int], int] | None = None

    def open(self) -> None:
        """Open every topic's logs, running recovery where needed."""
        self.logs.open()

    def close(self) -> None:
        """Flush and close every log (a clean shutdown: next start skips recovery)."""
        self.logs.close()

    # What the request paths ask of the two managers, under the names the
    # produce block below has always used (it moved here unchanged).

    def topic_names(self) -> list[str]:
        return self.logs.topic_names()

    def ensure_topic(self, name: str, auto_create: bool) -> Topic:
        return self.logs.ensure_topic(name, auto_create)

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        return self.logs.partition_log(topic, partition)

    def replication(self, topic: str, partition: int) -> PartitionReplication | None:
        return self.replicas.replication(topic, partition)

    def _leader_replication(
        self, topic: str, partition: int, write: bool
    ) -> PartitionReplication | None:
        return self.replicas.leader_replication(topic, partition, write)

    def _wake(self, key: TopicPartitionKey) -> None:
        self.logs.wake(key)

    async def wait_for_high_watermark(
        self, topic: str, partition: int, offset: int, leader_epoch: int, timeout_s: float
    ) -> None:
        """acks=all: ReplicaManager.wait_for_high_watermark."""
        await self.replicas.wait_for_high_watermark(
            topic, partition, offset, leader_epoch, timeout_s
        )

    # ------------------------------------------------------------ produce

    def append(self, topic: str, partition: int, data: bytes, acks: int = 1) -> ProduceResult:
        """Validate and append one partition's batches (all or nothing).

        Every batch is checked (size, header, CRC32C, body against header:
        record_policy.validated_batches) before any byte is written, so a bad
        batch in a request writes nothing for its partition.
        """
        try:
            partition_log = self.partition_log(topic, partition)
        except UnknownTopicOrPartitionError:
            # Standalone with auto.create.topics.enable: create, look again.
            # (A partition lookup first: in cluster mode a topic whose logs
            # are opening answers NOT_LEADER_OR_FOLLOWER, a retry.)
            self.ensure_topic(topic, auto_create=True)
            partition_log = self.partition_log(topic, partition)
        replication = self._leader_replication(topic, partition, write=True)
        if (
            acks == -1
            and replication is not None
            and len(replication.isr) < partition_log.config.min_insync_replicas
        ):
            raise NotEnoughReplicasError(
                f"{topic}-{partition} has {len(replication.isr)} in-sync replicas "
                f"{replication.isr}, min.insync.replicas is "
                f"{partition_log.config.min_insync_replicas}: nothing written, retry later"
            )
        buf = bytearray(data)  # the log patches base offsets in place
        config = partition_log.config
        batches = record_policy.validated_batches(buf, config.max_message_bytes)
        # The only two reasons to look inside batches, both opt-in per topic.
        if config.compression_type != "producer":
            codec = CompressionType.parse(config.compression_type)
            if record_policy.needs_recompression(batches, codec):
                buf = record_policy.recompress(buf, batches, codec)
                batches = list(records.iter_batches(buf, config.max_message_bytes))
        if config.compact:
            record_policy.reject_null_keys(buf, batches, topic)
        if replication is not None:
            # Outside the CRC: followers and a future leader's divergence
            # check read which epoch wrote each batch.
            for position, _ in batches:
                records.set_partition_leader_epoch(buf, position, replication.leader_epoch)
        info = partition_log.append(buf, batches, self.highest_producer_epoch)
        if replication is not None:
            replication.advance_high_watermark(self._config.broker_id, partition_log.log_end_offset)
        self._wake((topic, partition))
        return ProduceResult(
            info.first_offset,
            info.log_append_time_ms,
            partition_log.log_start_offset,
            info.last_offset,
        )

    # ------------------------------------------------------------ fetch

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[bytes | memoryview, int, PartitionLog]:
        """Read whole batches from `offset`, at most `max_bytes` (but at least
        one batch), up to the high watermark. Returns (records, next_offset, log)."""
        partition_log = self.partition_log(topic, partition)
        self._leader_replication(topic, partition, write=False)
        result = partition_log.read(offset, max_bytes, self.high_watermark(partition_log))
        return result.records, result.next_offset, partition_log

    def high_watermark(self, partition_log: PartitionLog) -> int:
        """What consumers may read up to (ReplicaManager.high_watermark)."""
        return self.replicas.high_watermark(partition_log)

    # ------------------------------------------------------------ offsets

    def list_offset(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) for latest (-1), earliest (-2), or by time.

        By time: the first offset whose timestamp is at or after
        `timestamp_ms`, or (-1, -1) when there is none.
        """
        partition_log = self.partition_log(topic, partition)
        self._leader_replication(topic, partition, write=False)
        if timestamp_ms == LATEST_TIMESTAMP:
            return self.high_watermark(partition_log), -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return partition_log.log_start_offset, -1
        if timestamp_ms < 0:
            raise InvalidRequestError(
                f"timestamp {timestamp_ms} is invalid: use -1 (latest), -2 (earliest) "
                "or a time in ms since the epoch"
            )
        found = partition_log.offset_for_timestamp(timestamp_ms)
        return found if found is not None else (-1, -1)

    def hosted_partitions(
        self,
    ) -> Iterator[tuple[PartitionLog, PartitionReplication | None, int]]:
        """Every partition log hosted here, with its replication state (None
        standalone) and its min.insync.replicas: what metrics are read from."""
        for name in self.logs.topic_names():
            for partition_log in self.logs.topic(name).hosted.values():
                yield (
                    partition_log,
                    self.replicas.replication(name, partition_log.partition),
                    partition_log.config.min_insync_replicas,
                )

    def describe(self, topic: str) -> list[PartitionView]:
        return [self._view(partition_log) for partition_log in self.logs.topic(topic).logs]

    def _view(self, partition_log: PartitionLog) -> PartitionView:
        offline = self.logs.offline_error(partition_log)
        if offline is not None:
            # An unopened log has no figures at all, one taken offline
            # part-way through a change has those of a half-done change.
            return PartitionView(
                partition_log.topic, partition_log.partition, -1, -1, -1, -1, -1, offline
            )
        return PartitionView(
            partition_log.topic,
            partition_log.partition,
            partition_log.log_start_offset,
            partition_log.log_end_offset,
            self.high_watermark(partition_log),
            partition_log.size_bytes,
            partition_log.segment_count,
        )
