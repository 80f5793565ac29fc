"""LogManager.close and a cleaner round running in a worker thread.

A round (`cleaner.clean`, via `clean_logs`) writes `.cleaned` files into the
log's directory; close sets `_cleaner_cancel`, and the round stops at its
next batch and removes the files it wrote (`discard_cleaned`). Before, close
returned at once and the round did that afterwards: a LogManager opened
right after on the same data directory (a restart in the same process: the
tests, the in-process broker, the dev cluster) removes leftover `.cleaned`
files at open too, and the two raced: its open listed a file the old thread
then unlinked, failed on it (FileNotFoundError) and hosted the log offline
until the next restart. Now close waits for the round (bounded, logged if
it gives up).

A real LogManager on a temporary data directory, run on a real asyncio
loop, with real keyed records: many tiny segments with many duplicate keys,
so that a round writes hundreds of `.cleaned` groups and removing them takes
long enough to overlap the next open.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tidelog_broker.log_manager as log_manager_module
from tidelog.records import decode_batches, encode_batch, iter_batches
from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager
from tidelog_broker.storage import cleaner, files
from tidelog_server.clock import SYSTEM_CLOCK

from tests.unit.broker import removal_spy
from tests.unit.broker.in_process_broker import eventually

pytestmark = pytest.mark.timeout(120)

TOPIC = "compacted"
#: Tiny segments: about three batches each, so about one `.cleaned` group
#: (three files) per segment.
SEGMENT_BYTES = 1024
BATCHES = 3000
PER_BATCH = 5
KEYS = 50
#: The round is closed once it has written this many groups (of ~600).
GROUPS_BEFORE_CLOSE = 300
#: Generous: a loaded 2-core CI machine.
WAIT_S = 30.0
until = functools.partial(eventually, within_s=WAIT_S)
AN_HOUR_MS = 3_600_000


def manager(data_dir: Path) -> LogManager:
    logs = LogManager(
        BrokerConfig(data_dir=data_dir, retention_check_interval_ms=AN_HOUR_MS),
        SYSTEM_CLOCK,
        cluster_mode=False,
    )
    logs.open()
    return logs


def fill(logs: LogManager, create: bool = True) -> dict[bytes, tuple[int, bytes]]:
    """A compacted topic of ~600 closed segments of keyed records (created
    here unless `create` is False: hosted already); returns the latest
    (offset, value) of each key."""
    if create:
        logs.create_topic(
            TOPIC,
            partitions=1,
            configs={"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)},
        )
    partition_log = logs.partition_log(TOPIC, 0)
    latest: dict[bytes, tuple[int, bytes]] = {}
    for batch in range(BATCHES):
        keys = [b"key-%03d" % ((batch * PER_BATCH + i) * 7 % KEYS) for i in range(PER_BATCH)]
        values = [b"value-%d-%d" % (batch, i) for i in range(PER_BATCH)]
        data = bytearray(encode_batch(values, keys=keys))
        first = partition_log.append(data, list(iter_batches(data))).first_offset
        for i, key in enumerate(keys):
            latest[key] = (first + i, values[i])
    partition_log.flush()
    return latest


def cleaned_files(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(files.CLEANED_SUFFIX))


def read_all(logs: LogManager) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from the log start."""
    partition_log = logs.partition_log(TOPIC, 0)
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, 1 << 20)
        assert result.records, offset
        for batch in decode_batches(result.records):
            for record in zip(batch.offsets, batch.keys, batch.values, strict=True):
                if record[0] >= offset:
                    yield record
        offset = result.next_offset


async def close_mid_round(logs: LogManager, directory: Path) -> asyncio.Task[object]:
    """Start a forced round and wait until it has written GROUPS_BEFORE_CLOSE
    groups; returns its task (still running)."""
    round_task = asyncio.create_task(logs.clean_logs(force=True))
    await until(
        lambda: (
            round_task.done()
            or sum(n.endswith(".log.cleaned") for n in os.listdir(directory)) >= GROUPS_BEFORE_CLOSE
        ),
        "the round writes its first groups",
    )
    assert not round_task.done(), "the round ended before close: raise BATCHES"
    return round_task


def test_a_log_manager_opened_right_after_close_finds_the_log_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed mid-round, then a new LogManager opened at once on the same
    data directory: close has waited for the round, which removed its
    `.cleaned` files; the new one opens the log (not offline), a round of
    its own compacts it, and every key's latest value is there, at its
    offset. Without the wait: 5 of 5 runs had the new open fail on a
    `.cleaned` file the old round's thread unlinked under it (the log
    hosted offline: 'No such file or directory: ...cleaned')."""
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            latest = fill(logs)
            end = logs.partition_log(TOPIC, 0).log_end_offset
            round_task = await close_mid_round(logs, directory)
        finally:
            logs.close()
        # The round has stopped and removed what it wrote.
        assert cleaned_files(directory) == []

        with caplog.at_level(logging.WARNING):
            again = manager(tmp_path)
            try:
                assert again.offline_partitions() == []
                [result] = await again.clean_logs(force=True)
                assert result.records_removed > 0
                records = list(read_all(again))
                assert again.partition_log(TOPIC, 0).log_end_offset == end
            finally:
                again.close()
        # The old round's task saw its cancel and swapped nothing in.
        assert await round_task == []
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

        offsets = [offset for offset, _key, _value in records]
        assert offsets == sorted(set(offsets))
        kept = {key: (offset, value) for offset, key, value in records}
        assert kept == latest
        assert cleaned_files(directory) == []

    asyncio.run(run())


def test_close_gives_up_on_a_round_past_its_wait_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait is bounded: a round still removing its `.cleaned` files
    (held at a gate before the real `discard_cleaned`) past
    CLOSE_WAIT_S is left to its thread, and close says which log's."""
    monkeypatch.setattr(log_manager_module, "CLOSE_WAIT_S", 0.2)
    gate = threading.Event()
    held = threading.Event()
    real_discard = cleaner.discard_cleaned

    def discard_cleaned(directory: Path, base_offsets: list[int]) -> None:
        held.set()
        assert gate.wait(WAIT_S), "the gate stayed shut"
        real_discard(directory, base_offsets)

    monkeypatch.setattr(cleaner, "discard_cleaned", discard_cleaned)
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        closed = False
        try:
            fill(logs)
            round_task = await close_mid_round(logs, directory)
            with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
                logs.close()
            closed = True
            [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert line.startswith(
                f"closing: the cleaner's round of {TOPIC}-0 is still under way after a wait of "
                "0.2 s (close waits 0.2 s in all for worker threads); left to finish in its "
                "worker thread"
            ), line
            assert cleaned_files(directory) != []
            await until(held.is_set, "the round stops at its cancel")
            gate.set()
            assert await round_task == []
            assert cleaned_files(directory) == []
        finally:
            gate.set()
            if not closed:
                logs.close()

    asyncio.run(run())


def test_close_waits_once_for_a_removal_and_a_round_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep's removal of a deleted log's directory (held at the removal
    spy's gate) and a cleaner round (held before its real
    `discard_cleaned`) both still under way at close: close waits
    CLOSE_WAIT_S for them together, not that long for each. The removal,
    waited for first, has the whole wait; the round has none of it left (a
    wait of 0.0 s, only checked), and each is named as still under way.
    Before, the round got a second full wait of its own."""
    monkeypatch.setattr(log_manager_module, "CLOSE_WAIT_S", 1.0)
    spy = removal_spy.install(monkeypatch)
    gate = threading.Event()
    held = threading.Event()
    real_discard = cleaner.discard_cleaned

    def discard_cleaned(directory: Path, base_offsets: list[int]) -> None:
        held.set()
        assert gate.wait(WAIT_S), "the gate stayed shut"
        real_discard(directory, base_offsets)

    monkeypatch.setattr(cleaner, "discard_cleaned", discard_cleaned)
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        closed = False
        try:
            fill(logs)
            logs.create_topic("doomed", partitions=1)
            spy.gate.clear()
            logs.delete_topic("doomed")
            [doomed] = removal_spy.renamed_aside(tmp_path)
            round_task = await close_mid_round(logs, directory)
            await until(spy.entered.is_set, "the sweep starts removing")
            with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
                logs.close()
            closed = True
            removal, cleaning = [
                r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            ]
            assert removal.startswith(
                f"closing: the removal of {tmp_path / doomed} (a deleted log's directory) is "
                "still under way after a wait of 1.0 s (close waits 1 s in all for worker "
                "threads); left to finish in its worker thread"
            ), removal
            assert cleaning.startswith(
                f"closing: the cleaner's round of {TOPIC}-0 is still under way after a wait of "
                "0.0 s (close waits 1 s in all for worker threads); left to finish in its "
                "worker thread"
            ), cleaning
            spy.gate.set()
            await until(held.is_set, "the round stops at its cancel")
            gate.set()
            assert await round_task == []
            assert cleaned_files(directory) == []
            await until(lambda: removal_spy.renamed_aside(tmp_path) == [], "the removal ends")
        finally:
            spy.gate.set()
            gate.set()
            if not closed:
                logs.close()

    asyncio.run(run())


def test_an_open_right_after_close_tolerates_deleted_files_still_being_unlinked(
    tmp_path: Path,
) -> None:
    """A round swapped in just before close: its ~4,500 replaced files,
    renamed `.deleted`, are unlinked by a worker thread (`unlink_dropped`),
    which close stops before its next file and waits for; a LogManager
    opened at once removes the rest at open. (Before close waited for it,
    the thread raced that open: its open skips a file the thread unlinked
    first, which a thread left past close's wait still may; without that,
    3 of 3 runs failed the open with FileNotFoundError on a `.deleted` file
    and hosted the log offline.)"""
    directory = tmp_path / f"{TOPIC}-0"

    async def run() -> None:
        logs = manager(tmp_path)
        try:
            latest = fill(logs)
            round_task = asyncio.create_task(logs.clean_logs(force=True))
            await until(
                lambda: (
                    round_task.done()
                    or any(name.endswith(files.DELETED_SUFFIX) for name in os.listdir(directory))
                ),
                "the round swaps in and renames the replaced segments .deleted",
            )
            assert not round_task.done(), "the unlinks ended before close"
        finally:
            logs.close()
        again = manager(tmp_path)
        try:
            assert again.offline_partitions() == []
            records = list(read_all(again))
        finally:
            again.close()
        [result] = await round_task
        assert result.records_removed > 0
        assert {key: (offset, value) for offset, key, value in records} == latest

    asyncio.run(run())


def test_close_stops_the_unlinks_of_dropped_files_and_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A round swapped in just before close: the worker thread unlinking
    the replaced files (renamed `.deleted`), held before the real
    `unlink_files` past CLOSE_WAIT_S, is named as still under way; let go,
    it stops before its first file (close set its cancel), and the next
    open removes every `.deleted` file it left. Before, close neither
    stopped nor waited for it (no warning), and it raced that open."""
    monkeypatch.setattr(log_manager_module, "CLOSE_WAIT_S", 0.2)
    gate = threading.Event()
    held = threading.Event()
    real_unlink = log_manager_module.unlink_files

    def unlink_files(paths: list[Path], *args: threading.Event | None) -> int:
        held.set()
        assert gate.wait(WAIT_S), "the gate stayed shut"
        return real_unlink(paths, *args)

    monkeypatch.setattr(log_manager_module, "unlink_files", unlink_files)
    directory = tmp_path / f"{TOPIC}-0"

    def deleted_files() -> list[str]:
        return [n for n in os.listdir(directory) if n.endswith(files.DELETED_SUFFIX)]

    async def run() -> None:
        logs = manager(tmp_path)
        closed = False
        try:
            latest = fill(logs)
            round_task = asyncio.create_task(logs.clean_logs(force=True))
            await until(held.is_set, "the round swaps in and its unlinks start")
            with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
                logs.close()
            closed = True
            [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert line.startswith(
                f"closing: unlinking the files dropped from {TOPIC}-0 (by retention, compaction "
                "or DeleteRecords) is still under way after a wait of 0.2 s"
            ), line
            left = deleted_files()
            assert left != []
            gate.set()
            [result] = await round_task
            assert result.records_removed > 0
            assert deleted_files() == left
        finally:
            gate.set()
            if not closed:
                logs.close()
        again = manager(tmp_path)
        try:
            assert again.offline_partitions() == []
            assert deleted_files() == []
            records = list(read_all(again))
        finally:
            again.close()
        assert {key: (offset, value) for offset, key, value in records} == latest

    asyncio.run(run())
