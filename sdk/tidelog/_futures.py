"""Delivery results: one `BatchResult` per batch, one tiny future per record.

A producer sends hundreds of thousands of records a second, so a record's
future must cost about as much as a tuple: `FutureRecordMetadata` is a
2-tuple (batch result, index in the batch) with methods, and everything that
waits or calls back (an Event, a lock, callbacks, an asyncio future) lives on
the batch's `BatchResult`, shared by all its records.

Thread-safety: `BatchResult.complete` runs on the client's event loop; the
waiting and callback methods may be called from any thread. Callbacks run on
the event loop thread (as kafka-python runs them on its sender thread), so
they must be quick and must not block on the producer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Generator
from typing import Any

from tidelog.errors import TidelogError, TidelogTimeoutError
from tidelog.types import RecordMetadata

log = logging.getLogger(__name__)

Callback = Callable[..., object]


class BatchResult:
    """The outcome of one batch: base offset or error, shared by its records."""

    __slots__ = (
        "_aio_future",
        "_callbacks",
        "_event",
        "_lock",
        "base_offset",
        "error",
        "log_append_time_ms",
        "partition",
        "timestamps",
        "topic",
    )

    def __init__(self, topic: str, partition: int, timestamps: list[int]) -> None:
        self.topic = topic
        self.partition = partition
        #: The batch's per-record create times (the builder's column, shared).
        self.timestamps = timestamps
        self.base_offset = -1
        self.log_append_time_ms = -1
        self.error: BaseException | None = None
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[tuple[int, Callback, bool]] | None = None
        self._aio_future: asyncio.Future[None] | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Record success (on the event loop)."""
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self._finish()

    def fail(self, error: BaseException) -> None:
        """Record failure (on the event loop)."""
        self.error = error
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, None
        if self._aio_future is not None and not self._aio_future.done():
            self._aio_future.set_result(None)
        for index, fn, is_errback in callbacks or ():
            self._run_callback(index, fn, is_errback)

    def _run_callback(self, index: int, fn: Callback, is_errback: bool) -> None:
        if (self.error is not None) != is_errback:
            return
        try:
            fn(self.error if is_errback else self.metadata(index))
        except Exception:
            # A user callback must not kill the sender; say so loudly.
            log.exception("a delivery callback raised")

    def add_callback(self, index: int, fn: Callback, is_errback: bool) -> None:
        with self._lock:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((index, fn, is_errback))
                return
        self._run_callback(index, fn, is_errback)

    def metadata(self, index: int) -> RecordMetadata:
        offset = -1 if self.base_offset < 0 else self.base_offset + index
        timestamp = (
            self.log_append_time_ms if self.log_append_time_ms >= 0 else self.timestamps[index]
        )
        return RecordMetadata(self.topic, self.partition, offset, timestamp)

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    async def wait_async(self) -> None:
        """Wait on the loop that completes this batch (AsyncProducer's loop)."""
        if self._event.is_set():
            return
        if self._aio_future is None:
            self._aio_future = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._aio_future)


class FutureRecordMetadata(tuple[BatchResult, int]):
    """Where one sent record ends up: `get()` it, `await` it (AsyncProducer),
    or add callbacks. A 2-tuple (batch result, index) to stay cheap."""

    __slots__ = ()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Block until delivered; return its RecordMetadata or raise its error."""
        result = self[0]
        if not result.wait(timeout):
            raise TidelogTimeoutError(f"record not delivered within {timeout} s")
        if result.error is not None:
            raise result.error
        return result.metadata(self[1])

    def done(self) -> bool:
        return self[0].done()

    def succeeded(self) -> bool:
        return self[0].done() and self[0].error is None

    def failed(self) -> bool:
        return self[0].done() and self[0].error is not None

    def exception(self) -> BaseException | None:
        """The error, or None when still pending or delivered."""
        return self[0].error

    def add_callback(self, fn: Callable[[RecordMetadata], object]) -> FutureRecordMetadata:
        """Call fn(RecordMetadata) on success (on the client's loop thread)."""
        self[0].add_callback(self[1], fn, False)
        return self

    def add_errback(self, fn: Callable[[BaseException], object]) -> FutureRecordMetadata:
        """Call fn(error) on failure (on the client's loop thread)."""
        self[0].add_callback(self[1], fn, True)
        return self

    def add_both(self, fn: Callable[[Any], object]) -> FutureRecordMetadata:
        self.add_callback(fn)
        return self.add_errback(fn)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        result = self[0]
        yield from result.wait_async().__await__()
        if result.error is not None:
            raise result.error
        return result.metadata(self[1])

    def __repr__(self) -> str:
        result = self[0]
        state = "done" if result.done() else "pending"
        return f"<FutureRecordMetadata {result.topic}-{result.partition}[{self[1]}] {state}>"


def failed_future(topic: str, partition: int, error: TidelogError) -> FutureRecordMetadata:
    """A future that already failed (a record rejected before batching)."""
    result = BatchResult(topic, partition, [-1])
    result.fail(error)
    return FutureRecordMetadata((result, 0))
