"""The recovery point after a truncation, a reset or an open that finds the
log ending below it: lowered durably before anything is appended above it,
so a crash cannot leave a stale, higher one that vouches for batches never
fsynced (and a torn one among them served as valid).

Each test crashes with batches appended after the recovery point went down,
tears the last page of one of them (the file grew but that page was never
written back: the header and the length survive, only the CRC can tell),
and reopens from the state a crash leaves (`DurableDirectory`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog_broker.storage import PartitionLog, files

from tests.unit.broker.storage.durable_directory import DurableDirectory
from tests.unit.broker.storage.storage_helpers import OpenLog, append, crash, make_batch, read_all

SEGMENT_BYTES = 1024
#: Offsets in the log before the recovery point goes down, all flushed.
FLUSHED_END = 40
TRUNCATE_AT = 14

#: What a crash left for a recovery point whose lowering was not yet durable.
STALE_RECOVERY_POINT = f"{FLUSHED_END}\n"


def _flushed_log(open_log: OpenLog) -> PartitionLog:
    log = open_log(segment_bytes=SEGMENT_BYTES)
    for tag in range(FLUSHED_END // 2):
        append(log, make_batch(2, value_bytes=100, tag=tag))
    log.flush()
    assert log.recovery_point == FLUSHED_END
    return log


def _append_new(log: PartitionLog, count: int) -> list[tuple[int, bytes]]:
    return [append(log, make_batch(2, value_bytes=100, tag=100 + i)) for i in range(count)]


def _append_into_a_new_segment(log: PartitionLog) -> list[tuple[int, bytes]]:
    """New batches until one lands in a new segment, so that a batch torn in
    the segment before it is not in the last one (which open recovers when
    the recovery point is past the end, whatever else was done)."""
    segments = log.segment_count
    new = _append_new(log, 1)
    while log.segment_count == segments:
        new += _append_new(log, 1)
    assert log.log_end_offset < FLUSHED_END
    return new


def _tear_last_batch(log_path: Path) -> None:
    """Zero the last bytes of the file's last batch, keeping the file's size."""
    with log_path.open("r+b") as out:
        out.seek(-16, 2)
        out.write(bytes(16))


def _tear_before_the_last_segment(log: PartitionLog, new: list[tuple[int, bytes]]) -> int:
    """Tear the last batch of the segment before the last; its offset."""
    torn_segment = log.segments[-2]
    _tear_last_batch(torn_segment.log_path)
    return max(offset for offset, _ in new if offset < torn_segment.next_offset)


def _stored_below(new: list[tuple[int, bytes]], end: int) -> bytes:
    return b"".join(stored for offset, stored in new if offset < end)


def _crash_tear_and_reopen(
    open_log: OpenLog, log: PartitionLog, new: list[tuple[int, bytes]], disk: DurableDirectory
) -> tuple[PartitionLog, int]:
    """Crash, tear the last batch of the segment before the last, put the
    recovery point back as the disk holds it, reopen: the reopened log and
    the torn batch's offset."""
    crash(log)
    torn_offset = _tear_before_the_last_segment(log, new)
    disk.bring_back(files.RECOVERY_POINT_FILE)
    return open_log(segment_bytes=SEGMENT_BYTES), torn_offset


def test_truncation_lowers_the_recovery_point_durably(
    open_log: OpenLog, log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _flushed_log(open_log)
    disk = DurableDirectory(log_dir, monkeypatch)
    log.truncate_to(TRUNCATE_AT)
    kept = read_all(log)
    new = _append_into_a_new_segment(log)
    reopened, torn_offset = _crash_tear_and_reopen(open_log, log, new, disk)
    assert reopened.log_end_offset == torn_offset
    assert read_all(reopened) == kept + _stored_below(new, torn_offset)


def test_reset_lowers_the_recovery_point_durably(
    open_log: OpenLog, log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _flushed_log(open_log)
    disk = DurableDirectory(log_dir, monkeypatch)
    log.reset_to(TRUNCATE_AT)
    new = _append_into_a_new_segment(log)
    reopened, torn_offset = _crash_tear_and_reopen(open_log, log, new, disk)
    assert reopened.log_start_offset == TRUNCATE_AT
    assert reopened.log_end_offset == torn_offset
    assert read_all(reopened) == _stored_below(new, torn_offset)


def test_open_lowers_a_recovery_point_past_the_log_end_durably(
    open_log: OpenLog, log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A truncation cut short by a crash after it cut the log and before it
    # lowered the recovery point.
    log = _flushed_log(open_log)
    log.truncate_to(TRUNCATE_AT)
    kept = read_all(log)
    crash(log)
    (log_dir / files.RECOVERY_POINT_FILE).write_text(STALE_RECOVERY_POINT, encoding="ascii")
    disk = DurableDirectory(log_dir, monkeypatch)
    log = open_log(segment_bytes=SEGMENT_BYTES)
    assert log.log_end_offset == TRUNCATE_AT
    new = _append_into_a_new_segment(log)
    reopened, torn_offset = _crash_tear_and_reopen(open_log, log, new, disk)
    assert reopened.log_end_offset == torn_offset
    assert read_all(reopened) == kept + _stored_below(new, torn_offset)


def test_open_recovers_the_last_segment_when_the_recovery_point_is_past_the_end(
    open_log: OpenLog, log_dir: Path
) -> None:
    # What a broker that lowered the recovery point without an fsync could
    # leave: batches appended after a truncation, under the old recovery point.
    log = _flushed_log(open_log)
    log.truncate_to(TRUNCATE_AT)
    kept = read_all(log)
    new = _append_new(log, 3)
    crash(log)
    _tear_last_batch(log.segments[-1].log_path)
    (log_dir / files.RECOVERY_POINT_FILE).write_text(STALE_RECOVERY_POINT, encoding="ascii")
    # The marker is no reason to trust a recovery point the log does not reach.
    (log_dir / files.CLEAN_SHUTDOWN_FILE).touch()

    reopened = open_log(segment_bytes=SEGMENT_BYTES)
    assert reopened.log_end_offset == new[-1][0]
    assert read_all(reopened) == kept + b"".join(stored for _, stored in new[:-1])
    assert reopened.recovery_point <= reopened.log_end_offset
    assert (log_dir / files.RECOVERY_POINT_FILE).read_text(encoding="ascii") == (
        f"{reopened.recovery_point}\n"
    )
