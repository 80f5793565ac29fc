"""The leader epoch history: assign, truncate, end offsets, and when it is
written (assign: never; flush and truncate_from_end: durably)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tidelog_broker.storage.leader_epoch import UNDEFINED, LeaderEpochCache


def test_end_offset_for_epoch_and_persistence(tmp_path: Path) -> None:
    cache = LeaderEpochCache.load(tmp_path)
    assert cache.end_offset_for_epoch(0, 10) == UNDEFINED
    cache.assign(0, 0)
    cache.assign(2, 100)
    cache.assign(1, 50)  # older than the latest: ignored
    cache.assign(5, 250)
    assert cache.end_offset_for_epoch(0, 300) == (0, 100)
    assert cache.end_offset_for_epoch(1, 300) == (0, 100)  # unknown epoch: the one below
    assert cache.end_offset_for_epoch(2, 300) == (2, 250)
    assert cache.end_offset_for_epoch(7, 300) == (5, 300)
    assert LeaderEpochCache.load(tmp_path).entries == []  # assign writes nothing
    cache.flush()
    assert LeaderEpochCache.load(tmp_path).entries == [(0, 0), (2, 100), (5, 250)]


def test_truncation_and_a_new_epoch_below_the_last_start(tmp_path: Path) -> None:
    cache = LeaderEpochCache.load(tmp_path)
    cache.assign(0, 0)
    cache.assign(3, 100)
    cache.truncate_from_end(100)  # epoch 3 wrote nothing that is kept
    assert cache.entries == [(0, 0)]
    cache.assign(4, 80)
    cache.assign(6, 80)  # epoch 4 wrote nothing: replaced
    cache.flush()
    assert LeaderEpochCache.load(tmp_path).entries == [(0, 0), (6, 80)]


def test_assign_does_no_io_and_flush_and_truncation_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """assign is called on the event loop for every election: no fsync (it
    is written with the log's flush). flush and truncate_from_end fsync the
    file and then the directory after the rename: a truncation that a crash
    forgot would leave epochs past the log end."""
    cache = LeaderEpochCache.load(tmp_path)
    fsynced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for epoch in range(1_000):
        cache.assign(epoch, epoch * 10)
    assert fsynced == []
    assert not (tmp_path / "leader-epoch-checkpoint").exists()
    cache.flush()
    assert fsynced == ["file", "directory"]
    fsynced.clear()
    cache.flush()  # nothing changed since
    assert fsynced == []
    cache.truncate_from_end(5_000)
    assert fsynced == ["file", "directory"]
    assert LeaderEpochCache.load(tmp_path).entries == [(e, e * 10) for e in range(500)]
