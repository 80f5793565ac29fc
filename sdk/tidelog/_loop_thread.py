"""The background event loop behind the synchronous clients.

grpc.aio channels and streams belong to one asyncio loop. A synchronous
client (Producer, Consumer, AdminClient) owns one `LoopThread`: a daemon
thread running a private loop, where all of its gRPC work happens. The
calling thread talks to it in two ways only:

- `run(coro, timeout)`: block until a coroutine finishes there (setup,
  metadata, flush, close): a few per client lifetime, never per record;
- `call_soon(fn, *args)`: fire-and-forget a callback (wake the sender, grant
  fetch credit): at most once per batch or per poll.

Thread-safe: every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tidelog.errors import ClosedError, TidelogTimeoutError

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one asyncio event loop."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (or its exception).

        On timeout the coroutine is cancelled and TidelogTimeoutError raised.
        """
        if self._closed:
            coro.close()
            raise ClosedError("the client is closed")
        if self.in_loop_thread():
            coro.close()
            # Waiting here would deadlock: the loop cannot run the coroutine
            # while its own thread is blocked on it (for example a blocking
            # call made from a delivery callback).
            raise RuntimeError("a blocking client call was made from its own callback thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TidelogTimeoutError(f"the operation did not finish in {timeout:.3f} s") from None

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Schedule `fn(*args)` on the loop without waiting."""
        if not self._closed:
            self._loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        if not self.in_loop_thread():
            self._thread.join(timeout)
