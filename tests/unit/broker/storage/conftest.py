"""Fixtures shared by the storage tests: a clock and logs in tmp_path."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog

from tests.unit.broker.storage.storage_helpers import PARTITION, TOPIC, OpenLog


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / f"{TOPIC}-{PARTITION}"


@pytest.fixture
def open_log(log_dir: Path, clock: ManualClock) -> Iterator[OpenLog]:
    """`open_log(segment_bytes=..., ...)` opens the log under test with those
    LogConfig fields; every log it opened has its files closed at the end."""
    opened: list[PartitionLog] = []

    def open_(**fields: Any) -> PartitionLog:
        config = dataclasses.replace(LogConfig(), **fields)
        log = PartitionLog.open(log_dir, TOPIC, PARTITION, config, clock)
        opened.append(log)
        return log

    yield open_
    for log in opened:
        for segment in log.segments:
            segment.close()
