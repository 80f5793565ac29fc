"""PartitionLog.reset_to: a follower behind the leader's log start restarts
its log empty at that offset (Kafka's truncateFullyAndStartAt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog.errors import OffsetOutOfRangeError, StorageError
from tidelog.records import encode_batch
from tidelog_broker.storage import PartitionLog, checkpoints, files

from tests.unit.broker.storage.compaction_helpers import clean, put
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


def test_a_reset_cut_short_after_its_commit_point_completes_at_open(
    open_log: OpenLog, log_dir: Path
) -> None:
    # The first step of reset_to: the reset offset, durably; then a crash.
    log = _filled_log(open_log)
    log.producer_state.take_snapshot(log.log_end_offset)
    checkpoints.write_reset_offset(log_dir, RESET_AT)
    crash(log)
    log = open_log(segment_bytes=400)
    _assert_empty_at(log, RESET_AT)
    assert log.producer_state.snapshot_offsets() == []
    assert not (log_dir / files.RESET_OFFSET_FILE).exists()
    assert (log_dir / files.LOG_START_OFFSET_FILE).read_text(encoding="ascii") == f"{RESET_AT}\n"
    assert append(log, make_batch(tag=99))[0] == RESET_AT


def test_a_reset_below_the_end_cut_short_completes_at_open(
    open_log: OpenLog, log_dir: Path
) -> None:
    log = _filled_log(open_log)
    inside = log.segments[1].base_offset + 1
    checkpoints.write_reset_offset(log_dir, inside)
    # As if the new log start had reached the disk and nothing else had.
    (log_dir / files.LOG_START_OFFSET_FILE).write_text(f"{inside}\n", encoding="ascii")
    crash(log)
    log = open_log(segment_bytes=400)
    _assert_empty_at(log, inside)
    assert _segment_logs(log_dir) == [files.segment_file_name(inside, files.LOG_SUFFIX)]


def test_an_unreadable_reset_offset_refuses_the_open(open_log: OpenLog, log_dir: Path) -> None:
    log = _filled_log(open_log)
    crash(log)
    (log_dir / files.RESET_OFFSET_FILE).write_bytes(b"\xff garbage")
    with pytest.raises(StorageError, match=files.RESET_OFFSET_FILE):
        open_log(segment_bytes=400)


def test_records_deleted_up_to_the_end_keep_their_history_across_a_restart(
    open_log: OpenLog,
) -> None:
    # DeleteRecords (or a follower's follow_log_start) up to the log end
    # leaves a log wholly below its start; open once took it for a reset
    # cut short and forgot the epoch history and the producer state.
    log = _filled_log(open_log)
    log.delete_records_before(log.log_end_offset)
    end, epochs = log.log_end_offset, log.leader_epochs.entries
    producers = log.producer_state.producers
    log.close()
    log = open_log(segment_bytes=400)
    assert (log.log_start_offset, log.log_end_offset) == (end, end)
    assert log.leader_epochs.entries == epochs
    assert log.producer_state.producers == producers


def test_reset_to_a_negative_offset_is_refused(open_log: OpenLog) -> None:
    log = _filled_log(open_log)
    end = log.log_end_offset
    with pytest.raises(ValueError):
        log.reset_to(-1)
    assert log.log_end_offset == end


def _compacted_log(open_log: OpenLog) -> PartitionLog:
    log = open_log(cleanup_policy="compact", segment_bytes=300)
    for i in range(60):
        put(log, b"k%d" % (i % 4), b"v%d" % i, timestamp_ms=1_000)
    assert clean(log) is not None
    assert log.clean_offset > 20
    return log


@pytest.mark.parametrize("crashed", [False, True])
def test_a_reset_below_the_clean_offset_lowers_the_cleaner_checkpoint(
    open_log: OpenLog, log_dir: Path, crashed: bool
) -> None:
    # Nothing above the offset is clean or rewritten by the cleaner any more:
    # a checkpoint left above it would keep the cleaner off the new records
    # there and let gaps between them pass for compaction's.
    log = _compacted_log(open_log)
    if crashed:
        checkpoints.write_reset_offset(log_dir, 10)
        crash(log)
    else:
        log.reset_to(10)
        log.close()
    log = open_log(cleanup_policy="compact", segment_bytes=300)
    assert (log.log_start_offset, log.log_end_offset, log.clean_offset) == (10, 10, 10)
    assert checkpoints.read_cleaner_checkpoint(log_dir) == (10, 10, {})


def test_a_reset_an_older_broker_cut_short_completes_at_open(
    open_log: OpenLog, log_dir: Path
) -> None:
    # A broker from before the reset-offset file wrote the new log start
    # first, then dropped the segments: a crash between the two left a log
    # ending below its start, with no reset-offset file.
    log = _filled_log(open_log)
    assert log.log_end_offset < RESET_AT
    log.flush()
    crash(log)
    checkpoints.write_log_start_offset(log_dir, RESET_AT, durable=True)
    assert not (log_dir / files.RESET_OFFSET_FILE).exists()
    _assert_empty_at(open_log(segment_bytes=400), RESET_AT)
