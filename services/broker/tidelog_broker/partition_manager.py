"""The broker's work: the partitions it hosts, and produce, fetch and offset
lookups against them.

The servicers validate requests and map errors; this manager does the work
and raises typed `tidelog.errors` exceptions; the storage engine persists.
It knows nothing of gRPC.

Concurrency: every method runs on the broker's one asyncio event loop, so no
locks are needed. Appends and reads do their file I/O inline: they hit the
page cache and take microseconds, far less than a hop to a thread would cost.
Only long waits (long-poll fetches) are awaited.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog import records
from tidelog.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name

from tidelog_broker.config import BrokerConfig
from tidelog_broker.storage import SYSTEM_CLOCK, Clock, LogConfig, PartitionLog, parse_topic_configs
from tidelog_broker.storage.files import log_dir_name
from tidelog_broker.topic_store import TopicSpec, TopicStore

log = logging.getLogger("tidelog.broker")

TopicPartitionKey = tuple[str, int]

# Earliest/latest sentinels of ListOffsets, as in Kafka.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True)
class ProduceResult:
    """The outcome of appending one partition's batches."""

    base_offset: int
    log_append_time_ms: int
    log_start_offset: int


@dataclass(frozen=True)
class PartitionView:
    """A snapshot of one partition for describe and fetch responses."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segment_count: int


class Topic:
    """A topic hosted on this broker: its spec, effective config and logs."""

    def __init__(self, spec: TopicSpec, config: LogConfig, logs: list[PartitionLog]) -> None:
        self.spec = spec
        self.config = config
        self.logs = logs


class PartitionManager:
    """Hosts partition logs and serves produce, read and offset requests."""

    def __init__(self, config: BrokerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self._config = config
        self._clock = clock
        self._store = TopicStore(config.data_dir)
        self._topics: dict[str, Topic] = {}
        # Futures of long-polling fetches, woken when their partitions grow.
        self._append_waiters: dict[TopicPartitionKey, set[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open every topic's logs, running recovery where needed."""
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        for spec in self._store.load().values():
            self._topics[spec.name] = self._open_topic(spec)
        log.info(
            "opened %d topics, %d partitions in %s",
            len(self._topics),
            sum(len(t.logs) for t in self._topics.values()),
            self._config.data_dir,
        )

    def close(self) -> None:
        """Flush and close every log (a clean shutdown: next start skips recovery)."""
        for topic in self._topics.values():
            for partition_log in topic.logs:
                partition_log.close()
        self._topics.clear()
        for waiters in self._append_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()

    def _open_topic(self, spec: TopicSpec) -> Topic:
        config = parse_topic_configs(spec.configs, self._config.log_defaults)
        logs = [
            PartitionLog.open(
                self._config.data_dir / log_dir_name(spec.name, p),
                spec.name,
                p,
                config,
                self._clock,
            )
            for p in range(spec.partitions)
        ]
        return Topic(spec, config, logs)

    # ------------------------------------------------------------ topics

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> Topic:
        validate_topic_name(name)
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        logs = self.topic(topic).logs
        if not 0 <= partition < len(logs):
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0 to {len(logs) - 1}; {partition} does not exist"
            )
        return logs[partition]

    def create_topic(
        self,
        name: str,
        partitions: int = 0,
        replication_factor: int = 0,
        configs: dict[str, str] | None = None,
        validate_only: bool = False,
    ) -> Topic | None:
        """Create a topic and its partition logs; raise a typed error when the
        request is invalid. With validate_only, check and create nothing."""
        validate_topic_name(name)
        if name in self._topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        partitions = partitions or self._config.num_partitions
        if partitions < 1:
            raise InvalidPartitionsError(f"a topic needs at least 1 partition, not {partitions}")
        if replication_factor not in (0, 1):
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} is larger than the 1 broker available"
            )
        configs = dict(configs or {})
        parse_topic_configs(configs, self._config.log_defaults)  # validates every key
        if validate_only:
            return None
        spec = TopicSpec(name, partitions, configs)
        topic = self._open_topic(spec)
        self._topics[name] = topic
        self._save_specs()
        log.info("created topic %s with %d partitions", name, partitions)
        return topic

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data."""
        topic = self.topic(name)
        del self._topics[name]
        self._save_specs()
        for partition, partition_log in enumerate(topic.logs):
            partition_log.delete()
            self._wake((name, partition))
        log.info("deleted topic %s", name)

    def ensure_topic(self, name: str, auto_create: bool) -> Topic:
        """The topic, created with defaults when missing and allowed."""
        validate_topic_name(name)
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        if auto_create and self._config.auto_create_topics:
            created = self.create_topic(name)
            assert created is not None
            return created
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def _save_specs(self) -> None:
        self._store.save({name: topic.spec for name, topic in self._topics.items()})

    # ------------------------------------------------------------ produce

    def append(self, topic: str, partition: int, data: bytes) -> ProduceResult:
        """Validate and append one partition's batches (all or nothing).

        Every batch is checked (size, header, CRC32C) before any byte is
        written, so a bad batch in a request writes nothing for its partition.
        """
        partition_log = self.partition_log(
            self.ensure_topic(topic, auto_create=True).spec.name, partition
        )
        buf = bytearray(data)  # the log patches base offsets in place
        batches = list(records.iter_batches(buf, partition_log.config.max_message_bytes))
        info = partition_log.append(buf, batches)
        self._wake((topic, partition))
        return ProduceResult(
            info.first_offset, info.log_append_time_ms, partition_log.log_start_offset
        )

    # ------------------------------------------------------------ fetch

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[bytes, int, PartitionLog]:
        """Read whole batches from `offset`, at most `max_bytes` (but at least
        one batch), up to the high watermark. Returns (records, next_offset, log)."""
        partition_log = self.partition_log(topic, partition)
        result = partition_log.read(offset, max_bytes, self.high_watermark(partition_log))
        return result.records, result.next_offset, partition_log

    @staticmethod
    def high_watermark(partition_log: PartitionLog) -> int:
        # One replica: everything appended is committed. Replication moves
        # this to the smallest log end offset of the in-sync replicas.
        return partition_log.log_end_offset

    async def wait_for_append(
        self, partitions: Iterable[TopicPartitionKey], timeout_s: float
    ) -> None:
        """Return when any of `partitions` gets new data, or after timeout_s."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        keys = list(partitions)
        for key in keys:
            self._append_waiters.setdefault(key, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._append_waiters.get(key)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._append_waiters[key]

    def _wake(self, key: TopicPartitionKey) -> None:
        waiters = self._append_waiters.pop(key, None)
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------ offsets

    def list_offset(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) for latest (-1), earliest (-2), or by time.

        By time: the first offset whose timestamp is at or after
        `timestamp_ms`, or (-1, -1) when there is none.
        """
        partition_log = self.partition_log(topic, partition)
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

    def describe(self, topic: str) -> list[PartitionView]:
        return [
            PartitionView(
                topic,
                partition_log.partition,
                partition_log.log_start_offset,
                partition_log.log_end_offset,
                self.high_watermark(partition_log),
                partition_log.size_bytes,
                partition_log.segment_count,
            )
            for partition_log in self.topic(topic).logs
        ]

    # ------------------------------------------------------------ background

    async def run_flush_scheduler(self) -> None:
        """Apply flush.ms: fsync logs whose oldest unflushed data is too old."""
        interval_s = self._config.flush_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self._clock.monotonic_ms()
            for topic in list(self._topics.values()):
                for partition, partition_log in enumerate(topic.logs):
                    try:
                        partition_log.maybe_flush(now_ms)
                    except TidelogError:
                        log.exception("flush of %s-%d failed", topic.spec.name, partition)
