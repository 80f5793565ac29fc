"""LogSegment: append, read whole batches, index entries, recovery of one file."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from tidelog.compression import CompressionType
from tidelog.errors import InvalidRecordError
from tidelog.records import CRC_START, HEADER_SIZE, encode_batch, iter_batches, set_base_offset
from tidelog_broker.storage import segment as segment_module
from tidelog_broker.storage.segment import AppendedBatch, LogSegment

from tests.unit.broker.storage.storage_helpers import append_to_segment as _append
from tests.unit.broker.storage.storage_helpers import make_batch


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[LogSegment]:
    segment = LogSegment.create(tmp_path, base_offset=1000)
    yield segment
    segment.close()


def test_read_returns_the_batch_containing_the_offset(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(5, tag=i) for i in range(4)])
    size = len(stored) // 4
    assert segment.next_offset == 1020
    result = segment.read(1007, 10**6, 10**9)  # inside the second batch
    assert result.records == stored[size:]
    assert result.next_offset == 1020
    assert segment.read(1020, 10**6, 10**9).records == b""


def test_read_trims_to_whole_batches_and_always_makes_progress(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(1, value_bytes=100, tag=i) for i in range(4)])
    size = len(stored) // 4
    assert segment.read(1000, 2 * size + size // 2, 10**9).records == stored[: 2 * size]
    assert segment.read(1000, 2 * size, 10**9).next_offset == 1002
    # A first batch bigger than max_bytes comes whole, and alone.
    assert segment.read(1001, 1, 10**9) == (stored[size : 2 * size], 1002)


def test_read_stops_before_a_batch_at_or_past_max_offset(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(3, tag=i) for i in range(4)])
    size = len(stored) // 4
    assert segment.read(1000, 10**6, 1006).records == stored[: 2 * size]
    # A batch that starts below the bound is whole even if it ends past it.
    assert segment.read(1000, 10**6, 1007).records == stored[: 3 * size]
    assert segment.read(1006, 10**6, 1006).records == b""


def test_offset_index_gets_an_entry_every_interval(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(2, value_bytes=200, tag=i) for i in range(10)], 1000)
    size = len(stored) // 10
    per_entry = -(-1000 // size)  # batches between entries
    expected = [(1000 + 2 * i, i * size) for i in range(per_entry, 10, per_entry)]
    assert segment.offset_index.entries() == expected
    for offset in range(1000, 1020):
        batch = (offset - 1000) // 2
        assert segment.read(offset, 1, 10**9).records == stored[batch * size : (batch + 1) * size]


def test_recover_keeps_good_batches_and_rebuilds_the_same_indexes(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(2, timestamp_ms=t, tag=t) for t in range(20)], 100)
    offsets, times = segment.offset_index.entries(), segment.time_index.entries()
    assert segment.recover(max_batch_bytes=None, index_interval_bytes=100) == 0
    assert segment.offset_index.entries() == offsets
    assert segment.time_index.entries() == times
    assert segment.read(1000, 10**6, 10**9).records == stored


def test_recover_cuts_a_torn_tail(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(2, tag=i) for i in range(3)])
    with open(segment.log_path, "ab") as f:
        f.write(stored[:30])
    assert segment.recover(10**6, 0) == 30
    assert segment.log_path.stat().st_size == len(stored)
    assert segment.next_offset == 1006


def test_truncate_to_drops_the_containing_batch_and_after(segment: LogSegment) -> None:
    stored = _append(segment, [make_batch(3, tag=i) for i in range(5)], 0)
    size = len(stored) // 5
    assert segment.truncate_to(1007) == 3 * size
    assert segment.next_offset == 1006
    assert segment.read(1000, 10**6, 10**9).records == stored[: 2 * size]
    assert all(offset < 1006 for offset, _ in segment.offset_index.entries())
    assert all(offset < 1006 for _, offset in segment.time_index.entries())
    assert _append(segment, [make_batch(1)]) and segment.next_offset == 1007


def test_time_lookup_decodes_only_the_holding_batch(segment: LogSegment) -> None:
    _append(segment, [make_batch(2, timestamp_ms=t * 10) for t in range(10)], 50)
    assert segment.find_offset_for_timestamp(0) == (1000, 0)
    assert segment.find_offset_for_timestamp(41) == (1010, 50)
    assert segment.find_offset_for_timestamp(90) == (1018, 90)
    assert segment.find_offset_for_timestamp(91) is None


def test_time_lookup_answers_the_first_record_reaching_the_target(segment: LogSegment) -> None:
    """Timestamps out of order within a batch (CreateTime is the
    producers'): the first record in offset order at or above the target,
    not the nearest, as Kafka answers; compressed batches alike."""
    _append(
        segment,
        [
            bytearray(encode_batch([b"a"] * 4, timestamps=[50, 10, 70, 30])),
            bytearray(
                encode_batch([b"b"] * 3, timestamps=[90, 60, 95], codec=CompressionType.GZIP)
            ),
        ],
    )
    assert segment.find_offset_for_timestamp(20) == (1000, 50)
    assert segment.find_offset_for_timestamp(55) == (1002, 70)
    assert segment.find_offset_for_timestamp(71) == (1004, 90)
    assert segment.find_offset_for_timestamp(91) == (1006, 95)
    assert segment.find_offset_for_timestamp(96) is None


#: Records of 10-byte values in the memory test's batch: a body of ~1 MiB.
_SMALL_RECORDS = 40_000


def test_time_lookup_builds_no_record(segment: LogSegment) -> None:
    """Invariant 1: the broker builds no per-record objects. A lookup in a
    batch of ~1 MiB of small records holds the body and its number columns
    (~2x the body at its peak); decoding it built ~8x (every value, offset
    and timestamp as an object)."""
    count = _SMALL_RECORDS
    batch = encode_batch([b"0123456789"] * count, timestamps=list(range(count)))
    _append(segment, [bytearray(batch)])
    assert segment.find_offset_for_timestamp(count - 1) == (1000 + count - 1, count - 1)
    tracemalloc.start()
    try:
        assert segment.find_offset_for_timestamp(count - 1) == (1000 + count - 1, count - 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(batch), f"peak {peak} bytes for a batch of {len(batch)}"


def test_time_lookup_refuses_a_stored_body_that_lies(segment: LogSegment) -> None:
    """A stored batch whose value length claims more than its body holds
    (stored before brokers checked bodies): the lookup that reaches it is
    refused as decoding it was, with InvalidRecordError, and lookups
    answered by the batches before it still are."""
    good = make_batch(2, timestamp_ms=10)
    bad = bytearray(encode_batch([b"x" * 10] * 2, timestamps=[20, 30]))
    value_lengths_at = HEADER_SIZE + 1 + 8 * 2 + 4 * 2  # flags, timestamps, key lengths
    struct.pack_into("<i", bad, value_lengths_at, 2**31 - 1)
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bad[CRC_START:]))  # a CRC that agrees
    _append(segment, [good, bad])
    assert segment.find_offset_for_timestamp(5) == (1000, 10)
    with pytest.raises(InvalidRecordError, match="add up to"):
        segment.find_offset_for_timestamp(15)


# ---------------------------------------------------------------- all or nothing
# Issue 16 item 1: an append that fails, however, leaves the segment, its
# indexes and its offsets exactly as before.


def _state(segment: LogSegment) -> tuple:
    return (
        segment.size_bytes,
        segment.next_offset,
        segment.max_timestamp,
        segment.offset_index.entries(),
        segment.time_index.entries(),
        segment.log_path.stat().st_size,
        segment.offset_index.path.stat().st_size,
        segment.time_index.path.stat().st_size,
    )


def _placed(records: bytearray, first_offset: int) -> list[AppendedBatch]:
    placed = []
    offset = first_offset
    for position, header in iter_batches(records):
        set_base_offset(records, position, offset)
        placed.append(
            AppendedBatch(position, offset, offset + header.last_offset_delta, header.max_timestamp)
        )
        offset += header.last_offset_delta + 1
    return placed


@pytest.mark.parametrize("failing", ["log_write", "offset_index", "time_index"])
def test_a_failure_after_the_log_write_undoes_the_whole_append(
    segment: LogSegment, failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = _append(segment, [make_batch(2, value_bytes=200, tag=i) for i in range(5)], 100)
    before = _state(segment)
    records = bytearray(
        b"".join(
            make_batch(2, value_bytes=200, timestamp_ms=5_000 + i, tag=10 + i) for i in range(5)
        )
    )
    placed = _placed(records, segment.next_offset)

    def broken(*args: object) -> None:
        raise RuntimeError("injected after the .log write")  # not an OSError

    if failing == "log_write":
        real_write = segment_module._write_all

        def write_then_fail(fd: int, data: bytes) -> None:
            real_write(fd, data)
            broken()

        monkeypatch.setattr(segment_module, "_write_all", write_then_fail)
    else:
        monkeypatch.setattr(getattr(segment, failing), "append_packed", broken)
    with pytest.raises(RuntimeError, match="injected"):
        segment.append(records, placed, 100, now_ms=0)
    monkeypatch.undo()
    assert _state(segment) == before
    assert not segment.needs_recovery
    assert segment.read(1000, 10**6, 10**9).records == stored
    # The next append lands where the failed one would have, and reads back.
    again = _append(segment, [make_batch(3, tag=99)], 100)
    assert segment.read(1010, 10**6, 10**9).records == again
    assert segment.recover(max_batch_bytes=None, index_interval_bytes=100) == 0
    assert segment.read(1000, 10**6, 10**9).records == stored + again


def test_offsets_that_do_not_fit_the_index_write_nothing(segment: LogSegment) -> None:
    # The request: three batches each spanning 2^31 offsets, so the
    # third starts past what a uint32 relative offset holds. Refused before
    # any byte is written (it used to raise struct.error after the write).
    _append(segment, [make_batch(1, tag=1)])
    before = _state(segment)
    batches = [bytearray(make_batch(1, tag=i)) for i in range(3)]
    records = bytearray(b"".join(batches))
    size = len(batches[0])
    placed = []
    offset = segment.next_offset
    for i in range(3):
        set_base_offset(records, i * size, offset)
        placed.append(AppendedBatch(i * size, offset, offset + 2**31 - 1, 1_000))
        offset += 2**31
    with pytest.raises(ValueError, match="relative offsets are 0 to 4294967295"):
        segment.append(records, placed, 0, now_ms=0)
    assert _state(segment) == before
