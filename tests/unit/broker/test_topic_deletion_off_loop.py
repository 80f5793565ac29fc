"""A deleted topic's files are removed in a worker thread, not on the
broker's event loop.

Before, `delete_topic` (and, in cluster mode, `drop_topic` and
`delete_local_logs`) renamed each log directory aside and then removed it
inline: the broker's one asyncio loop unlinked every segment, so deleting a
topic of a few GB stalled every produce and fetch of the broker for as long
(~0.45 s for 2 GiB on the CI machine). Now the loop only closes the logs and
renames their directories aside (which makes the deletion durable and frees
the name for a new incarnation); the LogManager's sweep
(`delete_renamed_dirs`) removes them in a worker thread, started at once.

A real LogManager (or BrokerServer) on a temporary data directory, run on a
real asyncio loop. The removal is observed by wrapping the real
`files.remove_renamed` (it still removes): which thread ran it, and, where
a test needs the removal to be under way, holding it at a gate. A directory
that cannot be removed is made so with the file system's immutable flag
(`chattr +i`: tests/support/immutable_files.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import tidelog_broker.log_manager as log_manager_module
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager
from tidelog_broker.server import BrokerServer
from tidelog_broker.storage import files
from tidelog_server.clock import SYSTEM_CLOCK

from tests.support.immutable_files import pin, unpin
from tests.unit.broker.in_process_broker import eventually
from tests.unit.broker.removal_spy import RemovalSpy, install, renamed_aside

pytestmark = pytest.mark.timeout(120)

TOPIC = "t"
OLD = [b"old-%d" % i for i in range(10)]
NEW = [b"new-%d" % i for i in range(3)]
#: Generous: a loaded 2-core CI machine.
WAIT_S = 30.0
#: `eventually`, within WAIT_S.
until = functools.partial(eventually, within_s=WAIT_S)
AN_HOUR_MS = 3_600_000


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> RemovalSpy:
    return install(monkeypatch)


def append(logs: LogManager, partition: int, values: list[bytes]) -> None:
    partition_log = logs.partition_log(TOPIC, partition)
    data = bytearray(encode_batch(values))
    partition_log.append(data, list(iter_batches(data)))
    partition_log.flush()


def records(logs: LogManager, partition: int) -> bytes:
    return bytes(logs.partition_log(TOPIC, partition).read(0, 1 << 20).records)


def manager(data_dir: Path, *, cluster_mode: bool = False) -> LogManager:
    logs = LogManager(
        BrokerConfig(data_dir=data_dir, retention_check_interval_ms=AN_HOUR_MS),
        SYSTEM_CLOCK,
        cluster_mode=cluster_mode,
    )
    logs.open()
    return logs


def test_delete_topic_removes_the_files_in_a_worker_thread(tmp_path: Path, spy: RemovalSpy) -> None:
    async def run() -> None:
        logs = manager(tmp_path)
        try:
            logs.create_topic(TOPIC, partitions=2)
            append(logs, 0, OLD)
            append(logs, 1, OLD)
            logs.delete_topic(TOPIC)
            # Its names are free at once (renamed aside, durably).
            assert not (tmp_path / f"{TOPIC}-0").exists()
            assert not (tmp_path / f"{TOPIC}-1").exists()
            await until(lambda: renamed_aside(tmp_path) == [], "the renamed directories go")
        finally:
            logs.close()
        assert len(spy.calls) == 2 and all(removed for _t, _n, removed in spy.calls)
        assert spy.loop_thread.name not in spy.threads(), spy.threads()

    asyncio.run(run())


def test_a_topic_created_again_while_the_old_one_is_removed_starts_empty(
    tmp_path: Path, spy: RemovalSpy
) -> None:
    """The new incarnation gets its own, empty directories, and the removal
    of the old one (held at the gate meanwhile) leaves them alone."""

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            logs.create_topic(TOPIC, partitions=2)
            append(logs, 0, OLD)
            spy.gate.clear()
            logs.delete_topic(TOPIC)
            old = renamed_aside(tmp_path)
            assert len(old) == 2, old

            logs.create_topic(TOPIC, partitions=2)
            assert records(logs, 0) == b"" and logs.partition_log(TOPIC, 0).log_end_offset == 0
            append(logs, 0, NEW)
            # The old directories are still being removed.
            assert renamed_aside(tmp_path) == old

            spy.gate.set()
            await until(lambda: renamed_aside(tmp_path) == [], "the old directories go")
            kept = records(logs, 0)
            assert b"new-0" in kept and b"old-" not in kept
            assert logs.partition_log(TOPIC, 0).log_end_offset == len(NEW)
        finally:
            spy.gate.set()
            logs.close()
        assert spy.loop_thread.name not in spy.threads(), spy.threads()

    asyncio.run(run())


def test_close_stops_the_sweep_a_deletion_started(tmp_path: Path, spy: RemovalSpy) -> None:
    """close() cancels the sweep task; its thread ends with the directory it
    is at (close waits for it) and leaves the rest to the next start's sweep."""

    async def run() -> None:
        logs = manager(tmp_path)
        closed = False
        opener: threading.Timer | None = None
        try:
            logs.create_topic(TOPIC, partitions=2)
            append(logs, 0, OLD)
            spy.gate.clear()
            logs.delete_topic(TOPIC)
            first, second = renamed_aside(tmp_path)
            # The sweep is at the first directory, held at the gate, which
            # another thread opens while close waits (it blocks the loop).
            await until(spy.entered.is_set, "the sweep starts removing")
            opener = threading.Timer(0.2, spy.gate.set)
            opener.start()
            logs.close()
            closed = True
            assert renamed_aside(tmp_path) == [second]
            await asyncio.sleep(0.2)  # any further removal would have happened by now
            assert renamed_aside(tmp_path) == [second]
            assert [name for _t, name, _r in spy.calls] == [first]
        finally:
            spy.gate.set()
            if opener is not None:
                opener.join()
            if not closed:
                logs.close()

        # The next start's sweep removes what was left.
        broker = BrokerServer(
            BrokerConfig(data_dir=tmp_path, port=0, retention_check_interval_ms=AN_HOUR_MS)
        )
        await broker.start()
        try:
            await until(lambda: renamed_aside(tmp_path) == [], "the next start removes the rest")
        finally:
            await broker.stop()

    asyncio.run(run())


def test_close_waits_for_the_directory_a_sweep_is_removing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real files, no spy: a topic of thousands of segment files deleted, the
    manager closed while its sweep's thread is part-way through a directory,
    and a new manager opened at once on the same data directory (a restart
    in the same process, as tests and the dev cluster do). close() waits for
    that directory: none is left half-removed, and the next start-up sweep
    removes the rest alone. Before, the thread went on after close and raced
    the new sweep on the same directory: each restarted rmtree at every
    entry the other took, and one gave up (`entries keep vanishing`, a
    WARNING), so the start-up sweep logged and counted one less."""
    segments = 1500
    value = os.urandom(900)

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            # Tiny segments: one per append, three files each.
            logs.create_topic(TOPIC, partitions=2, configs={"segment.bytes": "1024"})
            for partition in (0, 1):
                partition_log = logs.partition_log(TOPIC, partition)
                for _ in range(segments):
                    data = bytearray(encode_batch([value]))
                    partition_log.append(data, list(iter_batches(data)))
            logs.delete_topic(TOPIC)
            # The sweep task has not run yet (no await since): all whole.
            whole = {name: len(os.listdir(tmp_path / name)) for name in renamed_aside(tmp_path)}
            assert len(whole) == 2 and min(whole.values()) > 2 * segments, whole

            def under_way() -> bool:
                return any(
                    not (tmp_path / name).exists() or len(os.listdir(tmp_path / name)) < count
                    for name, count in whole.items()
                )

            deadline = time.monotonic() + WAIT_S
            while not under_way():
                assert time.monotonic() < deadline, "the sweep never started"
                await asyncio.sleep(0.001)
        finally:
            logs.close()
        left = {name: len(os.listdir(tmp_path / name)) for name in renamed_aside(tmp_path)}
        # The one it was at is gone; any other is untouched.
        assert len(left) < len(whole) and all(whole[name] == n for name, n in left.items()), (
            whole,
            left,
        )

        caplog.clear()
        again = manager(tmp_path)
        try:
            with caplog.at_level(logging.WARNING):
                assert await again.delete_renamed_dirs() == len(left)
        finally:
            again.close()
        assert renamed_aside(tmp_path) == []
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

    asyncio.run(run())


def test_close_gives_up_on_a_removal_past_its_wait_and_says_so(
    tmp_path: Path,
    spy: RemovalSpy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wait is bounded: a removal held up (at the spy's gate) past
    CLOSE_WAIT_S is left to its thread, and close says which."""
    monkeypatch.setattr(log_manager_module, "CLOSE_WAIT_S", 0.2)

    async def run() -> None:
        logs = manager(tmp_path)
        closed = False
        try:
            logs.create_topic(TOPIC, partitions=2)
            append(logs, 0, OLD)
            spy.gate.clear()
            logs.delete_topic(TOPIC)
            first, second = renamed_aside(tmp_path)
            await until(spy.entered.is_set, "the sweep starts removing")
            with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
                logs.close()
            closed = True
            [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert f"the removal of {tmp_path / first} " in line, line
            assert (
                "still under way after a wait of 0.2 s (close waits 0.2 s in all for worker "
                "threads); left to finish in its worker thread" in line
            ), line
            assert renamed_aside(tmp_path) == [first, second]
            spy.gate.set()
            # The thread finishes that one and starts no other.
            await until(lambda: renamed_aside(tmp_path) == [second], "the first one goes")
        finally:
            spy.gate.set()
            if not closed:
                logs.close()

    asyncio.run(run())


def test_a_directory_that_cannot_be_removed_is_retried_by_the_retention_checks(
    tmp_path: Path, spy: RemovalSpy
) -> None:
    """A real standalone broker: the first removal, in a worker thread,
    fails (an immutable segment); the directory stays renamed aside until a
    retention check's sweep removes it once it can."""

    async def run() -> None:
        broker = BrokerServer(
            BrokerConfig(data_dir=tmp_path, port=0, retention_check_interval_ms=100)
        )
        await broker.start()
        logs = broker.manager.logs
        pinned: Path | None = None
        try:
            logs.create_topic(TOPIC, partitions=1)
            append(logs, 0, OLD)
            segment = next(logs.partition_log(TOPIC, 0).directory.glob("*" + files.LOG_SUFFIX))
            pin(segment)
            pinned = segment
            logs.delete_topic(TOPIC)
            [left] = renamed_aside(tmp_path)
            pinned = tmp_path / left / segment.name
            await until(lambda: len(spy.calls) >= 2, "the removal is tried, then retried")
            assert not any(removed for _t, _n, removed in spy.calls)
            assert renamed_aside(tmp_path) == [left]
            unpin(pinned)
            pinned = None
            await until(lambda: renamed_aside(tmp_path) == [], "a retention check removes it")
        finally:
            if pinned is not None:
                unpin(pinned)
            await broker.stop()
        assert spy.calls[-1][2] is True
        assert spy.loop_thread.name not in spy.threads(), spy.threads()

    asyncio.run(run())


def test_delete_local_logs_removes_them_in_a_worker_thread(tmp_path: Path, spy: RemovalSpy) -> None:
    """Cluster mode: the logs of a topic deleted while the broker was down
    (not hosted here) are renamed aside on the loop, removed off it."""
    logs = manager(tmp_path)
    try:
        logs.create_topic(TOPIC, partitions=2)
        append(logs, 0, OLD)
    finally:
        logs.close()

    async def run() -> None:
        cluster_logs = manager(tmp_path, cluster_mode=True)
        try:
            assert cluster_logs.local_topics() == {TOPIC: [0, 1]}
            cluster_logs.delete_local_logs(TOPIC, [0, 1])
            assert cluster_logs.local_topics() == {}
            await until(lambda: renamed_aside(tmp_path) == [], "the renamed directories go")
        finally:
            cluster_logs.close()
        assert len(spy.calls) == 2
        assert spy.loop_thread.name not in spy.threads(), spy.threads()

    asyncio.run(run())
