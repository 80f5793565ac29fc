"""The epoch history after a crash: open learns it again from the batches.

`assign` writes nothing; the history reaches the disk with the log's flush
(before the recovery point moves) and with a truncation. So after a crash
the file may lack every epoch assigned since the last flush, and open must
learn them from the partition_leader_epoch of the batches it recovered
(`leader_epoch`'s invariant). Each test writes batches stamped with epochs
as a follower does (`append_replicated`), crashes, leaves the file stale or
damaged, reopens, and checks the entries and `end_offset_for_epoch`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tidelog.records import iter_batches, set_base_offset, set_partition_leader_epoch
from tidelog_broker.storage import PartitionLog, checkpoints, files
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_server.atomic_files import TEMP_SUFFIX

from tests.unit.broker.storage.compaction_helpers import clean, put
from tests.unit.broker.storage.storage_helpers import OpenLog, crash, make_batch


def replicate(log: PartitionLog, epoch: int, batches: int = 2) -> None:
    """Append `batches` batches of two records stamped with `epoch` at the
    log end, as a follower appends what its leader wrote."""
    records = bytearray()
    offset = log.log_end_offset
    for tag in range(batches):
        batch = make_batch(record_count=2, tag=tag)
        set_base_offset(batch, 0, offset)
        set_partition_leader_epoch(batch, 0, epoch)
        records += batch
        offset += 2
    log.append_replicated(records, list(iter_batches(records)))


def checkpoint_file(log_dir: Path) -> Path:
    return log_dir / files.LEADER_EPOCH_CHECKPOINT_FILE


def test_epochs_assigned_since_the_last_flush_are_learnt_from_the_batches(
    open_log: OpenLog, log_dir: Path
) -> None:
    log = open_log()
    replicate(log, epoch=0)  # offsets 0-3
    replicate(log, epoch=2)  # 4-7
    log.flush()  # the file now holds epochs 0 and 2; the recovery point is 8
    written = checkpoint_file(log_dir).read_text()
    replicate(log, epoch=3)  # 8-11
    log.leader_epochs.assign(5, log.log_end_offset)  # led epoch 5 from 12...
    replicate(log, epoch=7)  # ...but wrote nothing: epoch 7's follower from 12
    assert log.leader_epochs.entries == [(0, 0), (2, 4), (3, 8), (7, 12)]
    crash(log)
    # What a crash leaves, at worst: the file as the last flush wrote it.
    checkpoint_file(log_dir).write_text(written)

    log = open_log()
    assert log.leader_epochs.entries == [(0, 0), (2, 4), (3, 8), (7, 12)]
    assert log.leader_epochs.end_offset_for_epoch(2, log.log_end_offset) == (2, 8)
    assert log.leader_epochs.end_offset_for_epoch(4, log.log_end_offset) == (3, 12)
    assert log.leader_epochs.end_offset_for_epoch(7, log.log_end_offset) == (7, 16)


def test_a_log_never_flushed_learns_its_whole_history(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log()
    for epoch in (1, 4, 9):
        replicate(log, epoch)
    crash(log)
    checkpoint_file(log_dir).unlink(missing_ok=True)

    log = open_log()
    assert log.leader_epochs.entries == [(1, 0), (4, 4), (9, 8)]
    assert log.leader_epochs.end_offset_for_epoch(3, log.log_end_offset) == (1, 4)


def test_an_unreadable_file_is_learnt_again_from_every_batch(
    open_log: OpenLog, log_dir: Path
) -> None:
    # Below the recovery point too: recovery checks nothing there, but the
    # file that named those epochs is gone.
    log = open_log(segment_bytes=200)
    for epoch in (0, 3, 6):
        replicate(log, epoch)
    log.close()
    assert log.segment_count > 1
    checkpoint_file(log_dir).write_bytes(b"\xff garbage\n")

    log = open_log(segment_bytes=200)
    assert log.leader_epochs.entries == [(0, 0), (3, 4), (6, 8)]
    log.close()  # the flush writes the file again
    assert LeaderEpochCache.load(log_dir).entries == [(0, 0), (3, 4), (6, 8)]


def test_a_recovery_point_past_the_log_end_is_lowered_durably_at_open(
    open_log: OpenLog, log_dir: Path
) -> None:
    # A truncation cut short by a crash: the log was cut, the lower recovery
    # point not yet written. Batches appended after the reopen would sit
    # below the stale one and never be checked, nor their epochs learnt.
    log = open_log()
    replicate(log, epoch=0)
    crash(log)
    checkpoints.write_recovery_point(log_dir, 1_000)

    log = open_log()
    # At or below the log end (main's loader lowers it to the base of the
    # segment it recovered: `test_recovery_point`).
    on_disk = checkpoints.read_recovery_point(log_dir)
    assert on_disk is not None and on_disk <= log.log_end_offset == 4
    replicate(log, epoch=5)
    crash(log)

    log = open_log()
    assert log.leader_epochs.entries == [(0, 0), (5, 4)]


def test_a_truncation_lowers_the_recovery_point_durably(
    open_log: OpenLog, log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The new leader's records appended after the cut, and their epoch,
    # must be above the recovery point on disk whatever a crash forgets.
    log = open_log()
    replicate(log, epoch=0)
    replicate(log, epoch=3)  # 4-7: diverged from the new leader
    log.flush()  # recovery point 8
    fsynced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log.truncate_to(4)
    monkeypatch.undo()
    assert files.RECOVERY_POINT_FILE + TEMP_SUFFIX in fsynced
    assert checkpoints.read_recovery_point(log_dir) == 4
    assert LeaderEpochCache.load(log_dir).entries == [(0, 0)]
    replicate(log, epoch=4)  # the new leader's records at 4-7
    crash(log)

    log = open_log()
    assert log.leader_epochs.entries == [(0, 0), (4, 4)]
    assert log.leader_epochs.end_offset_for_epoch(3, log.log_end_offset) == (0, 4)


def test_a_compaction_swap_writes_the_epochs_first(open_log: OpenLog, log_dir: Path) -> None:
    # The cleaner may drop the first batches of an epoch: recovery could no
    # longer tell where it started, so the swap writes the history first.
    log = open_log(cleanup_policy="compact", segment_bytes=300)
    log.leader_epochs.assign(6, 0)
    for i in range(12):
        put(log, b"k", b"v%d" % i, timestamp_ms=i)
    assert not checkpoint_file(log_dir).exists()
    assert clean(log) is not None
    assert LeaderEpochCache.load(log_dir).entries == [(6, 0)]
