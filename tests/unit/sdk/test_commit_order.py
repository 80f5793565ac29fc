"""`_commit_order.OrderedCommits`: one consumer's commits go one request at a
time, in call order, those queued meanwhile merged (a later offset wins);
each caller gets its own outcome; a failure in the middle stops nothing;
close() fails what is unanswered. The request is a stand-in coroutine that
records what it was sent and answers when the test says so (the process
test, tests/integration/groups/test_commit_order.py, sends real ones).
Also: AsyncConsumer's commit() queues after a commit_async() made before it
whose task has not started yet."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from tidelog._async_consumer import _AsyncIo
from tidelog._commit_order import MERGED_PARTITIONS_MAX, OrderedCommits
from tidelog._consumer_common import HandedOut
from tidelog._consumer_group import GroupSide
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    ClosedError,
    CoordinatorNotAvailableError,
    UnknownTopicOrPartitionError,
)
from tidelog.group import OffsetAndMetadata
from tidelog.types import TopicPartition

A, B, GONE = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("gone", 0)

pytestmark = pytest.mark.timeout(30)


def _om(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset)


class _Coordinator:
    """Answers each request when `answer()` is called, in order; a request
    naming GONE fails as the coordinator fails it; `fail_next` fails the
    next one with that error."""

    def __init__(self) -> None:
        self.sent: list[dict[TopicPartition, OffsetAndMetadata]] = []
        self.applied: dict[TopicPartition, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next: BaseException | None = None
        self._answers: asyncio.Queue[None] = asyncio.Queue()
        self.waiting = asyncio.Event()

    def answer(self, count: int = 1) -> None:
        for _ in range(count):
            self._answers.put_nowait(None)

    async def send(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.sent.append(dict(offsets))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.waiting.set()
        try:
            await self._answers.get()
        finally:
            self.in_flight -= 1
            self.waiting.clear()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if GONE in offsets:
            raise UnknownTopicOrPartitionError("gone-0 does not exist")
        self.applied.update((tp, om.offset) for tp, om in offsets.items())


async def _settled(task: asyncio.Task[Any]) -> BaseException | None:
    try:
        await asyncio.wait_for(task, 10)
    except Exception as exc:
        return exc
    return None


def test_commits_made_while_one_is_in_flight_go_together_next_later_offsets_winning() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        first = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        later = [
            asyncio.create_task(commits.commit(offsets))
            for offsets in ({A: _om(2), B: _om(5)}, {A: _om(3)}, {B: _om(4)})
        ]
        await asyncio.sleep(0.05)
        assert coordinator.sent == [{A: _om(1)}]  # one request at a time
        coordinator.answer(2)
        for task in [first, *later]:
            assert await _settled(task) is None
        assert coordinator.sent == [{A: _om(1)}, {A: _om(3), B: _om(4)}]
        assert coordinator.applied == {A: 3, B: 4}
        assert coordinator.most_in_flight == 1

    asyncio.run(scenario())


def test_a_merged_request_that_fails_is_sent_again_commit_by_commit_each_its_own_answer() -> None:
    """A commit naming a partition that does not exist fails alone: the
    commits merged with it succeed, before and after it, in call order."""

    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        first = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        before = asyncio.create_task(commits.commit({A: _om(2)}))
        bad = asyncio.create_task(commits.commit({GONE: _om(9)}))
        after = asyncio.create_task(commits.commit({A: _om(3)}))
        coordinator.answer(5)
        assert await _settled(first) is None
        assert await _settled(before) is None
        assert isinstance(await _settled(bad), UnknownTopicOrPartitionError)
        assert await _settled(after) is None
        assert coordinator.sent == [
            {A: _om(1)},
            {A: _om(3), GONE: _om(9)},  # merged (A: 2 then 3)
            {A: _om(2)},
            {GONE: _om(9)},
            {A: _om(3)},
        ]
        assert coordinator.applied == {A: 3}

    asyncio.run(scenario())


def test_a_retriable_failure_is_every_merged_commits_and_the_next_commits_still_go() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        first = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        merged = [asyncio.create_task(commits.commit({A: _om(n)})) for n in (2, 3)]
        coordinator.answer()
        assert await _settled(first) is None
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        last = asyncio.create_task(commits.commit({A: _om(4)}))
        coordinator.fail_next = CoordinatorNotAvailableError("no coordinator answered")
        coordinator.answer(2)
        for task in merged:
            assert isinstance(await _settled(task), CoordinatorNotAvailableError)
        assert await _settled(last) is None
        assert coordinator.sent == [{A: _om(1)}, {A: _om(3)}, {A: _om(4)}]
        assert coordinator.applied == {A: 4}

    asyncio.run(scenario())


def test_a_commit_whose_caller_stopped_waiting_is_not_sent_unless_it_was_already() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        sent = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        dropped = asyncio.create_task(commits.commit({A: _om(2)}))
        kept = asyncio.create_task(commits.commit({B: _om(3)}))
        await asyncio.sleep(0)
        sent.cancel()  # a wakeup() or a timeout of the caller: already sent
        dropped.cancel()  # not sent yet
        coordinator.answer(2)
        assert await _settled(kept) is None
        assert sent.cancelled() and dropped.cancelled()
        assert coordinator.sent == [{A: _om(1)}, {B: _om(3)}]
        assert coordinator.applied == {A: 1, B: 3}

    asyncio.run(scenario())


def test_close_fails_the_commit_in_flight_and_those_queued_and_a_later_commit_goes() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        in_flight = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        queued = asyncio.create_task(commits.commit({A: _om(2)}))
        await asyncio.sleep(0)
        answered = asyncio.create_task(commits.answered())
        await commits.close()
        assert isinstance(await _settled(in_flight), ClosedError)
        assert isinstance(await _settled(queued), ClosedError)
        await asyncio.wait_for(answered, 10)  # not an error of its own
        assert coordinator.sent == [{A: _om(1)}]
        after = asyncio.create_task(commits.commit({A: _om(3)}))
        coordinator.answer()
        assert await _settled(after) is None
        assert coordinator.applied == {A: 3}

    asyncio.run(scenario())


def test_answered_waits_for_every_commit_made_so_far() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        tasks = [asyncio.create_task(commits.commit({A: _om(1)}))]
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        tasks.append(asyncio.create_task(commits.commit({A: _om(2)})))
        await asyncio.sleep(0)
        answered = asyncio.create_task(commits.answered())
        coordinator.answer()
        await asyncio.sleep(0.05)
        assert not answered.done()  # the second, merged, still to answer
        coordinator.answer()
        await asyncio.wait_for(answered, 10)
        assert coordinator.applied == {A: 2}
        await asyncio.wait(tasks)

    asyncio.run(scenario())


def test_a_merged_request_stops_at_the_coordinators_partition_limit() -> None:
    async def scenario() -> None:
        coordinator = _Coordinator()
        commits = OrderedCommits(coordinator.send)
        first = asyncio.create_task(commits.commit({A: _om(1)}))
        await asyncio.wait_for(coordinator.waiting.wait(), 10)
        half = MERGED_PARTITIONS_MAX // 2 + 1
        big = [{TopicPartition(f"t{n}", p): _om(1) for p in range(half)} for n in range(2)]
        tasks = [asyncio.create_task(commits.commit(offsets)) for offsets in big]
        coordinator.answer(3)
        for task in [first, *tasks]:
            assert await _settled(task) is None
        assert [len(sent) for sent in coordinator.sent] == [1, half, half]

    asyncio.run(scenario())


class _OrderedGroup:
    """GroupClient's commit surface over OrderedCommits and a _Coordinator."""

    def __init__(self, coordinator: _Coordinator) -> None:
        self._commits = OrderedCommits(coordinator.send)

    async def commit(self, offsets: Any) -> None:
        await self._commits.commit(dict(offsets))

    async def commits_answered(self) -> None:
        await self._commits.answered()


def test_async_consumer_commit_goes_after_a_commit_async_made_before_it() -> None:
    """AsyncConsumer: commit_async() starts a task; a commit() right after
    it queues after that task's commit, not before (it used to run at once,
    ahead of the task that had not started)."""

    async def scenario() -> None:
        coordinator = _Coordinator()
        config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="g")
        subs = SubscriptionState(config, deque(), lambda name, args: None)
        io = _AsyncIo(asyncio.Event(), lambda: None)
        group = _OrderedGroup(coordinator)
        side = GroupSide(subs, config, group, HandedOut(), io, "AsyncConsumer")  # type: ignore[arg-type]
        subs.assign([A])
        coordinator.answer(2)
        future = side.commit_async({A: 1}, None)
        await side.commit({A: 2})  # in this task, at once (the test's timeout bounds it)
        await asyncio.wait_for(future, 10)
        assert coordinator.applied == {A: 2}

    asyncio.run(scenario())
