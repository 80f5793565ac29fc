"""PartitionLog: offsets, reads across segments, rolling, flushing, restart."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import tidelog_broker.storage as storage
from tidelog.errors import OffsetOutOfRangeError, StorageError
from tidelog.records import LOG_APPEND_TIME, decode_batches, iter_batches, read_header
from tidelog_broker.storage import ManualClock

from tests.unit.broker.storage.storage_helpers import OpenLog, append, crash, make_batch, read_all


def test_exports_are_pinned() -> None:
    assert sorted(storage.__all__) == sorted(
        [
            "PartitionLog",
            "LogSegment",
            "AppendInfo",
            "ReadResult",
            "LogConfig",
            "parse_topic_configs",
            "config_to_strings",
            "Clock",
            "SystemClock",
            "ManualClock",
            "SYSTEM_CLOCK",
            "UnopenedLog",
        ]
    )


def test_append_assigns_dense_offsets_and_reports_them(open_log: OpenLog) -> None:
    log = open_log()
    first_batch = make_batch(3, timestamp_ms=5)
    records = first_batch + make_batch(2, timestamp_ms=7)
    info = log.append(records, list(iter_batches(records)))
    assert (info.first_offset, info.last_offset, info.records_count) == (0, 4, 5)
    assert (info.max_timestamp, info.log_append_time_ms, info.size_bytes) == (7, -1, len(records))
    assert read_header(records, 0).base_offset == 0  # patched in place
    assert read_header(records, len(first_batch)).base_offset == 3
    assert log.append(make_batch(1), list(iter_batches(make_batch(1)))).first_offset == 5
    assert log.log_end_offset == 6


def test_round_trip_across_many_segments(open_log: OpenLog) -> None:
    log = open_log(segment_bytes=2048, index_interval_bytes=256)
    stored = [
        append(log, make_batch(1 + i % 5, value_bytes=37 * (i % 7), tag=i))[1] for i in range(300)
    ]
    assert log.segment_count > 20
    assert read_all(log) == b"".join(stored)
    assert read_all(log, max_bytes=1) == b"".join(stored)
    # Every offset reads back from the batch that holds it.
    for batch in decode_batches(log.read(0, 10**9).records):
        for offset in batch.offsets:
            first = next(decode_batches(log.read(offset, 1).records))
            assert first.header.base_offset == batch.header.base_offset


def test_on_disk_names(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log(segment_bytes=1024)
    for _ in range(3):
        append(log, make_batch(10, value_bytes=60))
    assert log_dir.name == "orders.eu-west-3"
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 10, 20]
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(
        f"{base:020d}{suffix}" for base in bases for suffix in (".log", ".index", ".timeindex")
    )
    log.close()
    assert {"recovery-point", "clean-shutdown"} <= {p.name for p in log_dir.iterdir()}


def test_out_of_range_reads_name_the_valid_range(open_log: OpenLog) -> None:
    log = open_log()
    for _ in range(3):
        append(log, make_batch(3))
    with pytest.raises(
        OffsetOutOfRangeError,
        match=r"offset 10 is out of range for "
        r"orders.eu-west-3: valid offsets are 0 to 9",
    ):
        log.read(10, 100)
    with pytest.raises(OffsetOutOfRangeError, match="offset -1 is out of range"):
        log.read(-1, 100)
    at_end = log.read(9, 100)
    assert (at_end.records, at_end.next_offset, at_end.log_end_offset) == (b"", 9, 9)


def test_max_offset_is_the_exclusive_bound(open_log: OpenLog) -> None:
    log = open_log(segment_bytes=1024)
    stored = [append(log, make_batch(4, value_bytes=100))[1] for _ in range(6)]
    assert log.read(0, 10**6, max_offset=8).records == stored[0] + stored[1]
    assert log.read(8, 10**6, max_offset=8).records == b""
    assert log.read(8, 10**6, max_offset=8).next_offset == 8


def test_rolls_by_segment_bytes(open_log: OpenLog) -> None:
    log = open_log(segment_bytes=1000)
    batch = make_batch(1, value_bytes=300)  # ~370 bytes: two fit, the third rolls
    for _ in range(5):
        append(log, batch)
    assert [s.base_offset for s in log.segments] == [0, 2, 4]
    assert all(s.size_bytes <= 1000 for s in log.segments)
    # A batch bigger than segment.bytes still goes in, alone.
    append(log, make_batch(1, value_bytes=2000))
    assert [s.base_offset for s in log.segments][-1] == 5


def test_rolls_by_segment_ms(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(segment_ms=60_000)
    append(log, make_batch())
    clock.advance(59_999)
    append(log, make_batch())
    assert log.segment_count == 1
    clock.advance(1)
    append(log, make_batch())
    assert [s.base_offset for s in log.segments] == [0, 2]
    clock.advance(10**9)  # an idle log does not roll until something is appended
    assert log.segment_count == 2


def test_rolls_when_an_index_would_be_full(open_log: OpenLog) -> None:
    log = open_log(segment_index_bytes=64, index_interval_bytes=0)
    for _ in range(12):
        append(log, make_batch())
    assert log.segment_count > 1
    assert all(s.time_index.size_bytes <= 64 for s in log.segments)
    assert read_all(log) and log.log_end_offset == 12


def test_offset_for_timestamp(open_log: OpenLog) -> None:
    log = open_log(segment_bytes=1024, index_interval_bytes=100)
    for i in range(40):  # timestamps 0, 10, ..., out of order every 5th batch
        append(log, make_batch(2, timestamp_ms=(i * 10 if i % 5 else i * 10 - 45)))
    assert log.segment_count > 3
    assert log.offset_for_timestamp(-10_000) == (0, -45)
    assert log.offset_for_timestamp(1) == (2, 10)
    assert log.offset_for_timestamp(200) == (42, 210)  # batch 20 is stamped 155
    assert log.offset_for_timestamp(390) == (78, 390)
    assert log.offset_for_timestamp(391) is None


def test_log_append_time_stamps_batches(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(message_timestamp_type="LogAppendTime")
    _, stored = append(log, make_batch(3, timestamp_ms=5))
    info_time = clock.time_ms()
    header = read_header(stored)
    assert header.timestamp_type == LOG_APPEND_TIME
    assert header.max_timestamp == info_time
    assert next(decode_batches(log.read(0, 10**6).records)).timestamps == [info_time] * 3
    assert log.offset_for_timestamp(info_time) == (0, info_time)


def test_flush_messages_fsyncs_every_n_records(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(flush_messages=3)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    for _ in range(7):
        append(log, make_batch(1))
    assert sum(path.endswith(".log") for path in synced) == 2
    assert log.recovery_point == 6


def test_flush_ms_flushes_old_unflushed_data(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(flush_ms=1_000)
    assert not log.maybe_flush(clock.monotonic_ms())
    append(log, make_batch(2))
    clock.advance(999)
    assert not log.maybe_flush(clock.monotonic_ms())
    clock.advance(1)
    assert log.maybe_flush(clock.monotonic_ms())
    assert log.recovery_point == 2
    assert (log.directory / "recovery-point").read_text() == "2\n"


@pytest.mark.parametrize("clean", [True, False], ids=["close", "crash"])
def test_restart_keeps_all_data(open_log: OpenLog, clean: bool) -> None:
    log = open_log(segment_bytes=1024, index_interval_bytes=128)
    stored = [append(log, make_batch(3, value_bytes=40, tag=i))[1] for i in range(50)]
    if clean:
        log.close()
    else:
        crash(log)
    reopened = open_log(segment_bytes=1024, index_interval_bytes=128)
    assert reopened.log_end_offset == 150
    assert reopened.segment_count == log.segment_count
    assert read_all(reopened) == b"".join(stored)
    assert append(reopened, make_batch())[0] == 150


def test_truncate_to_drops_the_tail_durably(open_log: OpenLog) -> None:
    log = open_log(segment_bytes=1024)
    stored = [append(log, make_batch(2, value_bytes=100, tag=i))[1] for i in range(20)]
    log.flush()
    log.truncate_to(15)  # inside the batch at 14: it goes too
    assert log.log_end_offset == 14
    assert log.recovery_point == 14
    assert read_all(log) == b"".join(stored[:7])
    offset, appended = append(log, make_batch())
    assert offset == 14
    log.close()
    assert read_all(open_log(segment_bytes=1024)) == b"".join(stored[:7]) + appended


def test_write_failure_leaves_the_log_unchanged(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    first = append(log, make_batch(2))[1]

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", disk_full)
        with pytest.raises(StorageError, match=r"appending to orders\.eu-west-3 failed"):
            append(log, make_batch(2))
    assert log.log_end_offset == 2
    assert append(log, make_batch(1))[0] == 2
    assert read_all(log).startswith(first)


def test_delete_removes_the_directory(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log()
    append(log, make_batch())
    log.delete()
    assert not log_dir.exists()
