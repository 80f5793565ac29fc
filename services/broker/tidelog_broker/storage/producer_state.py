"""Idempotent producers' state of one partition, and its snapshots.

An idempotent producer stamps every batch with its producer id, its epoch and
the sequence number of the batch's first record (per partition, counting
records, wrapping from 2^31-1 to 0 as Kafka's do). For each producer id the
partition remembers the epoch and the last `BATCHES_KEPT` batches it wrote
(first and last sequence, first and last offset): five, because a producer
has at most five requests in flight, so a retry can only repeat one of those.
On append (`check`, before anything is written; then `update`):

- producer_id < 0: not idempotent; nothing is checked;
- epoch older than the producer's: INVALID_PRODUCER_EPOCH (a newer instance
  with the same id fenced this one; not retriable);
- epoch newer (or an unknown producer id): only base_sequence 0 starts it,
  anything else is OUT_OF_ORDER_SEQUENCE_NUMBER; and the epoch must have
  been handed out by InitProducerId (`highest_epoch`, given by the broker),
  else INVALID_PRODUCER_EPOCH: epochs move only through InitProducerId, so
  a client cannot fence another producer by sending its id with epoch + 1;
- same epoch: base_sequence == last sequence + 1 appends; a batch equal to
  one of the kept batches (same first and last sequence) is a DUPLICATE: it
  is not written and the append answers with the original offsets (so the
  client's retry resolves to where the records already are); anything else
  is OUT_OF_ORDER_SEQUENCE_NUMBER.

Snapshots let `PartitionLog.open` rebuild the state without decoding
records: `{offset:020d}.snapshot` in the log directory holds the state of
every producer as of all batches below `offset`. One is written when a
segment rolls and on close (`Durability.CONTENT`); open loads the newest
intact snapshot at or below the log end (recovery has verified everything
below it, and one above it describes records lost since), then reads only
the batch headers after it. Truncation deletes snapshots above the new end
and rebuilds the same way; retention deletes snapshots below the log start
(keeping the newest one, which holds the state of the deleted data).

Snapshot format (big-endian)::

    offset size field
    0      4    magic         b"TLPS"
    4      2    version       1
    6      4    crc           CRC32C of bytes [10, end)
    10     8    offset        the offset the snapshot describes (also its name)
    18     4    producer count
    22     ...  per producer: producer_id int64, epoch int16, batch count uint8,
                then per batch (oldest first): first_seq int32, last_seq int32,
                first_offset int64, last_offset int64

A snapshot that fails its CRC (a torn write) is deleted and an older one used.

Not thread-safe: the partition's event-loop thread calls it.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Protocol

import crc32c
from tidelog.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidRequestError,
    OutOfOrderSequenceError,
)
from tidelog.records import BatchHeader
from tidelog_server.atomic_files import Durability, write_atomically

from tidelog_broker.storage import files
from tidelog_broker.storage.segment import read_headers

logger = logging.getLogger("tidelog.broker.storage")

#: Largest sequence number; the next one is 0.
SEQUENCE_MAX = 2**31 - 1
#: Batches remembered per producer: a retry can only repeat one of the last
#: five, since a producer keeps at most five requests in flight.
BATCHES_KEPT = 5

_MAGIC = b"TLPS"
_VERSION = 1
_PREAMBLE = struct.Struct(">4sHI")  # magic, version, crc
_SNAPSHOT_HEADER = struct.Struct(">qI")  # offset, producer count
_PRODUCER = struct.Struct(">qhB")  # producer_id, epoch, batch count
_BATCH = struct.Struct(">iiqq")  # first_seq, last_seq, first_offset, last_offset


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past SEQUENCE_MAX to 0."""
    if sequence > SEQUENCE_MAX - increment:
        return increment - (SEQUENCE_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Where one producer batch went."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


class ProducerEntry:
    """One producer id's epoch and its last batches (oldest first)."""

    __slots__ = ("batches", "epoch", "producer_id")

    def __init__(self, producer_id: int, epoch: int, batches: list[BatchMetadata]) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches = batches

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, batch: BatchMetadata) -> None:
        self.batches.append(batch)
        if len(self.batches) > BATCHES_KEPT:
            del self.batches[0]

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.producer_id, self.epoch, list(self.batches))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerEntry) and (
            self.producer_id,
            self.epoch,
            self.batches,
        ) == (other.producer_id, other.epoch, other.batches)

    def __repr__(self) -> str:
        return f"ProducerEntry({self.producer_id}, epoch={self.epoch}, {self.batches})"


@dataclass(frozen=True, slots=True)
class Duplicate:
    """An append that repeats batches already in the log: their offsets."""

    first_offset: int
    last_offset: int


class ProducerStateManager:
    """The producer state of one partition log (see module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._producers: dict[int, ProducerEntry] = {}

    # ------------------------------------------------------------------ state

    def entry(self, producer_id: int) -> ProducerEntry | None:
        """The state of one producer id (for tests and tools)."""
        return self._producers.get(producer_id)

    @property
    def producers(self) -> dict[int, ProducerEntry]:
        """Every producer's state (read-only by convention)."""
        return self._producers

    # ------------------------------------------------------------------ append

    def check(
        self,
        batches: Sequence[tuple[int, BatchHeader]],
        highest_epoch: Callable[[int], int] | None = None,
    ) -> Duplicate | None:
        """Validate the producer fields of one append's batches, in order,
        before anything is written. Returns None when every batch is new,
        a `Duplicate` when every idempotent batch repeats one already written
        (contiguous in the log), and raises otherwise:
        InvalidProducerEpochError, OutOfOrderSequenceError, InvalidRecordError
        (bad fields) or InvalidRequestError (new and repeated batches mixed).

        `highest_epoch(producer_id)`: the highest epoch InitProducerId has
        handed out for that id; a new epoch above it is refused (None: not
        checked, as on a follower, which copies what its leader accepted).
        """
        pending: dict[int, ProducerEntry] | None = None
        duplicates: list[BatchMetadata] = []
        new = 0
        for _, header in batches:
            producer_id = header.producer_id
            if producer_id < 0:
                new += 1
                continue
            epoch = header.producer_epoch
            first_seq = header.base_sequence
            if epoch < 0 or first_seq < 0:
                raise InvalidRecordError(
                    f"batch of producer {producer_id} has epoch {epoch} and base sequence "
                    f"{first_seq}; an idempotent batch needs both >= 0"
                )
            last_seq = increment_sequence(first_seq, header.last_offset_delta)
            entry = None if pending is None else pending.get(producer_id)
            if entry is None:
                entry = self._producers.get(producer_id)
            if entry is None or epoch > entry.epoch:
                if highest_epoch is not None and epoch > (allowed := highest_epoch(producer_id)):
                    raise InvalidProducerEpochError(
                        f"producer {producer_id} epoch {epoch} was never handed out: "
                        f"InitProducerId gave this id epoch {allowed} at most, and epochs "
                        "move only through InitProducerId"
                    )
                if first_seq != 0:
                    what = "unknown producer" if entry is None else f"new epoch {epoch} of producer"
                    raise OutOfOrderSequenceError(
                        f"{what} {producer_id} must start at sequence 0, not {first_seq}"
                    )
                entry = ProducerEntry(producer_id, epoch, [])
            elif epoch < entry.epoch:
                raise InvalidProducerEpochError(
                    f"producer {producer_id} epoch {epoch} is fenced: epoch {entry.epoch} "
                    "took over this producer id"
                )
            else:
                original = entry.find(first_seq, last_seq)
                if original is not None:
                    duplicates.append(original)
                    continue
                expected = increment_sequence(entry.last_seq, 1)
                if first_seq != expected:
                    raise OutOfOrderSequenceError(
                        f"producer {producer_id} epoch {epoch}: sequence {first_seq} is out of "
                        f"order, expected {expected}"
                    )
                entry = entry.copy()
            # Later batches of this append see this one as written.
            entry.add(BatchMetadata(first_seq, last_seq, -1, -1))
            if pending is None:
                pending = {}
            pending[producer_id] = entry
            new += 1
        if not duplicates:
            return None
        if new:
            raise InvalidRequestError(
                "a produce request repeats batches already written and adds new ones; "
                "send a retried batch on its own"
            )
        for before, after in pairwise(duplicates):
            if after.first_offset != before.last_offset + 1:
                raise InvalidRequestError(
                    "a produce request repeats batches that are not contiguous in the log; "
                    "send each retried batch on its own"
                )
        return Duplicate(duplicates[0].first_offset, duplicates[-1].last_offset)

    def update(self, header: BatchHeader, first_offset: int) -> None:
        """Record one batch written at `first_offset` (no checks: the leader's
        `check` made them, and a follower copies what its leader accepted).
        Batches without a producer id are ignored."""
        producer_id = header.producer_id
        if producer_id < 0:
            return
        epoch = header.producer_epoch
        batch = BatchMetadata(
            header.base_sequence,
            increment_sequence(header.base_sequence, header.last_offset_delta),
            first_offset,
            first_offset + header.last_offset_delta,
        )
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self._producers[producer_id] = ProducerEntry(producer_id, epoch, [batch])
        elif epoch == entry.epoch:
            entry.add(batch)
        # An older epoch cannot follow a newer one in a log; ignore it.

    # ------------------------------------------------------------------ snapshots

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files, ascending."""
        out = []
        for entry in os.scandir(self.directory):
            offset = files.parse_snapshot_file_name(entry.name)
            if offset is not None:
                out.append(offset)
        return sorted(out)

    def take_snapshot(self, offset: int, supersedes_above: int | None = None) -> Path:
        """Write the current state as the snapshot at `offset` (the log end:
        the state must describe exactly the batches below it), then delete
        the snapshots strictly between `supersedes_above` and `offset` (those
        of earlier closes within the active segment). Raises OSError."""
        parts = [_SNAPSHOT_HEADER.pack(offset, len(self._producers))]
        for entry in self._producers.values():
            parts.append(_PRODUCER.pack(entry.producer_id, entry.epoch, len(entry.batches)))
            for batch in entry.batches:
                parts.append(
                    _BATCH.pack(
                        batch.first_seq, batch.last_seq, batch.first_offset, batch.last_offset
                    )
                )
        body = b"".join(parts)
        path = files.snapshot_path(self.directory, offset)
        # No directory fsync: a snapshot lost in a crash only means a longer
        # header scan at the next open (and a roll writes one on the event loop).
        write_atomically(
            path,
            _PREAMBLE.pack(_MAGIC, _VERSION, crc32c.crc32c(body)) + body,
            Durability.CONTENT,
        )
        if supersedes_above is not None:
            for older in self.snapshot_offsets():
                if supersedes_above < older < offset:
                    files.snapshot_path(self.directory, older).unlink(missing_ok=True)
        return path

    def clear(self) -> None:
        """Forget every producer and delete every snapshot (the log was
        emptied, `PartitionLog.reset_to`). Raises OSError."""
        self._producers = {}
        for snapshot in self.snapshot_offsets():
            files.snapshot_path(self.directory, snapshot).unlink(missing_ok=True)

    def delete_snapshots_above(self, offset: int) -> None:
        """Remove snapshots of offsets > `offset` (the log was cut there)."""
        for snapshot in self.snapshot_offsets():
            if snapshot > offset:
                files.snapshot_path(self.directory, snapshot).unlink(missing_ok=True)

    def delete_snapshots_below(self, log_start_offset: int) -> None:
        """Retention: remove snapshots below the log start, except the newest
        snapshot of all (it carries the state of the deleted batches)."""
        offsets = self.snapshot_offsets()
        for snapshot in offsets[:-1]:
            if snapshot < log_start_offset:
                files.snapshot_path(self.directory, snapshot).unlink(missing_ok=True)

    def _read_snapshot(self, offset: int) -> dict[int, ProducerEntry] | None:
        path = files.snapshot_path(self.directory, offset)
        try:
            data = path.read_bytes()
            return _decode_snapshot(data, offset)
        except (OSError, ValueError, struct.error) as exc:
            logger.warning("%s: producer snapshot unusable (%s): deleting it", path, exc)
            path.unlink(missing_ok=True)
            return None

    # ------------------------------------------------------------------ rebuild

    def rebuild(self, segments: Iterable[SegmentView], log_end_offset: int) -> int:
        """Rebuild the state from the newest intact snapshot at or below
        `log_end_offset` plus the batch headers after it (snapshots above it
        are deleted). `segments` are the log's, in offset order. Returns the
        number of batch headers read."""
        self.delete_snapshots_above(log_end_offset)
        producers: dict[int, ProducerEntry] = {}
        start = -1
        for offset in reversed(self.snapshot_offsets()):
            loaded = self._read_snapshot(offset)
            if loaded is not None:
                producers, start = loaded, offset
                break
        self._producers = producers
        scanned = 0
        for segment in segments:
            if segment.next_offset <= start or segment.size_bytes == 0:
                continue
            for header in read_headers(segment.log_path, segment.size_bytes):
                if header.base_offset >= start:
                    self.update(header, header.base_offset)
                    scanned += 1
        return scanned


class SegmentView(Protocol):
    """What `rebuild` needs of a segment (a LogSegment)."""

    @property
    def log_path(self) -> Path: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def next_offset(self) -> int: ...


def _decode_snapshot(data: bytes, offset: int) -> dict[int, ProducerEntry]:
    magic, version, crc = _PREAMBLE.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a version {_VERSION} producer snapshot")
    body = memoryview(data)[_PREAMBLE.size :]
    if crc32c.crc32c(body) != crc:
        raise ValueError("CRC32C mismatch")
    stored_offset, count = _SNAPSHOT_HEADER.unpack_from(body, 0)
    if stored_offset != offset:
        raise ValueError(f"holds offset {stored_offset}, its name says {offset}")
    position = _SNAPSHOT_HEADER.size
    producers: dict[int, ProducerEntry] = {}
    for _ in range(count):
        producer_id, epoch, batch_count = _PRODUCER.unpack_from(body, position)
        position += _PRODUCER.size
        batches = []
        for _ in range(batch_count):
            batches.append(BatchMetadata(*_BATCH.unpack_from(body, position)))
            position += _BATCH.size
        producers[producer_id] = ProducerEntry(producer_id, epoch, batches)
    if position != len(body):
        raise ValueError(f"{len(body) - position} bytes after the last producer")
    return producers
