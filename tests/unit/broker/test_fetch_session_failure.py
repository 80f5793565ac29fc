"""FetchSession.fail: the first failure ends the stream. A consumer's bad
request and the broker's drain (log_servicer: the drain fails the session
with `_Drained`, answered UNAVAILABLE + NOT_LEADER_OR_FOLLOWER) can arrive
together; the consumer must be told of its bad request, not sent to retry it
elsewhere, and a drain that came first is not turned into a bad request
either."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from tidelog.errors import InvalidRequestError
from tidelog.records import encode_batch
from tidelog.v1 import log_pb2
from tidelog_broker.config import BrokerConfig
from tidelog_broker.fetch_session import FetchSession
from tidelog_broker.log_servicer import _Drained
from tidelog_broker.partition_manager import PartitionManager

DEADLINE_S = 30.0


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[PartitionManager]:
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, auto_create_topics=True))
    manager.open()
    try:
        manager.append("t", 0, encode_batch([b"x"]))  # offset 0; the tail is 1
        yield manager
    finally:
        manager.close()


def ended_with(manager: PartitionManager, *failures: BaseException) -> BaseException:
    """What `responses` raises after a session at the tail of its partition,
    its response pending, was failed with `failures` in turn."""

    async def scenario() -> BaseException:
        session = FetchSession(manager)
        session.apply(
            log_pb2.FetchRequest(
                positions=[log_pb2.FetchPosition(topic="t", partition=0, fetch_offset=1)],
                credit_bytes=1 << 20,
            )
        )
        responses = session.responses()
        pending = asyncio.ensure_future(anext(responses))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not pending.done()  # waiting for records, none come
        for failure in failures:
            session.fail(failure)
        async with asyncio.timeout(DEADLINE_S):
            try:
                await pending
            except BaseException as exc:  # what the stream ends with
                return exc
        raise AssertionError("the session answered instead of ending")

    return asyncio.run(scenario())


def test_a_bad_request_that_meets_a_drain_is_what_the_stream_ends_with(
    manager: PartitionManager,
) -> None:
    bad = InvalidRequestError("credit_bytes must be >= 0, got -1")
    assert ended_with(manager, bad, _Drained("the broker drains")) is bad


def test_a_drain_that_came_first_is_not_replaced_by_a_later_failure(
    manager: PartitionManager,
) -> None:
    drained = _Drained("the broker drains")
    assert ended_with(manager, drained, InvalidRequestError("late")) is drained
