"""Waiting with a timeout without losing a cancel.

On Python 3.11, `asyncio.wait_for` can swallow a cancel that arrives in the
same step as the awaited thing completing (fixed in 3.12, where wait_for is
built on `asyncio.timeout`): the cancelled task then carries on as if nothing
had happened. In a loop that waits with a timeout (a sender waiting to be
woken, a consumer waiting for data) that means a close that never finishes.
`within` is wait_for's meaning built on `asyncio.timeout`, which does not
have that flaw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Await `awaitable`; TimeoutError after `timeout_s` seconds (None: no
    limit), having cancelled it, as asyncio.wait_for does. As wait_for, no
    time at all (<= 0) does not start a coroutine (a close with no time
    left sends no final commit), unless the result is already there."""
    if timeout_s is not None and timeout_s <= 0:
        future = asyncio.ensure_future(awaitable)
        if not future.done():
            future.cancel()
            # asyncio.wait, not `await future`: a cancel of our own task
            # must still propagate.
            await asyncio.wait([future])
        if future.cancelled():
            raise TimeoutError
        return future.result()
    async with asyncio.timeout(timeout_s):
        return await awaitable
