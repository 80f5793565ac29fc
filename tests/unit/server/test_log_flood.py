"""Rate-limited logging of repeated errors (issue 16, item 7: log floods)."""

from __future__ import annotations

import logging

import pytest
from tidelog_server.log_flood import RateLimitedLog


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fail_many(flood: RateLimitedLog, times: int) -> None:
    for partition in range(times):
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            flood.exception("flush of %s-%d failed", "t", partition)


def test_a_repeated_error_logs_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    flood = RateLimitedLog(logging.getLogger("test.flood"), interval_s=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.flood"):
        fail_many(flood, 7000)
        clock.now = 59
        fail_many(flood, 10)
        assert len(caplog.records) == 1
        assert caplog.records[0].getMessage() == "flush of t-0 failed"
        assert caplog.records[0].exc_info is not None
        clock.now = 61
        fail_many(flood, 1)
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage() == (
        "flush of t-0 failed (and 7009 more like it in the last 60 s)"
    )


def test_kinds_are_counted_apart(caplog: pytest.LogCaptureFixture) -> None:
    flood = RateLimitedLog(logging.getLogger("test.flood"), interval_s=60, clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="test.flood"):
        fail_many(flood, 3)
        flood.warning("replicating %s-%d failed: %s", "t", 0, "boom")
        flood.warning("replicating %s-%d failed: %s", "t", 1, "boom")
        try:
            raise ValueError("other")
        except ValueError:
            flood.exception("flush of %s-%d failed", "t", 9)
    assert [r.getMessage() for r in caplog.records] == [
        "flush of t-0 failed",
        "replicating t-0 failed: boom",
        "flush of t-9 failed",
    ]
