"""`read_until`: poll a reading until it passes a check, for the tests that
wait on what a cluster shows (Metadata, DescribeTopics, a registration in
etcd) after something changed, and fail naming what they waited for and
the last value read."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Between two readings: each one is an RPC or an etcd read.
POLL_INTERVAL_S = 0.1


def read_until(
    read: Callable[[], T], check: Callable[[T], bool], what: str, deadline_s: float
) -> T:
    """The first `read()` that passes `check`, read every POLL_INTERVAL_S;
    AssertionError naming `what` and the last value after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = read()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {deadline_s} s")
        time.sleep(POLL_INTERVAL_S)
