"""The calls of a client that close() ends with ClosedError (the admin clients').

grpc.aio ends a call whose channel closes with asyncio.CancelledError, as if
the caller's task had been cancelled (the blocking client's caller then got
concurrent.futures.CancelledError), and a call waiting between two RPCs (a
retry's backoff, a coordinator failover) is not ended at all: it went on,
on channels opened again. `RunningCalls` keeps the tasks running a client's
calls; `end()` (close()) cancels them and waits until they have ended, and
a call seeing that cancel, which came from close() and not from its caller,
raises ClosedError instead: the error that means "this client is closed". A
caller's own cancel still raises CancelledError. A call made after end()
raises ClosedError at once.

`ended_by_close(cls)` routes every public coroutine method of a client class
through its `_running` (a RunningCalls), so a method added later is covered
too.

Not thread-safe: the client's event loop only.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tidelog.errors import ClosedError

T = TypeVar("T")
C = TypeVar("C", bound=type)

#: How long end() waits for the calls it cancelled: they end at their next
#: await; this bounds close() only if one swallowed its cancel.
END_WAIT_S = 5.0


class RunningCalls:
    """The tasks running one client's calls (see module doc)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self.closed = False
        # Task -> its calls under way (a call may make another call).
        self._depth: dict[asyncio.Task[Any], int] = {}
        # Set when a task's outermost call has ended (end() waits on these).
        self._finished: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        # Tasks end() cancelled and that have not seen that cancel yet.
        self._ended: set[asyncio.Task[Any]] = set()

    async def run(self, call: Awaitable[T]) -> T:
        """Await `call` (a coroutine of the client) as one of its calls."""
        if self.closed:
            _discard(call)
            raise ClosedError(f"the {self._what} is closed")
        task = asyncio.current_task()
        assert task is not None, "a client call runs in a task"
        depth = self._depth.get(task, 0)
        self._depth[task] = depth + 1
        if not depth:
            self._finished[task] = asyncio.get_running_loop().create_future()
        try:
            return await call
        except asyncio.CancelledError:
            if task in self._ended:
                self._ended.discard(task)
                # Another cancel pending (the caller's own) still wins.
                if task.uncancel() == 0:
                    raise ClosedError(f"the {self._what} was closed during the call") from None
            raise
        finally:
            if depth:
                self._depth[task] = depth
            else:
                del self._depth[task]
                self._ended.discard(task)
                self._finished.pop(task).set_result(None)

    async def end(self) -> None:
        """Refuse new calls; cancel the running ones (they raise
        ClosedError) and wait until they have ended (up to END_WAIT_S)."""
        self.closed = True
        current = asyncio.current_task()
        waiting = []
        for task, finished in self._finished.items():
            if task is not current:
                self._ended.add(task)
                task.cancel()
                waiting.append(finished)
        if waiting:
            await asyncio.wait(waiting, timeout=END_WAIT_S)


def _discard(call: Awaitable[Any]) -> None:
    """Close a coroutine that will not be awaited (no "never awaited" warning)."""
    if inspect.iscoroutine(call):
        call.close()


def ended_by_close(cls: C) -> C:
    """Route each public coroutine method of `cls` (its bases' too) through
    `self._running`, a RunningCalls; close() and the async context manager
    methods stay as they are."""
    for name in dir(cls):
        if name.startswith("_") or name == "close":
            continue
        method = getattr(cls, name)
        if inspect.iscoroutinefunction(method):
            setattr(cls, name, _through_running(method))
    return cls


def _through_running(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> T:
        running: RunningCalls = self._running
        return await running.run(method(self, *args, **kwargs))

    return call
