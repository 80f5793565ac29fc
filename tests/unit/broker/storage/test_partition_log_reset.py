"""PartitionLog.reset_to: a follower behind the leader's log start restarts
its log empty at that offset (Kafka's truncateFullyAndStartAt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog.errors import OffsetOutOfRangeError
from tidelog.records import encode_batch
from tidelog_broker.storage import PartitionLog, files

from tests.unit.broker.storage.storage_helpers import OpenLog, append, crash, make_batch, read_all

RESET_AT = 1_000


def _filled_log(open_log: OpenLog) -> PartitionLog:
    log = open_log(segment_bytes=400)
    for tag in range(12):
        append(log, make_batch(record_count=3, value_bytes=20, tag=tag))
    append(
        log,
        bytearray(encode_batch([b"p"], producer_id=7, producer_epoch=0, base_sequence=0)),
    )
    log.leader_epochs.assign(0, 0)
    log.leader_epochs.assign(2, 20)
    log.flush()
    assert log.segment_count > 2
    assert log.producer_state.producers
    return log


def _assert_empty_at(log: PartitionLog, offset: int) -> None:
    assert log.log_start_offset == offset
    assert log.log_end_offset == offset
    assert log.recovery_point == offset
    assert log.segment_count == 1
    assert log.segments[0].base_offset == offset
    assert log.leader_epochs.entries == []
    assert log.leader_epochs.latest_epoch == -1
    assert not log.producer_state.producers
    assert read_all(log) == b""
    assert log.read(offset, 1 << 20).records == b""
    for below in (0, offset - 1):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(below, 1 << 20)


def _segment_logs(log_dir: Path) -> list[str]:
    return sorted(p.name for p in log_dir.iterdir() if p.name.endswith(files.LOG_SUFFIX))


def test_reset_to_empties_the_log_at_the_offset(open_log: OpenLog, log_dir: Path) -> None:
    log = _filled_log(open_log)
    log.reset_to(RESET_AT)
    _assert_empty_at(log, RESET_AT)
    assert len(_segment_logs(log_dir)) == 1
    assert not [p for p in log_dir.iterdir() if p.name.endswith(files.DELETED_SUFFIX)]
    assert log.producer_state.snapshot_offsets() == []
    first, stored = append(log, make_batch(tag=99))
    assert first == RESET_AT
    assert log.log_end_offset == RESET_AT + 1
    assert read_all(log) == stored


def test_reset_survives_a_clean_reopen(open_log: OpenLog) -> None:
    log = _filled_log(open_log)
    log.reset_to(RESET_AT)
    log.close()
    log = open_log(segment_bytes=400)
    _assert_empty_at(log, RESET_AT)
    first, stored = append(log, make_batch(tag=99))
    assert first == RESET_AT
    assert read_all(log) == stored


def test_reset_survives_a_crash(open_log: OpenLog) -> None:
    log = _filled_log(open_log)
    log.reset_to(RESET_AT)
    crash(log)
    log = open_log(segment_bytes=400)
    _assert_empty_at(log, RESET_AT)
    first, _ = append(log, make_batch(tag=99))
    assert first == RESET_AT
    log.flush()
    crash(log)
    log = open_log(segment_bytes=400)
    assert (log.log_start_offset, log.log_end_offset) == (RESET_AT, RESET_AT + 1)


def test_a_reset_cut_short_after_the_log_start_is_written_completes_at_open(
    open_log: OpenLog, log_dir: Path
) -> None:
    # The first step of reset_to: the new log start, durably; then a crash.
    log = _filled_log(open_log)
    log.producer_state.take_snapshot(log.log_end_offset)
    (log_dir / files.LOG_START_OFFSET_FILE).write_text(f"{RESET_AT}\n", encoding="ascii")
    crash(log)
    log = open_log(segment_bytes=400)
    _assert_empty_at(log, RESET_AT)
    assert log.producer_state.snapshot_offsets() == []
    assert append(log, make_batch(tag=99))[0] == RESET_AT


def test_reset_to_a_negative_offset_is_refused(open_log: OpenLog) -> None:
    log = _filled_log(open_log)
    end = log.log_end_offset
    with pytest.raises(ValueError):
        log.reset_to(-1)
    assert log.log_end_offset == end
