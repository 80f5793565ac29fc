"""The group Consume stream's commit answers, with a scripted consumer in
place of the SDK's (the real path is tests/integration/gateway/
test_gateway_records_group.py): every commit is answered, and a commit that
failed in any way is never answered as a success."""

from __future__ import annotations

import asyncio
from typing import Any

from tidelog import TopicPartition
from tidelog.errors import CoordinatorNotAvailableError
from tidelog.v1 import common_pb2, group_pb2, records_pb2
from tidelog_gateway.records_common import consumer_options
from tidelog_gateway.records_group import GroupConsumeSession

TP = TopicPartition("t", 0)


class View:
    def topic(self, name: str) -> Any:
        return object()

    def leader_address(self, name: str, partition: int) -> str:
        return "127.0.0.1:1"


class ScriptedConsumer:
    """commit() raises the scripted outcomes in turn (None: success)."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.outcomes = list(outcomes)
        self.committed: list[Any] = []

    async def commit(self, offsets: Any) -> None:
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome
        self.committed.append(offsets)


def session_with(consumer: ScriptedConsumer) -> GroupConsumeSession:
    first = records_pb2.ConsumeRequest(group=records_pb2.ConsumeGroup(group_id="g", topics=["t"]))
    session = GroupConsumeSession(
        View(),  # type: ignore[arg-type]
        ["127.0.0.1:1"],
        first,
        consumer_options(0),
    )
    session._consumer = consumer  # type: ignore[assignment]
    session.on_partitions_assigned({TP})
    session._outbox.clear()
    return session


def commit(correlation_id: int) -> records_pb2.ConsumeCommit:
    return records_pb2.ConsumeCommit(
        correlation_id=correlation_id,
        offsets=[group_pb2.OffsetCommit(topic="t", partition=0, offset=5)],
    )


def test_every_commit_is_answered_and_failures_never_as_success() -> None:
    async def scenario() -> list[records_pb2.CommitResult]:
        consumer = ScriptedConsumer(
            TimeoutError(), CoordinatorNotAvailableError("no coordinator"), ValueError("?"), None
        )
        session = session_with(consumer)
        worker = asyncio.ensure_future(session._commit_loop())
        for n in range(4):
            session._commits.put_nowait(commit(n))
        await asyncio.wait_for(session._commits.join(), 10)
        worker.cancel()
        assert len(consumer.committed) == 1
        return [response.commit for response in session._outbox]

    answers = asyncio.run(scenario())
    assert [a.correlation_id for a in answers] == [0, 1, 2, 3]
    assert [a.error.code for a in answers] == [
        common_pb2.REQUEST_TIMED_OUT,
        common_pb2.COORDINATOR_NOT_AVAILABLE,
        common_pb2.UNKNOWN_SERVER_ERROR,
        common_pb2.NONE,
    ]
