"""`PollEvent`: what a blocking Consumer waits on for data.

The loop (fetcher, group client) sets it when records, a rebalance or an
error are ready; any thread sets it to wake a poll (wakeup(), close()). It
is a `threading.Event` with one difference in `wait`:

Ctrl-C (tidelog._sigint): in a guarded Consumer call of the main thread, a
SIGINT ends the wait early without raising into it: the handler releases a
private lock the wait blocks on (not the threading.Event's: the handler
runs between any two bytecodes of the main thread, which may hold the
Event's Condition lock). The caller then finds the interrupt pending at its
next check (the place a wakeup() is raised).
"""

from __future__ import annotations

import _thread
import contextlib
import threading

from tidelog import _sigint


class PollEvent:
    """A threading.Event whose main-thread wait a SIGINT may end (see the
    module doc). Thread-safe, as threading.Event."""

    def __init__(self) -> None:
        self._event = threading.Event()
        # The lock a guarded main-thread waiter blocks on: set() and the
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

    def wait(self, timeout: float) -> None:
        """Return when the event is set or `timeout` seconds have passed (or,
        in a guarded call, a SIGINT came: see the module doc)."""
        if self._event.is_set():
            return
        if not _sigint.waiting(self._release_thread_waiter):
            self._event.wait(timeout)
            return
        try:
            if not _sigint.pending():
                self._wait_guarded(timeout)
        finally:
            _sigint.done_waiting()

    def _wait_guarded(self, timeout: float) -> None:
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
        """set()'s and the SIGINT handler's wake (the handler's in the main
        thread, at any bytecode of it): no lock taken, nothing raised."""
        lock = self._thread_waiter
        if lock is None:
            return
        # Released already: set() twice, or set() and a SIGINT.
        with contextlib.suppress(RuntimeError):
            lock.release()
