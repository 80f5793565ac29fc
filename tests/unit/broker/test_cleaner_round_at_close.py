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
    CLEANER_CLOSE_WAIT_S is left to its thread, and close says which log's."""
    monkeypatch.setattr(log_manager_module, "CLEANER_CLOSE_WAIT_S", 0.2)
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
                f"closing: the cleaner's round of {TOPIC}-0 is still under way after 0.2 s; "
                "left to finish in its worker thread"
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


def test_an_open_right_after_close_tolerates_deleted_files_still_being_unlinked(
    tmp_path: Path,
) -> None:
    """A round swapped in just before close: its ~4,500 replaced files,
    renamed `.deleted`, are unlinked by a worker thread (`unlink_files`) that
    close does not wait for, while a LogManager opened at once removes the
    same leftovers at open. Its open skips a file the thread unlinked first.
    Without that: 3 of 3 runs failed the open (FileNotFoundError on a
    `.deleted` file) and hosted the log offline."""
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
