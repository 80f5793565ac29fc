"""The leader epoch history: assign, truncate, end offsets, durable persistence."""

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
    assert LeaderEpochCache.load(tmp_path).entries == [(0, 0), (2, 100), (5, 250)]


def test_truncation_and_a_new_epoch_below_the_last_start(tmp_path: Path) -> None:
    cache = LeaderEpochCache.load(tmp_path)
    cache.assign(0, 0)
    cache.assign(3, 100)
    cache.truncate_from_end(100)  # epoch 3 wrote nothing that is kept
    assert cache.entries == [(0, 0)]
    cache.assign(4, 80)
    cache.assign(6, 80)  # epoch 4 wrote nothing: replaced
    assert LeaderEpochCache.load(tmp_path).entries == [(0, 0), (6, 80)]


def test_every_change_is_durable_once_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is fsynced after each rename: a truncation that a crash
    forgot would leave epochs past the log end."""
    cache = LeaderEpochCache.load(tmp_path)
    fsynced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cache.assign(0, 0)
    assert fsynced == ["file", "directory"]
    fsynced.clear()
    cache.truncate_from_end(0)
    assert fsynced == ["file", "directory"]
