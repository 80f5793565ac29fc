"""Log compaction: keep the latest record of each key in a log's closed segments.

The cleaner works in two passes over a snapshot of plain data (`CleanPlan`,
built by `PartitionLog.plan_cleaning` on the event loop):

1. Offset map: read the dirty part of the log (from the clean offset to the
   first uncleanable offset) and remember, per key, the latest offset. Keys
   are stored as 16-byte BLAKE2b digests and the number of entries is bounded
   (`log.cleaner.dedupe.buffer.size` / `MAP_ENTRY_BYTES`): when the map is
   full the pass stops at a batch boundary (`map_end`), and the rest waits
   for the next round.
2. Rewrite: every segment from the log start up to the one holding `map_end`
   is rewritten, in groups of consecutive segments that together fit in
   `segment.bytes`, into one `.cleaned` segment per group (named by the
   group's first base offset, written with `LogSegment` so its indexes follow
   the one indexing rule, then fsynced). A record below `map_end` is dropped
   when the map holds a later offset for its key, or when it is a tombstone
   (null value) whose timestamp is older than `delete_horizon_ms`. Records
   keep their offsets (`encode_batch(offset_deltas=...)`, so gaps appear) and
   their order; a batch that loses no record is copied byte for byte, one
   that loses all of them disappears.

The swap of the cleaned segments into the log, and its crash safety, belong
to `PartitionLog.finish_cleaning`, on the event loop.

Thread-safety: `clean` runs in a worker thread (asyncio.to_thread). It reads
segment files through its own descriptors, opened by path, and never touches
an object the event loop uses: a segment deleted or truncated meanwhile makes
the round fail (StaleSnapshotError) or be discarded at the swap, never
corrupt the log. Records without a key are kept as they are (a compacted
topic refuses them on produce; older data may still hold some).

Stopping a round from the event loop: `cancel` (the broker closing) stops it
at its next batch, and it removes the `.cleaned` files it wrote. A
`DirectoryGuard` revoked (its log closed or deleted) stops it at its next
batch too, and from then on it opens, creates and unlinks nothing by path:
the directory's name may already be renamed aside for deletion (the sweep
removes it, with the round's files, and must not meet a second remover), or
be a new incarnation's of the topic, whose files the old round would read
and write as its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

from tidelog.records import HEADER_SIZE, BatchHeader, decode_body, encode_batch, validate_batch

from tidelog_broker.storage import files
from tidelog_broker.storage.index import MAX_RELATIVE_OFFSET
from tidelog_broker.storage.segment import AppendedBatch, LogSegment

logger = logging.getLogger("tidelog.broker.cleaner")

#: What one offset-map entry costs in this process: a dict slot, a 16-byte
#: bytes object and an int, measured with tracemalloc (~133 B) and rounded up.
#: Kafka counts 24 B (hash + offset in a flat array); Python objects cost more.
MAP_ENTRY_BYTES = 144

# The cleaner reads and writes in chunks this big, so its buffers stay small
# however large a segment is (a batch bigger than this is read alone).
_IO_CHUNK_BYTES = 1024 * 1024


class CleanerCancelledError(Exception):
    """The round was cancelled: the broker is closing (`cancel`), or its log
    was closed or deleted (`DirectoryGuard.revoke`)."""


class DirectoryGuard:
    """A round's leave to use its log's directory by path, which the log's
    close or deletion revokes, on the event loop, before the directory is
    renamed aside (or the log opened again). The round opens, creates and
    unlinks files only under it (`_path_access`), so once `revoke` returns
    it touches nothing there by path any more; it stops at its next batch,
    leaving the `.cleaned` files it wrote (their descriptors followed a
    rename) to whoever takes the directory: the deletion's sweep, or the
    log's next open, which removes leftover `.cleaned` files."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._revoked = False

    def revoke(self) -> None:
        """Withdraw the leave. Waits for a file operation under way (a few
        opens or unlinks, never a batch)."""
        with self._lock:
            self._revoked = True

    @property
    def revoked(self) -> bool:
        return self._revoked

    @contextmanager
    def _path_access(self) -> Iterator[bool]:
        """Whether the round may still use the directory by path; while
        this holds, `revoke` waits."""
        with self._lock:
            yield not self._revoked


def _revoked_error() -> CleanerCancelledError:
    return CleanerCancelledError("cancelled: the log was closed or deleted")


@contextmanager
def _require_path_access(guard: DirectoryGuard) -> Iterator[None]:
    with guard._path_access() as allowed:
        if not allowed:
            raise _revoked_error()
        yield


class StaleSnapshotError(Exception):
    """A segment of the plan changed under the cleaner; try again next round."""


@dataclass(frozen=True, slots=True)
class SegmentSnapshot:
    """A closed segment as the plan saw it: immutable plain data."""

    base_offset: int
    log_path: Path
    size_bytes: int
    #: Base offset of the segment after it (the end of its offset range).
    end_offset: int


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """Everything one cleaning round of one log needs, copied from the log."""

    directory: Path
    name: str
    #: Closed segments from the log start up to the first uncleanable offset.
    segments: tuple[SegmentSnapshot, ...]
    #: First dirty offset: the map starts here.
    clean_offset: int
    #: First uncleanable offset (active segment, min.compaction.lag.ms).
    end_offset: int
    #: Bound on the offset map (log.cleaner.dedupe.buffer.size).
    max_map_entries: int
    #: Tombstones whose timestamp is below this are removed (now - delete.retention.ms).
    delete_horizon_ms: int
    segment_bytes: int
    index_interval_bytes: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One `.cleaned` segment and the segments it replaces."""

    base_offset: int
    #: Base offsets of the segments it replaces (the first is `base_offset`).
    replaces: tuple[int, ...]
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What a round produced; `PartitionLog.finish_cleaning` swaps it in."""

    groups: tuple[CleanedGroup, ...]
    #: The new clean offset: everything below it is deduplicated.
    clean_offset: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_removed: int
    map_entries: int
    elapsed_s: float


def key_digest(key: bytes) -> bytes:
    """The offset map's key: 16 bytes of BLAKE2b (collisions: ~2^-64 per pair)."""
    return blake2b(key, digest_size=16).digest()


def _batches(
    snapshot: SegmentSnapshot, fd: int, cancel: threading.Event | None, guard: DirectoryGuard
) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, whole batch bytes) of every batch of a segment, CRC-checked."""
    size = snapshot.size_bytes
    position = 0
    chunk = b""
    chunk_start = 0
    while position < size:
        if cancel is not None and cancel.is_set():
            raise CleanerCancelledError("cancelled")
        if guard.revoked:
            raise _revoked_error()
        at = position - chunk_start
        if len(chunk) - at < HEADER_SIZE:
            chunk = os.pread(fd, min(_IO_CHUNK_BYTES, size - position), position)
            chunk_start, at = position, 0
            if len(chunk) < HEADER_SIZE:
                raise StaleSnapshotError(f"{snapshot.log_path} shrank under the cleaner")
        length = int.from_bytes(chunk[at + 8 : at + 12], "big", signed=True) + 12
        if len(chunk) - at < length:
            chunk = os.pread(fd, min(max(_IO_CHUNK_BYTES, length), size - position), position)
            chunk_start, at = position, 0
        try:
            header = validate_batch(chunk, at)
        except Exception as exc:
            raise StaleSnapshotError(f"{snapshot.log_path} at {position}: {exc}") from exc
        yield header, chunk[at : at + header.size]
        position += header.size


def _open_snapshot(snapshot: SegmentSnapshot, guard: DirectoryGuard) -> int:
    try:
        with _require_path_access(guard):
            return os.open(snapshot.log_path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise StaleSnapshotError(
            f"{snapshot.log_path} is gone since the round was planned: removed from the log "
            "(by retention, DeleteRecords or a truncation), or its directory deleted or moved"
        ) from exc


def build_offset_map(
    plan: CleanPlan, cancel: threading.Event | None = None, guard: DirectoryGuard | None = None
) -> tuple[dict[bytes, int], int, int]:
    """(key digest -> latest offset, map_end, bytes read) over the dirty part.

    `map_end` is the first offset not mapped: `plan.end_offset` when all of
    the dirty part fit, else the base offset of the first batch that did not.
    """
    guard = DirectoryGuard() if guard is None else guard
    offset_map: dict[bytes, int] = {}
    bytes_read = 0
    for snapshot in plan.segments:
        if snapshot.end_offset <= plan.clean_offset:
            continue
        if snapshot.base_offset >= plan.end_offset:
            break
        fd = _open_snapshot(snapshot, guard)
        try:
            for header, raw in _batches(snapshot, fd, cancel, guard):
                if header.next_offset <= plan.clean_offset:
                    continue
                if len(offset_map) + header.record_count > plan.max_map_entries:
                    return offset_map, header.base_offset, bytes_read
                bytes_read += len(raw)
                batch = decode_body(header, raw[HEADER_SIZE:])
                for offset, key in zip(batch.offsets, batch.keys, strict=True):
                    if key is not None:
                        offset_map[key_digest(key)] = offset
        finally:
            os.close(fd)
    return offset_map, plan.end_offset, bytes_read


def _groups(segments: list[SegmentSnapshot], segment_bytes: int) -> list[list[SegmentSnapshot]]:
    """Consecutive segments that fit in one: sizes within segment.bytes and
    offsets within what a segment's relative offsets can hold."""
    groups: list[list[SegmentSnapshot]] = []
    for snapshot in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size_bytes for s in group) + snapshot.size_bytes
            span = snapshot.end_offset - group[0].base_offset
            if size <= segment_bytes and span <= MAX_RELATIVE_OFFSET:
                group.append(snapshot)
                continue
        groups.append([snapshot])
    return groups


class _Stats:
    def __init__(self) -> None:
        self.bytes_read = 0
        self.bytes_written = 0
        self.records_read = 0
        self.records_removed = 0


def _clean_batch(
    header: BatchHeader,
    raw: bytes,
    offset_map: dict[bytes, int],
    map_end: int,
    delete_horizon_ms: int,
    stats: _Stats,
) -> bytes | None:
    """The batch with superseded records and expired tombstones removed:
    `raw` itself when nothing goes, None when everything does."""
    stats.records_read += header.record_count
    if header.base_offset >= map_end:
        return raw
    batch = decode_body(header, raw[HEADER_SIZE:])
    keep: list[int] = []
    for i, (offset, key, value, timestamp) in enumerate(
        zip(batch.offsets, batch.keys, batch.values, batch.timestamps, strict=True)
    ):
        if offset >= map_end or key is None:
            keep.append(i)
            continue
        latest = offset_map.get(key_digest(key))
        if latest is not None and offset < latest:
            continue
        if value is None and timestamp < delete_horizon_ms:
            continue
        keep.append(i)
    removed = header.record_count - len(keep)
    stats.records_removed += removed
    if not removed:
        return raw
    if not keep:
        return None
    timestamps = [batch.timestamps[i] for i in keep]
    return encode_batch(
        [batch.values[i] for i in keep],
        keys=[batch.keys[i] for i in keep],
        timestamps=timestamps if min(timestamps) != max(timestamps) else None,
        base_timestamp=timestamps[0],
        headers=[batch.headers[i] for i in keep] if batch.headers else None,
        offset_deltas=[batch.offsets[i] - header.base_offset for i in keep],
        codec=header.compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        timestamp_type=header.timestamp_type,
    )


def _write_group(
    plan: CleanPlan,
    group: list[SegmentSnapshot],
    offset_map: dict[bytes, int],
    map_end: int,
    stats: _Stats,
    cancel: threading.Event | None,
    guard: DirectoryGuard,
) -> CleanedGroup:
    with _require_path_access(guard):
        out = LogSegment.create(
            plan.directory, group[0].base_offset, files.CLEANED_SUFFIX, allow_gaps=True
        )
    try:
        pending = bytearray()
        placed: list[AppendedBatch] = []

        def flush_pending() -> None:
            if placed:
                out.append(pending, placed, plan.index_interval_bytes, plan.now_ms)
                pending.clear()
                placed.clear()

        for snapshot in group:
            fd = _open_snapshot(snapshot, guard)
            try:
                for header, raw in _batches(snapshot, fd, cancel, guard):
                    stats.bytes_read += len(raw)
                    cleaned = _clean_batch(
                        header, raw, offset_map, map_end, plan.delete_horizon_ms, stats
                    )
                    if cleaned is None:
                        continue
                    new_header = header if cleaned is raw else validate_batch(cleaned)
                    placed.append(
                        AppendedBatch(
                            len(pending),
                            new_header.base_offset,
                            new_header.last_offset,
                            new_header.max_timestamp,
                        )
                    )
                    pending += cleaned
                    if len(pending) >= _IO_CHUNK_BYTES:
                        flush_pending()
            finally:
                os.close(fd)
        flush_pending()
        out.flush()
        stats.bytes_written += out.size_bytes
        return CleanedGroup(
            group[0].base_offset, tuple(s.base_offset for s in group), out.size_bytes
        )
    finally:
        out.close()


def discard_cleaned(directory: Path, base_offsets: list[int]) -> None:
    """Remove the `.cleaned` files of these groups (a round that failed)."""
    for base_offset in base_offsets:
        for suffix in files.SEGMENT_SUFFIXES:
            path = files.segment_path(directory, base_offset, suffix + files.CLEANED_SUFFIX)
            path.unlink(missing_ok=True)


def _discard_written(plan: CleanPlan, written: list[int], guard: DirectoryGuard) -> None:
    """Remove the `.cleaned` files of a failed round, group by group, while
    the guard lets it (see `DirectoryGuard`: after a revoke they are the
    directory's next owner's to remove)."""
    for base_offset in written:
        with guard._path_access() as allowed:
            if not allowed:
                return
            discard_cleaned(plan.directory, [base_offset])


def clean(
    plan: CleanPlan, cancel: threading.Event | None = None, guard: DirectoryGuard | None = None
) -> CleanResult | None:
    """Run one round: map the dirty part, write `.cleaned` segments, fsynced.

    None when the map could not hold even one batch (raise
    log.cleaner.dedupe.buffer.size). Raises CleanerCancelledError,
    StaleSnapshotError, or OSError; no `.cleaned` file is left behind then,
    unless `guard` was revoked (see `DirectoryGuard`).
    """
    guard = DirectoryGuard() if guard is None else guard
    started = time.monotonic()
    offset_map, map_end, map_bytes = build_offset_map(plan, cancel, guard)
    if map_end <= plan.clean_offset:
        logger.warning(
            "%s: the cleaner's offset map (%d entries) cannot hold the batch at offset %d; "
            "raise log.cleaner.dedupe.buffer.size",
            plan.name,
            plan.max_map_entries,
            map_end,
        )
        return None
    to_clean = [s for s in plan.segments if s.base_offset < map_end]
    stats = _Stats()
    written: list[int] = []
    groups: list[CleanedGroup] = []
    try:
        for group in _groups(to_clean, plan.segment_bytes):
            written.append(group[0].base_offset)
            groups.append(_write_group(plan, group, offset_map, map_end, stats, cancel, guard))
    except BaseException:
        _discard_written(plan, written, guard)
        raise
    return CleanResult(
        groups=tuple(groups),
        clean_offset=map_end,
        bytes_read=stats.bytes_read + map_bytes,
        bytes_written=stats.bytes_written,
        records_read=stats.records_read,
        records_removed=stats.records_removed,
        map_entries=len(offset_map),
        elapsed_s=time.monotonic() - started,
    )


__all__ = [
    "MAP_ENTRY_BYTES",
    "CleanPlan",
    "CleanResult",
    "CleanedGroup",
    "CleanerCancelledError",
    "DirectoryGuard",
    "SegmentSnapshot",
    "StaleSnapshotError",
    "build_offset_map",
    "clean",
    "discard_cleaned",
    "key_digest",
]
