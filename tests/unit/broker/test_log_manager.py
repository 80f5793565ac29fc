"""The log manager's background loops: what they log when a log fails."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.topic_store import TopicSpec

DEADLINE_S = 10.0


def test_a_failed_flush_names_the_partition_that_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Hosting only partition 2 of a topic: the error names t-2, not the
    position of the log in the broker's list (which is 0)."""
    manager = PartitionManager(
        BrokerConfig(data_dir=tmp_path, flush_check_interval_ms=10), cluster_mode=True
    )
    manager.open()
    manager.logs.host_partitions(TopicSpec("t", 3, {}), [2])

    def failing_flush(now_ms: int) -> bool:
        raise StorageError("the disk is gone")

    manager.partition_log("t", 2).maybe_flush = failing_flush  # type: ignore[method-assign]

    async def run_until_logged() -> None:
        scheduler = asyncio.create_task(manager.logs.run_flush_scheduler())
        try:
            async with asyncio.timeout(DEADLINE_S):
                while not any("flush of" in r.getMessage() for r in caplog.records):
                    await asyncio.sleep(0.01)
        finally:
            scheduler.cancel()

    try:
        with caplog.at_level(logging.ERROR, logger="tidelog.broker"):
            asyncio.run(run_until_logged())
        messages = [r.getMessage() for r in caplog.records if "flush of" in r.getMessage()]
        assert messages[0].startswith("flush of t-2 failed"), messages
    finally:
        manager.close()
