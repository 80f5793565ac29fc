"""The consumers' shared calling-side pieces: what iteration handed out
(`_consumer_common.HandedOut`) and the blocking driver of GroupSide's
coroutines (`_consumer_group.run_blocking`)."""

from __future__ import annotations

import asyncio

import pytest
from tidelog._consumer_common import HandedOut
from tidelog._consumer_group import run_blocking
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
