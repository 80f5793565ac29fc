"""The background event loop behind the synchronous clients.

grpc.aio channels and streams belong to one asyncio loop. A synchronous
client (Producer, Consumer, AdminClient) owns one `LoopThread`: a daemon
thread running a private loop, where all of its gRPC work happens. The
calling thread talks to it in two ways only:

- `run(coro, timeout)`: block until a coroutine finishes there (setup,
  metadata, flush, close): a few per client lifetime, never per record;
- `call_soon(fn, *args)`: fire-and-forget a callback (wake the sender, grant
  fetch credit): at most once per batch or per poll.

`client_loop(name, shared)` gives a client its `LoopHandle`. By default the
blocking Producer and Consumer of a process share ONE loop thread (started by
the first, stopped when the last closes), as the asyncio clients share the
application's loop. Why: grpc.aio completes every operation of the process
through one poller thread and one wake-up fd that each loop watches; with a
loop per client, every gRPC completion woke both loop threads and the one
that drained the queue forwarded the other's events with
`call_soon_threadsafe` (a further wake-up), so a record produced and
consumed in one process crossed more threads, each taking the GIL (the p99 of
`python -m bench.e2e_trace --mode sync` against `async`). One loop thread
takes those hops out; the cost: delivery callbacks of one client run on the
loop of the others (a slow callback delays them) and may not make blocking
calls of any client sharing it (RuntimeError, as for their own producer).
`shared_loop_thread=False` gives a client a private loop thread.

The loop is uvloop's where it is installed (tidelog._event_loop says why and
how to choose). It always runs in its own thread. (A Consumer alone on its loop used
to borrow it into the thread waiting in poll(), to save one thread hand-off
per fetched answer. Measured again on a shared 2-core machine, two
processes at 10,000 records/s (`python -m bench.e2e_ab`), the p99 was lower
without it in 15 of 15 alternated rounds, three runs: medians 5.69 -> 5.04,
5.97 -> 4.76, 5.67 -> 5.11 ms; the p50 unchanged. While borrowed, the loop
ran only inside poll(), and the loop's thread, woken every 5 ms to look,
had to be stopped and woken again to take the loop back whenever the
caller was late.)

Ctrl-C: the loop's thread is never the main thread, so a KeyboardInterrupt
never lands in a task step; the Consumer's blocking calls defer SIGINT
around their waits and raise it at a safe point (tidelog._sigint).

Thread-safe: every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tidelog._event_loop import new_event_loop
from tidelog.errors import ClosedError, TidelogTimeoutError

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one asyncio event loop."""

    def __init__(self, name: str) -> None:
        self._loop = new_event_loop()
        self._closed = False
        self._closing = threading.Lock()  # makes stop() idempotent across threads
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def in_loop_thread(self) -> bool:
        """Whether the calling thread is running this loop now (its own
        thread, inside a callback or task)."""
        return asyncio._get_running_loop() is self._loop

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

    @property
    def closed(self) -> bool:
        return self._closed

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Schedule `fn(*args)` on the loop without waiting; dropped once
        the loop is closed."""
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            # stop() from another thread, between the check above and here,
            # closed the loop ("Event loop is closed"): dropped, as after it.
            if not self._loop.is_closed():
                raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread. Idempotent."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:
            # The loop is closed only by its thread's end: its run_forever
            # raised, and there is nothing left to stop.
            if not self._loop.is_closed():
                raise
        if not self.in_loop_thread():
            self._thread.join(timeout)


class LoopHandle:
    """One client's use of a `LoopThread`, private or shared: the methods of
    LoopThread, and `stop()`, which releases this use (idempotent) and stops
    the thread when no other client uses it."""

    def __init__(self, thread: LoopThread, release: Callable[[LoopThread], None]) -> None:
        self._thread = thread
        self._release = release
        self._stopped = False
        self._stop_lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._thread.loop

    @property
    def thread(self) -> LoopThread:
        return self._thread

    def in_loop_thread(self) -> bool:
        return self._thread.in_loop_thread()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._stopped:
            coro.close()
            raise ClosedError("the client is closed")
        return self._thread.run(coro, timeout)

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        if not self._stopped:
            self._thread.call_soon(fn, *args)

    def stop(self) -> None:
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._release(self._thread)


class _SharedLoop:
    """The process's shared loop thread and how many clients use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: LoopThread | None = None
        self._users = 0

    def acquire(self) -> LoopHandle:
        with self._lock:
            if self._thread is None or self._thread.closed:
                self._thread = LoopThread("tidelog-loop")
                self._users = 0
            self._users += 1
            return LoopHandle(self._thread, self._release)

    def _release(self, thread: LoopThread) -> None:
        with self._lock:
            if thread is not self._thread:
                return  # already replaced: cannot happen while it has users
            self._users -= 1
            if self._users:
                return
            self._thread = None
        thread.stop()

    def forget(self) -> None:
        """In a forked child: the parent's loop thread does not exist here
        (fork copies only the calling thread), so the next client starts one."""
        self._lock = threading.Lock()
        self._thread = None
        self._users = 0

    def users(self) -> int:
        """How many clients use the shared loop thread now (for tests)."""
        with self._lock:
            return self._users if self._thread is not None else 0


_SHARED = _SharedLoop()
os.register_at_fork(after_in_child=_SHARED.forget)


def client_loop(name: str, shared: bool) -> LoopHandle:
    """A blocking client's loop: the process's shared one, or a private
    thread named `name` (see the module doc)."""
    if shared:
        return _SHARED.acquire()
    return LoopHandle(LoopThread(name), LoopThread.stop)


def shared_loop_users() -> int:
    """How many clients use the shared loop thread now (for tests)."""
    return _SHARED.users()
