"""`PartitionLog.reset_to` cut short by a crash at each of its fsyncs.

Each case builds a log and flushes it (the "old log"), resets it to an
offset below, inside, at or above it, and crashes before the n-th fsync of
the reset (or after it returned), for every n. The crash keeps or loses
each write not yet made durable: all lost, all kept, or each at random
(`DurableDirectory`). The next `open` must give the old log unchanged (its
records, log start, epoch history and producer state) or an empty log at
the reset offset with no epoch history, no producer state and no snapshot;
never old records under a new log start, a log start inside old data, or a
recovery point past the end. What that open finished must be durable too:
a batch appended and flushed after it survives another crash.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tidelog.records import encode_batch, iter_batches, set_base_offset, set_partition_leader_epoch
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog
from tidelog_broker.storage.producer_state import ProducerEntry

from tests.unit.broker.storage.durable_directory import DurableDirectory
from tests.unit.broker.storage.storage_helpers import (
    PARTITION,
    TOPIC,
    crash,
    make_batch,
    read_all,
)

SEGMENT_BYTES = 400
#: Random loss patterns tried at each crash point, besides all lost and all kept.
RANDOM_LOSSES = 2
#: No reset takes this many fsyncs: the loop over crash points ends well before.
FSYNCS_MAX = 64


class Crash(Exception):
    pass


def _stamped(offset: int, epoch: int, records: bytearray) -> bytearray:
    set_base_offset(records, 0, offset)
    set_partition_leader_epoch(records, 0, epoch)
    return records


def _replicate(log: PartitionLog, epoch: int, batch: bytearray) -> None:
    records = _stamped(log.log_end_offset, epoch, batch)
    log.append_replicated(records, list(iter_batches(records)))


def _fill(log: PartitionLog, batches: int) -> None:
    """Batches of three records under epochs 1 and 3, an idempotent
    producer's among them (so that there are snapshots), flushed."""
    for tag in range(batches):
        epoch = 1 if tag < batches // 2 else 3
        if tag == 2:
            producer = bytearray(
                encode_batch([b"p"], producer_id=7, producer_epoch=0, base_sequence=0)
            )
            _replicate(log, epoch, producer)
        _replicate(log, epoch, make_batch(record_count=3, value_bytes=20, tag=tag))
    log.flush()
    assert log.segment_count >= 3
    assert log.producer_state.producers


def _full(log: PartitionLog) -> int:
    _fill(log, 12)
    return log.log_end_offset + 100


def _at_end(log: PartitionLog) -> int:
    _fill(log, 12)
    return log.log_end_offset


def _inside(log: PartitionLog) -> int:
    _fill(log, 12)
    return log.segments[1].base_offset + 2


def _below_start(log: PartitionLog) -> int:
    """DeleteRecords moved the start into the second segment; the reset
    goes below it, into the first segment still on disk."""
    _fill(log, 12)
    log.delete_records_before(log.segments[1].base_offset + 4)
    return log.segments[0].base_offset + 1


def _below_every_segment(log: PartitionLog) -> int:
    _fill(log, 12)
    log.delete_records_before(log.segments[2].base_offset)
    assert log.segments[0].base_offset > 0
    return 0


def _empty_follower(log: PartitionLog) -> int:
    """`ReplicaManager.append_replicated`'s reset: the log is empty (its
    start moved up to its end, as `follow_log_start` does when the leader
    deleted records up to there) and the leader's first batch starts below
    its end: the reset goes to that batch's base offset, below the end, with
    the old records still in the segment files."""
    _fill(log, 12)
    last_batch = log.log_end_offset - 3
    log.delete_records_before(log.log_end_offset)
    assert log.log_start_offset == log.log_end_offset
    return last_batch


def _new_follower(log: PartitionLog) -> int:
    """The same reset on a replica that never held a record: reset to the
    leader's log start first (inside the leader's batch), then to the
    batch's base offset."""
    log.reset_to(4)
    log.leader_epochs.assign(5, 4)  # it led once, writing nothing
    log.flush()
    return 0


#: Builds the log; returns the offset to reset it to.
CASES: dict[str, Callable[[PartitionLog], int]] = {
    "above_the_end": _full,
    "at_the_end": _at_end,
    "inside_the_log": _inside,
    "below_the_log_start": _below_start,
    "below_every_segment": _below_every_segment,
    "empty_follower_with_old_segments": _empty_follower,
    "new_follower": _new_follower,
}


@dataclass(frozen=True)
class Seen:
    """What an open gave."""

    log_start_offset: int
    log_end_offset: int
    records: bytes
    epochs: list[tuple[int, int]]
    producers: dict[int, ProducerEntry]

    @classmethod
    def of(cls, log: PartitionLog) -> Seen:
        assert log.log_start_offset <= log.log_end_offset
        assert log.recovery_point <= log.log_end_offset
        return cls(
            log.log_start_offset,
            log.log_end_offset,
            read_all(log),
            # An epoch that wrote nothing yet (an entry at the log end) is
            # kept by no open (`leader_epoch`).
            [entry for entry in log.leader_epochs.entries if entry[1] < log.log_end_offset],
            log.producer_state.producers,
        )


class Directory:
    """One partition directory under test, opened and crashed on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.clock = ManualClock()
        self.opened: list[PartitionLog] = []

    def open(self) -> PartitionLog:
        config = LogConfig(segment_bytes=SEGMENT_BYTES)
        log = PartitionLog.open(self.path, TOPIC, PARTITION, config, self.clock)
        self.opened.append(log)
        return log

    def close_all(self) -> None:
        for log in self.opened:
            crash(log)


def _arm(monkeypatch: pytest.MonkeyPatch, crash_at: int) -> None:
    """Crash before the `crash_at`-th fsync from now (1 is the next)."""
    watched = os.fsync
    countdown = [crash_at]

    def fsync(fd: int) -> None:
        countdown[0] -= 1
        if countdown[0] == 0:
            raise Crash()
        watched(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _lose(path: Path, disk: DurableDirectory, loss: str, rng: random.Random) -> None:
    """Lose the writes a crash may lose: all of them, none, or each at random."""
    if loss == "kept":
        return
    names = {p.name for p in path.iterdir() if p.is_file()} | disk.names
    for name in sorted(names):
        if loss == "lost" or rng.random() < 0.5:
            disk.bring_back(name)


def _assert_empty_at(log: PartitionLog, seen: Seen, offset: int, where: str) -> None:
    assert seen == Seen(offset, offset, b"", [], {}), where
    assert log.recovery_point == offset, where
    assert [segment.base_offset for segment in log.segments] == [offset], where
    assert log.producer_state.snapshot_offsets() == [], where


def _run(
    build: Callable[[PartitionLog], int],
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crash_at: int,
    loss: str,
    seed: int,
) -> tuple[Directory, DurableDirectory, PartitionLog, Seen, int, bool]:
    """Build a case's log, reset it with a crash before fsync `crash_at`,
    lose writes as `loss` says, reopen. Returns the directory, its durable
    state from before that open on, the reopened log, the old log as open
    gave it before the reset, the reset offset, and whether the reset
    returned before the crash."""
    directory = Directory(path)
    log = directory.open()
    offset = build(log)
    log.flush()
    old = Seen.of(log)
    disk = DurableDirectory(path, monkeypatch)
    _arm(monkeypatch, crash_at)
    returned = True
    try:
        log.reset_to(offset)
    except Crash:
        returned = False
    crash(log)
    _lose(path, disk, loss, random.Random(seed))
    monkeypatch.undo()
    disk = DurableDirectory(path, monkeypatch)
    return directory, disk, directory.open(), old, offset, returned


def _check_survives_a_crash(
    directory: Directory, disk: DurableDirectory, log: PartitionLog, where: str
) -> None:
    """What the open finished is durable: a batch appended and flushed after
    it is there, on the same log, after a crash that loses everything else."""
    _replicate(log, 9, make_batch(record_count=2, tag=77))
    log.flush()
    expected = Seen.of(log)
    crash(log)
    _lose(directory.path, disk, "lost", random.Random(0))
    assert Seen.of(directory.open()) == expected, where


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_reset_cut_short_anywhere_leaves_the_old_log_or_an_empty_one_at_the_offset(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = CASES[case]
    outcomes: set[str] = set()
    for crash_at in range(1, FSYNCS_MAX):
        returned = False
        losses = ["lost", "kept"] + [f"random{i}" for i in range(RANDOM_LOSSES)]
        for i, loss in enumerate(losses):
            path = tmp_path / f"{crash_at}-{loss}" / f"{TOPIC}-{PARTITION}"
            seed = crash_at * 100 + i
            directory, disk, log, old, offset, returned = _run(
                build, path, monkeypatch, crash_at, loss, seed
            )
            where = f"{case}: crash before fsync {crash_at} of the reset to {offset}, {loss}"
            try:
                seen = Seen.of(log)
                if returned or seen != old:
                    _assert_empty_at(log, seen, offset, where)
                outcomes.add("old" if seen == old and not returned else "new")
                _check_survives_a_crash(directory, disk, log, where)
            finally:
                monkeypatch.undo()
                directory.close_all()
        if returned:
            break
    else:
        pytest.fail(f"{case}: the reset never returned within {FSYNCS_MAX} fsyncs")
    # Every case crosses from the old log to the new one somewhere.
    assert outcomes == {"old", "new"}, outcomes
