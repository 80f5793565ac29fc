"""tidelog._timeouts.within: a timeout that never loses a cancel."""

from __future__ import annotations

import asyncio

import pytest
from tidelog._timeouts import within


def test_a_cancel_that_lands_as_the_result_arrives_is_not_lost() -> None:
    # The race of Python 3.11's asyncio.wait_for (it returns the result and
    # the task carries on, cancelled in name only): the awaited future
    # completes and the task is cancelled in the same step.
    async def run() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        task = asyncio.create_task(within(answer, 10))
        await asyncio.sleep(0)  # the task now waits for the answer
        answer.set_result(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


def test_within_times_out_and_cancels_what_it_waited_for() -> None:
    async def run() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await within(never, 0.01)
        assert never.cancelled()
        assert await within(asyncio.sleep(0, "done"), None) == "done"

    asyncio.run(run())


def test_no_time_at_all_does_not_start_a_coroutine() -> None:
    # As asyncio.wait_for: Consumer.close(timeout=0) drops the final commit.
    started = []

    async def commit() -> None:
        started.append(True)

    async def run() -> None:
        with pytest.raises(TimeoutError):
            await within(commit(), 0)
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        done.set_result("already")
        assert await within(done, 0) == "already"

    asyncio.run(run())
    assert started == []
