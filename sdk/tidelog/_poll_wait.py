"""`PollEvent`: what a blocking Consumer waits on for data.

The loop (fetcher, group client) sets it when records, a rebalance or an
error are ready; any thread sets it to wake a poll (wakeup(), close()). It
is a `threading.Event` with one difference in `wait`: when the consumer is
the only user of its loop, the waiting thread borrows the loop
(`LoopThread.lend`) and runs it until the event is set or the time is up,
so the answer that sets it is handled in the polling thread itself (see
tidelog._loop_thread). Otherwise, or when the loop cannot be lent, it waits
as a threading.Event does while the loop's thread runs the loop.
"""

from __future__ import annotations

import asyncio
import threading

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

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    def set(self) -> None:
        self._event.set()
        waiter = self._waiter
        if waiter is None:
            return
        if asyncio._get_running_loop() is self._loop:
            settle(waiter)  # on the loop: the fetcher's or group's callback
        else:
            self._loop.call_soon_threadsafe(settle, waiter)  # wakeup(), close()

    def wait(self, timeout: float) -> None:
        """Return when the event is set or `timeout` seconds have passed."""
        if self._event.is_set():
            return
        if not self._loop_handle.lend():
            self._event.wait(timeout)
            return
        try:
            waiter = self._loop.create_future()
            self._waiter = waiter
            # set() before the line above saw no waiter: look again.
            if not self._event.is_set():
                self._loop_handle.run_lent(waiter, timeout)
        finally:
            self._waiter = None
            self._loop_handle.give_back(linger=True)
