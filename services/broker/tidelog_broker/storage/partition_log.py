"""The log of one partition: a directory of segments, the recovery point, flushing.

Directory layout and file names: see `files.py`. Besides the segments, the
directory holds two small files, both advisory:

- `recovery-point`: the offset below which every byte has been fsynced, as
  ASCII decimal and a newline. Written after the fsyncs it vouches for, by
  rename, without an fsync of its own: a stale or unreadable file only makes
  the next open recover more than it had to.
- `clean-shutdown`: empty; written by `close` after everything is flushed and
  removed (durably) by the next `open` before anything is written.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import OffsetOutOfRangeError, StorageError
from tidelog.records import BatchHeader, set_base_offset, set_log_append_time

from tidelog_broker.storage import files
from tidelog_broker.storage.clock import SYSTEM_CLOCK, Clock
from tidelog_broker.storage.config import LogConfig
from tidelog_broker.storage.index import MAX_RELATIVE_OFFSET, OffsetIndex, TimeIndex
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

    Offsets are dense and assigned here; batches are stored and served as
    bytes, never decoded (except to answer `offset_for_timestamp`).

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
        now_ms = clock.time_ms()
        segments = [
            LogSegment.open(directory, base_offset, now_ms)
            for base_offset in _segment_base_offsets(directory)
        ]
        if not segments:
            segments = [LogSegment.create(directory, 0)]
        log = cls(directory, topic, partition, config, clock, segments, 0)
        trust_all = clean_shutdown and recovery_point is not None
        log._recover(-1 if recovery_point is None else recovery_point, trust_all)
        return log

    def _recover(self, recovery_point: int, trust_all: bool) -> None:
        """Recover the segments that need it; drop every segment after damage."""
        kept: list[LogSegment] = []
        damaged_at: int | None = None
        for segment in self._segments:
            if damaged_at is not None:
                segment.delete()
                continue
            if kept and kept[-1].next_offset != segment.base_offset:
                # Offsets are dense (no compaction yet), so a hole means the
                # previous segment lost its tail.
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
        self._recovery_point = max(
            self.log_start_offset, min(max(recovery_point, 0), self.log_end_offset)
        )

    # ------------------------------------------------------------------ state

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        """Apply new settings from the next append on."""
        self._config = config

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

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

    def append(self, records: bytearray, batches: list[tuple[int, BatchHeader]]) -> AppendInfo:
        """Assign offsets to validated batches, stamp them, and append them.

        `batches` is what `tidelog.records.iter_batches(records)` returned; the
        base offsets (and under LogAppendTime the timestamps) are patched in
        `records` in place.
        """
        if not batches:
            raise ValueError("append needs at least one batch")
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
        self._segments.append(LogSegment.create(self.directory, base_offset))
        self._base_offsets.append(base_offset)
        self._directory_dirty = True

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
                    if found is not None:
                        return found
        return None

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
        if self._directory_dirty:
            _fsync_directory(self.directory)
            self._directory_dirty = False
        self._unflushed_records = 0
        self._first_unflushed_monotonic_ms = None
        if log_end_offset != self._recovery_point:
            self._recovery_point = log_end_offset
            _write_recovery_point(self.directory, log_end_offset)

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
            self._recovery_point = min(self._recovery_point, self.log_end_offset)
            _write_recovery_point(self.directory, self._recovery_point)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Flush, close every file, and mark the shutdown as clean."""
        if self._closed:
            return
        with _storage_errors(f"closing {self.name}"):
            self._flush()
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


def _segment_base_offsets(directory: Path) -> list[int]:
    """Base offsets of the segments in `directory`, sorted. Index files without
    a .log and leftover temporary files are removed (they can only come from a
    crash mid-roll or mid-deletion)."""
    logs: set[int] = set()
    indexes: list[tuple[int, Path]] = []
    for entry in os.scandir(directory):
        if entry.name.endswith(files.TEMP_SUFFIX):
            os.unlink(entry.path)
            continue
        parsed = files.parse_segment_file_name(entry.name)
        if parsed is None:
            continue
        base_offset, suffix = parsed
        if suffix == files.LOG_SUFFIX:
            logs.add(base_offset)
        else:
            indexes.append((base_offset, Path(entry.path)))
    for base_offset, path in indexes:
        if base_offset not in logs:
            path.unlink()
    return sorted(logs)


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
