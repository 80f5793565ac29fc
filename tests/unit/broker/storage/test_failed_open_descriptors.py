"""An open of a partition log that fails part-way closes whatever it
opened: no descriptor is left behind, however often it is tried (a log that
fails to open is hosted offline and tried again at every start of the
broker, `UnopenedLog`).

Each failure is a real one on real files: a directory where a later
segment's index or a producer snapshot should be (EISDIR, which root gets
too), and running out of descriptors (a real RLIMIT_NOFILE) at every point
of an open in turn. The error that surfaces is the one that failed.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import resource
import uuid
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog, files

from tests.unit.broker.storage.storage_helpers import (
    PARTITION,
    TOPIC,
    append,
    crash,
    make_batch,
    read_all,
)

#: Failed opens per case: a leak grows with each.
ATTEMPTS = 4
CONFIG = dataclasses.replace(LogConfig(), segment_bytes=1024)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fill(log_dir: Path, clock: ManualClock, clean: bool = True) -> bytes:
    """A log of several segments in `log_dir`, closed (or dropped as a crash
    would: every segment is then recovered by the next open); its bytes."""
    log = PartitionLog.open(log_dir, TOPIC, PARTITION, CONFIG, clock)
    for tag in range(20):
        append(log, make_batch(value_bytes=300, tag=tag))
    assert len(log.segments) >= 5
    records = read_all(log)
    if clean:
        log.close()
    else:
        crash(log)
    return records


def _fails_without_a_leak(log_dir: Path, clock: ManualClock, cause: type[OSError]) -> None:
    before = _descriptors()
    for attempt in range(ATTEMPTS):
        with pytest.raises(StorageError) as raised:
            PartitionLog.open(log_dir, TOPIC, PARTITION, CONFIG, clock)
        # The error of the step that failed, not one of the clean-up.
        assert isinstance(raised.value.__cause__, cause), raised.value
        assert _descriptors() == before, f"after failed open {attempt + 1}"


def test_a_later_segment_that_cannot_be_opened(log_dir: Path, clock: ManualClock) -> None:
    """The loader has opened the first segments when one further on fails."""
    _fill(log_dir, clock)
    index = sorted(log_dir.glob("*.index"))[-2]
    index.unlink()
    index.mkdir()
    _fails_without_a_leak(log_dir, clock, IsADirectoryError)


def test_a_producer_state_that_cannot_be_rebuilt(log_dir: Path, clock: ManualClock) -> None:
    """Every segment is loaded and recovered when the producer state's
    rebuild (after the loader) fails: its snapshot cannot be read or
    removed."""
    _fill(log_dir, clock, clean=False)
    files.snapshot_path(log_dir, 5).mkdir()
    _fails_without_a_leak(log_dir, clock, IsADirectoryError)


def test_a_reset_cut_short_that_cannot_be_finished(log_dir: Path, clock: ManualClock) -> None:
    """The loader finished the reset's segments (a new empty one is open)
    when forgetting the producer state fails."""
    _fill(log_dir, clock)
    (log_dir / files.RESET_OFFSET_FILE).write_text("7\n")
    files.snapshot_path(log_dir, 3).mkdir()
    _fails_without_a_leak(log_dir, clock, IsADirectoryError)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crashed"])
def test_out_of_descriptors_at_any_point_of_an_open(
    clean: bool, log_dir: Path, clock: ManualClock
) -> None:
    """With room for 0, 1, 2, ... more descriptors, the open fails at each
    of its steps in turn (a segment's files, the headers read to rebuild
    the epoch history and producer state, a checkpoint or the topic id
    written, the log's close after that write failed) until it gets
    through: none leaves a descriptor open, nor damages the log."""
    records = _fill(log_dir, clock, clean=clean)
    topic_id = uuid.uuid4().hex
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = _descriptors()
    taken = {int(fd) for fd in os.listdir("/proc/self/fd")}
    free = [fd for fd in range(max(taken) + 200) if fd not in taken]
    failures: list[str] = []
    for room in range(100):
        # A new descriptor takes the lowest free number: `room` of them fit.
        resource.setrlimit(resource.RLIMIT_NOFILE, (free[room], hard))
        try:
            log = PartitionLog.open(log_dir, TOPIC, PARTITION, CONFIG, clock, topic_id)
        except StorageError as exc:
            failures.append(str(exc))
            cause = exc.__cause__
            assert isinstance(cause, OSError) and cause.errno == errno.EMFILE, exc
        else:
            break
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert _descriptors() == before, f"room for {room} descriptors: {failures[-1]}"
    else:
        pytest.fail("the open never got through")
    try:
        assert len(failures) > 5, failures
        assert read_all(log) == records
        assert files.read_topic_id(log_dir) == topic_id
    finally:
        log.close()
    assert _descriptors() == before


def test_a_close_that_fails_part_way_closes_the_files(log_dir: Path, clock: ManualClock) -> None:
    """A close whose flush fails (a directory where the recovery point is
    written) still closes every file: nobody closes a log twice (the
    LogManager closing the logs it opened when hosting fails, an open whose
    topic id cannot be recorded). The next open recovers the log."""
    records = _fill(log_dir, clock)
    before = _descriptors()
    recovery_point = log_dir / files.RECOVERY_POINT_FILE
    recovery_point.unlink()
    (recovery_point / "in-the-way").mkdir(parents=True)
    log = PartitionLog.open(log_dir, TOPIC, PARTITION, CONFIG, clock)
    with pytest.raises(StorageError) as raised:
        log.close()
    assert isinstance(raised.value.__cause__, OSError), raised.value
    assert _descriptors() == before
    (recovery_point / "in-the-way").rmdir()
    recovery_point.rmdir()
    reopened = PartitionLog.open(log_dir, TOPIC, PARTITION, CONFIG, clock)
    try:
        assert read_all(reopened) == records
    finally:
        reopened.close()
    assert _descriptors() == before
