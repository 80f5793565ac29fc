"""One segment of a partition log: a .log file of record batches and its two indexes.

The .log file is record batches back to back, exactly as `tidelog.records`
defines them (61-byte header, then the body), with base offsets already
assigned; there is no file header and nothing between batches. Each batch
carries its own CRC32C over everything from its attributes to its end. Not
covered by any checksum: the base offset, the length and the leader epoch of
each batch (the broker patches them without recomputing the CRC). Recovery
therefore also checks that base offsets are dense and that every length
lands on the next batch, which catches damage to the first two; damage to
a leader epoch alone cannot be detected. A segment written by the cleaner
(`allow_gaps`) may have gaps between batches: there base offsets need only
increase, which still catches a base offset damaged downward.

The indexes (`index.py`) are derived from the .log and are rebuilt whenever
they look wrong or the segment is recovered.

Reads use os.pread on the .log file: the OS page cache is the cache, so the
broker's memory does not grow with the data it serves. A read also reads the
header of the batch after the ones it returns, and the segment remembers it
(`_read_ends`, a few per segment): a consumer's next read starts there with
one pread, without the index lookup and the header read before it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError
from tidelog.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    first_record_at_or_after,
    read_header,
    validate_batch,
)

from tidelog_broker.storage import files
from tidelog_broker.storage.index import (
    MAX_POSITION,
    MAX_RELATIVE_OFFSET,
    OffsetIndex,
    TimeIndex,
)

#: The largest timestamp of a segment that holds no batch.
NO_TIMESTAMP = -(2**63)

# Recovery reads the log in chunks this big, so memory stays bounded however
# large the segment is (a batch bigger than this is read alone).
_RECOVERY_CHUNK_BYTES = 4 * 1024 * 1024

_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_AT = 8
# A batch's base offset (at 0), length (at 8) and last offset delta (at 23).
_BATCH_SPAN = struct.Struct(">qi11xi")
# Read ends a segment remembers (see `_read_ends`): one per reader of the
# segment at a time is enough (a consumer, a follower); more readers only
# fall back to the index lookup and a header read.
_MAX_READ_ENDS = 16


class AppendedBatch(NamedTuple):
    """Where one batch sits in the bytes given to `LogSegment.append`, and what
    the indexes need of it (offsets as assigned, timestamp as stored)."""

    position: int
    base_offset: int
    last_offset: int
    max_timestamp: int


class SegmentRead(NamedTuple):
    """Whole batches read from a segment, and the offset after the last one.

    `records` is a memoryview when the bytes read went past the last batch
    returned (cutting them as bytes would copy them all).
    """

    records: bytes | memoryview
    next_offset: int


def _whole_batches(buf: bytes, limit_offset: int, limit_bytes: int) -> tuple[int, int]:
    """(length of the longest prefix of whole batches of `buf` that fits in
    `limit_bytes` and whose base offsets are below `limit_offset`, the offset
    after the last of them, or -1 if there is none). Reads only each header's
    offsets and length."""
    end = min(len(buf), limit_bytes)
    unpack = _BATCH_SPAN.unpack_from
    pos = 0
    next_offset = -1
    while pos + HEADER_SIZE <= end:
        base_offset, batch_length, last_offset_delta = unpack(buf, pos)
        size = batch_length + LOG_OVERHEAD
        if base_offset >= limit_offset or size < HEADER_SIZE or pos + size > end:
            break
        next_offset = base_offset + last_offset_delta + 1
        pos += size
    return pos, next_offset


def read_headers(path: Path, size: int) -> Iterator[BatchHeader]:
    """The headers of the whole batches in the first `size` bytes of a .log
    file, read through a memory map: only the pages holding headers are read.
    For what open rebuilds from a recovered log (producer state, epoch history)."""
    if size == 0:
        return  # mmap refuses an empty mapping
    with (
        open(path, "rb") as f,
        mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped,
        memoryview(mapped) as view,
    ):
        position = 0
        while position + HEADER_SIZE <= size:
            header = read_header(view, position)
            if header.size < HEADER_SIZE or position + header.size > size:
                break  # recovery has cut torn tails; be safe anyway
            yield header
            position += header.size


def close_all(segments: Iterable[LogSegment]) -> None:
    """Close the files of segments being given up (an open or a close that
    failed part-way), every one whatever fails: an OSError closing one must
    neither keep the others open nor replace the error being raised."""
    for segment in segments:
        with contextlib.suppress(OSError):
            segment.close()


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class LogSegment:
    """One `{base_offset:020d}.log` file with its `.index` and `.timeindex`.

    Appends whole batches, reads whole batches, recovers after a crash. Every
    offset in the segment is >= `base_offset` and < `next_offset`. Methods
    raise OSError (the partition log turns it into StorageError).

    Not thread-safe: one asyncio event-loop thread calls it.
    """

    def __init__(
        self, directory: Path, base_offset: int, file_suffix: str = "", allow_gaps: bool = False
    ) -> None:
        """Open (creating if missing) the three files. Use `create` or `open`.

        `file_suffix` is appended to every file name (the cleaner writes a
        segment as `.cleaned` files). `allow_gaps`: offsets may skip between
        batches (a compacted segment).
        """
        self.directory = directory
        self.base_offset = base_offset
        self.allow_gaps = allow_gaps
        self.log_path = files.segment_path(directory, base_offset, files.LOG_SUFFIX + file_suffix)
        index_path = files.segment_path(directory, base_offset, files.INDEX_SUFFIX + file_suffix)
        time_index_path = files.segment_path(
            directory, base_offset, files.TIME_INDEX_SUFFIX + file_suffix
        )
        #: False when an index file was missing (it must then be rebuilt).
        self._indexes_existed = index_path.exists() and time_index_path.exists()
        # The .log's descriptor, or -1 while released (see `_log_fd`).
        self._log_descriptor = -1
        self._closed = False
        # O_APPEND + os.write: unbuffered, every byte goes to the end; reads use
        # pread on the same descriptor.
        self._log_descriptor = os.open(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        offset_index: OffsetIndex | None = None
        try:
            offset_index = OffsetIndex(index_path, base_offset)
            self.time_index = TimeIndex(time_index_path, base_offset)
        except BaseException:
            os.close(self._log_descriptor)
            self._log_descriptor = -1
            if offset_index is not None:
                offset_index.close()
            raise
        self.offset_index = offset_index
        self._size_bytes = os.fstat(self._log_fd).st_size
        self._next_offset = base_offset
        self._max_timestamp = NO_TIMESTAMP
        # Position of the last batch given an offset-index entry (0: the first
        # batch, which needs none), and the largest timestamp in the time index.
        self._last_indexed_position = 0
        self._time_indexed_max = NO_TIMESTAMP
        #: Wall-clock ms of the first append (segment.ms counts from it); None when empty.
        self.first_append_ms: int | None = None
        self._dirty = False
        #: True when the files disagree with each other (torn tail, bad index)
        #: or a failed write could not be undone: only `recover` may follow.
        self.needs_recovery = False
        # Where earlier reads ended: offset -> position and header of the batch
        # that holds or follows it (read along with the batches returned).
        # A reader's next read starts there (and takes it): no index lookup,
        # no header read. At most _MAX_READ_ENDS, the oldest dropped first.
        # They describe bytes below the size, which appends never change;
        # whatever cuts or rewrites the .log clears them (`_forget_read_ends`).
        # A segment that compaction or retention replaces takes them along.
        self._read_ends: dict[int, tuple[int, BatchHeader]] = {}

    @property
    def _log_fd(self) -> int:
        """The .log's descriptor, opened again on demand after
        `release_descriptors`."""
        if self._log_descriptor < 0:
            if self._closed:
                raise OSError(f"{self.log_path} is closed")
            # No O_CREAT: a file removed under a released segment stays removed.
            self._log_descriptor = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
        return self._log_descriptor

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, file_suffix: str = "", allow_gaps: bool = False
    ) -> LogSegment:
        """A new, empty segment (files created; truncated if stale ones exist)."""
        segment = cls(directory, base_offset, file_suffix, allow_gaps)
        if segment._size_bytes or len(segment.offset_index) or len(segment.time_index):
            segment._truncate_at(0)
        segment._indexes_existed = True
        return segment

    @classmethod
    def open(
        cls, directory: Path, base_offset: int, now_ms: int, allow_gaps: bool = False
    ) -> LogSegment:
        """An existing segment, without checking CRCs: its indexes are loaded,
        its tail is walked from the last index entry to find `next_offset`,
        and `needs_recovery` is set if anything does not add up."""
        segment = cls(directory, base_offset, allow_gaps=allow_gaps)
        try:
            segment.needs_recovery = not segment._load_tail_state()
        except BaseException:
            # Nobody else has it: its descriptors would stay open for good.
            close_all([segment])
            raise
        if segment._size_bytes:
            # The first append's time is not on disk; restarting the segment.ms
            # clock at open may delay a roll but never rolls early on the
            # strength of a producer's timestamp.
            segment.first_append_ms = now_ms
        return segment

    # ------------------------------------------------------------------ state

    @property
    def size_bytes(self) -> int:
        """Bytes in the .log file."""
        return self._size_bytes

    @property
    def file_paths(self) -> tuple[Path, Path, Path]:
        """The .log, .index and .timeindex paths (the .log first)."""
        return (self.log_path, self.offset_index.path, self.time_index.path)

    @property
    def disk_bytes(self) -> int:
        """Bytes in all three files."""
        return self._size_bytes + self.offset_index.size_bytes + self.time_index.size_bytes

    @property
    def next_offset(self) -> int:
        """Last offset in the segment + 1 (`base_offset` when empty)."""
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch timestamp in the segment (NO_TIMESTAMP when empty)."""
        return self._max_timestamp

    def _header_or_none(self, position: int) -> BatchHeader | None:
        """The header at `position`, or None if the file holds no plausible
        batch there (short read, impossible length)."""
        raw = os.pread(self._log_fd, HEADER_SIZE, position)
        if len(raw) < HEADER_SIZE:
            return None
        header = read_header(raw)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            return None
        return header

    def _header_at(self, position: int) -> BatchHeader:
        header = self._header_or_none(position)
        if header is None or position + header.size > self._size_bytes:
            # Only damage behind the log's back gets here (a recovered segment
            # has whole batches only); refuse rather than serve garbage.
            raise OSError(errno.EIO, f"{self.log_path}: no valid batch header at {position}")
        return header

    def _load_tail_state(self) -> bool:
        """Derive next_offset and max_timestamp from the indexes and a walk of
        the batch headers after the last offset-index entry. False if the files
        are inconsistent (the state is then meaningless until `recover`)."""
        size = self._size_bytes
        offset_index = self.offset_index
        time_index = self.time_index
        if not (offset_index.intact and time_index.intact):
            return False
        if size and not self._indexes_existed:
            return False
        position = offset_index.last_position
        expected_base = offset_index.last_offset
        if len(offset_index) and (position >= size or not len(time_index)):
            # An entry must point into the log, and the first offset-index
            # entry always comes with a time-index entry.
            return False
        last_timestamp = time_index.last_timestamp
        max_timestamp = NO_TIMESTAMP if last_timestamp is None else last_timestamp
        next_offset = self.base_offset
        while position < size:
            header = self._header_or_none(position)
            if (
                header is None
                or not self._base_offset_fits(header.base_offset, expected_base)
                or position + header.size > size
                # No CRC is checked here: an end below the base would pass
                # for data older than the recovery point and escape recovery.
                or header.last_offset_delta < 0
            ):
                return False
            next_offset = header.next_offset
            expected_base = next_offset
            max_timestamp = max(max_timestamp, header.max_timestamp)
            position += header.size
        time_last = time_index.last_offset
        if time_last is not None and time_last >= next_offset:
            return False
        self._next_offset = next_offset
        self._max_timestamp = max_timestamp
        self._last_indexed_position = offset_index.last_position
        last_timestamp = time_index.last_timestamp
        self._time_indexed_max = NO_TIMESTAMP if last_timestamp is None else last_timestamp
        return True

    def _base_offset_fits(self, base_offset: int, expected: int) -> bool:
        """A batch's base offset follows the previous batch's next offset:
        exactly, or (compacted segment) anywhere after it."""
        return base_offset == expected or (self.allow_gaps and base_offset > expected)

    def _note_batch(
        self,
        position: int,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
        index_interval_bytes: int,
        offset_entries: list[tuple[int, int]],
        time_entries: list[tuple[int, int]],
    ) -> None:
        """Account for one batch at `position`; collect the index entries it earns.

        The one indexing rule, shared by append and recovery so that a rebuilt
        index is identical to the one written live.
        """
        if max_timestamp > self._max_timestamp:
            self._max_timestamp = max_timestamp
        if position - self._last_indexed_position >= max(index_interval_bytes, 1):
            offset_entries.append((base_offset, position))
            self._last_indexed_position = position
            if self._max_timestamp > self._time_indexed_max:
                time_entries.append((self._max_timestamp, last_offset))
                self._time_indexed_max = self._max_timestamp

    # ------------------------------------------------------------------ append

    def append(
        self,
        records: bytes | bytearray | memoryview,
        batches: Sequence[AppendedBatch],
        index_interval_bytes: int,
        now_ms: int,
    ) -> None:
        """Append whole batches (validated, offsets assigned) in one write.

        All or nothing: everything the indexes need is computed and packed
        before a byte is written (ValueError, nothing written, if an offset
        or position does not fit its index field); if anything fails after
        that, whatever the exception, the files and the in-memory state are
        put back as they were before the exception propagates.
        """
        if self.needs_recovery:
            raise OSError(errno.EIO, f"{self.log_path} needs recovery after a failed write")
        if not batches:
            return
        start = self._size_bytes
        last_offset = batches[-1].last_offset
        if batches[0].base_offset < self.base_offset or (
            last_offset - self.base_offset > MAX_RELATIVE_OFFSET
        ):
            raise ValueError(
                f"offsets {batches[0].base_offset} to {last_offset} do not fit in segment "
                f"{self.base_offset} (relative offsets are 0 to {MAX_RELATIVE_OFFSET})"
            )
        if start + len(records) > MAX_POSITION:
            raise ValueError(
                f"{len(records)} bytes at position {start} pass the largest position "
                f"an index entry holds ({MAX_POSITION})"
            )
        saved = (self._max_timestamp, self._last_indexed_position, self._time_indexed_max)
        index_counts = (len(self.offset_index), len(self.time_index))
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        try:
            for batch in batches:
                self._note_batch(
                    start + batch.position,
                    batch.base_offset,
                    batch.last_offset,
                    batch.max_timestamp,
                    index_interval_bytes,
                    offset_entries,
                    time_entries,
                )
            offset_data = self.offset_index.pack(offset_entries)
            time_data = self.time_index.pack(time_entries)
        except BaseException:
            self._max_timestamp, self._last_indexed_position, self._time_indexed_max = saved
            raise
        try:
            _write_all(self._log_fd, records)
            self.offset_index.append_packed(offset_entries, offset_data)
            self.time_index.append_packed(time_entries, time_data)
        except BaseException:
            # Any failure, not only OSError: bytes in the .log that the
            # indexes and the partition do not know of would be served (or
            # dropped by recovery) later.
            self._max_timestamp, self._last_indexed_position, self._time_indexed_max = saved
            self._undo_append(start, *index_counts)
            raise
        self._size_bytes = start + len(records)
        self._next_offset = last_offset + 1
        if self.first_append_ms is None:
            self.first_append_ms = now_ms
        self._dirty = True

    def _undo_append(self, log_size: int, offset_entries: int, time_entries: int) -> None:
        self._forget_read_ends()
        try:
            os.ftruncate(self._log_fd, log_size)
            self.offset_index.truncate_to_entries(offset_entries)
            self.time_index.truncate_to_entries(time_entries)
        except OSError:
            # The files now hold bytes the in-memory state does not know of.
            self.needs_recovery = True

    # ------------------------------------------------------------------ read

    def _first_batch_ending_at_or_after(self, offset: int) -> tuple[int, BatchHeader | None]:
        """Position and header of the batch that contains `offset`, or of the
        first one after it (offsets may have gaps); (size, None) if none."""
        position = self.offset_index.lookup(offset)
        size = self._size_bytes
        while position < size:
            header = self._header_at(position)
            if header.next_offset > offset:
                return position, header
            position += header.size
        return size, None

    def read(self, start_offset: int, max_bytes: int, max_offset_exclusive: int) -> SegmentRead:
        """Whole batches from the one containing `start_offset`, none whose base
        offset is >= `max_offset_exclusive`, at most `max_bytes` in all, except
        that a first batch bigger than `max_bytes` is returned whole (a consumer
        must always be able to make progress). Empty if there is nothing."""
        limit_offset = min(max_offset_exclusive, self._next_offset)
        if start_offset >= limit_offset:
            return SegmentRead(b"", start_offset)
        # Taken, not kept: a reader reading on leaves one read end behind it,
        # the next one (none at the segment's end).
        read_end = self._read_ends.pop(start_offset, None)
        if read_end is None:
            position, first = self._first_batch_ending_at_or_after(start_offset)
            if first is None:
                return SegmentRead(b"", start_offset)
        else:
            position, first = read_end
        if first.base_offset >= limit_offset:
            return SegmentRead(b"", start_offset)
        # One pread: the batches, and the header of the batch after them,
        # which is where the next read will start. Batches at or past the
        # limit (the high watermark) are cut off here, from their headers.
        limit_bytes = max(max_bytes, first.size)
        length = min(limit_bytes + HEADER_SIZE, self._size_bytes - position)
        data = os.pread(self._log_fd, length, position)
        if len(data) < length:
            raise OSError(errno.EIO, f"{self.log_path}: short read at {position}: file shrank")
        whole, next_offset = _whole_batches(data, limit_offset, limit_bytes)
        if next_offset < 0:
            raise OSError(errno.EIO, f"{self.log_path}: no whole batch at {position}")
        self._remember_read_end(next_offset, position + whole, data, whole)
        return SegmentRead(data if whole == length else memoryview(data)[:whole], next_offset)

    def _remember_read_end(self, offset: int, position: int, data: bytes, at: int) -> None:
        """Keep the header at `data[at:]` (file position `position`) for the
        next read from `offset`, if the read got it whole and it is plausible."""
        if len(data) - at < HEADER_SIZE:
            return
        header = read_header(data, at)
        if (
            header.batch_length < HEADER_SIZE - LOG_OVERHEAD
            or position + header.size > self._size_bytes
            or header.base_offset < offset
        ):
            return  # damage: the next read goes the long way and reports it
        read_ends = self._read_ends
        if offset not in read_ends and len(read_ends) >= _MAX_READ_ENDS:
            del read_ends[next(iter(read_ends))]  # the oldest
        read_ends[offset] = (position, header)

    def _forget_read_ends(self) -> None:
        self._read_ends.clear()

    def find_offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is >=
        `timestamp_ms`, or None. Reads only the batches whose max timestamp
        reaches it, and of those only the timestamp column (after the checks
        a decode makes): no record is built."""
        if self._max_timestamp < timestamp_ms:
            return None
        position = self.offset_index.lookup(self.time_index.scan_start(timestamp_ms))
        size = self._size_bytes
        while position < size:
            header = self._header_at(position)
            if header.max_timestamp >= timestamp_ms:
                body_bytes = header.size - HEADER_SIZE
                body = os.pread(self._log_fd, body_bytes, position + HEADER_SIZE)
                if len(body) < body_bytes:
                    raise OSError(errno.EIO, f"{self.log_path}: short read at {position}")
                found = first_record_at_or_after(header, body, timestamp_ms)
                if found is not None:
                    return found
            position += header.size
        return None

    # ------------------------------------------------------------------ recovery

    def recover(self, max_batch_bytes: int | None, index_interval_bytes: int) -> int:
        """Check every batch (CRC32C, dense or with `allow_gaps` increasing
        offsets), rebuild both indexes, and
        cut the .log after the last good batch. Returns the bytes dropped.

        A batch longer than `max_batch_bytes` (None: no limit) counts as damage.
        """
        file_size = os.fstat(self._log_fd).st_size
        self._forget_read_ends()
        self._next_offset = self.base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._last_indexed_position = 0
        self._time_indexed_max = NO_TIMESTAMP
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        chunk = b""
        chunk_start = 0
        position = 0
        while position < file_size:
            at = position - chunk_start
            available = len(chunk) - at
            need = HEADER_SIZE
            if available >= LOG_OVERHEAD:
                batch_length = _BATCH_LENGTH.unpack_from(chunk, at + _BATCH_LENGTH_AT)[0]
                need = max(need, batch_length + LOG_OVERHEAD)
            if available < need:
                # Refill from this batch on; a batch over the limit is not read
                # whole (validate_batch rejects it from its header).
                want = max(_RECOVERY_CHUNK_BYTES, min(need, max_batch_bytes or need))
                chunk = os.pread(self._log_fd, min(want, file_size - position), position)
                chunk_start = position
                at = 0
            try:
                header = validate_batch(chunk, at, max_batch_bytes)
            except (InvalidRecordError, CorruptRecordError, MessageTooLargeError):
                break
            if (
                not self._base_offset_fits(header.base_offset, self._next_offset)
                or header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET
            ):
                break
            self._note_batch(
                position,
                header.base_offset,
                header.last_offset,
                header.max_timestamp,
                index_interval_bytes,
                offset_entries,
                time_entries,
            )
            self._next_offset = header.next_offset
            position += header.size
        if position < file_size:
            os.ftruncate(self._log_fd, position)
        self._size_bytes = position
        self.offset_index.rewrite(offset_entries)
        self.time_index.rewrite(time_entries)
        self._indexes_existed = True
        self.needs_recovery = False
        if position == 0:
            self.first_append_ms = None
        self._dirty = True
        return file_size - position

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> int:
        """Drop the batch containing `offset` and everything after it; returns
        the bytes dropped. A batch is never split, so the segment may end below
        `offset`."""
        position, header = self._first_batch_ending_at_or_after(offset)
        if header is None:
            return 0
        dropped = self._size_bytes - position
        self._truncate_at(position)
        return dropped

    def _truncate_at(self, position: int) -> None:
        """Cut the .log at a batch boundary and bring the indexes and state along."""
        # First: the batches read ends point at may be gone even if this fails.
        self._forget_read_ends()
        os.ftruncate(self._log_fd, position)
        self._size_bytes = position
        self._dirty = True
        offset_index = self.offset_index
        offset_index.truncate_to_entries(offset_index.count_below_position(position))
        if position == 0:
            self.time_index.truncate_to_entries(0)
            self._next_offset = self.base_offset
            self._max_timestamp = NO_TIMESTAMP
            self._last_indexed_position = 0
            self._time_indexed_max = NO_TIMESTAMP
            self.first_append_ms = None
            return
        # Time entries name the last offset of a batch: find where the log now
        # ends (a walk from the last offset-index entry), drop entries past it,
        # then derive the state as `open` does.
        walk = offset_index.last_position
        next_offset = offset_index.last_offset
        while walk < position:
            header = self._header_at(walk)
            next_offset = header.next_offset
            walk += header.size
        self.time_index.truncate_to_entries(self.time_index.count_below_offset(next_offset))
        if not self._load_tail_state():
            self.needs_recovery = True

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """fsync the .log and both indexes, if anything changed since the last flush."""
        if self._dirty:
            os.fsync(self._log_fd)
            self.offset_index.flush()
            self.time_index.flush()
            self._dirty = False

    def release_descriptors(self) -> None:
        """Close the three files until a read or write needs one again.

        For segments that are not the active one (Kafka opens closed
        segments' indexes lazily too): a broker holds descriptors for its
        active segments and for what is being read, not three per segment
        on disk. Unflushed writes stay owed (`_dirty`): `flush` opens the
        file again, and fsync of a file flushes every dirty page of it,
        whichever descriptor wrote them (Linux reports a writeback error not
        yet seen to the next fsync, also through a descriptor opened later).
        """
        if self._log_descriptor >= 0:
            os.close(self._log_descriptor)
            self._log_descriptor = -1
        self.offset_index.release()
        self.time_index.release()

    def close(self) -> None:
        self._closed = True
        if self._log_descriptor >= 0:
            os.close(self._log_descriptor)
            self._log_descriptor = -1
        self.offset_index.close()
        self.time_index.close()

    def delete(self) -> None:
        """Close and remove all three files."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    def __repr__(self) -> str:
        return (
            f"LogSegment(base_offset={self.base_offset}, next_offset={self._next_offset}, "
            f"size_bytes={self._size_bytes})"
        )
