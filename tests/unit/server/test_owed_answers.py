"""OwedAnswers: the end of a stream's reading reaches its writer however
many answers are owed, after every answer pushed before it; the reader
waits for room at the limit, and a push never waits."""

from __future__ import annotations

import asyncio

import pytest
from tidelog_server.owed_answers import OwedAnswers


def test_the_end_reaches_the_writer_when_the_limit_is_owed() -> None:
    async def scenario() -> list[int | None]:
        owed: OwedAnswers[int] = OwedAnswers(2)
        owed.push(1)
        owed.push(2)
        # A refusal while the limit is owed: nothing to make room for it.
        owed.end(ValueError("refused"))
        return [await owed.get(), await owed.get(), await owed.get()]

    assert asyncio.run(scenario()) == [1, 2, None]


def test_the_first_end_counts() -> None:
    owed: OwedAnswers[int] = OwedAnswers(1)
    refusal = ValueError("refused")
    owed.end(refusal)
    owed.end()
    assert owed.ended and owed.error is refusal


def test_the_reader_waits_for_room_and_a_waiting_writer_wakes() -> None:
    async def scenario() -> None:
        owed: OwedAnswers[int] = OwedAnswers(2)
        owed.push(1)
        owed.push(2)
        room = asyncio.ensure_future(owed.room())
        await asyncio.sleep(0)
        assert not room.done()  # the limit is owed: read no more
        assert await owed.get() == 1
        await asyncio.wait_for(room, 5)
        assert await owed.get() == 2
        waiting = asyncio.ensure_future(owed.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        owed.end()
        assert await asyncio.wait_for(waiting, 5) is None

    asyncio.run(scenario())


def test_take_all_forgets_what_is_owed_and_makes_room() -> None:
    async def scenario() -> list[int]:
        owed: OwedAnswers[int] = OwedAnswers(1)
        owed.push(1)
        owed.push(2)  # a push never waits, even past the limit
        left = owed.take_all()
        await asyncio.wait_for(owed.room(), 5)
        return left

    assert asyncio.run(scenario()) == [1, 2]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        OwedAnswers(0)
