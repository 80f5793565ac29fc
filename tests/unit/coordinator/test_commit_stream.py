"""CommitStream: the bookkeeping of one CommitOffsetsStream (in-flight bound,
correlation ids, answers in completion order), with a commit function the
test controls in place of OffsetStore (the process-level tests in
tests/integration/coordinator/test_offset_commit_stream.py use the real one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from tidelog.v1 import common_pb2, group_pb2
from tidelog_coordinator.commit_stream import COMMITS_PER_MESSAGE_MAX, CommitStream

pytestmark = pytest.mark.timeout(60)


def _request(*correlation_ids: int, group: str = "g") -> group_pb2.CommitOffsetsStreamRequest:
    """One message carrying a commit per correlation id."""
    return group_pb2.CommitOffsetsStreamRequest(
        commits=[
            group_pb2.StreamedCommit(
                correlation_id=c, commit=group_pb2.CommitOffsetsRequest(group_id=group)
            )
            for c in correlation_ids
        ]
    )


class Client:
    """Requests the test writes, and how many the stream has read."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[group_pb2.CommitOffsetsStreamRequest | None] = asyncio.Queue()
        self.read = 0

    async def requests(self) -> AsyncIterator[group_pb2.CommitOffsetsStreamRequest]:
        while True:
            request = await self.queue.get()
            if request is None:
                return
            self.read += 1
            yield request


class HeldCommits:
    """The commit function of a stream: each commit starts (counted) and then
    waits until `release` is set, like an etcd transaction that has not
    returned yet."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, request: group_pb2.CommitOffsetsRequest) -> common_pb2.Error | None:
        self.started += 1
        await self.release.wait()
        return None


#: Generous: an answer the stream owes comes within it.
ANSWER_DEADLINE_S = 10
#: Event-loop turns that let every ready task run until it waits again.
SETTLE_TURNS = 50


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


def test_a_client_that_never_reads_answers_is_read_only_up_to_the_bound() -> None:
    async def run() -> None:
        commit = HeldCommits()
        client = Client()
        bound = 8
        for i in range(100):  # many more than the bound
            client.queue.put_nowait(_request(i))
        answers = CommitStream(commit, in_flight_max=bound).answers(client.requests())
        # The handler starts; the commits cannot finish: 8 read, 8 started.
        first = asyncio.ensure_future(anext(answers))
        await _settle()
        assert (client.read, commit.started) == (bound, bound)
        # Committed, but the answers are not taken (the client does not read;
        # gRPC asks for the next message only once it has written the one
        # before): still no more requests read.
        commit.release.set()
        await _settle()
        carried = len(first.result().answers)
        assert 1 <= carried <= bound
        assert client.read == bound
        # Asking for the next message means the one before was sent: as many
        # more requests are read as it carried answers, and no more.
        second = await anext(answers)
        await _settle()
        assert client.read == bound + carried
        assert len(second.answers) >= 1
        await answers.aclose()

    asyncio.run(run())


def test_answers_come_as_commits_finish_under_their_correlation_ids() -> None:
    """Each answer as soon as its commit finished (so in a message of its
    own here), under its request's correlation id."""

    async def run() -> None:
        gates = {i: asyncio.Event() for i in (10, 20, 30)}

        async def commit(request: group_pb2.CommitOffsetsRequest) -> common_pb2.Error | None:
            correlation = int(request.group_id)
            await gates[correlation].wait()
            if correlation == 20:
                return common_pb2.Error(code=common_pb2.ILLEGAL_GENERATION, message="stale")
            return None

        client = Client()
        for i in (10, 20, 30):
            client.queue.put_nowait(_request(i, group=str(i)))  # (the group says which gate)
        client.queue.put_nowait(None)
        answers = CommitStream(commit, in_flight_max=16).answers(client.requests())
        got: list[group_pb2.CommitOffsetsStreamAnswer] = []

        async def collect() -> None:
            async for message in answers:
                got.extend(message.answers)

        collector = asyncio.ensure_future(collect())
        for i in (30, 10, 20):
            gates[i].set()
            await _settle()
        # Ends: input closed, every answer sent.
        await asyncio.wait_for(collector, ANSWER_DEADLINE_S)
        assert [(a.correlation_id, a.error.code) for a in got] == [
            (30, common_pb2.NONE),
            (10, common_pb2.NONE),
            (20, common_pb2.ILLEGAL_GENERATION),
        ]

    asyncio.run(run())


def test_a_correlation_id_in_flight_twice_is_refused_naming_it() -> None:
    async def run() -> None:
        commit = HeldCommits()
        client = Client()
        client.queue.put_nowait(_request(5))
        client.queue.put_nowait(_request(5))
        answers = CommitStream(commit, in_flight_max=16).answers(client.requests())
        (refused,) = (await asyncio.wait_for(anext(answers), ANSWER_DEADLINE_S)).answers
        assert refused.correlation_id == 5
        assert refused.error.code == common_pb2.INVALID_REQUEST
        assert "correlation_id 5 is already in flight" in refused.error.message
        assert commit.started == 1
        commit.release.set()
        (done,) = (await asyncio.wait_for(anext(answers), ANSWER_DEADLINE_S)).answers
        assert (done.correlation_id, done.HasField("error")) == (5, False)
        # Once answered, the id may be used again.
        client.queue.put_nowait(_request(5))
        client.queue.put_nowait(None)
        again = [a async for message in answers for a in message.answers]
        assert [(a.correlation_id, a.HasField("error")) for a in again] == [(5, False)]

    asyncio.run(run())


def test_draining_answers_what_was_read_then_ends_without_reading_more() -> None:
    """The coordinator shutting down: the commits in flight are answered, no
    further request is read, and the stream ends (the client sends the rest
    elsewhere)."""

    async def run() -> None:
        commit = HeldCommits()
        client = Client()
        client.queue.put_nowait(_request(1))
        client.queue.put_nowait(_request(2))
        stream = CommitStream(commit, in_flight_max=2)
        answers = stream.answers(client.requests())

        async def collect() -> list[group_pb2.CommitOffsetsStreamAnswer]:
            return [a async for message in answers for a in message.answers]

        got = asyncio.ensure_future(asyncio.wait_for(collect(), ANSWER_DEADLINE_S))
        await _settle()
        assert client.read == 2
        stream.drain()
        client.queue.put_nowait(_request(3))  # never read
        await _settle()
        commit.release.set()
        assert sorted(a.correlation_id for a in await got) == [1, 2]
        assert client.read == 2

    asyncio.run(run())


def test_one_message_carries_many_commits_counted_one_by_one_against_the_bound() -> None:
    async def run() -> None:
        commit = HeldCommits()
        client = Client()
        client.queue.put_nowait(_request(*range(1, 11)))  # 10 commits, bound 4
        client.queue.put_nowait(_request(11))
        client.queue.put_nowait(None)
        answers = CommitStream(commit, in_flight_max=4).answers(client.requests())
        first = asyncio.ensure_future(anext(answers))
        await _settle()
        assert (client.read, commit.started) == (1, 4)  # the rest of the message waits
        commit.release.set()
        got = [a.correlation_id for a in (await first).answers]
        async for message in answers:
            got += [a.correlation_id for a in message.answers]
        assert sorted(got) == list(range(1, 12))
        assert client.read == 2

    asyncio.run(run())


def test_a_message_with_too_many_commits_ends_the_stream_naming_the_limit() -> None:
    async def run() -> None:
        async def commit(request: group_pb2.CommitOffsetsRequest) -> common_pb2.Error | None:
            return None

        client = Client()
        client.queue.put_nowait(_request(1))
        client.queue.put_nowait(_request(*range(2, COMMITS_PER_MESSAGE_MAX + 3)))
        stream = CommitStream(commit, in_flight_max=4096)
        got = [a.correlation_id async for m in stream.answers(client.requests()) for a in m.answers]
        assert got == [1]  # answered; nothing of the oversized message committed
        assert stream.refused is not None
        assert f"at most {COMMITS_PER_MESSAGE_MAX}" in stream.refused.message

    asyncio.run(run())
