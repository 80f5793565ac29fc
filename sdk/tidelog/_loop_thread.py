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

A loop with one user may be lent to the caller's thread (`lend`,
`give_back`): a Consumer alone on its loop runs the loop in the thread
that waits in poll() (`tidelog._poll_wait`), as Kafka's consumer does its
network I/O inside poll(). A fetched answer then wakes the polling thread
directly (gRPC's poller, then the caller) instead of the loop thread and
then the caller: one thread hand-off less per answer, the one the consumer
process's end-to-end latency paid for (`e2e_latency_10k_2proc`). Between
two polls less than LINGER_S apart the loop stays with the caller, unrun,
so a consumer polling in a loop never hands it over; past that the loop's
thread takes it back (heartbeats, auto-commit and the fetch streams go on
while the application works). Blocking calls made meanwhile (commit(),
position()) run in the caller too, rather than wait for it.

Ctrl-C: a loop lent to the main thread would take a KeyboardInterrupt inside
whatever callback or task step it runs (asyncio lets a BaseException end the
task and leave run_forever). This module does not handle it: the Consumer's
blocking calls defer SIGINT around all their work, lent loop included, and
raise it at a safe point (tidelog._sigint). The Producer never lends.

Thread-safe: every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tidelog.errors import ClosedError, TidelogTimeoutError

T = TypeVar("T")


#: How long a loop lent to a waiting caller stays with it after the wait, when
#: that caller is the loop's only user (see `LoopThread.lend`): a consumer
#: polling in a loop is back within this, and so never hands the loop over.
LINGER_S = 0.005


def settle(future: asyncio.Future[None]) -> None:
    """Resolve `future` (on its loop) unless it is done already."""
    if not future.done():
        future.set_result(None)


class LoopThread:
    """A daemon thread running one asyncio event loop, which it may lend to
    a caller's thread for a while (`lend`/`give_back`): whoever holds the
    loop runs it, never two threads at once."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        # Guards the loop's holder: the fields below change under it, and the
        # thread waits on it for the loop to come back.
        self._holder = threading.Condition(threading.Lock())
        self._running_here = False  # the thread is inside run_forever
        self._lent_to: int | None = None  # ident of the thread the loop is lent to
        self._linger_until = 0.0  # monotonic time the last lender keeps the loop until
        self._users = 1  # clients using this loop (set by _SharedLoop)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def in_loop_thread(self) -> bool:
        """Whether the calling thread is running this loop now: its own
        thread, or a caller it is lent to, inside a callback."""
        return asyncio._get_running_loop() is self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        try:
            while self._take_back():
                self._loop.run_forever()
                with self._holder:
                    self._running_here = False
                    self._holder.notify_all()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _take_back(self) -> bool:
        """Wait until this thread may run the loop: not lent, and no sole
        lender lingering. False once the loop is closed (and not lent)."""
        with self._holder:
            while True:
                if self._lent_to is None:
                    if self._closed:
                        return False
                    wait = self._linger_until - time.monotonic() if self._users == 1 else 0.0
                    if wait <= 0:
                        self._running_here = True
                        return True
                    self._holder.wait(wait)
                else:
                    # Woken by give_back() only when it does not linger: check
                    # again after at most a linger.
                    self._holder.wait(LINGER_S)

    def lend(self, only_if_idle: bool = False) -> bool:
        """Take the loop into the calling thread, to run it there (with
        `run_until_complete`) until `give_back()`. False, and nothing taken,
        when it cannot be: closed, lent to another thread, used by more than
        one client (the others' work would wait on this caller), or the
        calling thread runs an event loop already; with `only_if_idle`, also
        when the loop's thread is running it now (rather than stop it)."""
        if asyncio._get_running_loop() is not None:
            return False
        with self._holder:
            if self._closed or self._lent_to is not None or self._users != 1:
                return False
            if self._running_here:
                if only_if_idle:
                    return False
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._lent_to = threading.get_ident()
                while self._running_here:
                    self._holder.wait()
            else:
                self._lent_to = threading.get_ident()
        return True

    def give_back(self, linger: bool = False) -> None:
        """End a `lend()`. With `linger`, the loop's thread leaves it unrun
        for LINGER_S while this is the loop's only user, so that a caller
        lending it again within that time (the next poll) takes it without
        a hand-over."""
        with self._holder:
            self._lent_to = None
            if linger and self._users == 1 and not self._closed:
                self._linger_until = time.monotonic() + LINGER_S
            else:
                self._linger_until = 0.0
                self._holder.notify_all()

    def set_users(self, users: int) -> None:
        """How many clients use the loop: a loop with other users is never
        left unrun for a lender's linger."""
        with self._holder:
            self._users = users
            if users != 1:
                self._linger_until = 0.0
                self._holder.notify_all()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (or its exception).

        On timeout the coroutine is cancelled and TidelogTimeoutError raised.
        When the loop is idle (a lender lingering), it runs in the calling
        thread rather than wait for the loop's thread to take it back.
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
        if self.lend(only_if_idle=True):
            try:
                return self._run_here(coro, timeout)
            finally:
                self.give_back()
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TidelogTimeoutError(f"the operation did not finish in {timeout:.3f} s") from None

    def _run_here(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """`run` in the calling thread, the loop lent to it. Submitted as
        from another thread (after the callbacks already queued, such as a
        commit_async() just spawned, which must start first), and with the
        same outcomes."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        finished = self._loop.create_future()
        future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(settle, finished))
        self.run_lent(finished, timeout)
        if not future.done():
            future.cancel()
            raise TidelogTimeoutError(f"the operation did not finish in {timeout:.3f} s")
        return future.result()

    def run_lent(self, until: asyncio.Future[None], timeout: float | None) -> None:
        """Run the loop in the calling thread, which holds it (`lend`), until
        `until` is done, or `timeout` seconds have passed (it is settled
        then)."""
        timer = None if timeout is None else self._loop.call_later(timeout, settle, until)
        try:
            self._loop.run_until_complete(until)
        finally:
            if timer is not None:
                timer.cancel()

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
        """Stop the loop and join the thread (after a lender gives it back).
        Idempotent."""
        with self._holder:
            if self._closed:
                return
            self._closed = True
            if self._running_here and self._lent_to is None:
                self._loop.call_soon_threadsafe(self._loop.stop)
            else:
                # Not running it, or a lender is taking it (its own stop is
                # queued): the thread ends once the loop is back.
                self._holder.notify_all()
        if not self.in_loop_thread() and threading.current_thread() is not self._thread:
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

    def lend(self) -> bool:
        return not self._stopped and self._thread.lend()

    def give_back(self, linger: bool = False) -> None:
        self._thread.give_back(linger)

    def run_lent(self, until: asyncio.Future[None], timeout: float | None) -> None:
        self._thread.run_lent(until, timeout)

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
            self._thread.set_users(self._users)
            return LoopHandle(self._thread, self._release)

    def _release(self, thread: LoopThread) -> None:
        with self._lock:
            if thread is not self._thread:
                return  # already replaced: cannot happen while it has users
            self._users -= 1
            if self._users:
                thread.set_users(self._users)
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
