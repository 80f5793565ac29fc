"""Read ends: a segment remembers where a read ended (the position and header
of the next batch), so that the next read from there needs one pread, not an
index lookup and a header read first. Whatever cuts or rewrites the .log must
forget them; segments that retention or compaction replace take theirs along."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog.errors import OffsetOutOfRangeError
from tidelog.records import HEADER_SIZE, decode_batches, iter_batches
from tidelog_broker.storage import ManualClock
from tidelog_broker.storage.segment import LogSegment

from tests.unit.broker.storage.compaction_helpers import clean, put, read_records
from tests.unit.broker.storage.storage_helpers import (
    OpenLog,
    append,
    append_to_segment,
    make_batch,
)


def _append(segment: LogSegment, batches: list[bytearray]) -> list[bytes]:
    """Append batches in one write with dense offsets; return each as stored."""
    stored = append_to_segment(segment, batches)
    return [stored[p : p + h.size] for p, h in iter_batches(stored)]


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[LogSegment]:
    segment = LogSegment.create(tmp_path, base_offset=1000)
    yield segment
    segment.close()


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(length, position) of every os.pread from here on."""
    calls: list[tuple[int, int]] = []
    real: Callable[..., bytes] = os.pread

    def counting(fd: int, length: int, position: int) -> Any:
        calls.append((length, position))
        return real(fd, length, position)

    monkeypatch.setattr(os, "pread", counting)
    return calls


def test_a_read_from_where_the_last_ended_is_one_pread(
    segment: LogSegment, preads: list[tuple[int, int]]
) -> None:
    stored = _append(segment, [make_batch(3, value_bytes=100, tag=i) for i in range(4)])
    first = segment.read(1000, 1, 10**9)
    assert first == (stored[0], 1003)
    del preads[:]
    # Each later read starts where the last ended: no header read before it.
    for batch in range(1, 4):
        preads.clear()
        assert segment.read(1000 + 3 * batch, 1, 10**9) == (stored[batch], 1003 + 3 * batch)
        assert len(preads) == 1
    # Anywhere else: the index and a header read, as before.
    preads.clear()
    assert segment.read(1004, 1, 10**9) == (stored[1], 1006)
    assert len(preads) == 2


def test_a_read_end_cut_at_the_limit_is_checked_against_the_next_limit(
    segment: LogSegment,
) -> None:
    stored = _append(segment, [make_batch(3, tag=i) for i in range(4)])
    assert segment.read(1000, 10**6, 1006) == (stored[0] + stored[1], 1006)
    assert segment.read(1006, 10**6, 1006).records == b""  # still at the limit
    assert segment.read(1006, 10**6, 1009) == (stored[2], 1009)
    assert segment.read(1009, 10**6, 10**9) == (stored[3], 1012)


def test_truncation_forgets_read_ends(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(3, tag=i) for i in range(3)])
    assert segment.read(1000, 1, 10**9) == (stored[0], 1003)  # ends at 1003
    segment.truncate_to(1003)
    # Other batches where the forgotten one was: a bigger one, then more.
    again = _append(segment, [make_batch(7, value_bytes=50, tag=9), make_batch(1, tag=10)])
    assert segment.read(1003, 1, 10**9) == (again[0], 1010)
    assert segment.read(1010, 1, 10**9) == (again[1], 1011)


def test_recovery_forgets_read_ends(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(3, tag=i) for i in range(3)])
    assert segment.read(1000, 1, 10**9) == (stored[0], 1003)
    # Damage the second batch's CRC: recovery cuts the log before it.
    position = len(stored[0])
    with open(segment.log_path, "r+b") as f:
        f.seek(position + HEADER_SIZE - 1)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    assert segment.recover(None, 0) == len(stored[1]) + len(stored[2])
    again = _append(segment, [make_batch(5, value_bytes=40, tag=9)])
    assert segment.read(1003, 1, 10**9) == (again[0], 1008)


def test_after_retention_drops_a_segment_its_reads_get_out_of_range(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(segment_bytes=1024, retention_bytes=2048)
    stored = dict(append(log, make_batch(2, value_bytes=100, tag=i)) for i in range(30))
    assert log.read(0, 1).next_offset == 2  # a read end at offset 2, first segment
    assert log.delete_old_segments()
    start = log.log_start_offset
    assert start > 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 1)
    result = log.read(start, 1)
    assert (result.records, result.next_offset) == (stored[start], start + 2)


def test_after_compaction_replaces_segments_reads_see_the_cleaned_ones(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(segment_bytes=1024, cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    for i in range(200):
        put(log, b"k%d" % (i % 5), b"v%d" % i, clock.time_ms())
    # Read ends all over the closed segments, one batch (one record) at a time.
    ends = [0]
    while ends[-1] < 150:
        ends.append(log.read(ends[-1], 1).next_offset)
    assert clean(log) is not None
    surviving = [(offset, value) for offset, _, value, _ in read_records(log)]
    assert len(surviving) < 100
    for end in ends:
        batch = next(decode_batches(log.read(end, 1).records))
        got = [(o, v) for o, v in zip(batch.offsets, batch.values, strict=True) if o >= end]
        expected = [(o, v) for o, v in surviving if o >= end][: len(got)]
        assert got and got == expected


def test_a_fetch_after_the_log_was_truncated_under_it_gets_the_new_batches(
    open_log: OpenLog,
) -> None:
    """A follower's truncation (a new leader's log) between two fetches."""
    log = open_log()
    stored = [append(log, make_batch(3, tag=i))[1] for i in range(3)]
    assert log.read(0, 1).next_offset == 3  # a read end at 3
    log.truncate_to(3)
    again = append(log, make_batch(6, value_bytes=30, tag=7))[1]
    result = log.read(3, 1)
    assert (result.records, result.next_offset) == (again, 9)
    assert log.read(0, 1).records == stored[0]


def test_a_reader_leaves_one_read_end_behind_and_none_at_the_segments_end(
    segment: LogSegment,
) -> None:
    stored = _append(segment, [make_batch(2, tag=i) for i in range(50)])
    offset = 1000
    for batch in stored:
        result = segment.read(offset, 1, 10**9)
        assert result.records == batch
        offset = result.next_offset
        # Memory: what a segment keeps grows with its readers, not its reads.
        assert len(segment._read_ends) <= 1
    assert not segment._read_ends
