"""The fetch budget's rules: per-connection and broker-wide bytes in flight,
and the stream limits (fetch_limits)."""

from __future__ import annotations

import asyncio

import pytest
from tidelog_broker.fetch_limits import FetchBudget, FetchLimits
from tidelog_server.stream_refusal import StreamLimitError


def test_a_connection_uses_at_most_its_share() -> None:
    budget = FetchBudget(FetchLimits(buffer_max_bytes=100, buffer_max_bytes_per_connection=40))
    budget.reserve("a", 30)
    assert budget.available("a") == 10
    assert budget.available("b") == 40
    budget.reserve("b", 40)
    budget.reserve("c", 20)
    # The broker-wide budget is the tighter one now.
    assert budget.available("d") == 10
    budget.release("a", 30)
    assert budget.available("a") == 40
    assert budget.in_flight == 60


def test_release_wakes_waiters() -> None:
    async def scenario() -> None:
        budget = FetchBudget(FetchLimits(buffer_max_bytes=10))
        budget.reserve("a", 10)
        waiter = asyncio.ensure_future(budget.wait_released())
        await asyncio.sleep(0)
        assert not waiter.done()
        budget.release("a", 10)
        await asyncio.wait_for(waiter, 5)
        assert budget.available("a") == 10

    asyncio.run(scenario())


def test_streams_are_limited_per_connection_and_per_broker() -> None:
    budget = FetchBudget(FetchLimits(max_streams=3, max_streams_per_connection=2))
    budget.open_stream("a")
    budget.open_stream("a")
    with pytest.raises(StreamLimitError, match=r"fetch\.max\.streams\.per\.connection=2"):
        budget.open_stream("a")
    budget.open_stream("b")
    with pytest.raises(StreamLimitError, match=r"fetch\.max\.streams=3"):
        budget.open_stream("c")
    budget.close_stream("a")
    budget.open_stream("c")
