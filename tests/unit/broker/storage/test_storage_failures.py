"""The other changes of a partition log made in several steps, failing
part-way with an OSError while the broker keeps running (the faults of
`test_reset_failures`: the n-th os call of one kind fails, for every n until
the change gets through): DeleteRecords, retention, a flush, a cleaning
swap, an append that rolls a new segment.

After each failure the log must be exactly as before (nothing of the change
in memory nor on disk), or offline (`_assert_refuses_everything`); and a
new open of the directory must give a consistent log: the old one or the
changed one, which takes appends.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tidelog.errors import StorageError
from tidelog.records import iter_batches
from tidelog_broker.storage import ManualClock, PartitionLog, cleaner
from tidelog_broker.storage.partition_log import unlink_files

from tests.unit.broker.storage.compaction_helpers import put, read_records
from tests.unit.broker.storage.storage_helpers import make_batch, read_all
from tests.unit.broker.storage.test_cleaning_swap import Model, _check, _close_files, _open
from tests.unit.broker.storage.test_reset_crashes import Directory, Seen, _fill, _replicate
from tests.unit.broker.storage.test_reset_failures import (
    CALLS_MAX,
    FAULTS,
    _arm,
    _assert_refuses_everything,
)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _takes_appends(log: PartitionLog, where: str) -> None:
    end = log.log_end_offset
    records = read_all(log)
    _replicate(log, 9, make_batch(record_count=2, tag=77))
    log.flush()
    assert log.offline is None, where
    assert log.log_end_offset == end + 2, where
    assert read_all(log).startswith(records), where


# ------------------------------------------------------------ DeleteRecords


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_delete_records_that_fails_part_way_takes_the_log_offline(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part-way, the new start is in memory and not on disk, or on disk
    without its segments renamed: offline; open gives the old start or the
    new one (never records below a start it reports)."""
    reference = Directory(tmp_path / "reference" / "orders-3")
    try:
        log = reference.open()
        _fill(log, 12)
        offset = log.segments[2].base_offset + 1
        unlink_files(log.delete_records_before(offset))
        deleted = Seen.of(log)
    finally:
        reference.close_all()
    failures = 0
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            _fill(log, 12)
            old = Seen.of(log)
            where = f"os.{FAULTS[fault][0]} call {fail_at} of DeleteRecords failed"
            _arm(monkeypatch, fault, fail_at)
            try:
                unlink_files(log.delete_records_before(offset))
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert Seen.of(log) == deleted, where
                break
            finally:
                monkeypatch.undo()
            failures += 1
            _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            assert seen in (old, deleted), where
            _takes_appends(reopened, where)
        finally:
            directory.close_all()
    else:
        pytest.fail(f"DeleteRecords never got through within {CALLS_MAX} {fault} calls")
    assert failures, f"no {fault} call in DeleteRecords"


# ------------------------------------------------------------ retention


@pytest.mark.parametrize("fault", ["rename", "unlink"])  # retention fsyncs nothing
def test_retention_that_fails_part_way_leaves_the_log_as_before_or_takes_it_offline(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first step, the log start (a rename), fails with the log exactly
    as before; after it, memory has dropped segments still on disk under
    their names (or snapshots): offline. Open gives the old log or the one
    that starts at the first kept segment."""
    outcomes: set[str] = set()
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            _fill(log, 12)
            # Every closed segment is past retention.bytes.
            log.update_config(dataclasses.replace(log.config, retention_bytes=0))
            old = Seen.of(log)
            old_segments = log.segment_count
            new_start = log.segments[-1].base_offset
            before = _files(directory.path)
            where = f"os.{FAULTS[fault][0]} call {fail_at} of retention failed"
            _arm(monkeypatch, fault, fail_at)
            try:
                unlink_files(log.delete_old_segments())
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert log.log_start_offset == new_start, where
                break
            finally:
                monkeypatch.undo()
            if log.offline is None:
                outcomes.add("as before")
                assert Seen.of(log) == old, where
                assert log.segment_count == old_segments, where
                assert _files(directory.path) == before, where
            else:
                outcomes.add("offline")
                _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            assert seen.log_end_offset == old.log_end_offset, where
            assert seen.log_start_offset in (old.log_start_offset, new_start), where
            assert old.records.endswith(seen.records), where
            if seen.log_start_offset == old.log_start_offset:
                assert seen == old, where
            _takes_appends(reopened, where)
        finally:
            directory.close_all()
    else:
        pytest.fail(f"retention never got through within {CALLS_MAX} {fault} calls")
    # A rename fails first on the log start (as before), then on the segments.
    expected = {"as before", "offline"} if fault == "rename" else {"offline"}
    assert outcomes == expected, outcomes


# ------------------------------------------------------------ flush


@pytest.mark.parametrize("fault", ["fsync", "rename"])
def test_a_flush_that_fails_takes_the_log_offline(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the dirty pages may be gone: a second flush
    whose fsyncs succeed must not raise the recovery point over them. Open
    gives the log with what was flushed before and at most what was
    appended since."""
    failures = 0
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            _fill(log, 12)  # flushed
            flushed = Seen.of(log)
            # Unflushed: a new epoch, batches over a roll (a new file).
            segments = log.segment_count
            while log.segment_count < segments + 2:
                _replicate(log, 5, make_batch(record_count=3, value_bytes=20, tag=40))
            appended = read_all(log)
            where = f"os.{FAULTS[fault][0]} call {fail_at} of a flush failed"
            _arm(monkeypatch, fault, fail_at)
            try:
                log.flush()
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert log.recovery_point == log.log_end_offset, where
                break
            finally:
                monkeypatch.undo()
            failures += 1
            _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            assert seen.records.startswith(flushed.records), where
            assert appended.startswith(seen.records), where
            _takes_appends(reopened, where)
        finally:
            directory.close_all()
    else:
        pytest.fail(f"the flush never got through within {CALLS_MAX} {fault} calls")
    assert failures, f"no {fault} call in a flush"


# ------------------------------------------------------------ cleaning swap


#: No swap of the rounds below makes this many calls of one kind.
SWAP_CALLS_MAX = 256


def _latest(log: PartitionLog) -> Model:
    latest: Model = {}
    for _, key, value, _ in read_records(log):
        assert key is not None
        latest[key] = value
    return latest


@pytest.mark.parametrize("fault", ["fsync", "rename"])
def test_a_cleaning_swap_that_fails_part_way_takes_the_log_offline(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first durable write the swap has raised the gap limit in
    memory, committed groups for the next open to swap in, or replaced part
    of the segments: offline (serving on, a truncation or retention would
    change segments that the next open replaces with cleaned copies). Open
    gives every key's latest value."""
    failures = 0
    # Three renames a group to commit it, three more to swap it in.
    for fail_at in range(1, SWAP_CALLS_MAX):
        path = tmp_path / str(fail_at) / "orders-3"
        clock = ManualClock()
        log = _open(path, clock)
        try:
            for i in range(60):
                put(log, b"key-%d" % (i % 7), b"value-%d-" % i + b"v" * 40, clock.time_ms())
            clock.advance(1)
            model = _latest(log)
            end = log.log_end_offset
            plan = log.plan_cleaning(1_000, force=True)
            assert plan is not None
            result = cleaner.clean(plan)
            assert len(result.groups) > 1
            where = f"os.{FAULTS[fault][0]} call {fail_at} of a cleaning swap failed"
            _arm(monkeypatch, fault, fail_at)
            try:
                unlink_files(log.finish_cleaning(result))
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert log.clean_offset == result.clean_offset, where
                break
            finally:
                monkeypatch.undo()
            failures += 1
            _assert_refuses_everything(log, where)
            _close_files(log)
            _check(path, clock, model, end, where)
            reopened = _open(path, clock)
            try:
                put(reopened, b"key-0", b"after", clock.time_ms())
                assert _latest(reopened)[b"key-0"] == b"after", where
            finally:
                _close_files(reopened)
        finally:
            _close_files(log)
    else:
        pytest.fail(f"the swap never got through within {SWAP_CALLS_MAX} {fault} calls")
    assert failures, f"no {fault} call in a cleaning swap"


# ------------------------------------------------------------ roll


#: Faults of an append: the os call that fails at the n-th call and its
#: error; "write+unlink" also fails every os.unlink after it (the new
#: segment of a roll cannot be removed again), "write+ftruncate" every
#: os.ftruncate (the undo of the append).
APPEND_FAULTS: dict[str, tuple[str, int]] = {
    "open": ("open", errno.EMFILE),
    "write": ("write", errno.ENOSPC),
    "fsync": ("fsync", errno.EIO),
    "rename": ("replace", errno.ENOSPC),
    "write+unlink": ("write", errno.ENOSPC),
    "write+ftruncate": ("write", errno.ENOSPC),
}
#: The faults of a roll.
ROLL_FAULTS = sorted(APPEND_FAULTS)


def _arm_append(monkeypatch: pytest.MonkeyPatch, fault: str, fail_at: int) -> None:
    name, code = APPEND_FAULTS[fault]
    _, plus, then = fault.partition("+")
    countdown = [fail_at]

    def failing(real: Callable[..., Any], called: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if called == name:
                countdown[0] -= 1
                if countdown[0] == 0:
                    raise OSError(code, f"{os.strerror(code)} (injected into os.{called})")
            elif countdown[0] <= 0:  # `then`, after the first failure
                raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected into os.{called})")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, name, failing(getattr(os, name), name))
    if plus:
        monkeypatch.setattr(os, then, failing(getattr(os, then), then))


def _append(log: PartitionLog, path: str, batch: bytearray) -> None:
    if path == "leader":
        log.append(batch, list(iter_batches(batch)))
    else:
        _replicate(log, 5, batch)  # a new epoch


@pytest.mark.parametrize("path", ["leader", "follower"])
@pytest.mark.parametrize("fault", ROLL_FAULTS)
def test_an_append_that_rolls_is_all_or_nothing(
    path: str, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The architecture invariant for an append that rolls: a failure
    leaves the log exactly as before (no new segment in memory nor on
    disk, no epoch that wrote nothing); if the new segment's files cannot
    be removed, the log is offline. Open gives the old log either way
    (with "write+ftruncate" the new segment's files hold bytes of the
    failed append, and are removed: as before)."""
    failures = 0
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            _fill(log, 12)  # with a producer: a roll takes a snapshot
            old = Seen.of(log)
            old_segments = log.segment_count
            old_epochs = list(log.leader_epochs.entries)
            before = [n for n in _files(directory.path) if not n.endswith(".snapshot")]
            descriptors = _open_descriptors()
            where = f"{path}: {fault}: call {fail_at} of an append failed"
            # Bigger than what a segment holds besides it: it rolls.
            batch = make_batch(record_count=2, value_bytes=150, tag=50)
            _arm_append(monkeypatch, fault, fail_at)
            try:
                _append(log, path, batch)
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert log.segment_count == old_segments + 1, where
                break
            finally:
                monkeypatch.undo()
            failures += 1
            if fault == "write+unlink":
                _assert_refuses_everything(log, where)
                log.close()
            else:
                assert log.offline is None, where
                assert Seen.of(log) == old, where
                assert log.segment_count == old_segments, where
                assert log.leader_epochs.entries == old_epochs, where
                files_now = [n for n in _files(directory.path) if not n.endswith(".snapshot")]
                assert files_now == before, where
                # Not even a descriptor of the new segment's files left open.
                assert _open_descriptors() == descriptors, where
                # And the same append gets through now.
                _append(log, path, make_batch(record_count=2, value_bytes=150, tag=50))
                assert log.segment_count == old_segments + 1, where
                log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            if fault == "write+unlink":
                assert seen == old, where
            else:
                assert seen.records.startswith(old.records), where
                assert seen.log_end_offset == old.log_end_offset + 2, where
            _takes_appends(reopened, where)
        finally:
            directory.close_all()
    else:
        pytest.fail(f"the append never got through within {CALLS_MAX} {fault} calls")
    assert failures, f"no {fault} call in an append that rolls"


@pytest.mark.parametrize("path", ["leader", "follower"])
def test_an_append_whose_undo_fails_takes_the_log_offline(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the append fails (disk full) and so does every
    os.ftruncate of its undo: the segment's files hold bytes the log does
    not know of, and the segment refuses appends until an open recovers
    it, so the log is offline (not a leader that serves reads and fails
    every produce). Open gives the old log, or the old log and the batch
    if its .log write got through."""
    failures = 0
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            _fill(log, 12)
            old = Seen.of(log)
            segments = log.segment_count
            where = f"{path}: os.write call {fail_at} of an append failed, and its undo"
            batch = make_batch(record_count=2, value_bytes=5, tag=50)
            _arm_append(monkeypatch, "write+ftruncate", fail_at)
            try:
                _append(log, path, batch)
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                break
            finally:
                monkeypatch.undo()
            assert log.segment_count == segments, where  # it did not roll
            failures += 1
            _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            assert seen.records.startswith(old.records), where
            assert seen.log_end_offset in (old.log_end_offset, old.log_end_offset + 2), where
            _takes_appends(reopened, where)
        finally:
            directory.close_all()
    else:
        pytest.fail(f"the append never got through within {CALLS_MAX} os.write calls")
    assert failures, "no os.write call in an append"
