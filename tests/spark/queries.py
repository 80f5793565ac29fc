"""Waiting on a running streaming query in the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], bool], query: Any, timeout_s: float = 90) -> None:
    """Until `condition()`; fails at once with the query's own exception if it
    died, and after `timeout_s` with its last progress."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if query.exception() is not None:
            raise AssertionError(query.exception())
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s} s; progress: {query.lastProgress}")
        time.sleep(0.1)
