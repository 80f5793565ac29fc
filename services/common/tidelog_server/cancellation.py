"""Telling a cancel from a failure in the loops that retry.

A service's background loops (watches, lease keep-alives, the controller's
duties) catch `Exception` and go round again: etcd outages are expected and
outlived. But a cancel that reaches an etcd or gRPC call in flight can come
back wrapped as another exception (aetcd translates the errors of the calls
it makes), and such a loop would swallow it: the task never ends, and
whatever stops it (a controller stepping down, a service shutting down)
waits forever. Each of those handlers calls `raise_if_cancelling` first.

The same goes for a cancel that a library swallowed: aetcd waits for a
watch's creation with `asyncio.wait_for`, which on Python 3.11 can lose a
cancel that lands as the answer arrives (the caller then follows the new
watch forever). After such a call, `raise_if_cancelling()` honours it.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelling(cause: BaseException | None = None) -> None:
    """Raise CancelledError (from `cause`) when the current task has been
    asked to stop, whatever exception the cancel arrived as, or if it was
    swallowed on the way."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause
