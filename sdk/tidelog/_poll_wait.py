"""`PollEvent`: what a blocking Consumer waits on for data.

The loop (fetcher, group client) sets it when records, a rebalance or an
error are ready; any thread sets it to wake a poll (wakeup(), close()). It
is a `threading.Event` with one difference in `wait`: when the consumer is
the only user of its loop, the waiting thread borrows the loop
(`LoopThread.lend`) and runs it until the event is set or the time is up,
so the answer that sets it is handled in the polling thread itself (see
tidelog._loop_thread). Otherwise, or when the loop cannot be lent, it waits
as a threading.Event does while the loop's thread runs the loop.

Ctrl-C (tidelog._sigint): in a guarded Consumer call of the main thread, a
SIGINT ends the wait early without raising into it: the handler wakes the
lent loop as another thread would (`call_soon_threadsafe`, its self-pipe:
the loop's epoll_wait is retried after the handler, and would otherwise
sleep on), or releases the private lock a thread wait blocks on (not the
threading.Event's: the handler runs between any two bytecodes of the main
thread, which may hold the Event's Condition lock). The caller then finds
the interrupt pending at its next check (the place a wakeup() is raised).
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import threading

from tidelog import _sigint
from tidelog._loop_thread import LoopHandle, settle


class PollEvent:
    """A threading.Event whose waiter may run the consumer's loop while it
    waits. Thread-safe, as threading.Event."""

    def __init__(self, loop: LoopHandle) -> None:
        self._loop_handle = loop
        self._loop = loop.loop
        self._event = threading.Event()
        # The future a waiter running the loop waits for (None when no
        # waiter runs it): set() resolves it, on the loop.
        self._waiter: asyncio.Future[None] | None = None
        # The lock a main-thread waiter blocks on while the loop runs in its
        # own thread (a guarded call: see the module doc): set() and the
        # SIGINT handler release it.
        self._thread_waiter: _thread.LockType | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    def set(self) -> None:
        self._event.set()
        if self._thread_waiter is not None:
            self._release_thread_waiter()
        waiter = self._waiter
        if waiter is None:
            return
        if asyncio._get_running_loop() is self._loop:
            settle(waiter)  # on the loop: the fetcher's or group's callback
        else:
            self._loop.call_soon_threadsafe(settle, waiter)  # wakeup(), close()

    def wait(self, timeout: float) -> None:
        """Return when the event is set or `timeout` seconds have passed (or,
        in a guarded call, a SIGINT came: see the module doc)."""
        if self._event.is_set():
            return
        if not _sigint.waiting(self._wake_by_signal):
            self._wait(timeout, False)
            return
        try:
            if not _sigint.pending():
                self._wait(timeout, True)
        finally:
            _sigint.done_waiting()

    def _wait(self, timeout: float, by_signal: bool) -> None:
        if not self._loop_handle.lend():
            if by_signal:
                self._wait_thread(timeout)
            else:
                self._event.wait(timeout)
            return
        try:
            waiter = self._loop.create_future()
            self._waiter = waiter
            # set() before the line above saw no waiter: look again; so
            # for a SIGINT.
            if not self._event.is_set() and not (by_signal and _sigint.pending()):
                self._loop_handle.run_lent(waiter, timeout)
        finally:
            self._waiter = None
            self._loop_handle.give_back(linger=True)

    def _wait_thread(self, timeout: float) -> None:
        """threading.Event.wait's job on a private lock, which the SIGINT
        handler may release (it may not take the Event's)."""
        lock = _thread.allocate_lock()
        lock.acquire()
        self._thread_waiter = lock
        try:
            # A set() or SIGINT before the line above released nothing.
            if not self._event.is_set() and not _sigint.pending():
                lock.acquire(True, timeout)
        finally:
            self._thread_waiter = None

    def _release_thread_waiter(self) -> None:
        lock = self._thread_waiter
        if lock is None:
            return
        # Released already: set() twice, or set() and a SIGINT.
        with contextlib.suppress(RuntimeError):
            lock.release()

    def _wake_by_signal(self) -> None:
        """The SIGINT handler's wake (main thread, at any bytecode of it):
        no lock taken, nothing raised."""
        self._release_thread_waiter()
        waiter = self._waiter
        if waiter is not None:
            # RuntimeError: the loop is closed, nobody is waiting on it.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(settle, waiter)
