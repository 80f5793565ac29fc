"""The broker's logs: the topics it hosts, their partition logs' lifecycle,
their configs, and the background loops that maintain them (flush,
retention, the cleaner). Also who waits for appends (long-poll fetches,
acks=all): `wake` tells them.

The replica manager (roles, ISR, high watermark) and the request paths
(partition_manager: produce, fetch, offsets) build on it. It knows nothing
of gRPC nor of etcd: in cluster mode ClusterLink tells it which partitions to
host (`host_partitions`, `drop_topic`).

Concurrency: every method runs on the broker's one asyncio event loop, so no
locks guard its state. Appends and reads do their file I/O inline: they hit the
page cache and take microseconds, far less than a hop to a thread would cost.
Only long waits (long-poll fetches) are awaited, and the long kinds of
work are sent to worker threads (asyncio.to_thread) so that they never stall
produce or fetch: unlinking the files retention and compaction drop (renamed
`.deleted` on the loop first, which is cheap), removing the directories of
deleted topics (a deletion only closes the logs and renames their
directories `-delete` on the loop, which makes it durable and frees the name,
as does opening a log over a deleted incarnation's directory;
`delete_renamed_dirs` removes them, one sweep at a time: at once, in a task
the deletion or the open starts, then at start-up and after each retention
pass for what is left), the cleaner's rounds,
which work on a snapshot of plain data (the swap of cleaned segments into a
log then happens back on the loop), and, in cluster mode, opening the logs
of partitions newly hosted (`host_partitions_off_loop`: a log is opened in
a thread, then hosted on the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    NotLeaderOrFollowerError,
    StorageError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.names import validate_topic_name
from tidelog_server.log_flood import RateLimitedLog
from tidelog_server.topic_configs import TOPIC_CONFIGS, check_replication, validate_topic_configs

from tidelog_broker.config import BrokerConfig
from tidelog_broker.data_dir_lock import DataDirLock
from tidelog_broker.resources import open_file_limit, partition_capacity
from tidelog_broker.storage import (
    Clock,
    LogConfig,
    PartitionLog,
    UnopenedLog,
    config_to_strings,
    parse_topic_configs,
)
from tidelog_broker.storage import cleaner as log_cleaner
from tidelog_broker.storage.files import (
    is_renamed_for_deletion,
    log_dir_name,
    parse_log_dir_name,
    remove_renamed,
    rename_for_deletion,
)
from tidelog_broker.storage.log_loader import TailLoss
from tidelog_broker.storage.partition_log import unlink_files
from tidelog_broker.topic_store import TopicSpec, TopicStore

log = logging.getLogger("tidelog.broker")
# Errors that loops repeat (per partition, per pass) log once per interval.
flood = RateLimitedLog(log)

TopicPartitionKey = tuple[str, int]

#: Logs opened per worker-thread call when hosting new partitions: few hops
#: to a thread per topic, yet a broker that stops meanwhile leaves at most
#: ~0.2 s of opening behind it (closed when done, see `_in_thread`).
OPEN_SLICE = 64
#: At most this many new partitions of a topic are opened on the loop itself
#: (~1-3 ms each, within LoopSlices' 20 ms): a small topic is hosted in the
#: watch event's own turn, as before logs opened in threads, so requests that
#: follow its creation find it, rather than wait out a hop to a worker thread
#: (tens of ms on a loaded machine: clients that produced straight after
#: create_topics were refused).
INLINE_OPEN_MAX = 4
#: How long `close` waits, in all, for worker threads still at work it
#: tracks (`_ThreadWork`): sweeps removing a deleted log's directory (each
#: stops before its next one; a directory of thousands of segments takes
#: well under a second), cleaner rounds (each sees the cancel at its next
#: batch, milliseconds, and removes the `.cleaned` files it wrote), and
#: unlinks of the files retention, compaction and DeleteRecords dropped.
#: One deadline for all of them: a broker's stop waits this long at most,
#: not this long per kind. Past it each is left to finish (logged), racing
#: the open of a LogManager opened next on the same data directory
#: (tolerated: `remove_renamed`, and open skips a leftover that vanishes).
CLOSE_WAIT_S = 10.0
#: Out of descriptors (the process's, the system's) or memory.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


class _ThreadWork:
    """What worker threads are doing now that `LogManager.close` waits for
    (a directory being removed, a cleaner round, files being unlinked), so
    that a LogManager opened next on the same data directory (a restart in
    the same process) finds no thread still at it. `start` is checked
    against the close's `cancel` under the lock `wait_done` waits with:
    either close sees an item under way and waits for it, or the thread
    sees the cancel and starts nothing. An item may be under way more than
    once at a time (two unlinks in one log's directory): counted."""

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._done = threading.Condition()
        self._now: Counter[str] = Counter()

    def start(self, item: str) -> bool:
        """Record `item` as under way; False (nothing recorded) once closing."""
        with self._done:
            if self._cancel.is_set():
                return False
            self._now[item] += 1
            return True

    def finish(self, item: str) -> None:
        with self._done:
            self._now[item] -= 1
            if self._now[item] <= 0:
                del self._now[item]
            self._done.notify_all()

    def wait_done(self, timeout_s: float) -> list[str]:
        """Wait up to `timeout_s` (0: not at all) for every item to finish;
        those still under way then, sorted (empty: all done)."""
        with self._done:
            self._done.wait_for(lambda: not self._now, timeout_s)
            return sorted(self._now)


def _out_of_resources(exc: StorageError) -> bool:
    """Whether opening a log failed for want of descriptors or memory: the
    process's limits, not the directory's fault (see `_open_logs`)."""
    cause = exc.__cause__
    return isinstance(cause, OSError) and cause.errno in _RESOURCE_ERRNOS


def close_logs(logs: Iterable[PartitionLog]) -> None:
    """Close logs nobody will use (their errors are not worth more than the
    one being raised: a log not closed only gets recovered at the next open)."""
    for partition_log in logs:
        with contextlib.suppress(TidelogError):
            partition_log.close()


#: At most this many partitions are named in the line that logs the closes
#: that failed in one batch (a failing disk may fail thousands at once).
_NAMED_FAILURES_MAX = 20


def _tail_note(logs: Iterable[PartitionLog]) -> str:
    """What a hosting's log line adds about the newly opened `logs` that
    may have lost their tail (`PartitionLog.may_have_lost_tail`), counted by
    why: one clause per hosting, not a line per log ("" when none did). A
    broker that was killed has every log so, maybe thousands; the damaged
    ones were each logged by recovery already."""
    causes = Counter(
        partition_log.may_have_lost_tail
        for partition_log in logs
        if partition_log.may_have_lost_tail and partition_log.offline is None
    )
    if not causes:
        return ""
    why = ", ".join(f"{count} {cause.value}" for cause, count in causes.items())
    return (
        f"; {sum(causes.values())} may have lost their tail ({why}): listed as torn, not "
        "elected while another in-sync replica may return, until they catch up or lead"
    )


def _log_failed_closes(failed: Mapping[TopicPartitionKey, Exception], consequence: str) -> None:
    """Log, in one line, the closes of a batch that raised, naming their
    partitions, with `consequence` (what becomes of them) and the first
    error (its traceback too, if it is not a TidelogError: a bug)."""
    if not failed:
        return
    names = [f"{topic}-{partition}" for topic, partition in failed]
    more = len(names) - _NAMED_FAILURES_MAX
    shown = ", ".join(names[:_NAMED_FAILURES_MAX]) + (f" and {more} more" if more > 0 else "")
    first = next(iter(failed.values()))
    log.error(
        "closing the logs of %s failed (%s): %s",
        shown,
        consequence,
        first,
        exc_info=None if isinstance(first, TidelogError) else first,
    )


def _raise_first(failed: Mapping[TopicPartitionKey, Exception], consequence: str) -> None:
    """`_log_failed_closes`, then raise the first error, if any."""
    _log_failed_closes(failed, consequence)
    if failed:
        raise next(iter(failed.values()))


async def _in_thread(fn: Callable[..., list[PartitionLog]], *args: Any) -> list[PartitionLog]:
    """`fn(*args)` in a worker thread. If the caller is cancelled meanwhile,
    the logs `fn` opens are closed when it returns (a cancelled
    asyncio.to_thread would drop them, their descriptors open for good)."""
    future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_opened)
        raise


def _close_opened(future: asyncio.Future[list[PartitionLog]]) -> None:
    if not future.cancelled() and future.exception() is None:
        close_logs(future.result())


@dataclass(frozen=True)
class _Opening:
    """Partitions of a topic whose logs are being opened to be hosted."""

    #: The topic's partition count, as the hosting call was given it.
    count: int
    partitions: frozenset[int]


@dataclass(frozen=True)
class ConfigValue:
    """One topic config as DescribeConfigs reports it."""

    name: str
    value: str
    #: "topic" (an override), "broker" (the broker's config file) or "default".
    source: str


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


class LogManager:
    """Hosts partition logs: topics, lifecycle, configs, background loops."""

    def __init__(self, config: BrokerConfig, clock: Clock, *, cluster_mode: bool) -> None:
        self._config = config
        self._clock = clock
        # Cluster mode: topics come from etcd through the cluster-mode hooks
        # below (ClusterLink), not from topics.json, and are never auto-created.
        self._cluster_mode = cluster_mode
        self._store = TopicStore(config.data_dir)
        #: Held from `open` to `close` (data_dir_lock.py).
        self._dir_lock = DataDirLock(config.data_dir)
        self._topics: dict[str, Topic] = {}
        # Cluster mode: of each topic, the partitions whose logs
        # `host_partitions_off_loop` is opening (in worker threads): known,
        # soon served, so requests for them get NOT_LEADER_OR_FOLLOWER (retry)
        # rather than UNKNOWN_TOPIC_OR_PARTITION, also before the topic's
        # first partition is hosted (a new topic, a restart's listing).
        self._opening: dict[str, _Opening] = {}
        #: Cluster mode: the partition count of a topic the cluster has (its
        #: etcd view), None for one it has not: a topic known there but not
        #: hosted here yet (its turn in a listing not come) is not "unknown"
        #: either. Set by ClusterLink; read only on a lookup's miss.
        self.cluster_partition_count: Callable[[str], int | None] = lambda _name: None
        # Futures of long-polling fetches, woken when their partitions grow.
        self._append_waiters: dict[TopicPartitionKey, set[asyncio.Future[None]]] = {}
        # Callbacks called on every wake of their partitions, registered once
        # for as long as they care (consumer fetch sessions: `watch`).
        self._watchers: dict[TopicPartitionKey, set[Callable[[TopicPartitionKey], None]]] = {}
        # Set at close: a cleaner round in a worker thread stops at its next batch.
        self._cleaner_cancel = threading.Event()
        # The logs (by name) whose cleaner rounds worker threads are running
        # now, which close waits for. A round cancelled at close still
        # removes the `.cleaned` files it wrote; a LogManager opened next on
        # this data directory removes them too, at open, and the two raced:
        # its open failed on a file the other unlinked first, and hosted the
        # log offline.
        self._cleaning = _ThreadWork(self._cleaner_cancel)
        # The guards of the logs a cleaner round runs on now (on the loop):
        # a log's close or deletion revokes its round's (`_stop_hosting`),
        # which then stops at its next batch and touches nothing by path in
        # the log's directory any more. Before, the round went on with the
        # paths of a directory renamed aside: it failed at its next group
        # (a 'cleaning ... failed' ERROR, FileNotFoundError), or, the topic
        # re-created meanwhile, read the new incarnation's segments as its
        # own and wrote its `.cleaned` files among them.
        self._cleaning_guards: dict[PartitionLog, log_cleaner.DirectoryGuard] = {}
        # One sweep of directories renamed for deletion at a time (the one
        # at start-up may still be removing gigabytes when a retention pass
        # sweeps): the next lists only what the last one left.
        self._sweeping = asyncio.Lock()
        # Set at close: a sweep in a worker thread stops at its next directory.
        self._sweep_cancel = threading.Event()
        # The directories sweeps' worker threads are removing now, which
        # close waits for: else they raced the start-up sweep of a
        # LogManager opened next on this data directory.
        self._removing = _ThreadWork(self._sweep_cancel)
        # Set at close: an unlink of dropped files in a worker thread
        # (`unlink_dropped`) stops before its next file.
        self._unlink_cancel = threading.Event()
        # The logs (by directory name) whose dropped files worker threads
        # are unlinking now, which close waits for: else they raced the open
        # of a LogManager opened next on this data directory, which removes
        # the same `.deleted` leftovers.
        self._unlinking = _ThreadWork(self._unlink_cancel)
        # The sweep a deletion starts (`_sweep_soon`), while it runs; and
        # whether a deletion renamed more aside since it last listed.
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_wanted = False
        #: Called when a hosted partition's log closes or goes (cluster mode):
        #: the replica manager forgets its state. Set by ReplicaManager.
        self.on_partition_closed: Callable[[str, int], None] = lambda _topic, _partition: None
        #: Called when the set of offline logs (`offline_partitions`) may
        #: have changed: a log went offline (maybe on a worker thread), or
        #: an offline one closed. The ClusterLink publishes the set in the
        #: broker's registration, so the controller neither elects these
        #: replicas nor keeps them in the ISR.
        self.on_offline_changed: Callable[[], None] = lambda: None
        #: The open-file limit and the partition replicas it allows
        #: (resources.py); both go into the etcd registration.
        self.open_file_limit = open_file_limit()
        self.partition_capacity = partition_capacity(self.open_file_limit, config.max_partitions)

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Take the data directory's lock (DataDirLockedError: another
        process holds it), then open every topic's logs, running recovery
        where needed. If it raises (out of descriptors or memory), every log
        it opened is closed first, and the lock let go."""
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        # Before any file in it is read or written: two brokers on one data
        # directory would tear each other's logs.
        self._dir_lock.acquire()
        if self._cluster_mode:
            return
        try:
            for spec in self._store.load().values():
                # A log that fails to open is hosted offline (`_open_logs`):
                # the broker starts and serves the rest, as Kafka does.
                self._topics[spec.name] = self._open_topic(spec)
        except BaseException:
            # Out of descriptors or memory, say (`_open_logs` closed the
            # failing topic's logs): the topics opened before it are closed
            # too, clean-shutdown markers and all, not left holding their
            # descriptors with nobody to close them (a broker exits then,
            # but an embedding such as a test or a retry goes on); a close
            # that fails is logged, the open's error is the one raised.
            _log_failed_closes(self._close_topics(), "their next open recovers them")
            self._dir_lock.release()
            raise
        for topic in self._topics.values():
            for partition_log in topic.logs:
                # Standalone, each log is its partition's only replica:
                # nobody elects it or another, so what a crash may have cut
                # matters to no election (only the cluster's registration
                # reads it), and its next close marks it clean again.
                partition_log.may_have_lost_tail = None
        offline = self.offline_partitions()
        log.info(
            "opened %d topics, %d partitions in %s%s",
            len(self._topics),
            sum(len(t.logs) for t in self._topics.values()),
            self._config.data_dir,
            f"; offline (cannot be opened): {[f'{t}-{p}' for t, p in offline]}" if offline else "",
        )

    def close(self) -> None:
        """Flush and close every log (a clean shutdown: next start skips
        recovery). A close that fails (logged, naming its partition) stops
        none of the others; the first error is raised once all are closed.
        Worker threads still at work in the data directory (a sweep removing
        a deleted log's directory, a cleaner round, unlinks of dropped
        files) are waited for, CLOSE_WAIT_S in all (`_wait_for_threads`),
        not left racing the next LogManager opened on this data directory."""
        self._cleaner_cancel.set()
        self._sweep_cancel.set()
        self._unlink_cancel.set()
        if self._sweeper is not None:
            # Its thread stops at its next directory (`_sweep_cancel`; the
            # one it is at is waited for below); what it leaves, the next
            # start's sweep removes.
            self._sweeper.cancel()
            self._sweeper = None
        failed = self._close_topics()
        for waiters in self._append_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
        # After the logs: their flushes overlap the threads' last steps.
        self._wait_for_threads()
        # Last: nothing of this manager writes in the directory any more.
        self._dir_lock.release()
        _raise_first(failed, "their next open recovers them")

    def _close_topics(self) -> dict[TopicPartitionKey, Exception]:
        """Close every log of every topic and forget the topics; returns
        the closes that raised, by partition."""
        # Every log, whatever one raises: a log left unclosed gets no
        # clean-shutdown marker, so the next start would recover it too.
        failed: dict[TopicPartitionKey, Exception] = {}
        for name, topic in self._topics.items():
            for partition_log in topic.logs:
                try:
                    partition_log.close()
                except Exception as exc:
                    failed[(name, partition_log.partition)] = exc
        self._topics.clear()
        return failed

    def _wait_for_threads(self) -> None:
        """Wait for the worker threads close tracks, CLOSE_WAIT_S in all:
        one deadline, each kind waited for with what is left of it (none:
        only checked), and each kind still under way then logged, with the
        wait it had. Every cancel is set, so each thread stops at its next
        step and none starts. Blocks the loop: only at close."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        for work, what, leaves in (
            (
                self._removing,
                "the removal of %s (a deleted log's directory)",
                "the next start's sweep removes what it leaves",
            ),
            (
                self._cleaning,
                "the cleaner's round of %s",
                "the next start removes the .cleaned files it leaves",
            ),
            (
                self._unlinking,
                "unlinking the files dropped from %s (by retention, compaction or DeleteRecords)",
                "the next start removes the .deleted files it leaves",
            ),
        ):
            budget_s = max(0.0, deadline - time.monotonic())
            still = ", ".join(work.wait_done(budget_s))
            if still:
                log.warning(
                    "closing: %s is still under way after a wait of %.1f s (close waits %g s in "
                    "all for worker threads); left to finish in its worker thread (%s)",
                    what % still,
                    budget_s,
                    CLOSE_WAIT_S,
                    leaves,
                )

    def _open_topic(
        self,
        spec: TopicSpec,
        partitions: Iterable[int] | None = None,
        opened: dict[int, PartitionLog] | None = None,
        all_or_none: bool = False,
    ) -> Topic:
        """Topic `spec` with the logs of `partitions` (None: every one):
        taken from `opened` (logs opened beforehand, off the loop; those
        taken are removed from it), the others opened here (`_open_logs`:
        one that fails to open is hosted offline, unless `all_or_none`)."""
        config = parse_topic_configs(spec.configs, self._config.log_defaults)
        wanted = range(spec.partitions) if partitions is None else sorted(partitions)
        ready = {} if opened is None else opened
        missing = [p for p in wanted if p not in ready]
        logs = self._open_logs(
            spec.name, config, missing, topic_id=spec.topic_id, all_or_none=all_or_none
        )
        logs.extend(ready.pop(p) for p in wanted if p in ready)
        logs.sort(key=lambda partition_log: partition_log.partition)
        return Topic(spec, config, logs)

    def _open_logs(
        self,
        name: str,
        config: LogConfig,
        partitions: list[int],
        *,
        leader_epochs: Mapping[int, int] | None = None,
        topic_id: str = "",
        all_or_none: bool = False,
        on_renamed_aside: Callable[[Path], None] | None = None,
    ) -> list[PartitionLog]:
        """Open (creating them if needed) the logs of `partitions` of topic
        `name`; record `leader_epochs` (partition -> the epoch this broker
        is to lead it in) at the ends of those that open. `topic_id`: the
        topic's incarnation (PartitionLog.open refuses, or renames aside, a
        directory left by a deleted one). A directory renamed aside is left
        to the sweep: `on_renamed_aside` is called, in this thread, for
        each; the default, `_renamed_aside`, starts the sweep at once, so
        it is only for the loop's thread (or no loop at all): a worker
        thread passes one that hands it to the loop (`_sweep_from`).

        A log that fails to open (StorageError: EIO, an unreadable
        checkpoint, a deleted incarnation's directory that cannot be renamed
        aside) is an `UnopenedLog` in the list, offline until a restart, and
        the others open: one bad directory must not keep a broker from
        starting or from hosting the topic's other partitions, nor go
        unreported (hosted offline, it is listed in `offline_partitions`,
        so the controller does not elect this broker for it), as Kafka
        starts and marks a log directory that fails at load offline. Only
        when out of descriptors or memory (no fault of the directory, and
        gone once some are freed) does it raise, as with `all_or_none` for
        any failure (standalone CreateTopics: the client gets the error and
        nothing is created); either way the logs opened so far are closed.
        Thread-safe: each log is new and nobody else's yet
        (`host_partitions_off_loop` runs it in a worker thread)."""
        renamed_aside = self._renamed_aside if on_renamed_aside is None else on_renamed_aside
        logs: list[PartitionLog] = []
        try:
            for p in partitions:
                directory = self._config.data_dir / log_dir_name(name, p)
                try:
                    partition_log = PartitionLog.open(
                        directory, name, p, config, self._clock, topic_id, renamed_aside
                    )
                except StorageError as exc:
                    if all_or_none or _out_of_resources(exc):
                        raise
                    log.error(
                        "the log of %s-%d cannot be opened: %s; it is offline (listed so to "
                        "the controller) until the broker restarts, the topic's other "
                        "partitions are hosted",
                        name,
                        p,
                        exc,
                    )
                    logs.append(UnopenedLog(directory, name, p, config, self._clock, exc))
                    continue
                logs.append(partition_log)
                partition_log.on_offline = self._offline_changed
                if leader_epochs and p in leader_epochs:
                    partition_log.leader_epochs.assign(
                        leader_epochs[p], partition_log.log_end_offset
                    )
        except BaseException:
            # Out of descriptors, say: the logs opened so far must not keep
            # theirs (nobody would close them).
            close_logs(logs)
            raise
        return logs

    def _renamed_aside(self, _renamed: Path) -> None:
        """A log opening on the loop (or with no loop) renamed a deleted
        incarnation's directory aside: removed by the sweep, off the loop.
        (The task starts once the loop is back, after the opening.)"""
        self._sweep_soon()

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
        """The log of a partition hosted here (the lookup of every request
        path: produce, fetch, list offsets, replica fetch), else the error
        saying why not (`_not_served`). A log taken offline by a storage
        failure (`PartitionLog.offline`) is StorageError for every path, as
        Kafka's offline replicas answer KAFKA_STORAGE_ERROR: its offsets are
        not to be served nor fetched from, until a restart opens it again."""
        partition_log = self.hosted_log(topic, partition)
        error = self.offline_error(partition_log)
        if error is not None:
            raise error
        return partition_log

    def offline_error(self, partition_log: PartitionLog) -> StorageError | None:
        """What every path answers for `partition_log` while it is offline
        (naming it, this broker and why), or None while it serves."""
        if partition_log.offline is None:
            return None
        return StorageError(
            f"the log of {partition_log.name} on broker {self._config.broker_id} is offline "
            f"({partition_log.offline}): restart the broker to open it again"
        )

    def hosted_log(self, topic: str, partition: int) -> PartitionLog:
        """The log of a partition hosted here, offline or not (for what
        only records the partition's state, such as a follower's role),
        else the error saying why not (`_not_served`)."""
        validate_topic_name(topic)
        hosted = self._topics.get(topic)
        # Only partitions in range are ever hosted: the checks are the miss's.
        partition_log = None if hosted is None else hosted.hosted.get(partition)
        if partition_log is None:
            raise self._not_served(topic, partition)
        return partition_log

    def _not_served(self, name: str, partition: int) -> TidelogError:
        """Why `partition` of topic `name` has no log here (a lookup's miss):
        no such topic or partition, UNKNOWN_TOPIC_OR_PARTITION; else one that
        exists but is not served here, NOT_LEADER_OR_FOLLOWER (retriable:
        clients refresh metadata and retry after their backoff), saying
        whether its log is still being opened. Exists: hosted here, being
        opened, or (cluster mode) in the cluster's metadata."""
        topic = self._topics.get(name)
        opening = self._opening.get(name)
        # The largest count any of them knows: partitions being added exist
        # before the topic here has them.
        counts = [
            count
            for count in (
                topic.spec.partitions if topic is not None else None,
                opening.count if opening is not None else None,
                self.cluster_partition_count(name),
            )
            if count is not None
        ]
        if not counts:
            return UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        count = max(counts)
        if not 0 <= partition < count:
            return UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0 to {count - 1}; {partition} does not exist"
            )
        if opening is not None and partition in opening.partitions:
            return NotLeaderOrFollowerError(
                f"broker {self._config.broker_id} is still opening the log of "
                f"{name}-{partition}: retry shortly"
            )
        return NotLeaderOrFollowerError(
            f"broker {self._config.broker_id} does not lead {name}-{partition} "
            "(or has not opened its log yet): refresh metadata and ask its leader"
        )

    def opening_partitions(self, name: str) -> list[int]:
        """Cluster mode: the partitions of topic `name` whose logs are being
        opened to be hosted here (not served yet)."""
        opening = self._opening.get(name)
        return [] if opening is None else sorted(opening.partitions)

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
        # An id per incarnation, recorded in its logs' directories: a topic
        # created again under this name never opens a directory left by this
        # one (a deletion that could not remove it, see delete_topic).
        spec = TopicSpec(name, partitions, configs, uuid.uuid4().hex)
        # All or none: a log that cannot be created fails the request (the
        # client learns it now) rather than create a topic born offline.
        topic = self._open_topic(spec, all_or_none=True)
        self._topics[name] = topic
        self._save_specs()
        log.info("created topic %s with %d partitions", name, partitions)
        return topic

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data: its logs are closed and their
        directories renamed aside here, their files removed soon after in a
        worker thread (`_sweep_soon`)."""
        topic = self.topic(name)
        del self._topics[name]
        self._save_specs()
        closing = [(partition_log.partition, partition_log) for partition_log in topic.logs]
        failed = self._stop_hosting(name, closing, delete_data=True)
        self._sweep_soon()
        log.info("deleted topic %s", name)
        # Only the unexpected (`_delete_log` logs and swallows StorageError).
        _raise_first(failed, "no longer hosted here; their directories may stay")

    def _delete_log(self, partition_log: PartitionLog) -> None:
        """Delete a log whose topic was deleted, offline or not: close it and
        rename its directory aside (quick, and durable: the name is free for
        a new incarnation at once); the caller then has `_sweep_soon` remove
        it. Never raises: the deletion of a topic goes on with its other
        logs. A directory that cannot even be renamed stays under its name,
        where its topic id keeps a new incarnation of the topic from opening
        it."""
        try:
            partition_log.close_for_deletion()
        except StorageError as exc:
            flood.error(
                "%s; a topic created again under the name will not open it (its topic id "
                "differs) until it can be removed",
                exc,
            )

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

    async def host_partitions_off_loop(
        self,
        spec: TopicSpec,
        partitions: Iterable[int],
        leader_epochs: Mapping[int, int] | None = None,
    ) -> None:
        """`host_partitions`, with the logs of the partitions not hosted yet
        opened in worker threads first, OPEN_SLICE at a time (up to
        INLINE_OPEN_MAX of them are opened on the loop, without a hop).

        Opening a log is ~1-3 ms of file-system work (opens, a mkdir, fsyncs),
        and a new leader's epoch history two more fsyncs (far more when the
        disk is busy): a broker given ~1,000 partitions of a new topic held
        its event loop for seconds and lost its etcd session. Here the loop
        only waits, and a partition is hosted (served, followed, given a
        role) only once its log is open; until then requests for it get
        NOT_LEADER_OR_FOLLOWER, "still opening" (`_not_served`), which clients
        retry, not UNKNOWN_TOPIC_OR_PARTITION. `leader_epochs`: of the new
        partitions, those this broker is about to lead, with their epoch,
        recorded in the epoch history in the thread too (set_role then finds
        it there). The caller must not change this topic's hosting while
        this runs (ClusterLink does it all under one lock); cancelled, it
        closes every log it opened, also one still opening in a thread."""
        wanted = set(partitions)
        topic = self._topics.get(spec.name)
        new = sorted(wanted - set(topic.hosted if topic is not None else ()))
        # Refused before any log is opened, as host_partitions would.
        self._check_capacity(len(new), f"topic {spec.name!r}")
        config = parse_topic_configs(spec.configs, self._config.log_defaults)
        opened: dict[int, PartitionLog] = {}
        # Requests meanwhile find them opening (`_not_served`), whatever ends
        # this call: hosted, failed, cancelled, or the topic deleted next.
        opening = self._opening[spec.name] = _Opening(spec.partitions, frozenset(new))
        try:
            # One topic's logs, whichever thread opens them.
            open_logs = functools.partial(
                self._open_logs,
                spec.name,
                config,
                leader_epochs=leader_epochs or {},
                topic_id=spec.topic_id,
            )
            if len(new) <= INLINE_OPEN_MAX:
                # On the loop's thread, without suspending: a directory
                # renamed aside starts the sweep itself (`_renamed_aside`).
                self._take(opened, open_logs(new))
            else:
                in_thread = functools.partial(
                    open_logs, on_renamed_aside=self._sweep_from(asyncio.get_running_loop())
                )
                for start in range(0, len(new), OPEN_SLICE):
                    self._take(opened, await _in_thread(in_thread, new[start : start + OPEN_SLICE]))
            self.host_partitions(spec, wanted, opened)
        finally:
            if self._opening.get(spec.name) is opening:
                del self._opening[spec.name]
            # Logs not taken up: hosting failed, or was cancelled.
            close_logs(opened.values())

    def _sweep_from(self, loop: asyncio.AbstractEventLoop) -> Callable[[Path], None]:
        """`_open_logs`' `on_renamed_aside` for a worker thread: `_sweep_soon`
        is the loop's, so the thread hands it over."""

        def renamed_aside(_renamed: Path) -> None:
            # The loop closed meanwhile: the next start's sweep removes it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._sweep_soon)

        return renamed_aside

    @staticmethod
    def _take(opened: dict[int, PartitionLog], logs: list[PartitionLog]) -> None:
        """Add newly opened `logs` to `opened` (closed by the caller if not hosted)."""
        for partition_log in logs:
            opened[partition_log.partition] = partition_log

    def host_partitions(
        self,
        spec: TopicSpec,
        partitions: Iterable[int],
        opened: dict[int, PartitionLog] | None = None,
    ) -> None:
        """Cluster mode: host exactly `partitions` of topic `spec` (open or
        create their logs; close, without deleting, the ones no longer
        listed) and apply `spec.configs` to every log (no restart). Idempotent,
        so replaying the same etcd state changes nothing. `opened`: logs of
        new partitions already opened (`host_partitions_off_loop`); the ones
        taken up are removed from it. A close that fails still leaves its
        partition unhosted and forgotten, as a clean close does
        (`_stop_hosting`); the others close too, then the first error is
        raised (logged, naming the partitions), before anything opens."""
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
            topic = self._topics[spec.name] = self._open_topic(spec, wanted, opened)
            if wanted:
                log.info(
                    "hosting %s partitions %s%s", spec.name, sorted(wanted), _tail_note(topic.logs)
                )
            self._hosted_offline(topic.logs)
            return
        if spec.configs != topic.spec.configs:
            topic.config = parse_topic_configs(spec.configs, self._config.log_defaults)
            for partition_log in topic.logs:
                partition_log.update_config(topic.config)
            log.info("configs of topic %s are now %s", spec.name, spec.configs)
        topic.spec = spec
        if wanted == set(topic.hosted):
            return
        removed = sorted(set(topic.hosted) - wanted)
        closing = [(partition, topic.hosted.pop(partition)) for partition in removed]
        topic.logs = [topic.hosted[p] for p in sorted(topic.hosted)]
        # A close that failed is the hosting's failure (the caller logs and
        # retries it), once every one is closed and forgotten.
        _raise_first(
            self._stop_hosting(spec.name, closing, delete_data=False),
            "no longer hosted here: their next open recovers them",
        )
        added = self._open_topic(spec, wanted - set(topic.hosted), opened)
        topic.hosted.update(added.hosted)
        topic.logs = [topic.hosted[p] for p in sorted(topic.hosted)]
        self._hosted_offline(added.logs)
        # What changed, not the whole list: a topic's partitions may arrive a
        # few at a time, and listing thousands each time wrote ~12 MB of log
        # per broker for one topic of 3,000 partitions.
        log.info(
            "hosting %d partitions of %s: opened %s, closed %s%s",
            len(wanted),
            spec.name,
            sorted(added.hosted),
            sorted(removed),
            _tail_note(added.logs),
        )

    def _hosted_offline(self, logs: Iterable[PartitionLog]) -> None:
        """Newly hosted `logs` include offline ones (`UnopenedLog`, which
        never go offline, so never call `on_offline`) or torn ones
        (`torn_partitions`): what the registration lists changed. Once per
        hosting of a topic, not per log: the hook only wakes the
        ClusterLink's publisher, which rewrites the registration once for
        every wake-up since its last write (a broker killed with thousands
        of logs has every one torn at its start)."""
        if any(
            partition_log.offline is not None or partition_log.may_have_lost_tail
            for partition_log in logs
        ):
            self.on_offline_changed()

    def hosted_partitions(self, name: str) -> list[int]:
        """Cluster mode: the partitions of topic `name` with an open log here."""
        topic = self._topics.get(name)
        return [] if topic is None else sorted(topic.hosted)

    def drop_topic(self, name: str, delete_data: bool) -> None:
        """Cluster mode: stop hosting a topic; with `delete_data`, remove its
        logs (the topic was deleted). Unknown names are ignored (idempotent)."""
        topic = self._topics.pop(name, None)
        if topic is None:
            return
        failed = self._stop_hosting(name, list(topic.hosted.items()), delete_data=delete_data)
        if delete_data:
            self._sweep_soon()
        log.info("%s topic %s", "deleted" if delete_data else "closed", name)
        _log_failed_closes(failed, "no longer hosted here: their next open recovers them")
        # A log whose close failed is no worse off than one of a broker that
        # crashed (its next open recovers it): only the unexpected is raised
        # (`_delete_log` itself logs and swallows StorageError).
        unexpected = [exc for exc in failed.values() if not isinstance(exc, StorageError)]
        if unexpected:
            raise unexpected[0]

    def _stop_hosting(
        self, name: str, closing: list[tuple[int, PartitionLog]], *, delete_data: bool
    ) -> dict[TopicPartitionKey, Exception]:
        """Close the logs `closing` ((partition, log) pairs) of topic `name`,
        which the caller has taken out of its hosted set; with `delete_data`,
        delete them (`_delete_log`). Every one, whatever a close raises, and
        each left as a clean close leaves it: its role and what hangs on it
        forgotten (`on_partition_closed`: the replica manager drops its
        replication state, so nothing serves it as leader nor checks its
        ISR; the ClusterLink fetches only hosted partitions), its readers
        woken (they find it gone), the offline set updated. Returns the
        closes that raised, by partition, for the caller to log and raise
        (`_raise_first`)."""
        failed: dict[TopicPartitionKey, Exception] = {}
        offline = False
        for partition, partition_log in closing:
            guard = self._cleaning_guards.get(partition_log)
            if guard is not None:
                # Before the directory is renamed aside (or opened again).
                guard.revoke()
            try:
                if delete_data:
                    self._delete_log(partition_log)
                else:
                    partition_log.close()
            except Exception as exc:
                failed[(name, partition)] = exc
            finally:
                # Also when it raised: closed or not, it is no longer
                # hosted, and a role left behind would outlive it for good
                # (nothing applies roles to partitions not hosted).
                offline |= partition_log.offline is not None
                self.on_partition_closed(name, partition)
                self.wake((name, partition))
        if offline:
            self.on_offline_changed()
        return failed

    def offline_partitions(self) -> list[TopicPartitionKey]:
        """The hosted partitions whose log a storage failure took offline
        (`PartitionLog.offline`), sorted."""
        return sorted(
            (name, partition)
            for name, topic in self._topics.items()
            for partition, partition_log in topic.hosted.items()
            if partition_log.offline is not None
        )

    def torn_partitions(self) -> list[TopicPartitionKey]:
        """The hosted partitions whose log may have lost its tail when it
        was opened (`PartitionLog.may_have_lost_tail`: the broker was not
        shut down cleanly, or recovery cut damage) and has neither caught
        up with a leader nor been elected leader since, in `torn_figures`'
        order. "Torn" is the registration's word (`torn_partitions`, kept
        for compatibility): it lists them, and the controller elects none
        of them while another ISR member may return, since records this
        replica had acknowledged as an ISR member may be gone (a leader and
        a torn follower killed together: electing the follower, the first
        back, lost every record above its cut)."""
        return [(name, partition) for name, partition, _, _ in self.torn_figures()]

    def torn_figures(self) -> list[tuple[str, int, int, int]]:
        """`torn_partitions`, each with what its log holds now: (topic,
        partition, last epoch, log end offset), the newest epoch of its epoch
        history (-1 without one) and the offset after its last record. The
        registration publishes them so that, when every ISR member that may
        return is torn, the controller elects the one that holds the most
        (tidelog_server.election_rule.most_complete), not the first.

        Logs whose recovery found a loss (damage, a recovery point past the
        end) come first, then those only not closed cleanly, each group
        sorted: the registration lists the first MAX_OFFLINE_REPORTED
        (cluster_link), so on a killed broker with more logs than that the
        ones surely cut are the ones listed."""
        torn = [
            (
                partition_log.may_have_lost_tail is TailLoss.UNCLEAN_SHUTDOWN,
                name,
                partition,
                partition_log.leader_epochs.latest_epoch,
                partition_log.log_end_offset,
            )
            for name, topic in self._topics.items()
            for partition, partition_log in topic.hosted.items()
            if partition_log.may_have_lost_tail and partition_log.offline is None
        ]
        torn.sort()
        return [(name, partition, epoch, end) for _, name, partition, epoch, end in torn]

    def is_torn(self, topic: str, partition: int) -> bool:
        """Whether the hosted log of `topic`-`partition` is among
        `torn_partitions` (False when it is not hosted)."""
        hosted = self._topics.get(topic)
        partition_log = None if hosted is None else hosted.hosted.get(partition)
        return (
            partition_log is not None
            and partition_log.may_have_lost_tail is not None
            and partition_log.offline is None
        )

    def caught_up(self, partition_log: PartitionLog, offset: int) -> None:
        """A torn follower's log reached `offset`: its leader's high
        watermark while it holds records of the leader's epoch, or the
        leader's log end as of an answer it applied whole
        (ReplicaManager.append_replicated): whatever it lost is back, so it
        is no longer torn."""
        if partition_log.may_have_lost_tail and partition_log.log_end_offset >= offset:
            log.info(
                "%s: caught up with its leader (offset %d) after it may have lost its tail "
                "(%s): electable again",
                partition_log.name,
                offset,
                partition_log.may_have_lost_tail.value,
            )
            partition_log.may_have_lost_tail = None
            self.on_offline_changed()

    def elected_leader(self, partition_log: PartitionLog) -> None:
        """This broker leads `partition_log`'s partition in a new epoch: a
        torn log is not torn any more. Safe: the controller chose this
        replica knowing it was torn (its registration listed it before the
        state naming it was written: ReplicaManager applies leadership only
        of states newer than this broker's registration, which lists its
        torn logs from the first write that lets it be elected), because
        no other ISR member could hold more (all back and torn, the most
        complete leads) or by an unclean election. Its log is the
        partition's reference from now on: the others truncate to it, and
        what it acknowledges from here is on the ISR as for any leader. Kept
        listed, it would stay unelectable for good after it next stepped
        down while another ISR member may return, and its broker's restart
        would leave it without the clean-shutdown marker."""
        if partition_log.may_have_lost_tail:
            log.info(
                "%s: elected leader after it may have lost its tail (%s): its log is the "
                "reference now, electable again",
                partition_log.name,
                partition_log.may_have_lost_tail.value,
            )
            partition_log.may_have_lost_tail = None
            self.on_offline_changed()

    def _offline_changed(self) -> None:
        # A method, not `on_offline_changed` itself: a log keeps what it was
        # given at open, and the ClusterLink sets the hook after logs opened.
        self.on_offline_changed()

    def local_topics(self) -> dict[str, list[int]]:
        """Cluster mode: topics with log directories on disk, open or not
        (to find logs of topics deleted while this broker was down)."""
        out: dict[str, list[int]] = {}
        for entry in self._config.data_dir.iterdir():
            if not entry.is_dir() or entry.name == "etcd" or is_renamed_for_deletion(entry.name):
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
        renamed = False
        for partition in partitions:
            if hosted is not None and partition in hosted.hosted:
                continue
            # Not open, so no file handles to close: rename the directory
            # aside (it leaves its name whole); the sweep removes it.
            directory = self._config.data_dir / log_dir_name(name, partition)
            try:
                rename_for_deletion(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                # Its topic id keeps a new incarnation of the topic from
                # opening it; the stray sweep at the next start tries again.
                flood.warning("cannot delete %s: %s", directory, exc)
                continue
            renamed = True
        if renamed:
            self._sweep_soon()
        log.info("deleted stray logs of topic %s", name)

    def renamed_for_deletion(self) -> list[Path]:
        """Partition directories renamed aside for deletion and not removed
        yet (a file in them could not be)."""
        try:
            entries = list(self._config.data_dir.iterdir())
        except OSError as exc:
            flood.warning("cannot list %s: %s", self._config.data_dir, exc)
            return []
        return sorted(entry for entry in entries if is_renamed_for_deletion(entry.name))

    async def delete_renamed_dirs(self) -> int:
        """Remove the directories renamed for deletion (in a worker thread:
        a big log takes long); returns how many went. One call at a time
        (`_sweeping`): a second waits, then lists what is left.

        Listed here, on the loop, so only directories already renamed when
        it lists are touched: a topic deletion renames on the loop, as does
        a log opening over a deleted incarnation's directory (on the loop
        or in a worker thread), then calls for a sweep (`_sweep_soon`)."""
        async with self._sweeping:
            doomed = self.renamed_for_deletion()
            if not doomed:
                return 0
            return await asyncio.to_thread(self._remove_renamed_dirs, doomed)

    def _sweep_soon(self) -> None:
        """Have the directories that deletions (or log opens, see
        `_open_logs`) renamed aside removed now, in a worker thread
        (`delete_renamed_dirs`), by a task of this manager: at most one,
        which sweeps again while more are renamed aside meanwhile, and which
        `close` cancels. One that cannot be removed stays for the retention
        checks' sweeps. Without a running loop (a tool, a synchronous test)
        there is none to keep responsive: the directories are removed here.
        Only on the loop's thread (or with no loop)."""
        if self._sweep_cancel.is_set():
            return  # closed: the next start's sweep removes them
        self._sweep_wanted = True
        if self._sweeper is not None and not self._sweeper.done():
            return  # it lists again before it ends
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._sweep_wanted = False
            self._remove_renamed_dirs(self.renamed_for_deletion())
            return
        self._sweeper = loop.create_task(self._sweep_deleted(), name="log-deletion-sweep")

    async def _sweep_deleted(self) -> None:
        try:
            while self._sweep_wanted:
                self._sweep_wanted = False
                try:
                    await self.delete_renamed_dirs()
                except Exception:
                    # Logged, not raised: nobody awaits this task. What is
                    # left, the retention checks' sweeps retry.
                    flood.exception("removing the directories of deleted topics failed")
        finally:
            if self._sweeper is asyncio.current_task():
                self._sweeper = None

    def _remove_renamed_dirs(self, doomed: list[Path]) -> int:
        removed = 0
        for path in doomed:
            if not self._removing.start(str(path)):
                break  # closing: the next start's sweep finishes the job
            try:
                removed += remove_renamed(path)
            finally:
                self._removing.finish(str(path))
        return removed

    # ------------------------------------------------------------ appends

    async def wait_for_append(
        self, partitions: Iterable[TopicPartitionKey], timeout_s: float
    ) -> None:
        """Return when any of `partitions` gets new data, or after timeout_s."""
        keys = list(partitions)
        waiter = self.register_append_waiter(keys)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
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

    def watch(
        self, keys: Iterable[TopicPartitionKey], callback: Callable[[TopicPartitionKey], None]
    ) -> None:
        """Call `callback(key)` on every wake of each of `keys` until
        `unwatch`: for a long-lived reader of many partitions, which would
        otherwise register a waiter on each of them for every wait. The
        callback runs inside `wake`: it must be quick and must not raise."""
        for key in keys:
            self._watchers.setdefault(key, set()).add(callback)

    def unwatch(
        self, keys: Iterable[TopicPartitionKey], callback: Callable[[TopicPartitionKey], None]
    ) -> None:
        for key in keys:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(callback)
                if not watchers:
                    del self._watchers[key]

    def wake(self, key: TopicPartitionKey) -> None:
        """Wake the long-polls, acks=all waits and watchers of `key`: called
        whenever a read of it may answer differently than before (new data,
        a high watermark move, a new role, a log start move, a truncation,
        the log closing). A missed call stalls a consumer at the tail."""
        waiters = self._append_waiters.pop(key, None)
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        watchers = self._watchers.get(key)
        if watchers:
            for callback in tuple(watchers):
                callback(key)

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
        """Apply retention.ms and retention.bytes every log.retention.check.interval.ms.

        First, at once, remove the directories of deleted topics that a
        previous run left (it stopped between their rename and removal, or
        could not remove them): their space is free shortly after start-up,
        not a retention interval later, as in Kafka."""
        interval_s = self._config.retention_check_interval_ms / 1000
        left = await self.delete_renamed_dirs()
        if left:
            log.info("removed %d directories of deleted topics left by a previous run", left)
        while True:
            await asyncio.sleep(interval_s)
            await self.apply_retention()
            # Logs of deleted topics that could not be removed at once.
            await self.delete_renamed_dirs()

    async def apply_retention(self) -> int:
        """One retention pass over every log; returns the files unlinked.

        Segments leave their logs on the loop (a rename each); the unlinks,
        which can take milliseconds per large file, run in a worker thread.
        """
        doomed: list[Path] = []
        for topic in list(self._topics.values()):
            for partition_log in topic.logs:
                try:
                    deleted = partition_log.delete_old_segments()
                except TidelogError:
                    flood.exception("retention of %s failed", partition_log.name)
                    continue
                if deleted:
                    doomed.extend(deleted)
                    # The log start moved: a position below it now reads
                    # OFFSET_OUT_OF_RANGE (fetch sessions skip idle partitions).
                    self.wake((partition_log.topic, partition_log.partition))
        if not doomed:
            return 0
        return await asyncio.to_thread(self.unlink_dropped, doomed)

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
                guard = self._cleaning_guards[partition_log] = log_cleaner.DirectoryGuard()
                try:
                    result = await asyncio.to_thread(self._clean_in_thread, plan, guard)
                except (log_cleaner.CleanerCancelledError, log_cleaner.StaleSnapshotError) as exc:
                    log.info("cleaning %s stopped: %s", partition_log.name, exc)
                except Exception:
                    flood.exception("cleaning %s failed", partition_log.name)
                finally:
                    del self._cleaning_guards[partition_log]
                try:
                    doomed = partition_log.finish_cleaning(result)
                except TidelogError:
                    flood.exception("swapping cleaned segments into %s failed", partition_log.name)
                    continue
                if result is not None:
                    results.append(result)
                if doomed:
                    await asyncio.to_thread(self.unlink_dropped, doomed)
        return results

    def unlink_dropped(self, paths: Sequence[Path]) -> int:
        """Unlink files dropped from logs, renamed `.deleted` (retention,
        a cleaner's swap, DeleteRecords), in the calling worker thread: the
        number removed. Known to close, which waits for it; it stops before
        its next file once closing, and unlinks nothing if close came
        first: the next open removes what it leaves."""
        item = ", ".join(sorted({path.parent.name for path in paths}))
        if not paths or not self._unlinking.start(item):
            return 0
        try:
            return unlink_files(paths, self._unlink_cancel)
        finally:
            self._unlinking.finish(item)

    def _clean_in_thread(
        self, plan: log_cleaner.CleanPlan, guard: log_cleaner.DirectoryGuard
    ) -> log_cleaner.CleanResult | None:
        """`cleaner.clean` in a worker thread, known to close while it runs;
        `guard` is revoked if its log closes or is deleted meanwhile."""
        if not self._cleaning.start(plan.name):
            raise log_cleaner.CleanerCancelledError("cancelled: the logs are closing")
        try:
            return log_cleaner.clean(plan, self._cleaner_cancel, guard)
        finally:
            self._cleaning.finish(plan.name)

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
