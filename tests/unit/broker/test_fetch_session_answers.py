"""FetchSession: several answers in one message (FetchRequest.max_answers_per_message).

A session on a real PartitionManager over a log of equal batches; each test reads the
serialized messages that `responses()` yields, as gRPC would send them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog.errors import InvalidRequestError
from tidelog.records import encode_batch
from tidelog.v1 import common_pb2, log_pb2
from tidelog_broker import fetch_session
from tidelog_broker.config import BrokerConfig
from tidelog_broker.fetch_limits import FetchBudget, FetchLimits
from tidelog_broker.fetch_session import MAX_ANSWERS_PER_MESSAGE, FetchSession
from tidelog_broker.partition_manager import PartitionManager

BATCHES = 12
RECORDS_PER_BATCH = 10
BATCH = encode_batch([b"x" * 90] * RECORDS_PER_BATCH)
#: Each answer is two batches.
MAX_BYTES = 2 * len(BATCH)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[PartitionManager]:
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, auto_create_topics=True))
    manager.open()
    try:
        for _ in range(BATCHES):
            manager.append("t", 0, BATCH)
        yield manager
    finally:
        manager.close()


def _request(credit: int, answers: int = 0) -> log_pb2.FetchRequest:
    return log_pb2.FetchRequest(
        positions=[log_pb2.FetchPosition(topic="t", partition=0, fetch_offset=0)],
        credit_bytes=credit,
        max_bytes=MAX_BYTES,
        max_wait_ms=10,
        max_answers_per_message=answers,
    )


def _spans(message: bytes) -> list[tuple[int, int, int]]:
    """(fetch_offset, next_offset, record bytes) of each answer in a message."""
    response = log_pb2.FetchResponse.FromString(message)
    return [(p.fetch_offset, p.next_offset, len(p.records)) for p in response.partitions]


def _first_messages(session: FetchSession, count: int) -> list[list[tuple[int, int, int]]]:
    async def read() -> list[list[tuple[int, int, int]]]:
        out = []
        responses = session.responses()
        try:
            for _ in range(count):
                out.append(_spans(await asyncio.wait_for(anext(responses), 10)))
        finally:
            await responses.aclose()
        return out

    return asyncio.run(read())


def _answer(n: int) -> tuple[int, int, int]:
    """The n-th answer of a read from offset 0: two batches."""
    per_answer = 2 * RECORDS_PER_BATCH
    return n * per_answer, (n + 1) * per_answer, MAX_BYTES


def test_answers_ready_at_once_travel_in_one_message(manager: PartitionManager) -> None:
    session = FetchSession(manager)
    session.apply(_request(credit=1 << 20, answers=3))
    first, second = _first_messages(session, 2)
    # Consecutive answers of the partition, each within max_bytes, in offset order.
    assert first == [_answer(0), _answer(1), _answer(2)]
    assert second == [_answer(3), _answer(4), _answer(5)]


def test_one_answer_per_message_unless_asked(manager: PartitionManager) -> None:
    session = FetchSession(manager)
    session.apply(_request(credit=1 << 20))
    assert _first_messages(session, 2) == [[_answer(0)], [_answer(1)]]


def test_a_message_holds_no_more_answers_than_the_credit_pays_for(
    manager: PartitionManager,
) -> None:
    session = FetchSession(manager)
    session.apply(_request(credit=2 * MAX_BYTES, answers=4))
    (first,) = _first_messages(session, 1)
    assert first == [_answer(0), _answer(1)]


def test_a_message_ends_where_the_log_ends(manager: PartitionManager) -> None:
    session = FetchSession(manager)
    session.apply(_request(credit=1 << 20, answers=MAX_ANSWERS_PER_MESSAGE))
    (first,) = _first_messages(session, 1)
    assert first == [_answer(n) for n in range(BATCHES // 2)]


def test_the_budget_holds_every_answer_of_a_message_until_it_is_sent(
    manager: PartitionManager,
) -> None:
    budget = FetchBudget(FetchLimits())
    session = FetchSession(manager, budget, "peer")
    session.apply(_request(credit=1 << 20, answers=3))

    async def read() -> tuple[int, int]:
        responses = session.responses()
        await anext(responses)
        held = budget.in_flight
        await responses.aclose()
        return held, budget.in_flight

    assert asyncio.run(read()) == (3 * MAX_BYTES, 0)


def test_a_message_stops_at_the_connections_share_of_the_budget(
    manager: PartitionManager,
) -> None:
    # Room for a little over one answer: the second read takes one batch (a
    # batch is never split), then the budget is spent.
    budget = FetchBudget(FetchLimits(buffer_max_bytes_per_connection=MAX_BYTES + 1))
    session = FetchSession(manager, budget, "peer")
    session.apply(_request(credit=1 << 20, answers=4))
    (first,) = _first_messages(session, 1)
    assert first == [_answer(0), (20, 30, len(BATCH))]


def test_a_failed_read_ends_the_message_and_the_stream_goes_on(
    manager: PartitionManager,
) -> None:
    session = FetchSession(manager)
    request = _request(credit=1 << 20, answers=4)
    request.positions[0].fetch_offset = 1000  # past the end: OFFSET_OUT_OF_RANGE
    session.apply(request)

    async def read() -> tuple[log_pb2.FetchResponse, list[tuple[int, int, int]]]:
        responses = session.responses()
        try:
            failed = log_pb2.FetchResponse.FromString(await anext(responses))
            # The failed read removed the position; a new one is read from.
            session.apply(_request(credit=0))
            return failed, _spans(await asyncio.wait_for(anext(responses), 10))
        finally:
            await responses.aclose()

    failed, after = asyncio.run(read())
    assert [(p.fetch_offset, p.error.code != 0) for p in failed.partitions] == [(1000, True)]
    assert after == [_answer(0), _answer(1), _answer(2), _answer(3)]


@pytest.mark.parametrize("answers", [-1, MAX_ANSWERS_PER_MESSAGE + 1])
def test_a_bad_answer_count_is_refused_naming_the_limit(
    manager: PartitionManager, answers: int
) -> None:
    session = FetchSession(manager)
    with pytest.raises(InvalidRequestError, match=f"between 0 and {MAX_ANSWERS_PER_MESSAGE}"):
        session.apply(_request(credit=1 << 20, answers=answers))


def test_answers_are_put_together_only_within_the_bundled_message_bytes(
    manager: PartitionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for two answers' worth of record bytes, not three: messages of
    # several MiB would defeat the broker's allocator tuning.
    monkeypatch.setattr(fetch_session, "MAX_BUNDLED_MESSAGE_BYTES", 2 * MAX_BYTES + 1)
    session = FetchSession(manager)
    session.apply(_request(credit=1 << 20, answers=8))
    first, second = _first_messages(session, 2)
    assert first == [_answer(0), _answer(1)]
    assert second == [_answer(2), _answer(3)]


def test_a_refused_request_changes_nothing(manager: PartitionManager) -> None:
    # The session checked positions one by one while applying them: a bad one
    # after good ones left the request half applied (the positions before it
    # moved, the partitions it removed gone, its settings taken).
    session = FetchSession(manager)
    session.apply(_request(credit=1 << 20, answers=3))
    refused = log_pb2.FetchRequest(
        remove=[common_pb2.TopicPartition(topic="t", partition=0)],
        positions=[
            log_pb2.FetchPosition(topic="t", partition=0, fetch_offset=5 * RECORDS_PER_BATCH),
            log_pb2.FetchPosition(topic="t", partition=1, fetch_offset=0, partition_max_bytes=-1),
        ],
        max_answers_per_message=1,
    )
    with pytest.raises(
        InvalidRequestError, match="partition_max_bytes must be >= 0 for t-1, got -1"
    ):
        session.apply(refused)
    # Still at offset 0, still three answers a message.
    (first,) = _first_messages(session, 1)
    assert first == [_answer(0), _answer(1), _answer(2)]
