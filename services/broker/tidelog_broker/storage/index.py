"""The two sparse indexes of a segment: offset -> position and time -> offset.

Both are derived data: every entry can be recomputed from the segment's .log
file, so neither file carries a checksum or a header. A file that fails the
checks in `open` (size not a whole number of entries, entries not strictly
increasing) is reported through `intact` and rebuilt by segment recovery.

Each index is kept in memory as two `array`s searched with `bisect`, and
every new entry is also appended to the file. The file is never mmap'd:
mapped pages count toward the broker's RSS, which must stay small however
much data it serves.

Neither class is thread-safe: one asyncio event-loop thread uses them.
Methods raise OSError; the partition log turns it into StorageError.
"""

from __future__ import annotations

import operator
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

#: Largest relative offset an entry can hold (uint32).
MAX_RELATIVE_OFFSET = 0xFFFFFFFF
#: Largest .log position an offset-index entry can hold (uint32).
MAX_POSITION = 0xFFFFFFFF


def _strictly_increasing(values: array) -> bool:
    # map/all run in C: ~20 ns per entry, so checking a full index at open is cheap.
    return all(map(operator.lt, values, islice(values, 1, None)))


class _SparseIndex:
    """An append-only file of fixed-size (key, value) entries, both strictly
    increasing, mirrored in memory as two arrays."""

    _ENTRY: struct.Struct
    _KEY_TYPECODE: str
    _VALUE_TYPECODE: str

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._keys = array(self._KEY_TYPECODE)
        self._values = array(self._VALUE_TYPECODE)
        #: False when the file on disk was malformed; the arrays are then empty
        #: and the owner must rebuild the index from the log.
        self.intact = True
        self._dirty = False
        # The descriptor, or -1 while released (see `_fd`); _closed: for good.
        self._descriptor = -1
        self._closed = False
        # O_APPEND: each entry lands at the end without tracking a file position.
        self._descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    @property
    def _fd(self) -> int:
        """The file's descriptor, opened again on demand after `release`:
        lookups use the in-memory arrays, so an index that is not written
        holds no descriptor (a broker with many partitions would otherwise
        hold two per segment, issue 16 item 7)."""
        if self._descriptor < 0:
            if self._closed:
                raise OSError(f"{self.path} is closed")
            # No O_CREAT: a file removed under a released index stays removed.
            self._descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND)
        return self._descriptor

    def release(self) -> None:
        """Close the descriptor until the next write or flush needs it (an
        unflushed index stays `_dirty`: its flush opens the file again)."""
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1

    def _load(self) -> None:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        entry_size = self._ENTRY.size
        if len(data) % entry_size:
            self.intact = False
            return
        keys = array(self._KEY_TYPECODE)
        values = array(self._VALUE_TYPECODE)
        for key, value in self._ENTRY.iter_unpack(data):
            keys.append(key)
            values.append(value)
        if not (_strictly_increasing(keys) and _strictly_increasing(values)):
            self.intact = False
            return
        self._keys = keys
        self._values = values

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def size_bytes(self) -> int:
        return len(self._keys) * self._ENTRY.size

    def _pack(self, entries: Sequence[tuple[int, int]]) -> bytes:
        """Entries (already relative) as file bytes; ValueError, with nothing
        changed, if one does not fit its field or does not increase."""
        if not entries:
            return b""
        keys = self._keys
        previous = (keys[-1], self._values[-1]) if keys else None
        for key, value in entries:
            if previous is not None and (key <= previous[0] or value <= previous[1]):
                raise ValueError(
                    f"{self.path}: entry ({key}, {value}) does not follow ({previous[0]}, "
                    f"{previous[1]}): both columns must strictly increase"
                )
            previous = (key, value)
        pack = self._ENTRY.pack
        try:
            return b"".join([pack(key, value) for key, value in entries])
        except struct.error as exc:
            raise ValueError(f"{self.path}: an entry does not fit its field: {exc}") from exc

    def _append_packed(self, entries: Sequence[tuple[int, int]], data: bytes) -> None:
        """Write what `_pack` made of `entries` in one write, then remember them."""
        if not entries:
            return
        written = os.write(self._fd, data)
        if written != len(data):
            # A short write on a regular file means the disk is full: drop the
            # partial entry so the file stays a whole number of entries.
            os.ftruncate(self._fd, self.size_bytes)
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        for key, value in entries:
            self._keys.append(key)
            self._values.append(value)
        self._dirty = True

    def _append(self, entries: Sequence[tuple[int, int]]) -> None:
        """Write entries (already relative) in one write, then remember them."""
        self._append_packed(entries, self._pack(entries))

    def truncate_to_entries(self, count: int) -> None:
        """Keep only the first `count` entries."""
        if count >= len(self._keys):
            return
        os.ftruncate(self._fd, count * self._ENTRY.size)
        del self._keys[count:]
        del self._values[count:]
        self._dirty = True

    def _rewrite(self, entries: Sequence[tuple[int, int]]) -> None:
        """Replace every entry (recovery rebuilds an index this way)."""
        os.ftruncate(self._fd, 0)
        self._keys = array(self._KEY_TYPECODE)
        self._values = array(self._VALUE_TYPECODE)
        self.intact = True
        self._append(entries)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        self._closed = True
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class OffsetIndex(_SparseIndex):
    """Maps a batch's base offset to its byte position in the segment's .log.

    One entry per `index.interval.bytes` of log (the segment decides when), so a
    read finds the nearest entry at or below its offset and scans batch headers
    from there. File format (.index), entries back to back, big-endian::

        offset size field
        0      4    relative_offset  uint32  batch base offset - segment base offset
        4      4    position         uint32  byte position of that batch in the .log

    8 bytes per entry; no header, no checksum (derived data, see the module).
    """

    ENTRY_SIZE = 8
    _ENTRY = struct.Struct(">II")
    _KEY_TYPECODE = "I"
    _VALUE_TYPECODE = "I"

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch whose base offset is <= `offset`
        (0, the segment's first batch, when there is none)."""
        i = bisect_right(self._keys, offset - self.base_offset) - 1
        return self._values[i] if i >= 0 else 0

    @property
    def last_position(self) -> int:
        """Position of the last indexed batch (0 when empty: the first batch)."""
        return self._values[-1] if self._values else 0

    @property
    def last_offset(self) -> int:
        """Base offset of the last indexed batch (the segment base when empty)."""
        return self.base_offset + (self._keys[-1] if self._keys else 0)

    def append(self, entries: Sequence[tuple[int, int]]) -> None:
        """Add (base offset, position) entries, each above the last one."""
        base = self.base_offset
        self._append([(offset - base, position) for offset, position in entries])

    def pack(self, entries: Sequence[tuple[int, int]]) -> bytes:
        """(base offset, position) entries as file bytes, checked: ValueError
        if one does not fit or does not increase (nothing is changed)."""
        base = self.base_offset
        return self._pack([(offset - base, position) for offset, position in entries])

    def append_packed(self, entries: Sequence[tuple[int, int]], data: bytes) -> None:
        """Append entries already checked by `pack` (`data` is what it returned)."""
        base = self.base_offset
        self._append_packed([(offset - base, position) for offset, position in entries], data)

    def count_below_position(self, position: int) -> int:
        """How many entries point before `position`."""
        return bisect_left(self._values, position)

    def rewrite(self, entries: Sequence[tuple[int, int]]) -> None:
        base = self.base_offset
        self._rewrite([(offset - base, position) for offset, position in entries])

    def entries(self) -> list[tuple[int, int]]:
        """(base offset, position) pairs, for tests and tools."""
        base = self.base_offset
        return [(base + key, value) for key, value in zip(self._keys, self._values, strict=True)]


class TimeIndex(_SparseIndex):
    """Maps a timestamp to an offset: the log's largest timestamp so far and the
    last offset of the batch where it was reached.

    An entry (T, O) promises that every record at an offset <= O has a
    timestamp <= T. Entries are added only when the largest timestamp grows,
    at the same points as offset-index entries, so both columns strictly
    increase. File format (.timeindex), entries back to back, big-endian::

        offset size field
        0      8    timestamp        int64   ms since the epoch
        8      4    relative_offset  uint32  offset - segment base offset

    12 bytes per entry; no header, no checksum (derived data, see the module).
    """

    ENTRY_SIZE = 12
    _ENTRY = struct.Struct(">qI")
    _KEY_TYPECODE = "q"
    _VALUE_TYPECODE = "I"

    def scan_start(self, timestamp_ms: int) -> int:
        """Offset from which to scan for the first record with a timestamp >=
        `timestamp_ms`: the offset of the last entry older than it (every record
        up to there is older), or the segment's base offset."""
        # The first entry >= the target bounds where the record is; the one
        # before it is where a scan may start without missing it.
        i = bisect_left(self._keys, timestamp_ms) - 1
        return self.base_offset + (self._values[i] if i >= 0 else 0)

    @property
    def last_timestamp(self) -> int | None:
        return self._keys[-1] if self._keys else None

    @property
    def last_offset(self) -> int | None:
        return self.base_offset + self._values[-1] if self._values else None

    def append(self, entries: Sequence[tuple[int, int]]) -> None:
        """Add (timestamp, offset) entries, each above the last one."""
        base = self.base_offset
        self._append([(timestamp, offset - base) for timestamp, offset in entries])

    def pack(self, entries: Sequence[tuple[int, int]]) -> bytes:
        """(timestamp, offset) entries as file bytes, checked: ValueError if
        one does not fit or does not increase (nothing is changed)."""
        base = self.base_offset
        return self._pack([(timestamp, offset - base) for timestamp, offset in entries])

    def append_packed(self, entries: Sequence[tuple[int, int]], data: bytes) -> None:
        """Append entries already checked by `pack` (`data` is what it returned)."""
        base = self.base_offset
        self._append_packed([(timestamp, offset - base) for timestamp, offset in entries], data)

    def count_below_offset(self, offset: int) -> int:
        """How many entries have an offset below `offset`."""
        return bisect_left(self._values, offset - self.base_offset)

    def rewrite(self, entries: Sequence[tuple[int, int]]) -> None:
        base = self.base_offset
        self._rewrite([(timestamp, offset - base) for timestamp, offset in entries])

    def entries(self) -> list[tuple[int, int]]:
        """(timestamp, offset) pairs, for tests and tools."""
        base = self.base_offset
        return [(key, base + value) for key, value in zip(self._keys, self._values, strict=True)]
