"""The consumers' shared calling-side pieces: what iteration handed out
(`_consumer_common.HandedOut`), the blocking driver of GroupSide's
coroutines (`_consumer_group.run_blocking`) and where a wakeup stops
GroupSide's poll."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from tidelog._consumer_common import HandedOut
from tidelog._consumer_group import GroupSide, run_blocking
from tidelog._group_client import ASSIGNED, GroupEvent
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import WakeupError
from tidelog.group import OffsetAndMetadata
from tidelog.types import ConsumerRecord, TopicPartition

A, B, C = (TopicPartition("t", p) for p in range(3))


def _records(tp: TopicPartition, first: int, count: int) -> list[ConsumerRecord]:
    return [
        ConsumerRecord(tp.topic, tp.partition, o, 0, 0, None, b"", ())
        for o in range(first, first + count)
    ]


def test_handed_out_positions_are_what_was_returned_partition_by_partition() -> None:
    handed = HandedOut()
    chunk = {A: _records(A, 10, 3), B: _records(B, 20, 3), C: _records(C, 30, 3)}
    assert handed.take(chunk).offset == 10
    for _ in range(3):  # the rest of A's records, then B's first
        handed.last = next(handed.records)
    positions = {tp: OffsetAndMetadata(end) for tp, end in ((A, 13), (B, 23), (C, 33))}
    handed.adjust(positions)
    assert positions == {
        A: OffsetAndMetadata(13),  # returned whole
        B: OffsetAndMetadata(21),  # up to the last record returned
        C: OffsetAndMetadata(30),  # nothing returned yet
    }


def test_handed_out_after_reset_leaves_positions_alone() -> None:
    handed = HandedOut()
    handed.take({A: _records(A, 0, 5)})
    handed.reset()
    positions = {A: OffsetAndMetadata(5)}
    handed.adjust(positions)
    assert positions == {A: OffsetAndMetadata(5)}
    assert next(handed.records, None) is None


def test_handed_out_commit_of_some_partitions_counts_only_what_was_returned() -> None:
    handed = HandedOut()
    handed.take({A: _records(A, 0, 2), B: _records(B, 0, 2)})  # returned: A's first
    positions = {B: OffsetAndMetadata(2)}  # a commit of B alone (B revoked)
    handed.adjust(positions)
    assert positions == {B: OffsetAndMetadata(0)}


async def _no_suspension(value: int) -> int:
    return value


async def _fails() -> None:
    raise ValueError("from the coroutine")


async def _suspends() -> None:
    await asyncio.sleep(0)


def test_run_blocking_returns_the_result_or_raises_the_error() -> None:
    assert run_blocking(_no_suspension(7)) == 7
    with pytest.raises(ValueError, match="from the coroutine"):
        run_blocking(_fails())


def test_run_blocking_refuses_a_coroutine_that_suspends() -> None:
    with pytest.raises(RuntimeError, match="awaited something other"):
        run_blocking(_suspends())


def test_handed_out_gives_back_exactly_what_was_not_returned() -> None:
    handed = HandedOut()
    chunk = {A: _records(A, 10, 3), B: _records(B, 20, 3), C: _records(C, 30, 2)}
    handed.take(chunk)
    for _ in range(4):  # the rest of A's records, then B's first two
        handed.last = next(handed.records)
    back = handed.give_back()
    assert {tp: [r.offset for r in rs] for tp, rs in back.items()} == {B: [22], C: [30, 31]}
    assert handed.chunk is None and handed.give_back() == {}  # forgotten once given back

    handed.take({A: _records(A, 13, 2)})
    handed.last = next(handed.records)  # the last record of the chunk
    assert handed.give_back() == {}


def test_an_interrupted_chunk_is_given_back_whole_past_the_last_record_returned() -> None:
    """Consumer.wakeup() and close() send iteration to its poll from another
    thread by `interrupt()`: the next record is not taken, and the poll
    gives back exactly what was not returned, so nothing is lost."""
    handed = HandedOut()
    chunk = {A: _records(A, 10, 3), B: _records(B, 20, 3)}
    handed.take(chunk)  # returns A's first record
    for _ in range(2):  # the rest of A's; B's come next
        handed.last = next(handed.records)
    handed.interrupt()
    assert next(handed.records, None) is None
    positions = {A: OffsetAndMetadata(13), B: OffsetAndMetadata(23)}
    handed.adjust(positions)  # a commit meanwhile commits what was returned
    assert positions == {A: OffsetAndMetadata(13), B: OffsetAndMetadata(20)}
    back = handed.give_back()
    assert {tp: [r.offset for r in rs] for tp, rs in back.items()} == {B: [20, 21, 22]}


class _WokenIo:
    """A blocking Io (as the Consumer's) whose wait() is where wakeup() lands."""

    def __init__(self) -> None:
        self.woken = False
        self.waits = 0

    async def run(self, coro: Any, timeout_s: float | None) -> Any:
        return run_blocking(coro)

    def clear(self) -> None:
        pass

    def notify(self) -> None:
        pass

    async def wait(self, timeout_s: float) -> None:
        self.waits += 1
        self.woken = True  # as Consumer.wakeup() from another thread

    def check_wakeup(self) -> None:
        if self.woken:
            self.woken = False
            raise WakeupError("woken")

    async def step(self, coro: Any) -> None:
        await coro

    async def finish_step(self) -> None:
        pass


def test_a_wakeup_leaves_a_group_poll_with_its_events_and_its_membership() -> None:
    """A wakeup raises where GroupSide.poll has nothing half done: events
    that came meanwhile stay queued for the next poll (not dropped), the
    watchdog sees a poll, and the next poll applies them."""
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="g")
    subs = SubscriptionState(config, deque(), lambda name, args: None)
    group = SimpleNamespace(
        events=deque(),
        membership=None,
        left_for_poll_timeout=False,
        in_poll=False,
        last_poll=0.0,
        refusal=lambda: None,
    )
    io = _WokenIo()
    side = GroupSide(subs, config, group, HandedOut(), io, "Consumer")  # type: ignore[arg-type]
    side.subscribed = True
    started = time.monotonic()
    with pytest.raises(WakeupError):
        run_blocking(side.poll(timeout_ms=60_000, limit=10))
    assert io.waits == 1
    assert group.in_poll is False and group.last_poll >= started
    # An event that arrived: the next poll applies it (a wakeup pending
    # before the poll raises first, and leaves it queued).
    group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
    io.woken = True
    with pytest.raises(WakeupError):
        run_blocking(side.poll(timeout_ms=0, limit=10))
    assert len(group.events) == 1 and subs.assignment() == set()
