"""A cleaner round running in a worker thread while its log is deleted.

A round (`cleaner.clean`, via `clean_logs`) reads the log's segments and
writes `.cleaned` files by path, in the log's directory. Deleting the topic
(standalone, or in a cluster the topic gone from etcd), or the partition
moving to other brokers, closes the log and renames its directory aside;
nothing stopped the round: it went on under the old name. With the name
gone, its next group failed (`cleaning <log> failed` at ERROR, a
FileNotFoundError traceback, for an ordinary deletion); with the topic
re-created meanwhile, it read the new incarnation's segments as its own and
left its `.cleaned` files among them. Now the log's close or deletion
revokes the round's `DirectoryGuard`: the round stops at its next batch and
touches nothing by path in the directory any more (its files go with the
renamed directory, which the sweep removes).

A real LogManager on a temporary data directory, run on a real asyncio
loop, with real keyed records (the fixture of test_cleaner_round_at_close:
~600 tiny segments, each about one `.cleaned` group). The round is held
mid-way by a gate in the offset map's key hashing (`cleaner.key_digest`,
called for every record the round rewrites), outside any lock the deletion
takes, so the deletion happens while the round is at a known place: in the
middle of a group, with more groups to come.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from pathlib import Path

import pytest
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager
from tidelog_broker.storage import cleaner
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.clock import SYSTEM_CLOCK

from tests.unit.broker.test_cleaner_round_at_close import (
    AN_HOUR_MS,
    GROUPS_BEFORE_CLOSE,
    SEGMENT_BYTES,
    TOPIC,
    WAIT_S,
    cleaned_files,
    fill,
    manager,
    read_all,
    until,
)

pytestmark = pytest.mark.timeout(120)

STOPPED = f"cleaning {TOPIC}-0 stopped: cancelled: the log was closed or deleted"


class Gate:
    """Holds the round's thread at its next `key_digest` call once armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = threading.Event()
        self.held = threading.Event()
        self.opened = threading.Event()
        real = cleaner.key_digest

        def key_digest(key: bytes) -> bytes:
            if self.armed.is_set() and not self.held.is_set():
                self.held.set()
                assert self.opened.wait(WAIT_S), "the gate stayed shut"
            return real(key)

        monkeypatch.setattr(cleaner, "key_digest", key_digest)


async def hold_mid_round(logs: LogManager, directory: Path, gate: Gate) -> asyncio.Task[object]:
    """Start a forced round, let it write GROUPS_BEFORE_CLOSE groups (of
    ~600), then hold it at the gate; returns its task (still running)."""
    round_task = asyncio.create_task(logs.clean_logs(force=True))
    await until(
        lambda: (
            round_task.done()
            or sum(n.endswith(".log.cleaned") for n in os.listdir(directory)) >= GROUPS_BEFORE_CLOSE
        ),
        "the round writes its first groups",
    )
    gate.armed.set()
    await until(lambda: round_task.done() or gate.held.is_set(), "the round reaches the gate")
    assert not round_task.done(), "the round ended before the gate: raise BATCHES"
    return round_task


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def entries_of_the_log(data_dir: Path) -> list[str]:
    """The log's directory and any renamed aside for deletion."""
    return sorted(name for name in os.listdir(data_dir) if name.startswith(f"{TOPIC}-0"))


def test_deleting_the_topic_stops_the_round_at_its_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleted mid-round (standalone DeleteTopics): the round stops with a
    'cancelled' line, no ERROR, and the sweep removes the whole directory,
    the round's `.cleaned` files with it. Without the guard: 'cleaning
    compacted-0 failed' at ERROR, FileNotFoundError on the next group's
    `.cleaned` file under the old name (checked: fails)."""
    gate = Gate(monkeypatch)
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            fill(logs)
            round_task = await hold_mid_round(logs, directory, gate)
            with caplog.at_level(logging.INFO, logger="tidelog.broker"):
                logs.delete_topic(TOPIC)
                gate.opened.set()
                assert await round_task == []
                await until(lambda: entries_of_the_log(tmp_path) == [], "the sweep removes it")
        finally:
            gate.opened.set()
            logs.close()
        assert problems(caplog) == []
        assert STOPPED in [r.getMessage() for r in caplog.records]

    asyncio.run(run())


def test_a_topic_re_created_mid_round_is_left_alone_by_the_old_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleted mid-round and at once created again under the same name with
    the same records (so its segments have the old ones' names and sizes):
    the old round stops; the new incarnation's directory gets no `.cleaned`
    file and its records are all there, uncompacted, until a round of its
    own compacts them. Without the guard the old round went on under the
    old name, read the new incarnation's segments as its own and left
    ~300 `.cleaned` groups of them (~900 files) in its directory, and its
    round returned a result as if done (checked: fails)."""
    gate = Gate(monkeypatch)
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            fill(logs)
            round_task = await hold_mid_round(logs, directory, gate)
            with caplog.at_level(logging.INFO, logger="tidelog.broker"):
                logs.delete_topic(TOPIC)
                latest = fill(logs)
                end = logs.partition_log(TOPIC, 0).log_end_offset
                gate.opened.set()
                assert await round_task == []
                await until(
                    lambda: entries_of_the_log(tmp_path) == [f"{TOPIC}-0"],
                    "the sweep removes the old incarnation's directory",
                )
            assert cleaned_files(directory) == []
            records = list(read_all(logs))
            assert len(records) == end  # nothing compacted away
            [result] = await logs.clean_logs(force=True)
            assert result.records_removed > 0
            kept = {key: (offset, value) for offset, key, value in read_all(logs)}
            assert kept == latest
        finally:
            gate.opened.set()
            logs.close()
        assert problems(caplog) == []
        assert STOPPED in [r.getMessage() for r in caplog.records]

    asyncio.run(run())


def test_a_partition_moved_away_mid_round_stops_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cluster mode, the partition reassigned to other brokers mid-round:
    as the ClusterLink does, its log is closed (`host_partitions` without
    it) and its directory renamed aside (`delete_local_logs`). The round
    stops, no ERROR, the directory is removed. Without the guard: 'cleaning
    compacted-0 failed' at ERROR, FileNotFoundError (checked: fails)."""
    gate = Gate(monkeypatch)
    directory = tmp_path / f"{TOPIC}-0"
    spec = TopicSpec(
        TOPIC,
        1,
        {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)},
        uuid.uuid4().hex,
    )

    async def run() -> None:
        logs = LogManager(
            BrokerConfig(data_dir=tmp_path, retention_check_interval_ms=AN_HOUR_MS),
            SYSTEM_CLOCK,
            cluster_mode=True,
        )
        logs.open()
        try:
            logs.host_partitions(spec, [0])
            fill(logs, create=False)
            round_task = await hold_mid_round(logs, directory, gate)
            with caplog.at_level(logging.INFO, logger="tidelog.broker"):
                logs.host_partitions(spec, [])
                logs.delete_local_logs(TOPIC, [0])
                gate.opened.set()
                assert await round_task == []
                await until(lambda: entries_of_the_log(tmp_path) == [], "the sweep removes it")
        finally:
            gate.opened.set()
            logs.close()
        assert problems(caplog) == []
        assert STOPPED in [r.getMessage() for r in caplog.records]

    asyncio.run(run())
