"""Whether an opened log may have lost its tail (`may_have_lost_tail`),
which makes its replica torn for the controller: a log that was not closed
cleanly, whatever recovery finds; one whose recovery point is past its end;
not one closed cleanly, nor one whose directory the open created.

A crash that cuts a segment exactly at a batch boundary (what ext4's
data=ordered leaves after a power loss: a file at the size of an earlier
write()) recovers clean: nothing in the files tells it from a log that was
never longer. Before, only damage made a log torn, so a replica cut so was
elected while the leader could still return, and the others truncated to it
(a 900 s soak lost 9.9 M of 13.5 M acknowledged records).
"""

from __future__ import annotations

import os
from pathlib import Path

from tidelog.records import iter_batches
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog, files
from tidelog_broker.storage.log_loader import TailLoss

from tests.unit.broker.storage.storage_helpers import (
    PARTITION,
    TOPIC,
    append,
    crash,
    make_batch,
    read_all,
)

BATCHES = 4
RECORDS_PER_BATCH = 5


def _open(directory: Path) -> PartitionLog:
    return PartitionLog.open(directory, TOPIC, PARTITION, LogConfig(), ManualClock())


def _written(directory: Path, flush: bool = True) -> tuple[PartitionLog, list[int]]:
    """A log with BATCHES batches, each its own append (its own write()),
    flushed if `flush`; and the size of its segment file after each append:
    the batch boundaries, where a power loss leaves the file."""
    log = _open(directory)
    sizes = []
    for tag in range(BATCHES):
        append(log, make_batch(RECORDS_PER_BATCH, value_bytes=100, tag=tag))
        sizes.append(log.segments[-1].log_path.stat().st_size)
    if flush:
        log.flush()
    return log, sizes


def _boundaries(segment: Path) -> list[int]:
    """The position where each batch of `segment` ends, read from the batch
    headers of the file itself."""
    data = segment.read_bytes()
    return [position + header.size for position, header in iter_batches(data)]


def test_a_log_not_closed_cleanly_may_have_lost_its_tail(tmp_path: Path) -> None:
    log, _ = _written(tmp_path / "log")
    crash(log)
    reopened = _open(tmp_path / "log")
    try:
        assert reopened.may_have_lost_tail is TailLoss.UNCLEAN_SHUTDOWN
        assert reopened.log_end_offset == BATCHES * RECORDS_PER_BATCH
    finally:
        crash(reopened)


def test_a_cut_at_a_batch_boundary_recovers_clean_and_is_still_flagged(tmp_path: Path) -> None:
    """The soak's data loss: a crash left the file at a batch boundary. The
    log recovers with no damage found; only the missing clean-shutdown
    marker says that records may be gone. (Not flushed: the recovery point
    is below the cut, as after a power loss that lost what was not fsynced.)"""
    directory = tmp_path / "log"
    log, sizes = _written(directory, flush=False)
    assert log.recovery_point < 2 * RECORDS_PER_BATCH
    segment = log.segments[-1].log_path
    crash(log)
    assert _boundaries(segment) == sizes  # each append's size is a batch's end
    os.truncate(segment, sizes[1])
    reopened = _open(directory)
    try:
        assert reopened.log_end_offset == 2 * RECORDS_PER_BATCH
        assert reopened.may_have_lost_tail is TailLoss.UNCLEAN_SHUTDOWN
    finally:
        crash(reopened)


def test_a_log_closed_cleanly_has_lost_nothing(tmp_path: Path) -> None:
    log, _ = _written(tmp_path / "log")
    log.close()
    reopened = _open(tmp_path / "log")
    try:
        assert reopened.may_have_lost_tail is None
    finally:
        reopened.close()


def test_a_log_whose_directory_the_open_creates_has_nothing_to_lose(tmp_path: Path) -> None:
    log = _open(tmp_path / "new")
    try:
        assert log.may_have_lost_tail is None
    finally:
        crash(log)
    # The same directory again without a clean close: it was a log that a
    # crash interrupted, however empty.
    reopened = _open(tmp_path / "new")
    try:
        assert reopened.may_have_lost_tail is TailLoss.UNCLEAN_SHUTDOWN
    finally:
        reopened.close()


def test_a_recovery_point_past_the_end_at_a_batch_boundary_is_a_loss(tmp_path: Path) -> None:
    """Flushed records gone (the recovery point vouched for them) with the
    file cut at a batch boundary: even with the clean-shutdown marker, the
    log is flagged, and for that reason."""
    directory = tmp_path / "log"
    log, sizes = _written(directory)
    assert log.recovery_point == BATCHES * RECORDS_PER_BATCH
    segment = log.segments[-1].log_path
    log.close()
    assert (directory / files.CLEAN_SHUTDOWN_FILE).exists()
    os.truncate(segment, sizes[2])
    reopened = _open(directory)
    try:
        assert reopened.log_end_offset == 3 * RECORDS_PER_BATCH
        assert reopened.may_have_lost_tail is TailLoss.PAST_END
    finally:
        crash(reopened)


def test_damage_is_named_before_an_unclean_shutdown(tmp_path: Path) -> None:
    log, sizes = _written(tmp_path / "log")
    segment = log.segments[-1].log_path
    crash(log)
    os.truncate(segment, sizes[2] - 7)
    reopened = _open(tmp_path / "log")
    try:
        assert reopened.log_end_offset == 2 * RECORDS_PER_BATCH
        assert reopened.may_have_lost_tail is TailLoss.DAMAGE
    finally:
        crash(reopened)


def test_a_log_still_flagged_closes_without_the_marker(tmp_path: Path) -> None:
    """A torn log whose broker is stopped cleanly before it caught up is
    torn again at the next start: a restart restores nothing it lost. Once
    no longer flagged (caught up, or elected), its close marks it clean."""
    directory = tmp_path / "log"
    log, _ = _written(directory)
    crash(log)
    flagged = _open(directory)
    expected = read_all(flagged)
    flagged.close()
    assert not (directory / files.CLEAN_SHUTDOWN_FILE).exists()
    again = _open(directory)
    assert again.may_have_lost_tail is TailLoss.UNCLEAN_SHUTDOWN
    assert read_all(again) == expected
    again.may_have_lost_tail = None  # what catching up or leading does
    again.close()
    clean = _open(directory)
    try:
        assert clean.may_have_lost_tail is None
    finally:
        clean.close()
