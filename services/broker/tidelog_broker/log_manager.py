"""The broker's work: the partitions it hosts, and produce, fetch and offset
lookups against them.

The servicers validate requests and map errors; this manager does the work
and raises typed `tidelog.errors` exceptions; the storage engine persists.
It knows nothing of gRPC.

Concurrency: every method runs on the broker's one asyncio event loop, so no
locks are needed. Appends and reads do their file I/O inline: they hit the
page cache and take microseconds, far less than a hop to a thread would cost.
Only long waits (long-poll fetches) are awaited, and the two kinds of long
work are sent to worker threads (asyncio.to_thread) so that they never stall
produce or fetch: unlinking the files retention and compaction drop (renamed
`.deleted` on the loop first, which is cheap), and the cleaner's rounds,
which work on a snapshot of plain data; the swap of cleaned segments into a
log then happens back on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tidelog import records
from tidelog.compression import CompressionType
from tidelog.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog_server.log_flood import RateLimitedLog
from tidelog_server.topic_configs import TOPIC_CONFIGS, check_replication, validate_topic_configs

from tidelog_broker import record_policy
from tidelog_broker.config import BrokerConfig
from tidelog_broker.replica_state import PartitionReplication, RegistrationOf, Role
from tidelog_broker.resources import open_file_limit, partition_capacity
from tidelog_broker.storage import (
    SYSTEM_CLOCK,
    Clock,
    LogConfig,
    PartitionLog,
    config_to_strings,
    parse_topic_configs,
)
from tidelog_broker.storage import cleaner as log_cleaner
from tidelog_broker.storage.files import log_dir_name, parse_log_dir_name
from tidelog_broker.storage.partition_log import unlink_files
from tidelog_broker.topic_store import TopicSpec, TopicStore

log = logging.getLogger("tidelog.broker")
# Errors that loops repeat (per partition, per pass) log once per interval.
flood = RateLimitedLog(log)

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
    #: Offset of the last record appended (acks=all waits until the HW passes it).
    last_offset: int = -1


@dataclass(frozen=True)
class ConfigValue:
    """One topic config as DescribeConfigs reports it."""

    name: str
    value: str
    #: "topic" (an override), "broker" (the broker's config file) or "default".
    source: str


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
    """A topic hosted on this broker: its spec, effective config and logs.

    Standalone, `logs` holds every partition. In cluster mode it holds only
    the partitions this broker leads (ascending); `hosted` maps partition
    number to log either way, and `spec.partitions` is the topic's count."""

    def __init__(self, spec: TopicSpec, config: LogConfig, logs: list[PartitionLog]) -> None:
        self.spec = spec
        self.config = config
        self.logs = logs
        self.hosted = {partition_log.partition: partition_log for partition_log in logs}


class PartitionManager:
    """Hosts partition logs and serves produce, read and offset requests."""

    def __init__(
        self, config: BrokerConfig, clock: Clock = SYSTEM_CLOCK, *, cluster_mode: bool = False
    ) -> None:
        self._config = config
        self._clock = clock
        # Cluster mode: topics come from etcd through the cluster-mode hooks
        # below (ClusterLink), not from topics.json, and are never auto-created.
        self._cluster_mode = cluster_mode
        self._store = TopicStore(config.data_dir)
        self._topics: dict[str, Topic] = {}
        # Futures of long-polling fetches, woken when their partitions grow.
        self._append_waiters: dict[TopicPartitionKey, set[asyncio.Future[None]]] = {}
        # Set at close: a cleaner round in a worker thread stops at its next batch.
        self._cleaner_cancel = threading.Event()
        # Cluster mode: role, epoch, ISR and HW of every hosted partition.
        self._replication: dict[TopicPartitionKey, PartitionReplication] = {}
        #: Cluster mode: False while this broker's etcd lease may have expired;
        #: a leader then refuses writes (no split brain). Set by ClusterLink.
        self.lease_valid: Callable[[], bool] = lambda: True
        #: Cluster mode: the etcd registration revision of a live broker (None:
        #: not registered, so not alive); set by ClusterLink. Replica fetches
        #: and ISR expansion are bound to it.
        self.registration_of: RegistrationOf = lambda _broker_id: None
        #: Cluster mode: writes a proposed ISR to etcd (fenced); set by ClusterLink.
        self.isr_writer: Callable[[PartitionReplication, list[int]], Awaitable[None]] | None = None
        self._isr_tasks: set[asyncio.Task[None]] = set()
        #: The open-file limit and the partition replicas it allows
        #: (resources.py); both go into the etcd registration.
        self.open_file_limit = open_file_limit()
        self.partition_capacity = partition_capacity(self.open_file_limit, config.max_partitions)

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open every topic's logs, running recovery where needed."""
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        if self._cluster_mode:
            return
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
        self._cleaner_cancel.set()
        for topic in self._topics.values():
            for partition_log in topic.logs:
                partition_log.close()
        self._topics.clear()
        for waiters in self._append_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()

    def _open_topic(self, spec: TopicSpec, partitions: Iterable[int] | None = None) -> Topic:
        config = parse_topic_configs(spec.configs, self._config.log_defaults)
        logs: list[PartitionLog] = []
        try:
            for p in range(spec.partitions) if partitions is None else sorted(partitions):
                logs.append(
                    PartitionLog.open(
                        self._config.data_dir / log_dir_name(spec.name, p),
                        spec.name,
                        p,
                        config,
                        self._clock,
                    )
                )
        except BaseException:
            # Out of descriptors, say: the logs opened so far must not keep
            # theirs (nobody would close them).
            for partition_log in logs:
                with contextlib.suppress(TidelogError):
                    partition_log.close()
            raise
        return Topic(spec, config, logs)

    def hosted_partition_count(self) -> int:
        """Partition replicas this broker hosts now."""
        return sum(len(topic.hosted) for topic in self._topics.values())

    def _check_capacity(self, adding: int, what: str) -> None:
        """Refuse `adding` more partition replicas past partition_capacity."""
        hosted = self.hosted_partition_count()
        if hosted + adding > self.partition_capacity:
            source = (
                f"max.partitions={self._config.max_partitions}"
                if self._config.max_partitions
                else f"derived from its open-file limit of {self.open_file_limit}"
            )
            raise InvalidPartitionsError(
                f"{what} needs {adding} more partition replicas on broker "
                f"{self._config.broker_id}, which hosts {hosted} of at most "
                f"{self.partition_capacity} ({source})"
            )

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
        hosted = self.topic(topic)
        count = hosted.spec.partitions
        if not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0 to {count - 1}; {partition} does not exist"
            )
        partition_log = hosted.hosted.get(partition)
        if partition_log is None:
            raise NotLeaderOrFollowerError(
                f"broker {self._config.broker_id} does not lead {topic}-{partition}: "
                "refresh metadata and ask its leader"
            )
        return partition_log

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
        # The topic's own min.insync.replicas against the one replica.
        check_replication(parse_topic_configs(configs), 1, name)
        self._check_capacity(partitions, f"topic {name!r}")
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
        for partition_log in topic.logs:
            partition_log.delete()
            self._wake((name, partition_log.partition))
        log.info("deleted topic %s", name)

    def ensure_topic(self, name: str, auto_create: bool) -> Topic:
        """The topic, created with defaults when missing and allowed."""
        validate_topic_name(name)
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        if auto_create and self._config.auto_create_topics and not self._cluster_mode:
            created = self.create_topic(name)
            assert created is not None
            return created
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def _save_specs(self) -> None:
        if self._cluster_mode:
            return  # etcd holds the topics
        self._store.save({name: topic.spec for name, topic in self._topics.items()})

    # ------------------------------------------------------------ cluster mode

    def host_partitions(self, spec: TopicSpec, partitions: Iterable[int]) -> None:
        """Cluster mode: host exactly `partitions` of topic `spec` (open or
        create their logs; close, without deleting, the ones no longer
        listed) and apply `spec.configs` to every log (no restart). Idempotent,
        so replaying the same etcd state changes nothing."""
        wanted = set(partitions)
        topic = self._topics.get(spec.name)
        # Past its limit the broker refuses the new replicas (the caller
        # logs it) rather than run out of descriptors for the ones it has.
        self._check_capacity(
            len(wanted - set(topic.hosted if topic is not None else ())), f"topic {spec.name!r}"
        )
        if topic is None:
            # Known even when no partition is hosted here, so that requests
            # for it get NOT_LEADER_OR_FOLLOWER rather than UNKNOWN_TOPIC.
            self._topics[spec.name] = self._open_topic(spec, wanted)
            if wanted:
                log.info("hosting %s partitions %s", spec.name, sorted(wanted))
            return
        if spec.configs != topic.spec.configs:
            topic.config = parse_topic_configs(spec.configs, self._config.log_defaults)
            for partition_log in topic.logs:
                partition_log.update_config(topic.config)
            log.info("configs of topic %s are now %s", spec.name, spec.configs)
        topic.spec = spec
        if wanted == set(topic.hosted):
            return
        for partition in set(topic.hosted) - wanted:
            topic.hosted.pop(partition).close()
            self._replication.pop((spec.name, partition), None)
            self._wake((spec.name, partition))
        added = self._open_topic(spec, wanted - set(topic.hosted))
        topic.hosted.update(added.hosted)
        topic.logs = [topic.hosted[p] for p in sorted(topic.hosted)]
        log.info("hosting %s partitions %s", spec.name, sorted(wanted))

    def drop_topic(self, name: str, delete_data: bool) -> None:
        """Cluster mode: stop hosting a topic; with `delete_data`, remove its
        logs (the topic was deleted). Unknown names are ignored (idempotent)."""
        topic = self._topics.pop(name, None)
        if topic is None:
            return
        for partition, partition_log in topic.hosted.items():
            if delete_data:
                partition_log.delete()
            else:
                partition_log.close()
            self._replication.pop((name, partition), None)
            self._wake((name, partition))
        log.info("%s topic %s", "deleted" if delete_data else "closed", name)

    def local_topics(self) -> dict[str, list[int]]:
        """Cluster mode: topics with log directories on disk, open or not
        (to find logs of topics deleted while this broker was down)."""
        out: dict[str, list[int]] = {}
        for entry in self._config.data_dir.iterdir():
            if not entry.is_dir() or entry.name == "etcd":
                continue
            try:
                topic, partition = parse_log_dir_name(entry.name)
            except ValueError:
                continue
            out.setdefault(topic, []).append(partition)
        return out

    def delete_local_logs(self, name: str, partitions: Iterable[int]) -> None:
        """Cluster mode: delete logs of a topic this broker does not host."""
        hosted = self._topics.get(name)
        for partition in partitions:
            if hosted is not None and partition in hosted.hosted:
                continue
            # Not open, so no file handles to close: remove the directory.
            directory = self._config.data_dir / log_dir_name(name, partition)
            try:
                shutil.rmtree(directory)
            except FileNotFoundError:
                pass
            except OSError as exc:
                # Out of descriptors, say: the stray sweep at the next start
                # (or the next delete) tries again.
                flood.warning("cannot delete %s: %s", directory, exc)
        log.info("deleted stray logs of topic %s", name)

    # ------------------------------------------------------------ replication

    def replication(self, topic: str, partition: int) -> PartitionReplication | None:
        """Cluster mode: the role and ISR of a hosted partition (None: unknown)."""
        return self._replication.get((topic, partition))

    def _leader_replication(
        self, topic: str, partition: int, write: bool
    ) -> PartitionReplication | None:
        """Cluster mode: the partition's state if this broker leads it (and,
        for a write, still holds its etcd lease); else NotLeaderOrFollower.
        Followers serve neither produce nor consumer fetch (Kafka's default)."""
        if not self._cluster_mode:
            return None
        replication = self._replication.get((topic, partition))
        me = self._config.broker_id
        if replication is None or not replication.is_leader:
            leader = "unknown" if replication is None else replication.leader_id
            raise NotLeaderOrFollowerError(
                f"broker {me} does not lead {topic}-{partition} (leader: {leader}): "
                "refresh metadata and ask its leader"
            )
        if write and not self.lease_valid():
            raise NotLeaderOrFollowerError(
                f"broker {me} may have lost its etcd session, so it may no longer lead "
                f"{topic}-{partition}: refresh metadata and retry"
            )
        return replication

    def set_role(
        self,
        topic: str,
        partition: int,
        *,
        role: Role,
        leader_id: int,
        leader_epoch: int,
        replicas: list[int],
        isr: list[int],
    ) -> PartitionReplication:
        """Cluster mode: apply a hosted partition's state from etcd.
        Idempotent: the same state again changes nothing. A new epoch or
        role starts afresh (a new leader records its epoch in the log's
        epoch history at its log end offset); an ISR change alone keeps the
        followers' progress and may move the HW."""
        key = (topic, partition)
        partition_log = self.partition_log(topic, partition)
        me = self._config.broker_id
        old = self._replication.get(key)
        if old is not None and old.role is role and old.leader_epoch == leader_epoch:
            old.replicas = list(replicas)
            if old.isr != isr:
                old.isr = list(isr)
                old.isr_change_pending = False
                if old.is_leader:
                    old.advance_high_watermark(me, partition_log.log_end_offset)
                self._wake(key)
            return old
        state = PartitionReplication(
            topic,
            partition,
            role,
            leader_id,
            leader_epoch,
            list(replicas),
            list(isr),
            since_ms=self._clock.monotonic_ms(),
            # A HW learnt as follower is kept: it never moves backwards here.
            high_watermark=0 if old is None else old.high_watermark,
        )
        if role is Role.LEADER:
            partition_log.leader_epochs.assign(leader_epoch, partition_log.log_end_offset)
            state.start_leading(me, partition_log.log_end_offset)
        self._replication[key] = state
        log.info(
            "%s-%d: %s, leader %d, epoch %d, isr %s, log end %d",
            topic,
            partition,
            role.value,
            leader_id,
            leader_epoch,
            isr,
            partition_log.log_end_offset,
        )
        # Waiting acks=all requests and long-polls look at the new role.
        self._wake(key)
        return state

    async def wait_for_high_watermark(
        self, topic: str, partition: int, offset: int, leader_epoch: int, timeout_s: float
    ) -> None:
        """acks=all: return once the HW is past `offset` (the last offset of
        the batches appended in `leader_epoch`). RequestTimedOutError after
        timeout_s; NotLeaderOrFollowerError if leadership moved meanwhile
        (the records may or may not survive: the producer retries)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = (topic, partition)
        while True:
            replication = self._replication.get(key)
            if (
                replication is None
                or not replication.is_leader
                or replication.leader_epoch != leader_epoch
            ):
                raise NotLeaderOrFollowerError(
                    f"leadership of {topic}-{partition} moved while waiting for acks=all"
                )
            if replication.high_watermark > offset:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"{topic}-{partition}: in-sync replicas {replication.isr} did not confirm "
                    f"offset {offset} within {timeout_s * 1000:.0f} ms (high watermark "
                    f"{replication.high_watermark})"
                )
            await self.wait_for_append([key], remaining)

    def follower_registration(self, replication: PartitionReplication, follower: int) -> int:
        """Leader: the registration revision under which `follower` may fetch
        this partition. Only a replica assigned to it and registered live in
        etcd may: anything else (an id that is not a replica, a dead broker's
        id) gets NotLeaderOrFollowerError naming the replica and partition,
        and never a record (followers read past the HW)."""
        name = f"{replication.topic}-{replication.partition}"
        if follower not in replication.replicas or follower == self._config.broker_id:
            raise NotLeaderOrFollowerError(
                f"replica {follower} is not a follower of {name} (its replicas are "
                f"{replication.replicas}, led by broker {self._config.broker_id})"
            )
        registration = self.registration_of(follower)
        if registration is None:
            raise NotLeaderOrFollowerError(
                f"replica {follower} of {name} is not registered live in etcd: it may fetch "
                "again once its broker has registered"
            )
        return registration

    def on_follower_fetch(
        self, topic: str, partition: int, follower: int, fetch_offset: int
    ) -> tuple[PartitionReplication, PartitionLog]:
        """Leader: a follower fetches from `fetch_offset` (its log end): track
        its progress, move the HW, propose an ISR expansion. Raises
        NotLeaderOrFollowerError when this broker does not lead it or the
        follower may not fetch it (`follower_registration`)."""
        partition_log = self.partition_log(topic, partition)
        replication = self._leader_replication(topic, partition, write=False)
        assert replication is not None
        registration = self.follower_registration(replication, follower)
        me = self._config.broker_id
        leo = partition_log.log_end_offset
        now_ms = self._clock.monotonic_ms()
        replication.on_follower_fetch(follower, fetch_offset, leo, now_ms, registration)
        if replication.advance_high_watermark(me, leo):
            self._wake((topic, partition))
        expanded = replication.isr_to_expand(
            now_ms, self._config.replica_lag_time_max_ms, self.registration_of
        )
        if expanded is not None:
            self._propose_isr(replication, expanded)
        return replication, partition_log

    def append_replicated(
        self, topic: str, partition: int, data: bytes, leader_high_watermark: int
    ) -> None:
        """Follower: append batches exactly as the leader stored them."""
        partition_log = self.partition_log(topic, partition)
        if data:
            batches = list(records.iter_batches(data, None))
            partition_log.append_replicated(data, batches)
        replication = self._replication.get((topic, partition))
        if replication is not None and not replication.is_leader:
            high_watermark = min(leader_high_watermark, partition_log.log_end_offset)
            replication.high_watermark = max(replication.high_watermark, high_watermark)

    def truncate_replica(self, topic: str, partition: int, offset: int) -> int:
        """Follower: drop a divergent suffix from `offset`; the new log end."""
        partition_log = self.partition_log(topic, partition)
        before = partition_log.log_end_offset
        partition_log.truncate_to(offset)
        # Also when nothing was cut: an epoch that wrote nothing up to here
        # (this broker led it briefly) must leave the history, or the next
        # fetch names it again and diverges again.
        partition_log.leader_epochs.truncate_from_end(offset)
        log.warning(
            "%s-%d: truncated divergent records from offset %d (log end was %d, now %d)",
            topic,
            partition,
            offset,
            before,
            partition_log.log_end_offset,
        )
        return partition_log.log_end_offset

    def reset_replica(self, topic: str, partition: int, offset: int) -> None:
        """Follower: our log ends below the leader's log start offset
        `offset` (retention deleted what we still needed): restart the log
        empty at `offset` (PartitionLog.reset_to)."""
        partition_log = self.partition_log(topic, partition)
        before_start = partition_log.log_start_offset
        before_end = partition_log.log_end_offset
        partition_log.reset_to(offset)
        log.warning(
            "%s-%d: log (offsets %d to %d) is behind the leader's log start offset %d: "
            "reset to an empty log at offset %d",
            topic,
            partition,
            before_start,
            before_end,
            offset,
            offset,
        )

    def _propose_isr(self, replication: PartitionReplication, isr: list[int]) -> None:
        if self.isr_writer is None or replication.isr_change_pending:
            return
        replication.isr_change_pending = True
        task = asyncio.ensure_future(self._write_isr(replication, isr))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _write_isr(self, replication: PartitionReplication, isr: list[int]) -> None:
        assert self.isr_writer is not None
        try:
            await self.isr_writer(replication, isr)
        except Exception:
            flood.exception(
                "writing ISR %s of %s-%d failed", isr, replication.topic, replication.partition
            )
        finally:
            # The watch brings the written state (set_role clears the flag
            # too); clearing here lets a failed or fenced write be retried.
            replication.isr_change_pending = False

    async def run_isr_checks(self) -> None:
        """Leader: shrink the ISR of followers lagging for replica.lag.time.max.ms."""
        lag_ms = self._config.replica_lag_time_max_ms
        interval_s = max(0.05, lag_ms / 2000)
        me = self._config.broker_id
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self._clock.monotonic_ms()
            for replication in list(self._replication.values()):
                if not replication.is_leader:
                    continue
                shrunk = replication.isr_to_shrink(me, now_ms, lag_ms)
                if shrunk is not None:
                    log.info(
                        "%s-%d: followers %s lag more than %d ms; shrinking the ISR to %s",
                        replication.topic,
                        replication.partition,
                        sorted(set(replication.isr) - set(shrunk)),
                        lag_ms,
                        shrunk,
                    )
                    self._propose_isr(replication, shrunk)

    # ------------------------------------------------------------ produce

    def append(self, topic: str, partition: int, data: bytes, acks: int = 1) -> ProduceResult:
        """Validate and append one partition's batches (all or nothing).

        Every batch is checked (size, header, CRC32C) before any byte is
        written, so a bad batch in a request writes nothing for its partition.
        """
        partition_log = self.partition_log(
            self.ensure_topic(topic, auto_create=True).spec.name, partition
        )
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
        batches = list(records.iter_batches(buf, config.max_message_bytes))
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
        info = partition_log.append(buf, batches)
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
    ) -> tuple[bytes, int, PartitionLog]:
        """Read whole batches from `offset`, at most `max_bytes` (but at least
        one batch), up to the high watermark. Returns (records, next_offset, log)."""
        partition_log = self.partition_log(topic, partition)
        self._leader_replication(topic, partition, write=False)
        result = partition_log.read(offset, max_bytes, self.high_watermark(partition_log))
        return result.records, result.next_offset, partition_log

    def high_watermark(self, partition_log: PartitionLog) -> int:
        """What consumers may read up to: the smallest log end offset of the
        in-sync replicas (replicated partitions), else the log end."""
        replication = self._replication.get((partition_log.topic, partition_log.partition))
        if replication is None:
            return partition_log.log_end_offset
        return min(replication.high_watermark, partition_log.log_end_offset)

    async def wait_for_append(
        self, partitions: Iterable[TopicPartitionKey], timeout_s: float
    ) -> None:
        """Return when any of `partitions` gets new data, or after timeout_s."""
        keys = list(partitions)
        waiter = self.register_append_waiter(keys)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            self.discard_append_waiter(keys, waiter)

    def register_append_waiter(self, keys: list[TopicPartitionKey]) -> asyncio.Future[None]:
        """A future resolved by the next append to any of `keys`.

        Registered at once, with no await: a caller that has just found
        nothing to read and registers in the same step cannot miss an append
        in between (a wake-up lost that way stalls a consumer at the tail).
        Pair with `discard_append_waiter`.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._append_waiters.setdefault(key, set()).add(waiter)
        return waiter

    def discard_append_waiter(
        self, keys: list[TopicPartitionKey], waiter: asyncio.Future[None]
    ) -> None:
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
                for partition_log in topic.logs:
                    try:
                        partition_log.maybe_flush(now_ms)
                    except TidelogError:
                        flood.exception("flush of %s failed", partition_log.name)

    async def run_retention(self) -> None:
        """Apply retention.ms and retention.bytes every log.retention.check.interval.ms."""
        interval_s = self._config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.apply_retention()

    async def apply_retention(self) -> int:
        """One retention pass over every log; returns the files unlinked.

        Segments leave their logs on the loop (a rename each); the unlinks,
        which can take milliseconds per large file, run in a worker thread.
        """
        doomed: list[Path] = []
        for topic in list(self._topics.values()):
            for partition_log in topic.logs:
                try:
                    doomed.extend(partition_log.delete_old_segments())
                except TidelogError:
                    flood.exception("retention of %s failed", partition_log.name)
        if not doomed:
            return 0
        return await asyncio.to_thread(unlink_files, doomed)

    async def run_cleaner(self) -> None:
        """Compact logs whose cleanup.policy has compact, every log.cleaner.backoff.ms."""
        interval_s = self._config.cleaner_backoff_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.clean_logs()

    async def clean_logs(self, force: bool = False) -> list[log_cleaner.CleanResult]:
        """One cleaning round over every compacted log that is dirty enough
        (any dirt at all with `force`). Logs are cleaned one at a time, in a
        worker thread; the swap happens here, on the loop."""
        max_entries = max(
            1, self._config.cleaner_dedupe_buffer_bytes // log_cleaner.MAP_ENTRY_BYTES
        )
        results: list[log_cleaner.CleanResult] = []
        for topic in list(self._topics.values()):
            for partition_log in topic.logs:
                plan = partition_log.plan_cleaning(max_entries, force)
                if plan is None:
                    continue
                result: log_cleaner.CleanResult | None = None
                try:
                    result = await asyncio.to_thread(log_cleaner.clean, plan, self._cleaner_cancel)
                except (log_cleaner.CleanerCancelledError, log_cleaner.StaleSnapshotError) as exc:
                    log.info("cleaning %s stopped: %s", partition_log.name, exc)
                except Exception:
                    flood.exception("cleaning %s failed", partition_log.name)
                try:
                    doomed = partition_log.finish_cleaning(result)
                except TidelogError:
                    flood.exception("swapping cleaned segments into %s failed", partition_log.name)
                    continue
                if result is not None:
                    results.append(result)
                if doomed:
                    await asyncio.to_thread(unlink_files, doomed)
        return results

    # ------------------------------------------------------------ configs

    def describe_configs(self, name: str) -> list[ConfigValue]:
        """Every topic config of `name`: effective value and its source."""
        topic = self.topic(name)
        effective = config_to_strings(topic.config)
        broker = config_to_strings(self._config.log_defaults)
        builtin = config_to_strings(LogConfig())
        out = []
        for key in sorted(effective):
            if key in topic.spec.configs:
                source = "topic"
            elif broker[key] != builtin[key]:
                source = "broker"
            else:
                source = "default"
            out.append(ConfigValue(key, effective[key], source))
        return out

    def alter_configs(
        self,
        name: str,
        set_configs: dict[str, str],
        delete_configs: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set and remove overrides of one topic; every log applies the new
        config from its next operation on (no restart). Raises
        InvalidConfigError naming the key for an unknown key or a bad value."""
        topic = self.topic(name)
        overrides = dict(topic.spec.configs)
        overrides.update(validate_topic_configs(set_configs))
        for key in delete_configs:
            if key not in TOPIC_CONFIGS:
                known = ", ".join(sorted(TOPIC_CONFIGS))
                raise InvalidConfigError(f"unknown topic config {key!r}; known keys: {known}")
            overrides.pop(key, None)
        config = parse_topic_configs(overrides, self._config.log_defaults)
        check_replication(parse_topic_configs(overrides), 1, name)  # the one replica
        if validate_only:
            return
        topic.spec = dataclasses.replace(topic.spec, configs=overrides)
        topic.config = config
        for partition_log in topic.logs:
            partition_log.update_config(config)
        self._save_specs()
        log.info("altered configs of topic %s: %s", name, overrides)
