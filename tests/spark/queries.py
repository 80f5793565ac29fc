"""Waiting on a streaming query in the tests: for a condition while it runs,
or for its end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: How long a test waits for a query it started to end (a few micro-batches
#: take seconds; this is for a loaded 2-core machine).
END_S = 240


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


def await_end(query: Any, timeout_s: float = END_S) -> Exception | None:
    """Until `query` ends: the exception it failed with, or None when it
    finished. Fails, after stopping it, when it still runs after `timeout_s`.

    Why not `query.awaitTermination(timeout_s)` alone: past its timeout it
    returns False and raises nothing, so a test that expected it to raise
    saw no error at all on a machine slow enough (pytest's "DID NOT RAISE"),
    one that expected it to finish checked a half-done output, and either
    left the query running into the next test."""
    from pyspark.errors import StreamingQueryException

    try:
        ended = query.awaitTermination(timeout_s)
    except StreamingQueryException:
        ended = True  # it failed: query.exception() is that error
    if not ended:
        progress = query.lastProgress
        query.stop()
        raise AssertionError(
            f"the query did not end within {timeout_s} s (stopped now); last progress: {progress}"
        )
    return query.exception()
