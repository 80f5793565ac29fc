"""The log of one partition: a directory of segments, the recovery point, flushing.

Directory layout and file names: see `files.py`. Besides the segments, the
directory holds small files:

- `recovery-point`: the offset below which every byte has been fsynced, as
  ASCII decimal and a newline. Written after the fsyncs it vouches for, by
  rename, without an fsync of its own: a stale or unreadable file only makes
  the next open recover more than it had to.
- `clean-shutdown`: empty; written by `close` after everything is flushed and
  removed (durably) by the next `open` before anything is written.
- `log-start-offset`: the first readable offset, ASCII decimal. Retention
  writes it before renaming the segments it drops; `open` deletes segments
  that lie wholly below it (a retention pass cut short by a crash). A lost
  update is harmless: the first segment's base offset is a lower bound.
  `reset_to` writes it durably before dropping every segment; `open` empties
  a log that lies wholly below it (a reset cut short by a crash).
- `cleaner-checkpoint`: two offsets, `clean_offset gap_limit`, then, while
  a swap is in flight, one `base-end` pair per cleaned group: the offsets
  [base, end) whose segments the group replaces. Below the clean offset every
  key appears at most once (the cleaner maps only what is above it). Below
  the gap limit, segments may have been rewritten by the cleaner and hold
  offset gaps, so the density checks of recovery are relaxed there to
  "offsets increase"; above it, a gap still counts as damage.

Retention (`delete_old_segments`, cleanup.policy with delete): whole closed
segments past retention.ms (their largest timestamp) or beyond retention.bytes
are dropped from the front, never the active one. They are renamed to
`.deleted` on the event loop (cheap) and unlinked by the caller in a worker
thread; `open` removes leftovers.

Compaction (`plan_cleaning`, `cleaner.clean` in a worker thread,
`finish_cleaning`): the cleaner writes each group of cleaned segments as
fsynced `.cleaned` files. The swap, on the event loop, is crash-safe:

1. the gap limit is raised to the new clean offset and the checkpoint written
   durably, with the offset range each group replaces, before any rewritten
   segment can become part of the log;
2. every `.cleaned` file is renamed `.swap` (index files first, the .log
   last: a `.log.swap` is the commit point of its group), directory fsynced;
3. per group: the replaced segments are renamed `.deleted` (the first one
   last), then the `.swap` files are renamed into the first one's names;
4. the clean offset is raised and the checkpoint written again (without
   the ranges).

`open` completes an interrupted swap: for each `<B>.log.swap` it removes
every segment the group replaces, those whose base offset lies in [B, end)
with the end from the checkpoint, and renames the swap files into place.
Every one of them must go, not only those up to the swap's last offset: a
replaced segment past that offset holds only records the cleaner dropped,
superseded values among them, and the tombstone that superseded them may be
dropped by the same round (delete.retention.ms), in a group that is swapped
in too: kept, such a segment brings a deleted key back. Stray `.cleaned`
files and index `.swap` files without their `.log.swap` are deleted. So a
crash at any point leaves each offset in exactly one segment, and each group
either wholly swapped in or not at all.

Open loads every segment cheaply (indexes plus a walk of the last few batch
headers). Unless the marker says the log was closed cleanly, every segment
holding offsets at or above the recovery point is then recovered: each
batch's CRC32C checked, indexes rebuilt, a torn or corrupt tail cut off. Any
segment whose files do not add up is recovered whatever the marker says.
Nothing after damage may be readable, so every segment after a damaged one
is deleted.

Every public method turns OSError into `tidelog.errors.StorageError`; this is
the one place where that happens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import OffsetOutOfRangeError, StorageError
from tidelog.records import (
    HEADER_SIZE,
    BatchHeader,
    read_header,
    set_base_offset,
    set_log_append_time,
)
from tidelog_server.clock import SYSTEM_CLOCK, Clock

from tidelog_broker.storage import files
from tidelog_broker.storage.cleaner import (
    CleanPlan,
    CleanResult,
    SegmentSnapshot,
)
from tidelog_broker.storage.config import LogConfig
from tidelog_broker.storage.index import MAX_RELATIVE_OFFSET, OffsetIndex, TimeIndex
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_broker.storage.producer_state import ProducerStateManager
from tidelog_broker.storage.segment import AppendedBatch, LogSegment

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

    records: bytes
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


def _fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    ) -> None:
        """Use `PartitionLog.open`."""
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
        self._log_start_offset = max(log_start_offset, segments[0].base_offset)
        self._clean_offset = clean_offset
        self._gap_limit = gap_limit
        # The segments (and their sizes) a cleaning round in flight was
        # planned on; finish_cleaning swaps only if they are all still there.
        self._cleaning: tuple[tuple[LogSegment, int], ...] | None = None
        #: Epoch history (replication): which leader epoch wrote which offsets.
        self.leader_epochs = LeaderEpochCache.load(directory)
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
    ) -> PartitionLog:
        """Open the log in `directory` (the partition's own directory, see
        `files.log_dir`), creating it if needed, and recover what needs it."""
        with _storage_errors(f"opening {files.log_dir_name(topic, partition)} in {directory}"):
            return cls._open(directory, topic, partition, config, clock)

    @classmethod
    def _open(
        cls, directory: Path, topic: str, partition: int, config: LogConfig, clock: Clock
    ) -> PartitionLog:
        if not directory.is_dir():
            directory.mkdir(parents=True)
            _fsync_directory(directory.parent)
        marker = directory / files.CLEAN_SHUTDOWN_FILE
        clean_shutdown = marker.exists()
        if clean_shutdown:
            # Gone for good before any write: a crash from here on must not
            # pass for a clean shutdown.
            marker.unlink()
            _fsync_directory(directory)
        recovery_point = _read_recovery_point(directory)
        log_start_offset = _read_offset_file(directory / files.LOG_START_OFFSET_FILE) or 0
        clean_offset, gap_limit, swap_ends = _read_cleaner_checkpoint(directory)
        now_ms = clock.time_ms()
        base_offsets = _segment_base_offsets(directory, swap_ends)
        # Segments wholly below the log start: a retention pass was cut short.
        while len(base_offsets) > 1 and base_offsets[1] <= log_start_offset:
            _delete_segment_files(directory, base_offsets.pop(0))
        segments = [
            LogSegment.open(directory, base_offset, now_ms, allow_gaps=base_offset < gap_limit)
            for base_offset in base_offsets
        ]
        # The whole log lies below the log start: a `reset_to` was cut short
        # after it wrote the new start. Finish it: the log is empty there.
        reset = (
            bool(segments)
            and segments[-1].base_offset < log_start_offset
            and segments[-1].next_offset <= log_start_offset
        )
        if reset:
            for segment in segments:
                segment.delete()
            segments = []
        if not segments:
            segments = [LogSegment.create(directory, log_start_offset)]
        log = cls(
            directory,
            topic,
            partition,
            config,
            clock,
            segments,
            0,
            log_start_offset,
            clean_offset,
            gap_limit,
        )
        if reset:
            log._forget_history()
            _fsync_directory(directory)
        trust_all = clean_shutdown and recovery_point is not None
        log._recover(-1 if recovery_point is None else recovery_point, trust_all)
        # Recovery may have cut a torn tail: epochs past the end wrote nothing kept.
        log.leader_epochs.truncate_from_end(log.log_end_offset)
        log.producer_state.rebuild(log._segments, log.log_end_offset)
        log._release_inactive_descriptors()
        return log

    def _recover(self, recovery_point: int, trust_all: bool) -> None:
        """Recover the segments that need it; drop every segment after damage."""
        kept: list[LogSegment] = []
        damaged_at: int | None = None
        for segment in self._segments:
            if damaged_at is not None:
                segment.delete()
                continue
            if kept and self._segments_do_not_meet(kept[-1], segment):
                # Offsets are dense outside the cleaned part, so a hole there
                # means the previous segment lost its tail; an overlap is
                # damage anywhere.
                damaged_at = kept[-1].next_offset
                segment.delete()
                continue
            if segment.needs_recovery or (not trust_all and segment.next_offset > recovery_point):
                # No limit from max.message.bytes: it may have been lowered
                # since older batches were written, and they are still good. A
                # corrupt length costs one read bounded by the file's size.
                dropped_bytes = segment.recover(None, self._config.index_interval_bytes)
                if dropped_bytes:
                    logger.warning(
                        "%s: recovery dropped %d bytes from the end of %s; the log now ends "
                        "at offset %d",
                        self.name,
                        dropped_bytes,
                        segment.log_path.name,
                        segment.next_offset,
                    )
                    damaged_at = segment.next_offset
            kept.append(segment)
        if len(kept) < len(self._segments):
            logger.warning(
                "%s: deleted %d segments after damage at offset %s",
                self.name,
                len(self._segments) - len(kept),
                damaged_at,
            )
            self._directory_dirty = True
        self._segments = kept
        self._base_offsets = [segment.base_offset for segment in kept]
        self._log_start_offset = min(
            max(self._log_start_offset, kept[0].base_offset), self.log_end_offset
        )
        self._clean_offset = min(
            max(self._clean_offset, self._log_start_offset), self.log_end_offset
        )
        self._recovery_point = max(
            self.log_start_offset, min(max(recovery_point, 0), self.log_end_offset)
        )

    def _segments_do_not_meet(self, previous: LogSegment, segment: LogSegment) -> bool:
        if previous.next_offset > segment.base_offset:
            return True
        gap = previous.next_offset < segment.base_offset
        return gap and previous.base_offset >= self._gap_limit

    # ------------------------------------------------------------------ state

    @property
    def config(self) -> LogConfig:
        return self._config

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
            if self._should_roll(len(records), next_offset - 1, len(placed)):
                self._roll()
            self._segments[-1].append(
                records, placed, self._config.index_interval_bytes, self._clock.time_ms()
            )
            update_producer = self.producer_state.update
            for (_, header), batch in zip(batches, placed, strict=True):
                update_producer(header, batch.base_offset)
            if self._first_unflushed_monotonic_ms is None:
                self._first_unflushed_monotonic_ms = self._clock.monotonic_ms()
            self._unflushed_records += records_count
            flush_messages = self._config.flush_messages
            if flush_messages is not None and self._unflushed_records >= flush_messages:
                self._flush()
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
            for epoch, start in epochs:
                self.leader_epochs.assign(epoch, start)
            if self._should_roll(len(records), next_offset - 1, len(placed)):
                self._roll()
            self._segments[-1].append(
                records, placed, self._config.index_interval_bytes, self._clock.time_ms()
            )
            # A follower keeps producer state too, so that it can dedupe
            # retries the moment it becomes leader (it trusts the leader's
            # checks and only records the batches).
            for _position, header in batches:
                self.producer_state.update(header, header.base_offset)
            if self._first_unflushed_monotonic_ms is None:
                self._first_unflushed_monotonic_ms = self._clock.monotonic_ms()
            self._unflushed_records += records_count
            flush_messages = self._config.flush_messages
            if flush_messages is not None and self._unflushed_records >= flush_messages:
                self._flush()
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

    def _roll(self) -> None:
        # The old segment is not fsynced here (that could stall the event
        # loop); flush() or close() does it, and recovery covers a crash.
        base_offset = self.log_end_offset
        if self.producer_state.producers:
            self.producer_state.take_snapshot(base_offset)
        self._segments.append(LogSegment.create(self.directory, base_offset))
        self._base_offsets.append(base_offset)
        self._directory_dirty = True
        # No more writes to the old segment: its descriptors go (the next
        # flush opens it again to fsync what it still owes).
        self._segments[-2].release_descriptors()

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
        if not config.delete or self._closed:
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

    def _delete_first_segments(self, count: int) -> list[Path]:
        doomed = self._segments[:count]
        del self._segments[:count]
        del self._base_offsets[:count]
        self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        self._clean_offset = max(self._clean_offset, self._log_start_offset)
        self._recovery_point = max(self._recovery_point, self._log_start_offset)
        # Before the renames: if they survive a crash and this does not, the
        # first segment still bounds the start; if this survives and they do
        # not, open drops the segments below it.
        _write_offset_file(self.directory / files.LOG_START_OFFSET_FILE, self._log_start_offset)
        self.producer_state.delete_snapshots_below(self._log_start_offset)
        renamed: list[Path] = []
        for segment in doomed:
            segment.close()
            renamed.extend(_rename_deleted(segment.file_paths))
        self._directory_dirty = True
        logger.info(
            "%s: retention deleted %d segments; the log now starts at offset %d",
            self.name,
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
        if not config.compact or self._closed or self._cleaning is not None:
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
        if self._closed:
            return []  # deleted or closed: open removes .cleaned files
        with _storage_errors(f"swapping cleaned segments into {self.name}"):
            if planned is None or not self._still_planned(result, planned):
                logger.info("%s: segments changed during cleaning; discarding the round", self.name)
                paths: list[Path] = []
                for group in result.groups:
                    paths.extend(_rename_deleted(_cleaned_paths(self.directory, group.base_offset)))
                return paths
            return self._swap_in(result)

    def _still_planned(
        self, result: CleanResult, planned: tuple[tuple[LogSegment, int], ...]
    ) -> bool:
        by_base = {segment.base_offset: (segment, size) for segment, size in planned}
        active = self._segments[-1]
        for group in result.groups:
            for base_offset in group.replaces:
                segment, size = by_base[base_offset]
                i = bisect_right(self._base_offsets, base_offset) - 1
                if (
                    i < 0
                    or self._segments[i] is not segment
                    or segment is active
                    or segment.size_bytes != size
                ):
                    return False
        return True

    def _swap_in(self, result: CleanResult) -> list[Path]:
        directory = self.directory
        # 1. Segments below the new clean offset may hold gaps from now on.
        # Recovery needs each group's whole range: its cleaned segment may end
        # well before the last segment it replaces.
        swap_ends: dict[int, int] = {}
        for group in result.groups:
            after = bisect_right(self._base_offsets, group.base_offset) - 1 + len(group.replaces)
            swap_ends[group.base_offset] = self._base_offsets[after]
        self._gap_limit = max(self._gap_limit, result.clean_offset)
        _write_cleaner_checkpoint(directory, self._clean_offset, self._gap_limit, swap_ends)
        # 2. Commit every group: .cleaned -> .swap, the .log last (an index
        # .swap without its .log.swap is not committed: open deletes it).
        for group in result.groups:
            for path in _cleaned_paths(directory, group.base_offset):
                os.replace(path, _with_suffix(path, files.CLEANED_SUFFIX, files.SWAP_SUFFIX))
        _fsync_directory(directory)
        # 3. Replace the segments of each group.
        deleted: list[Path] = []
        now_ms = self._clock.time_ms()
        for group in result.groups:
            first = bisect_right(self._base_offsets, group.base_offset) - 1
            replaced = self._segments[first : first + len(group.replaces)]
            for segment in reversed(replaced[1:]):
                segment.close()
                deleted.extend(_rename_deleted(segment.file_paths))
            replaced[0].close()
            # Renamed away rather than replaced by the swap: a rename over a
            # file frees its blocks on the spot (~1 ms per MB here), which
            # belongs in the worker thread with the other unlinks.
            deleted.extend(_rename_deleted(replaced[0].file_paths))
            for path in reversed(_swap_paths(directory, group.base_offset)):
                os.replace(path, _with_suffix(path, files.SWAP_SUFFIX, ""))
            segment = LogSegment.open(directory, group.base_offset, now_ms, allow_gaps=True)
            if segment.needs_recovery:
                segment.recover(None, self._config.index_interval_bytes)
            self._segments[first : first + len(replaced)] = [segment]
            self._base_offsets[first : first + len(replaced)] = [group.base_offset]
        _fsync_directory(directory)
        # 4. Everything below the map's end is deduplicated now.
        self._clean_offset = max(self._clean_offset, result.clean_offset)
        _write_cleaner_checkpoint(directory, self._clean_offset, self._gap_limit)
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
        """fsync everything appended so far and advance the recovery point."""
        with _storage_errors(f"flushing {self.name}"):
            self._flush()

    def _flush(self) -> None:
        log_end_offset = self.log_end_offset
        first = max(bisect_right(self._base_offsets, self._recovery_point) - 1, 0)
        for segment in self._segments[first:]:
            segment.flush()
        self._release_inactive_descriptors()
        if self._directory_dirty:
            _fsync_directory(self.directory)
            self._directory_dirty = False
        self._unflushed_records = 0
        self._first_unflushed_monotonic_ms = None
        if log_end_offset != self._recovery_point:
            self._recovery_point = log_end_offset
            _write_recovery_point(self.directory, log_end_offset)

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
        if flush_ms is None or since is None or now_monotonic_ms - since < flush_ms:
            return False
        self.flush()
        return True

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or above `offset` (the whole batch containing
        it: batches are never split, so the log may end below `offset`).
        Durable when it returns."""
        if offset >= self.log_end_offset:
            return
        with _storage_errors(f"truncating {self.name} to offset {offset}"):
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
            _fsync_directory(self.directory)
            self._directory_dirty = False
            self._log_start_offset = min(self._log_start_offset, self.log_end_offset)
            self._clean_offset = min(self._clean_offset, self.log_end_offset)
            self._recovery_point = min(self._recovery_point, self.log_end_offset)
            _write_recovery_point(self.directory, self._recovery_point)
            self.leader_epochs.truncate_from_end(self.log_end_offset)
            self.producer_state.rebuild(self._segments, self.log_end_offset)

    def reset_to(self, offset: int) -> None:
        """Drop every record and restart the log, empty, at `offset`: log
        start = log end = recovery point = `offset`, no epoch history, no
        producer state. Durable when it returns.

        For a follower whose log ends below the leader's log start offset
        (retention deleted what it still needed while it was away): it can
        never fetch those records, so it starts over where the leader's log
        starts (Kafka's truncateFullyAndStartAt).

        Crash-safe for `offset` >= the old log end (the follower's case): the
        new log start is written durably first, so a crash part-way leaves a
        log wholly below it, which `open` empties at `offset`.
        """
        if offset < 0:
            raise ValueError(f"cannot reset {self.name} to negative offset {offset}")
        with _storage_errors(f"resetting {self.name} to offset {offset}"):
            directory = self.directory
            _write_offset_file(directory / files.LOG_START_OFFSET_FILE, offset, durable=True)
            self._forget_history()
            deleted: list[Path] = []
            for segment in self._segments:
                segment.close()
                deleted.extend(_rename_deleted(segment.file_paths))
            self._segments = [LogSegment.create(directory, offset)]
            self._base_offsets = [offset]
            self._segments[0].flush()
            _fsync_directory(directory)
            self._directory_dirty = False
            self._log_start_offset = offset
            self._clean_offset = offset
            self._recovery_point = offset
            self._unflushed_records = 0
            self._first_unflushed_monotonic_ms = None
            _write_recovery_point(directory, offset)
        # The renamed files are unreachable now; a failed unlink is retried
        # by the next open.
        unlink_files(deleted)
        logger.warning("%s: reset to an empty log at offset %d", self.name, offset)

    def _forget_history(self) -> None:
        """Empty the epoch history and the producer state (files included)."""
        self.leader_epochs.truncate_from_end(0)  # every entry starts at >= 0
        self.producer_state.clear()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Flush, close every file, and mark the shutdown as clean."""
        if self._closed:
            return
        with _storage_errors(f"closing {self.name}"):
            self._flush()
            if self.producer_state.producers:
                self.producer_state.take_snapshot(
                    self.log_end_offset, supersedes_above=self._segments[-1].base_offset
                )
            for segment in self._segments:
                segment.close()
            self._closed = True
            (self.directory / files.CLEAN_SHUTDOWN_FILE).touch()

    def delete(self) -> None:
        """Close every file and remove the log's directory."""
        with _storage_errors(f"deleting {self.name}"):
            for segment in self._segments:
                segment.close()
            self._closed = True
            shutil.rmtree(self.directory)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.name}, log_start_offset={self.log_start_offset}, "
            f"log_end_offset={self.log_end_offset}, segments={len(self._segments)})"
        )


def _segment_base_offsets(directory: Path, swap_ends: dict[int, int]) -> list[int]:
    """Base offsets of the segments in `directory`, sorted, after finishing
    what a crash interrupted: leftover temporary, `.deleted` and `.cleaned`
    files are removed, committed swaps completed (see the module docstring;
    `swap_ends`: the end of the range each group of the swap in flight
    replaces, by base offset, from the checkpoint), and index files without a
    .log removed (a crash mid-roll or mid-deletion).
    """
    logs: set[int] = set()
    indexes: list[tuple[int, Path]] = []
    swaps: dict[int, list[Path]] = {}
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith((files.TEMP_SUFFIX, files.DELETED_SUFFIX, files.CLEANED_SUFFIX)):
            os.unlink(entry.path)
            continue
        if name.endswith(files.SWAP_SUFFIX):
            parsed = files.parse_segment_file_name(name[: -len(files.SWAP_SUFFIX)])
            if parsed is not None:
                swaps.setdefault(parsed[0], []).append(Path(entry.path))
            continue
        parsed = files.parse_segment_file_name(name)
        if parsed is None:
            continue
        base_offset, suffix = parsed
        if suffix == files.LOG_SUFFIX:
            logs.add(base_offset)
        else:
            indexes.append((base_offset, Path(entry.path)))
    if swaps:
        _complete_swaps(directory, swaps, logs, swap_ends)
    for base_offset, path in indexes:
        if base_offset not in logs:
            path.unlink(missing_ok=True)
    return sorted(logs)


def _complete_swaps(
    directory: Path, swaps: dict[int, list[Path]], logs: set[int], swap_ends: dict[int, int]
) -> None:
    """Finish the swaps whose `.log.swap` exists; drop index swaps without one.

    Each committed group replaces every segment in [base, end): a kill may
    have left any of them, the one at `base` included (its old index files
    must not outlive it either). Deleted before the renames, so a kill in
    here leaves a swap that the next open completes the same way.
    """
    for base_offset in sorted(swaps):
        log_swap = files.segment_path(directory, base_offset, files.LOG_SUFFIX + files.SWAP_SUFFIX)
        if log_swap not in swaps[base_offset]:
            for path in swaps[base_offset]:
                path.unlink()
            continue
        end = swap_ends.get(base_offset)
        if end is None:
            # A checkpoint written before it recorded the ranges: the swap's
            # own offsets are the best bound left.
            end = max(_swap_next_offset(log_swap, base_offset), base_offset + 1)
        _delete_segment_files(directory, base_offset)
        for other in sorted(logs):
            if base_offset < other < end:
                _delete_segment_files(directory, other)
                logs.discard(other)
        for path in sorted(swaps[base_offset], key=lambda p: p == log_swap):
            os.replace(path, _with_suffix(path, files.SWAP_SUFFIX, ""))
        logs.add(base_offset)
        logger.warning(
            "%s: completed an interrupted swap of cleaned segment %d (replacing offsets %d to %d)",
            directory.name,
            base_offset,
            base_offset,
            end,
        )
    _fsync_directory(directory)


def _swap_next_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a swap file (headers only:
    it was fsynced before it was committed)."""
    next_offset = base_offset
    size = path.stat().st_size
    with open(path, "rb") as f:
        position = 0
        while position + HEADER_SIZE <= size:
            header = read_header(os.pread(f.fileno(), HEADER_SIZE, position))
            if header.size < HEADER_SIZE or position + header.size > size:
                break
            next_offset = header.next_offset
            position += header.size
    return next_offset


def _with_suffix(path: Path, old: str, new: str) -> Path:
    assert path.name.endswith(old)
    return path.with_name(path.name[: len(path.name) - len(old)] + new)


def _cleaned_paths(directory: Path, base_offset: int) -> list[Path]:
    """The .cleaned files of a group, index files first, the .log last."""
    return [
        files.segment_path(directory, base_offset, suffix + files.CLEANED_SUFFIX)
        for suffix in (files.INDEX_SUFFIX, files.TIME_INDEX_SUFFIX, files.LOG_SUFFIX)
    ]


def _swap_paths(directory: Path, base_offset: int) -> list[Path]:
    """The .swap files of a group, index files first, the .log last."""
    return [
        files.segment_path(directory, base_offset, suffix + files.SWAP_SUFFIX)
        for suffix in (files.INDEX_SUFFIX, files.TIME_INDEX_SUFFIX, files.LOG_SUFFIX)
    ]


def _delete_segment_files(directory: Path, base_offset: int) -> None:
    for suffix in files.SEGMENT_SUFFIXES:
        files.segment_path(directory, base_offset, suffix).unlink(missing_ok=True)


def _rename_deleted(paths: Sequence[Path]) -> list[Path]:
    """Rename files to `<name>.deleted` (cheap); return the new paths."""
    renamed = []
    for path in paths:
        target = path.with_name(path.name + files.DELETED_SUFFIX)
        try:
            os.replace(path, target)
        except FileNotFoundError:
            continue
        renamed.append(target)
    return renamed


def unlink_files(paths: Sequence[Path]) -> int:
    """Unlink files (a worker thread's job: unlinking a large file can take
    milliseconds). Returns how many were removed; errors are logged."""
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot unlink %s: %s (the next open removes it)", path, exc)
    return removed


def _read_offset_file(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        logger.warning("%s unreadable (%s): ignoring it", path, exc)
        return None


def _write_offset_file(path: Path, offset: int, durable: bool = False) -> None:
    temp = path.with_name(path.name + files.TEMP_SUFFIX)
    if not durable:
        temp.write_text(f"{offset}\n", encoding="ascii")
        os.replace(temp, path)
        return
    with open(temp, "w", encoding="ascii") as out:
        out.write(f"{offset}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    _fsync_directory(path.parent)


def _read_cleaner_checkpoint(directory: Path) -> tuple[int, int, dict[int, int]]:
    """(clean offset, gap limit, end of the range each group of a swap in
    flight replaces by its base offset); (0, 0, {}) when the log was never
    cleaned."""
    path = directory / files.CLEANER_CHECKPOINT_FILE
    try:
        clean_offset, gap_limit, *ranges = path.read_text(encoding="ascii").split()
        swap_ends: dict[int, int] = {}
        for pair in ranges:
            base, end = pair.split("-")
            swap_ends[int(base)] = int(end)
        return int(clean_offset), int(gap_limit), swap_ends
    except FileNotFoundError:
        return 0, 0, {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # Written durably by rename, so this is damage from outside: without
        # the gap limit, compacted segments would look damaged. Refuse.
        raise OSError(
            f"{path} unreadable ({exc}): cannot tell compacted segments from damage"
        ) from exc


def _write_cleaner_checkpoint(
    directory: Path, clean_offset: int, gap_limit: int, swap_ends: dict[int, int] | None = None
) -> None:
    """Durably: the gap limit, and the ranges a swap replaces, must be on
    disk before a gapped segment is."""
    path = directory / files.CLEANER_CHECKPOINT_FILE
    temp = path.with_name(path.name + files.TEMP_SUFFIX)
    ranges = "".join(f" {base}-{end}" for base, end in sorted((swap_ends or {}).items()))
    with open(temp, "w", encoding="ascii") as out:
        out.write(f"{clean_offset} {gap_limit}{ranges}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    _fsync_directory(directory)


def _read_recovery_point(directory: Path) -> int | None:
    path = directory / files.RECOVERY_POINT_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("%s unreadable (%s): recovering every segment", path, exc)
        return None
    try:
        return int(text.strip())
    except ValueError:
        logger.warning("%s holds %r, not an offset: recovering every segment", path, text[:40])
        return None


def _write_recovery_point(directory: Path, offset: int) -> None:
    # No fsync: the file is written only after the data it vouches for is
    # durable, so a lost or torn update can only make recovery do more.
    path = directory / files.RECOVERY_POINT_FILE
    temp = path.with_name(path.name + files.TEMP_SUFFIX)
    temp.write_text(f"{offset}\n", encoding="ascii")
    os.replace(temp, path)
