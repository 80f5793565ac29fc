"""The log of one partition: a directory of segments, offsets, the flush
policy and the recovery point, retention, truncation and reset, and the
compaction round's hand-over.

Its neighbours own the rest of the directory: file names are in `files.py`;
the small files beside the segments (recovery point, clean-shutdown marker,
log start offset, cleaner checkpoint, reset offset) in `checkpoints.py`;
opening, crash completion and recovery in `log_loader.py`; the crash-safe
swap of cleaned segments in `cleaning_swap.py`.

Retention (`delete_old_segments`, cleanup.policy with delete): whole closed
segments past retention.ms (their largest timestamp) or beyond retention.bytes
are dropped from the front, never the active one. They are renamed to
`.deleted` on the event loop (cheap) and unlinked by the caller in a worker
thread (`unlink_files`); open removes leftovers.

Truncation (`truncate_to`) cuts the log's end and is durable when it
returns. Reset (`reset_to`, Kafka's truncateFullyAndStartAt) drops every
record, the epoch history and the producer state, and restarts the log
empty at any offset, below, inside or above the old log. Its commit point
is the `reset-offset` file (`checkpoints`): written durably before
anything else changes, removed durably after everything else is on disk,
and finished by any open that finds it. So a crash anywhere in a reset
leaves the old log whole or an empty one at the new offset; never old
records under a new log start, nor old epochs or producers beside an
empty log.

Compaction (`plan_cleaning`, `cleaner.clean` in a worker thread,
`finish_cleaning`): the cleaner writes each group of cleaned segments as
fsynced `.cleaned` files, and `finish_cleaning` swaps them in, or discards
them if a segment they replace changed meanwhile.

The recovery point: every offset below it is fsynced, so after a crash
only the segments from it on are recovered (`log_loader`). The invariant kept
is that the recovery point on disk is never above the one in memory, and
that one never above what is fsynced: it rises only in `flush`, after the
fsyncs, and is then written without an fsync of its own (a lost raise only
costs recovery work, and appends gain no fsync); whatever lowers it
(`truncate_to`, `reset_to`, an open that finds the log ending below it)
writes it durably before returning, so before anything can be appended
above the new value. Otherwise a stale, higher file would vouch for batches
appended after a truncation, and a torn one among them would be served,
and open would not learn their epochs again. The epoch history rides on
the recovery point (the invariant of `leader_epoch`): `flush` writes it
durably before it raises the recovery point, and open learns the epochs of
the batches it recovers.

Every public method turns OSError into `tidelog.errors.StorageError`; this is
the one place where that happens.

A change of several steps that fails part-way (disk full, EIO) takes the
log offline (`offline`): a reset, a truncation, DeleteRecords, retention
once its first step (the log start, a rename) is done, the steps of a
cleaning swap after the epoch history, a flush, removing the new segment of
a roll whose append failed, and undoing an append (if that fails, the
segment holds bytes the log does not know of, and only an open recovers
it). Its segments, offsets, epoch history and producer state in memory are
then a mix of the old log and the new one, or differ from the files
(segments left on disk under their names, groups committed for the next
open to swap in), or, after a failed fsync, a later fsync could succeed
over lost pages and the recovery point vouch for them; so from then on
every read, append, flush, truncation and reset raises StorageError, the
background work (flush.ms, retention, cleaning) skips it, and `close`
writes nothing (no flush, no snapshot, no clean-shutdown marker). Only a
new open of the directory brings it back: it finishes a reset from the
`reset-offset` file (or finds the old log whole, if the failure came before
that file was written), and recovers a truncation as it does one cut short
by a crash. An append stays all or nothing, a roll included: the new
segment joins the log only with the batches in it. Kafka does the same
with a log directory that failed (LogDirFailureChannel: offline until the
broker restarts); no retry in the same process, because after a failed
fsync Linux may have dropped the dirty pages and a second fsync can
succeed with nothing written.
"""

from __future__ import annotations

import contextlib
import logging
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import OffsetOutOfRangeError, StorageError
from tidelog.records import BatchHeader, set_base_offset, set_log_append_time
from tidelog_server.atomic_files import fsync_directory
from tidelog_server.clock import SYSTEM_CLOCK, Clock

from tidelog_broker.storage import checkpoints, cleaning_swap, files, log_loader
from tidelog_broker.storage.cleaner import (
    CleanPlan,
    CleanResult,
    SegmentSnapshot,
)
from tidelog_broker.storage.config import LogConfig
from tidelog_broker.storage.files import rename_deleted, unlink_files
from tidelog_broker.storage.index import MAX_RELATIVE_OFFSET, OffsetIndex, TimeIndex
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_broker.storage.producer_state import ProducerStateManager
from tidelog_broker.storage.segment import AppendedBatch, LogSegment, close_all, read_headers

__all__ = ["AppendInfo", "PartitionLog", "ReadResult", "unlink_files"]

logger = logging.getLogger("tidelog.broker.storage")


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did."""

    first_offset: int
    last_offset: int
    #: Largest timestamp appended (the append time under LogAppendTime).
    max_timestamp: int
    #: The time stamped on the batches, or -1 under CreateTime.
    log_append_time_ms: int
    records_count: int
    size_bytes: int
    #: Idempotent producer retry: nothing was written; the offsets are those
    #: the batches got when first appended (producer_state.py).
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches read from a log, and where the next read starts."""

    #: A memoryview when the read went past the batches returned (no copy).
    records: bytes | memoryview
    #: Offset after the last record returned (the requested offset when empty).
    next_offset: int
    log_start_offset: int
    log_end_offset: int


@contextlib.contextmanager
def _storage_errors(what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise StorageError(f"{what} failed: {exc}") from exc


class PartitionLog:
    """The log of one partition, in its own directory.

    Offsets are assigned here, dense (compaction later leaves gaps below the
    clean offset); batches are stored and served as bytes, never decoded
    (except to answer `offset_for_timestamp`; the cleaner works on files).

    Not thread-safe: one asyncio event-loop thread calls it.
    """

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        segments: list[LogSegment],
        recovery_point: int,
        log_start_offset: int = 0,
        clean_offset: int = 0,
        gap_limit: int = 0,
        leader_epochs: LeaderEpochCache | None = None,
    ) -> None:
        """Use `PartitionLog.open` (`leader_epochs`: None, loaded from
        `directory`; `segments` is empty only for an `UnopenedLog`)."""
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self._config = config
        self._clock = clock
        self._segments = segments
        # Parallel to _segments, for bisect.
        self._base_offsets = [segment.base_offset for segment in segments]
        self._recovery_point = recovery_point
        self._unflushed_records = 0
        self._first_unflushed_monotonic_ms: int | None = None
        # Set when a segment file was created or deleted: the next flush
        # fsyncs the directory so the new name survives a crash.
        self._directory_dirty = False
        self._closed = False
        # Why the log refuses every read and write (see the module
        # docstring), or None.
        self._offline: str | None = None
        #: Why records this replica held, and may have acknowledged as an
        #: ISR member, may be missing since its open (it was not closed
        #: cleanly, or recovery cut damage: `LoadedLog.may_have_lost_tail`),
        #: until it caught up with a leader or was elected leader since;
        #: None: nothing is missing. While set it must not be elected when
        #: another ISR member may return (the broker's registration lists
        #: it as torn; see LogManager.torn_partitions), and `close` leaves
        #: no clean-shutdown marker, so the next open says so again.
        self.may_have_lost_tail: log_loader.TailLoss | None = None
        #: Called once when the log goes offline (on the thread that took
        #: it offline): the LogManager tells the cluster (the broker's
        #: registration lists its offline replicas for the controller).
        self.on_offline: Callable[[], None] = lambda: None
        self._log_start_offset = (
            max(log_start_offset, segments[0].base_offset) if segments else log_start_offset
        )
        self._clean_offset = clean_offset
        self._gap_limit = gap_limit
        # The segments (and their sizes) a cleaning round in flight was
        # planned on; finish_cleaning swaps only if they are all still there.
        self._cleaning: tuple[tuple[LogSegment, int], ...] | None = None
        #: Epoch history (replication): which leader epoch wrote which offsets.
        self.leader_epochs = (
            LeaderEpochCache.load(directory) if leader_epochs is None else leader_epochs
        )
        #: Idempotent producers' sequences (rebuilt by `open`). Followers call
        #: `producer_state.update(header, first_offset)` for each batch they append.
        self.producer_state = ProducerStateManager(directory)

    @property
    def name(self) -> str:
        return files.log_dir_name(self.topic, self.partition)

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock = SYSTEM_CLOCK,
        topic_id: str = "",
        on_renamed_aside: Callable[[Path], None] | None = None,
    ) -> PartitionLog:
        """Open the log in `directory` (the partition's own directory, see
        `files.log_dir`), creating it if needed, and recover what needs it.

        `topic_id`: the topic incarnation the log belongs to ("" when not
        known), recorded in the directory. A directory that records another
        id holds a deleted incarnation's log (a topic deleted and created
        again under the same name while its directory could not be
        removed): it is renamed aside for deletion (`<name>.<id>-delete`)
        and a new, empty log opened, never the old records served under the
        new topic. If it cannot be renamed, StorageError, and the directory
        stays untouched.

        The renamed directory is only renamed here, not removed: removing a
        log of many GB takes long, and this may run on the broker's event
        loop. `on_renamed_aside(renamed)` is called (in this thread) once
        it is renamed, also if the open then fails: the LogManager has its
        sweep remove it in a worker thread. Opened without one (a tool, a
        test), the renamed directory stays until a LogManager's sweep (the
        broker's next start, or its retention checks) removes it."""
        name = files.log_dir_name(topic, partition)
        if topic_id:
            with _storage_errors(f"reading the topic id of {name} in {directory}"):
                found = files.read_topic_id(directory)
            if found is not None and found != topic_id:
                renamed = cls._rename_stale(directory, name, found, topic_id)
                if renamed is not None and on_renamed_aside is not None:
                    on_renamed_aside(renamed)
        with _storage_errors(f"opening {name} in {directory}"):
            log = cls._open(directory, topic, partition, config, clock)
        if topic_id and found != topic_id:
            try:
                files.write_topic_id(directory, topic_id)
            except OSError as exc:
                with contextlib.suppress(StorageError):
                    log.close()
                raise StorageError(f"recording the topic id of {name} failed: {exc}") from exc
        return log

    @staticmethod
    def _rename_stale(directory: Path, name: str, found: str, topic_id: str) -> Path | None:
        """Rename aside for deletion the directory of a deleted incarnation;
        returns its new path (None if it was gone). Its removal is left to
        the LogManager's sweep (see `open`)."""
        try:
            doomed = files.rename_for_deletion(directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(
                f"{directory} holds the log of a deleted topic {name} (topic id {found}, not "
                f"{topic_id}) and cannot be renamed aside for deletion: {exc}; the partition "
                "is not opened until it can be (free or repair the disk, restart the broker)"
            ) from exc
        logger.warning(
            "%s held the log of a deleted incarnation of the topic (id %s, now %s): "
            "renamed to %s for deletion",
            directory,
            found,
            topic_id,
            doomed.name,
        )
        return doomed

    @classmethod
    def _open(
        cls, directory: Path, topic: str, partition: int, config: LogConfig, clock: Clock
    ) -> PartitionLog:
        loaded = log_loader.load(
            directory, files.log_dir_name(topic, partition), config, clock.time_ms()
        )
        try:
            return cls._finish_open(directory, topic, partition, config, clock, loaded)
        except BaseException:
            # Nobody else holds the segments `load` opened: their descriptors
            # would stay open for good (a log that fails to open is tried
            # again at every start). Nothing is written: the next open
            # recovers whatever state they are in.
            close_all(loaded.segments)
            raise

    @classmethod
    def _finish_open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        loaded: log_loader.LoadedLog,
    ) -> PartitionLog:
        """The log over the segments `load` kept, its epoch history and
        producer state brought in line with them."""
        log = cls(
            directory,
            topic,
            partition,
            config,
            clock,
            loaded.segments,
            loaded.recovery_point,
            loaded.log_start_offset,
            loaded.clean_offset,
            loaded.gap_limit,
        )
        log._directory_dirty = loaded.directory_dirty
        log.may_have_lost_tail = loaded.may_have_lost_tail
        if loaded.reset:
            # The rest of a reset cut short (`log_loader` did the segments),
            # durably, and then its commit point can go (see `reset_to`).
            log._forget_history()
            fsync_directory(directory)
            checkpoints.remove_reset_offset(directory)
        log._rebuild_epoch_history(loaded.recovered_from)
        log.producer_state.rebuild(log._segments, log.log_end_offset)
        log._release_inactive_descriptors()
        return log

    def _rebuild_epoch_history(self, recovered_from: int | None) -> None:
        """Bring the epoch history in line with the recovered log: recovery
        may have cut a torn tail (epochs past the end wrote nothing kept),
        and epochs assigned since the file was last written are learnt again
        from the batches recovery checked, which hold every batch at or
        above the recovery point on disk (see `leader_epoch`). An unreadable
        file is learnt again from every batch."""
        epochs = self.leader_epochs
        if epochs.unreadable:
            recovered_from = self._segments[0].base_offset
        headers = (
            header
            for segment in self._segments
            if recovered_from is not None and segment.next_offset > recovered_from
            for header in read_headers(segment.log_path, segment.size_bytes)
        )
        epochs.rebuild(headers, self.log_end_offset)

    # ------------------------------------------------------------------ state

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def offline(self) -> str | None:
        """Why this log refuses every read and write until the directory is
        opened again (a change failed part-way, or, for an `UnopenedLog`,
        the open itself), or None while it serves."""
        return self._offline

    @contextlib.contextmanager
    def _offline_on_failure(self, what: str) -> Iterator[None]:
        """Around a change that is not all or nothing (see the module
        docstring for which): an OSError part-way leaves part of the old log
        and part of the new one, so the log goes offline and StorageError is
        raised."""
        try:
            yield
        except OSError as exc:
            raise self._take_offline(what, exc) from exc

    def _take_offline(self, what: str, exc: OSError) -> StorageError:
        """Take the log offline (telling `on_offline` the first time);
        returns the error to raise."""
        first = self._offline is None
        self._offline = f"{what} failed part-way: {exc}"
        if first:
            self.on_offline()
        logger.error(
            "%s: %s failed part-way (%s): the log is offline until the broker restarts "
            "(opening it again recovers it)",
            self.name,
            what,
            exc,
        )
        return StorageError(
            f"{self.name}: {what} failed: {exc}; the log is offline until the broker restarts"
        )

    def _check_online(self) -> None:
        if self._offline is not None:
            raise StorageError(
                f"the log of {self.name} is offline ({self._offline}): it serves nothing "
                "until the broker restarts and opens it again"
            )

    def update_config(self, config: LogConfig) -> None:
        """Apply new settings from the next append on."""
        self._config = config

    @property
    def log_start_offset(self) -> int:
        """The first offset a read may ask for (retention moves it forward)."""
        return self._log_start_offset

    @property
    def clean_offset(self) -> int:
        """Below this offset the log is compacted (each key at most once)."""
        return self._clean_offset

    @property
    def log_bytes(self) -> int:
        """Bytes of the .log files (what retention.bytes limits)."""
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def log_end_offset(self) -> int:
        """The offset the next record will get."""
        return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        """Every offset below this is on disk (fsynced)."""
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        """Bytes of every segment file (logs and indexes)."""
        return sum(segment.disk_bytes for segment in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> Sequence[LogSegment]:
        """The segments in offset order (read-only view, for tests and tools)."""
        return tuple(self._segments)

    # ------------------------------------------------------------------ append

    def append(
        self,
        records: bytearray,
        batches: list[tuple[int, BatchHeader]],
        highest_epoch: Callable[[int], int] | None = None,
    ) -> AppendInfo:
        """Assign offsets to validated batches, stamp them, and append them.

        `batches` is what `tidelog.records.iter_batches(records)` returned; the
        base offsets (and under LogAppendTime the timestamps) are patched in
        `records` in place. `highest_epoch`: see ProducerStateManager.check.
        """
        self._check_online()
        if not batches:
            raise ValueError("append needs at least one batch")
        # Idempotent producers: rejected or repeated batches write nothing.
        duplicate = self.producer_state.check(batches, highest_epoch)
        if duplicate is not None:
            return AppendInfo(
                duplicate.first_offset, duplicate.last_offset, -1, -1, 0, 0, duplicate=True
            )
        append_time_ms = self._clock.time_ms() if self._config.log_append_time else -1
        first_offset = self.log_end_offset
        next_offset = first_offset
        max_timestamp = -1
        records_count = 0
        expected_position = 0
        placed: list[AppendedBatch] = []
        for position, header in batches:
            if position != expected_position:
                raise ValueError(f"batches do not tile records: a batch at {position}")
            expected_position = position + header.size
            set_base_offset(records, position, next_offset)
            if append_time_ms >= 0:
                set_log_append_time(records, position, append_time_ms)
                batch_timestamp = append_time_ms
            else:
                batch_timestamp = header.max_timestamp
            last_offset = next_offset + header.last_offset_delta
            placed.append(AppendedBatch(position, next_offset, last_offset, batch_timestamp))
            max_timestamp = max(max_timestamp, batch_timestamp)
            records_count += header.record_count
            next_offset = last_offset + 1
        if expected_position != len(records):
            raise ValueError(f"batches cover {expected_position} of {len(records)} bytes")
        with _storage_errors(f"appending to {self.name}"):
            self._append_batches(records, placed)
        update_producer = self.producer_state.update
        for (_, header), batch in zip(batches, placed, strict=True):
            update_producer(header, batch.base_offset)
        self._appended(records_count)
        return AppendInfo(
            first_offset=first_offset,
            last_offset=next_offset - 1,
            max_timestamp=max_timestamp,
            log_append_time_ms=append_time_ms,
            records_count=records_count,
            size_bytes=len(records),
        )

    def append_replicated(
        self, records: bytes | bytearray, batches: list[tuple[int, BatchHeader]]
    ) -> AppendInfo:
        """Append batches a leader already placed (a follower's append): the
        base offsets in the headers are kept and must continue this log
        exactly (the first batch at log_end_offset, dense after). Records the
        epoch of every batch stamped with a newer leader epoch.

        Raises ValueError, writing nothing, when the offsets do not fit.
        """
        self._check_online()
        if not batches:
            raise ValueError("append needs at least one batch")
        first_offset = self.log_end_offset
        next_offset = first_offset
        max_timestamp = -1
        records_count = 0
        expected_position = 0
        placed: list[AppendedBatch] = []
        epochs: list[tuple[int, int]] = []
        latest_epoch = self.leader_epochs.latest_epoch
        for position, header in batches:
            if position != expected_position:
                raise ValueError(f"batches do not tile records: a batch at {position}")
            if header.base_offset != next_offset:
                raise ValueError(
                    f"{self.name}: replicated batch at offset {header.base_offset}, "
                    f"expected {next_offset}"
                )
            expected_position = position + header.size
            if header.partition_leader_epoch > latest_epoch:
                latest_epoch = header.partition_leader_epoch
                epochs.append((latest_epoch, header.base_offset))
            last_offset = header.base_offset + header.last_offset_delta
            placed.append(
                AppendedBatch(position, header.base_offset, last_offset, header.max_timestamp)
            )
            max_timestamp = max(max_timestamp, header.max_timestamp)
            records_count += header.record_count
            next_offset = last_offset + 1
        if expected_position != len(records):
            raise ValueError(f"batches cover {expected_position} of {len(records)} bytes")
        with _storage_errors(f"appending replicated batches to {self.name}"):
            self._append_batches(records, placed)
        # After the write, so that a failed one leaves no epoch behind that
        # wrote nothing (the log exactly as before).
        for epoch, start in epochs:
            self.leader_epochs.assign(epoch, start)
        # A follower keeps producer state too, so that it can dedupe
        # retries the moment it becomes leader (it trusts the leader's
        # checks and only records the batches).
        for _position, header in batches:
            self.producer_state.update(header, header.base_offset)
        self._appended(records_count)
        return AppendInfo(
            first_offset=first_offset,
            last_offset=next_offset - 1,
            max_timestamp=max_timestamp,
            log_append_time_ms=-1,
            records_count=records_count,
            size_bytes=len(records),
        )

    def _should_roll(self, size_bytes: int, last_offset: int, batch_count: int) -> bool:
        active = self._segments[-1]
        if active.size_bytes == 0:
            return False  # an empty segment takes anything: a batch is never split
        config = self._config
        if active.size_bytes + size_bytes > config.segment_bytes:
            return True
        first_append_ms = active.first_append_ms
        if first_append_ms is not None and (
            self._clock.time_ms() - first_append_ms >= config.segment_ms
        ):
            return True
        if last_offset - active.base_offset > MAX_RELATIVE_OFFSET:
            return True
        # Each batch may earn one entry in each index.
        index_bytes = config.segment_index_bytes
        return (
            active.offset_index.size_bytes + batch_count * OffsetIndex.ENTRY_SIZE > index_bytes
            or active.time_index.size_bytes + batch_count * TimeIndex.ENTRY_SIZE > index_bytes
        )

    def _append_batches(self, records: bytearray | bytes, placed: list[AppendedBatch]) -> None:
        """Write placed batches to the active segment, or to a new one if
        the active one is full. All or nothing, the roll included (the
        architecture invariant): the new segment joins the log only once
        the batches are in it; if it cannot be removed again after a
        failure, the log goes offline (a stray segment file at an offset
        the log may reach again would be taken for damage by an open, and
        every segment after it dropped). Raises OSError."""
        now_ms = self._clock.time_ms()
        interval = self._config.index_interval_bytes
        if not self._should_roll(len(records), placed[-1].last_offset, len(placed)):
            active = self._segments[-1]
            try:
                active.append(records, placed, interval, now_ms)
            except OSError as exc:
                if active.needs_recovery:
                    # Its undo failed too: the files hold bytes the log does
                    # not know of, and only an open recovers the segment.
                    raise self._take_offline("an append and its undo", exc) from exc
                raise
            return
        # The old segment is not fsynced here (that could stall the event
        # loop); flush() or close() does it, and recovery covers a crash.
        base_offset = self.log_end_offset
        if self.producer_state.producers:
            # Of the log end, which a failure below leaves where it is: true either way.
            self.producer_state.take_snapshot(base_offset)
        segment: LogSegment | None = None
        try:
            segment = LogSegment.create(self.directory, base_offset)
            segment.append(records, placed, interval, now_ms)
        except BaseException:
            self._remove_failed_roll(segment, base_offset)
            raise
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        self._directory_dirty = True
        # No more writes to the old segment: its descriptors go (the next
        # flush opens it again to fsync what it still owes). A failed close
        # loses nothing written, and the append above is done.
        with contextlib.suppress(OSError):
            self._segments[-2].release_descriptors()

    def _remove_failed_roll(self, segment: LogSegment | None, base_offset: int) -> None:
        """Delete the files of a roll whose append failed (`create` may have
        made some before it failed); offline if that fails too."""
        if segment is not None:
            with contextlib.suppress(OSError):
                segment.close()
        with self._offline_on_failure(f"removing the new segment {base_offset} of a failed roll"):
            files.delete_segment_files(self.directory, base_offset)

    def _appended(self, records_count: int) -> None:
        """After an append: the flush policy (flush.messages)."""
        if self._first_unflushed_monotonic_ms is None:
            self._first_unflushed_monotonic_ms = self._clock.monotonic_ms()
        self._unflushed_records += records_count
        flush_messages = self._config.flush_messages
        if flush_messages is not None and self._unflushed_records >= flush_messages:
            with self._offline_on_failure("a flush"):
                self._flush()

    # ------------------------------------------------------------------ read

    def _out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"offset {offset} is out of range for {self.name}: valid offsets are "
            f"{self.log_start_offset} to {self.log_end_offset}"
        )

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> ReadResult:
        """Whole batches from the one that contains `offset`, up to `max_bytes`
        (a first batch bigger than that is returned whole), none at or past
        `max_offset` (exclusive; the high watermark, default the log end).

        Raises OffsetOutOfRangeError unless log_start_offset <= offset <=
        log_end_offset; at the log end the result is empty.
        """
        self._check_online()
        log_start_offset = self.log_start_offset
        log_end_offset = self.log_end_offset
        if offset < log_start_offset or offset > log_end_offset:
            raise self._out_of_range(offset)
        limit = log_end_offset if max_offset is None else min(max_offset, log_end_offset)
        with _storage_errors(f"reading {self.name} at offset {offset}"):
            first = bisect_right(self._base_offsets, offset) - 1
            for segment in self._segments[first:]:
                if segment.base_offset >= limit:
                    break
                # A segment may hold nothing at or past `offset` (compaction
                # gaps): the data then starts in a later one.
                records, next_offset = segment.read(offset, max_bytes, limit)
                if segment is not self._segments[-1]:
                    # An inactive segment holds its descriptors for one read.
                    segment.release_descriptors()
                if records:
                    return ReadResult(records, next_offset, log_start_offset, log_end_offset)
        return ReadResult(b"", offset, log_start_offset, log_end_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is >=
        `timestamp_ms`, or None if there is no such record."""
        self._check_online()
        with _storage_errors(f"looking up a timestamp in {self.name}"):
            for segment in self._segments:
                # Every record before a segment whose max timestamp reaches the
                # target is older than it, so the first such segment holds it.
                if segment.max_timestamp >= timestamp_ms:
                    found = segment.find_offset_for_timestamp(timestamp_ms)
                    if segment is not self._segments[-1]:
                        segment.release_descriptors()
                    if found is not None:
                        return found
        return None

    # ------------------------------------------------------------------ retention

    def delete_old_segments(self) -> list[Path]:
        """Apply retention.ms and retention.bytes when cleanup.policy has
        delete: drop whole closed segments from the front (never the active
        one) and move the log start offset past them. No per-record work:
        a segment's age is its largest timestamp.

        The files are renamed `.deleted` here, which is cheap; the caller
        unlinks the returned paths off the event loop (`unlink_files`).
        """
        config = self._config
        if not config.delete or self._closed or self._offline is not None:
            return []
        segments = self._segments
        closed = len(segments) - 1
        count = 0
        if config.retention_ms >= 0:
            horizon_ms = self._clock.time_ms() - config.retention_ms
            while count < closed and segments[count].max_timestamp < horizon_ms:
                count += 1
        if config.retention_bytes >= 0:
            excess = self.log_bytes - config.retention_bytes
            excess -= sum(segment.size_bytes for segment in segments[:count])
            while count < closed and excess >= segments[count].size_bytes:
                excess -= segments[count].size_bytes
                count += 1
        if not count:
            return []
        with _storage_errors(f"deleting old segments of {self.name}"):
            return self._delete_first_segments(count)

    def delete_records_before(self, offset: int) -> list[Path]:
        """Kafka's DeleteRecords: move the log start offset up to `offset`
        (never down; at most the log end; the caller checks it against the
        high watermark) and drop the closed segments wholly below it. Reads
        below the new start get OFFSET_OUT_OF_RANGE from now on; the batch
        that straddles it stays on disk, unreadable below it.

        The new start is on disk (fsynced) before this returns: an
        acknowledged deletion survives a crash. Returns the renamed segment
        files for the caller to unlink off the event loop (`unlink_files`).
        """
        self._check_online()
        if offset < 0 or offset > self.log_end_offset:
            raise self._out_of_range(offset)
        if offset <= self._log_start_offset:
            return []
        # Part-way, the new start may be in memory and not on disk, or on
        # disk (not durably) and not in memory, and segments renamed or not.
        with self._offline_on_failure(f"deleting records below offset {offset}"):
            # Segments [i] with the next one starting at or below `offset`
            # hold nothing at or above it; the active one always stays.
            count = bisect_right(self._base_offsets, offset) - 1
            checkpoints.write_log_start_offset(self.directory, offset, durable=True)
            self._log_start_offset = offset
            renamed = self._delete_first_segments(count, "delete-records") if count > 0 else []
            self._clean_offset = max(self._clean_offset, offset)
        logger.info("%s: records below offset %d deleted (%d segments)", self.name, offset, count)
        return renamed

    def _delete_first_segments(self, count: int, reason: str = "retention") -> list[Path]:
        """Drop the first `count` segments. The log start is written first,
        before anything changes in memory: it is a rename only, so if it
        fails the log is as before (Raises OSError). Any failure after it
        takes the log offline: memory no longer lists segments still on
        disk under their names, which no later truncation or reset would
        remove (after a reset below them, an open would serve their records
        above the new start)."""
        log_start_offset = max(self._log_start_offset, self._segments[count].base_offset)
        # Before the renames: if they survive a crash and this does not, the
        # first segment still bounds the start; if this survives and they do
        # not, open drops the segments below it.
        checkpoints.write_log_start_offset(self.directory, log_start_offset)
        doomed = self._segments[:count]
        with self._offline_on_failure(f"{reason} deleting {count} segments"):
            del self._segments[:count]
            del self._base_offsets[:count]
            self._log_start_offset = log_start_offset
            self._clean_offset = max(self._clean_offset, log_start_offset)
            self._recovery_point = max(self._recovery_point, log_start_offset)
            self._directory_dirty = True
            self.producer_state.delete_snapshots_below(log_start_offset)
            renamed: list[Path] = []
            for segment in doomed:
                segment.close()
                renamed.extend(rename_deleted(segment.file_paths))
        logger.info(
            "%s: %s deleted %d segments; the log now starts at offset %d",
            self.name,
            reason,
            count,
            self._log_start_offset,
        )
        return renamed

    # ------------------------------------------------------------------ compaction

    def plan_cleaning(self, max_map_entries: int, force: bool = False) -> CleanPlan | None:
        """A snapshot for one cleaning round (`cleaner.clean`), or None when
        cleanup.policy has no compact, nothing is dirty, or the dirty ratio is
        below min.cleanable.dirty.ratio (unless `force`). Only closed segments
        older than min.compaction.lag.ms are planned. Every plan must be
        followed by `finish_cleaning` (with None if the round failed)."""
        config = self._config
        if not config.compact or self._closed or self._offline is not None:
            return None
        if self._cleaning is not None:
            return None
        now_ms = self._clock.time_ms()
        segments = self._segments
        end = len(segments) - 1
        if config.min_compaction_lag_ms > 0:
            horizon_ms = now_ms - config.min_compaction_lag_ms
            for i in range(end):
                if segments[i].max_timestamp > horizon_ms:
                    end = i
                    break
        if end == 0:
            return None
        end_offset = segments[end].base_offset
        clean_offset = max(self._clean_offset, self._log_start_offset)
        if clean_offset >= end_offset:
            return None
        clean_bytes = dirty_bytes = 0
        for i in range(end):
            if segments[i + 1].base_offset <= clean_offset:
                clean_bytes += segments[i].size_bytes
            else:
                dirty_bytes += segments[i].size_bytes
        if not force and (
            dirty_bytes == 0
            or dirty_bytes / (clean_bytes + dirty_bytes) < config.min_cleanable_dirty_ratio
        ):
            return None
        self._cleaning = tuple((segment, segment.size_bytes) for segment in segments[:end])
        return CleanPlan(
            directory=self.directory,
            name=self.name,
            segments=tuple(
                SegmentSnapshot(
                    segment.base_offset,
                    segment.log_path,
                    segment.size_bytes,
                    segments[i + 1].base_offset,
                )
                for i, segment in enumerate(segments[:end])
            ),
            clean_offset=clean_offset,
            end_offset=end_offset,
            max_map_entries=max_map_entries,
            delete_horizon_ms=now_ms - config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
            index_interval_bytes=config.index_interval_bytes,
            now_ms=now_ms,
        )

    @property
    def cleaning(self) -> bool:
        """A cleaning round is planned and not finished."""
        return self._cleaning is not None

    def finish_cleaning(self, result: CleanResult | None) -> list[Path]:
        """Swap the cleaned segments of a round into the log (see the module
        docstring for the crash-safe order), or discard them if a segment they
        replace changed meanwhile (retention, truncation). None: the round
        failed. Returns files renamed `.deleted`, for the caller to unlink off
        the event loop."""
        planned, self._cleaning = self._cleaning, None
        if result is None or not result.groups:
            return []
        if self._closed or self._offline is not None:
            return []  # deleted, closed or offline: open removes .cleaned files
        with _storage_errors(f"swapping cleaned segments into {self.name}"):
            if planned is None or not cleaning_swap.still_planned(
                result.groups, planned, self._segments, self._base_offsets
            ):
                logger.info("%s: segments changed during cleaning; discarding the round", self.name)
                return cleaning_swap.discard(self.directory, result.groups)
            return self._swap_in(result)

    def _swap_in(self, result: CleanResult) -> list[Path]:
        """The swap's four steps (see `cleaning_swap`), in their crash-safe order."""
        # 0. The epoch history first: the cleaner may have dropped the first
        # batches of an epoch, so recovery could no longer learn where it
        # started from the batches (see `leader_epoch`). Changes nothing
        # else: a failure here leaves the log as it was.
        self.leader_epochs.flush()
        # From here on a failure leaves the gap limit raised in memory,
        # committed groups that the next open swaps in (over segments this
        # log would go on changing: retention, truncation) or the segments
        # half replaced: the log goes offline.
        with self._offline_on_failure("swapping cleaned segments in"):
            return self._swap_in_steps(result)

    def _swap_in_steps(self, result: CleanResult) -> list[Path]:
        """Steps 1 to 4 of the swap. Raises OSError."""
        directory = self.directory
        # 1. Segments below the new clean offset may hold gaps from now on
        # (raised here first: a failed swap must not lower it on disk later),
        # and recovery learns the range each group replaces.
        swap_ends = cleaning_swap.swap_ends(result.groups, self._base_offsets)
        self._gap_limit = max(self._gap_limit, result.clean_offset)
        checkpoints.write_cleaner_checkpoint(
            directory, self._clean_offset, self._gap_limit, swap_ends
        )
        # 2. Commit every group: .cleaned -> .swap, the .log last.
        cleaning_swap.commit(directory, result.groups)
        # 3. Replace the segments of each group.
        deleted = cleaning_swap.replace_groups(
            directory,
            self._segments,
            self._base_offsets,
            result.groups,
            self._clock.time_ms(),
            self._config.index_interval_bytes,
        )
        # 4. Everything below the map's end is deduplicated now.
        self._clean_offset = max(self._clean_offset, result.clean_offset)
        checkpoints.write_cleaner_checkpoint(directory, self._clean_offset, self._gap_limit)
        logger.info(
            "%s: cleaned %d segments into %d: %d of %d records removed, %d bytes written "
            "in %.2f s; clean up to offset %d",
            self.name,
            sum(len(group.replaces) for group in result.groups),
            len(result.groups),
            result.records_removed,
            result.records_read,
            result.bytes_written,
            result.elapsed_s,
            self._clean_offset,
        )
        return deleted

    # ------------------------------------------------------------------ flush

    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point.
        An OSError takes the log offline (see the module docstring): after
        a failed fsync the dirty pages may be gone, and a second flush
        whose fsyncs succeed would raise the recovery point over them."""
        self._check_online()
        with self._offline_on_failure("a flush"):
            self._flush()

    def _flush(self) -> None:
        log_end_offset = self.log_end_offset
        first = max(bisect_right(self._base_offsets, self._recovery_point) - 1, 0)
        for segment in self._segments[first:]:
            segment.flush()
        self._release_inactive_descriptors()
        if self._directory_dirty:
            fsync_directory(self.directory)
            self._directory_dirty = False
        # Before the recovery point moves past the epochs it names (the
        # invariant of `leader_epoch`).
        self.leader_epochs.flush()
        self._unflushed_records = 0
        self._first_unflushed_monotonic_ms = None
        if log_end_offset != self._recovery_point:
            self._recovery_point = log_end_offset
            checkpoints.write_recovery_point(self.directory, log_end_offset)

    def _release_inactive_descriptors(self) -> None:
        """Close the files of every segment but the active one: they are
        opened again for a read, and closed after it (issue 16 item 7: a
        partition at rest holds the active segment's three descriptors,
        not three per segment)."""
        for segment in self._segments[:-1]:
            segment.release_descriptors()

    def maybe_flush(self, now_monotonic_ms: int) -> bool:
        """Apply flush.ms: flush if the oldest unflushed append is that old.
        Returns whether it flushed. The broker calls this periodically."""
        flush_ms = self._config.flush_ms
        since = self._first_unflushed_monotonic_ms
        if (
            flush_ms is None
            or since is None
            or now_monotonic_ms - since < flush_ms
            or self._offline is not None
        ):
            return False
        self.flush()
        return True

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or above `offset` (the whole batch containing
        it: batches are never split, so the log may end below `offset`).
        Durable when it returns. An OSError part-way takes the log offline
        (see the module docstring): the next open recovers it."""
        self._check_online()
        if offset >= self.log_end_offset:
            return
        with self._offline_on_failure(f"a truncation to offset {offset}"):
            if offset <= self.log_start_offset:
                keep = 1
                self._segments[0].truncate_to(self._segments[0].base_offset)
            else:
                keep = bisect_right(self._base_offsets, offset)
                self._segments[keep - 1].truncate_to(offset)
            for segment in self._segments[keep:]:
                segment.delete()
            del self._segments[keep:]
            del self._base_offsets[keep:]
            self._segments[-1].flush()
            fsync_directory(self.directory)
            self._directory_dirty = False
            self._log_start_offset = min(self._log_start_offset, self.log_end_offset)
            self._clean_offset = min(self._clean_offset, self.log_end_offset)
            if self.log_end_offset < self._recovery_point:
                # Durably: the follower appends above the new end next (see
                # the module docstring). A crash before this leaves it above
                # the end, which open lowers.
                self._recovery_point = self.log_end_offset
                checkpoints.write_recovery_point(self.directory, self._recovery_point, durable=True)
            self.leader_epochs.truncate_from_end(self.log_end_offset)
            self.producer_state.rebuild(self._segments, self.log_end_offset)

    def reset_to(self, offset: int) -> None:
        """Drop every record and restart the log, empty, at `offset`: log
        start = log end = recovery point = `offset`, no epoch history, no
        producer state. Durable when it returns.

        For a follower whose log ends below the leader's log start offset
        (retention deleted what it still needed while it was away): it can
        never fetch those records, so it starts over where the leader's log
        starts (Kafka's truncateFullyAndStartAt). And for an empty follower
        log that starts inside the leader's first batch: it restarts at the
        batch's base offset, below its old end.

        Crash-safe for any `offset`, below, inside or above the old log: an
        open after a crash anywhere in here gives the old log unchanged
        (records, log start, epoch history, producer state) or an empty log
        at `offset`, never a mix. The `reset-offset` file, written durably
        before anything else changes, is the commit point: an open that
        finds it finishes the reset (`log_loader`), whatever else of it
        reached the disk; it is removed, durably, only once everything else
        is on disk, before anything can be appended at `offset`.

        An OSError part-way takes the log offline (see the module docstring)
        and raises StorageError: the next open finishes the reset.
        """
        self._check_online()
        if offset < 0:
            raise ValueError(f"cannot reset {self.name} to negative offset {offset}")
        with self._offline_on_failure(f"a reset to offset {offset}"):
            deleted = self._reset(offset)
        # The renamed files are unreachable now; a failed unlink is retried
        # by the next open.
        unlink_files(deleted)
        logger.warning("%s: reset to an empty log at offset %d", self.name, offset)

    def _reset(self, offset: int) -> list[Path]:
        """`reset_to`'s steps, in their crash-safe order; returns the files
        renamed `.deleted`. Raises OSError."""
        directory = self.directory
        # 1. The commit point. Before it nothing has changed; after it,
        # the steps below may reach the disk in any order and any part.
        checkpoints.write_reset_offset(directory, offset)
        # 2. Everything of the old log goes: its history (durably), its
        # segments; a new, empty segment and new offsets come.
        self._forget_history()
        deleted: list[Path] = []
        for segment in self._segments:
            segment.close()
            deleted.extend(rename_deleted(segment.file_paths))
        self._segments = [LogSegment.create(directory, offset)]
        self._base_offsets = [offset]
        self._segments[0].flush()
        self._log_start_offset = offset
        checkpoints.write_log_start_offset(directory, offset, durable=True)
        # Durably when it goes down (see the module docstring): before
        # the commit point goes, so before anything is appended above it.
        lowered = offset < self._recovery_point
        self._recovery_point = offset
        checkpoints.write_recovery_point(directory, offset, durable=lowered)
        if self._clean_offset > offset or self._gap_limit > offset:
            # Only a reset below the old end: nothing above it is clean
            # any more, nor rewritten by the cleaner.
            self._gap_limit = min(self._gap_limit, offset)
            checkpoints.write_cleaner_checkpoint(directory, offset, self._gap_limit)
        self._clean_offset = offset
        self._unflushed_records = 0
        self._first_unflushed_monotonic_ms = None
        # The renames, the new segment and the snapshot deletions.
        fsync_directory(directory)
        self._directory_dirty = False
        # 3. Done: the commit point goes, before anything is appended at
        # `offset` (an open that found it would drop that).
        checkpoints.remove_reset_offset(directory)
        return deleted

    def _forget_history(self) -> None:
        """Empty the epoch history and the producer state (files included)."""
        self.leader_epochs.truncate_from_end(0)  # every entry starts at >= 0
        self.producer_state.clear()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Flush, close every file, and mark the shutdown as clean, unless
        the log may have lost its tail (`may_have_lost_tail`): without the
        marker its next open says so again, since a restart loses none of
        the doubt (the open recovers nothing the flush wrote: its recovery
        point is the log end). An offline log only closes its files: nothing of its state in memory
        may reach the disk, and the next open must recover it. A close
        that fails (StorageError) still closes every file, without the
        marker: the next open recovers what it did not write."""
        if self._closed:
            return
        if self._offline is not None:
            self._closed = True
            # Its files may be the ones that failed: the next open
            # recovers whatever state they are in.
            close_all(self._segments)
            return
        try:
            with _storage_errors(f"closing {self.name}"):
                self._flush()
                if self.producer_state.producers:
                    self.producer_state.take_snapshot(
                        self.log_end_offset, supersedes_above=self._segments[-1].base_offset
                    )
                for segment in self._segments:
                    segment.close()
                self._closed = True
                if self.may_have_lost_tail is None:
                    checkpoints.mark_clean_shutdown(self.directory)
        except BaseException:
            # The files go whatever failed (out of descriptors, say: the
            # flush opens some): nobody closes a log twice, so they would
            # stay open for good. Without the marker, the next open recovers
            # what the flush did not write.
            self._closed = True
            close_all(self._segments)
            raise

    def delete(self) -> Path | None:
        """Close every file and remove the log's directory, offline or not
        (`close_for_deletion`, then `files.remove_renamed`, here: a big log
        takes long, so the broker's loop uses `close_for_deletion` and leaves
        the removal to a worker thread). Returns None once removed, else the
        renamed directory still to remove (the LogManager's sweep retries).
        StorageError if it cannot be renamed (see `close_for_deletion`)."""
        doomed = self.close_for_deletion()
        if doomed is None:
            return None
        return None if files.remove_renamed(doomed) else doomed

    def close_for_deletion(self) -> Path | None:
        """Close every file, offline or not, and rename the log's directory
        aside for deletion (`files.rename_for_deletion`: one rename, made
        durable, so it leaves its name whole and free for a new incarnation
        of the topic, even if removing its files fails part-way or never
        happens). Quick whatever the log's size: removing the files is the
        caller's (`delete`, or the LogManager's sweep in a worker thread).
        Returns the renamed directory, None if it was gone already.
        StorageError if it cannot be renamed: it then stays whole under its
        name, and a new incarnation of the topic refuses it by its topic id
        (`open`)."""
        self._closed = True
        # Going anyway: a file that fails to close (maybe the one whose
        # failure took the log offline) must not keep the rest.
        close_all(self._segments)
        try:
            return files.rename_for_deletion(self.directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(
                f"deleting {self.name}: cannot rename {self.directory} aside for deletion: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.name}, log_start_offset={self.log_start_offset}, "
            f"log_end_offset={self.log_end_offset}, segments={len(self._segments)})"
        )
