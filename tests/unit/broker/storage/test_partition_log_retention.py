"""Retention: retention.ms and retention.bytes drop whole closed segments from
the front, never the active one; the log start offset moves and survives a
restart; deleted files are renamed first and unlinked separately. All on a
ManualClock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tidelog.errors import OffsetOutOfRangeError
from tidelog_broker.storage import ManualClock, PartitionLog
from tidelog_broker.storage.partition_log import unlink_files

from tests.unit.broker.storage.compaction_helpers import put, read_records
from tests.unit.broker.storage.storage_helpers import OpenLog, append, crash, make_batch

HOUR_MS = 3_600_000


def _fill(log: PartitionLog, clock: ManualClock, batches: int, step_ms: int = 0) -> None:
    for i in range(batches):
        append(log, make_batch(2, value_bytes=100, timestamp_ms=clock.time_ms(), tag=i))
        clock.advance(step_ms)


def test_time_retention_deletes_expired_closed_segments_only(
    open_log: OpenLog, clock: ManualClock, log_dir: Path
) -> None:
    log = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    _fill(log, clock, 40, step_ms=60_000)  # 40 minutes of data
    segments = log.segment_count
    assert segments > 5
    assert log.delete_old_segments() == []  # nothing is an hour old yet
    clock.advance(HOUR_MS - 20 * 60_000)  # the first ~20 minutes have expired
    renamed = log.delete_old_segments()
    assert renamed and all(p.name.endswith(".deleted") for p in renamed)
    assert all(p.exists() for p in renamed)  # renamed, not yet unlinked
    assert unlink_files(renamed) == len(renamed)
    assert 1 < log.segment_count < segments
    start = log.log_start_offset
    assert start == log.segments[0].base_offset > 0
    # Every remaining closed segment but the first is younger than the horizon.
    assert log.segments[0].max_timestamp >= clock.time_ms() - HOUR_MS
    with pytest.raises(OffsetOutOfRangeError, match=rf"valid offsets are {start} to 80"):
        log.read(start - 1, 1000)
    assert log.read(start, 1000).records
    # Even when everything has expired, the active segment stays.
    clock.advance(10 * HOUR_MS)
    unlink_files(log.delete_old_segments())
    assert log.segment_count == 1
    assert log.log_start_offset == log.segments[0].base_offset
    assert log.log_end_offset == 80
    assert not [n for n in os.listdir(log_dir) if n.endswith(".deleted")]


def test_size_retention_keeps_the_log_under_retention_bytes(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(segment_bytes=1024, retention_ms=-1, retention_bytes=3000)
    _fill(log, clock, 60)
    assert log.log_bytes > 3000
    unlink_files(log.delete_old_segments())
    # As in Kafka: whole segments go while the excess covers one, so the log
    # ends within one segment of the limit, never under it by a segment.
    assert log.log_bytes - log.segments[0].size_bytes < 3000 < log.log_bytes
    assert log.log_end_offset == 120


def test_unlimited_and_compact_policies_delete_nothing(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(segment_bytes=1024, retention_ms=-1, retention_bytes=-1)
    _fill(log, clock, 30)
    clock.advance(100 * HOUR_MS)
    assert log.delete_old_segments() == []
    log.update_config(
        log.config.__class__(segment_bytes=1024, retention_ms=1, cleanup_policy="compact")
    )
    assert log.delete_old_segments() == []


def test_log_start_offset_survives_restart_and_crash(
    open_log: OpenLog, clock: ManualClock, log_dir: Path
) -> None:
    log = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    _fill(log, clock, 30)
    clock.advance(2 * HOUR_MS)
    _fill(log, clock, 30)
    unlink_files(log.delete_old_segments())
    start = log.log_start_offset
    assert start > 0
    log.close()
    reopened = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    assert reopened.log_start_offset == start
    crash(reopened)
    again = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    assert again.log_start_offset == start
    assert [r[0] for r in read_records(again)] == list(range(start, 120))


def test_open_finishes_a_retention_pass_cut_short(
    open_log: OpenLog, clock: ManualClock, log_dir: Path
) -> None:
    """The log start was written, but the crash came before the renames (or
    the renames were lost): open drops the segments below it; leftover
    `.deleted` files are removed."""
    log = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    _fill(log, clock, 30)
    third = log.segments[3].base_offset
    crash(log)
    (log_dir / "log-start-offset").write_text(f"{third}\n")
    (log_dir / "00000000000000000000.log.deleted").write_bytes(b"junk")
    reopened = open_log(segment_bytes=1024, retention_ms=HOUR_MS)
    assert reopened.log_start_offset == third
    assert reopened.segments[0].base_offset == third
    assert not [n for n in os.listdir(log_dir) if n.endswith(".deleted")]
    assert not [n for n in os.listdir(log_dir) if n.startswith(f"{0:020d}")]


def test_time_lookup_works_after_rolls_and_retention(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(segment_bytes=1024, retention_ms=HOUR_MS, index_interval_bytes=128)
    first_ts = clock.time_ms()
    offsets = []
    for i in range(60):
        offsets.append(put(log, b"k%d" % i, b"x" * 80, clock.time_ms()))
        clock.advance(60_000)
    assert log.segment_count > 5
    for i in (0, 7, 33, 59):
        assert log.offset_for_timestamp(first_ts + i * 60_000) == (i, first_ts + i * 60_000)
        assert log.offset_for_timestamp(first_ts + i * 60_000 - 1)[0] == i
    assert log.offset_for_timestamp(first_ts + 60 * 60_000) is None
    clock.advance(30 * 60_000)  # now = first + 90 min: the first half hour has expired
    unlink_files(log.delete_old_segments())
    start = log.log_start_offset
    assert start > 0
    # A time before the log start answers with the first remaining record.
    assert log.offset_for_timestamp(first_ts)[0] == start
    assert log.offset_for_timestamp(first_ts + 59 * 60_000)[0] == 59
