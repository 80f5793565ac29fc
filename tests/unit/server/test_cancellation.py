"""tidelog_server.cancellation: a cancel lost on the way is raised again."""

from __future__ import annotations

import asyncio

import pytest
from tidelog_server.cancellation import raise_if_cancelling


def test_a_cancel_swallowed_on_the_way_is_raised_again() -> None:
    async def swallowing_loop(started: asyncio.Event) -> None:
        while True:
            try:
                started.set()
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass  # what a library that loses the cancel amounts to
            raise_if_cancelling()

    async def run() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(swallowing_loop(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(run())
