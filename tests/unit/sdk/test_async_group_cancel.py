"""A cancelled getmany() of AsyncConsumer in a group (GroupSide driven by
`_async_consumer._AsyncIo`): the rebalance step it was in goes on, and the
next poll finishes it before anything else, so no assignment or revocation
is dropped. The membership is a stand-in whose offset lookup and listener
block on events, which makes the cancel land inside the step every time;
tests/integration/groups/test_async_consumer_cancel.py does the same
against a real cluster."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from tidelog._async_consumer import _AsyncIo
from tidelog._consumer_common import HandedOut
from tidelog._consumer_group import GroupSide
from tidelog._group_client import ASSIGNED, REVOKED, GroupEvent
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import TidelogTimeoutError
from tidelog.group import OffsetAndMetadata
from tidelog.types import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)

pytestmark = pytest.mark.timeout(30)


class _Group:
    """The GroupClient's surface GroupSide uses; committed() waits for `release`."""

    def __init__(self) -> None:
        self.events: deque[GroupEvent] = deque()
        self.membership = SimpleNamespace(error=None)
        self.left_for_poll_timeout = False
        self.in_poll = False
        self.last_poll = 0.0
        self.group_id = "g"
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.lookups = 0
        self.fail_next = False
        self.commits: list[dict[TopicPartition, Any]] = []
        self.committing = asyncio.Event()
        self.commit_release = asyncio.Event()
        self.commit_release.set()

    async def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, Any]:
        self.lookups += 1
        self.asked.set()
        await self.release.wait()
        if self.fail_next:
            self.fail_next = False
            raise TidelogTimeoutError("the coordinator did not answer")
        return {tp: OffsetAndMetadata(7) for tp in partitions}

    async def commit(self, offsets: Any) -> None:
        self.commits.append(dict(offsets))
        self.committing.set()
        await self.commit_release.wait()

    async def commits_answered(self) -> None:
        pass  # commit() answers each commit itself

    def refusal(self) -> None:
        return None  # the coordinator never refuses this member


class _Listener:
    """Records its calls; each method waits for `release` (set: at once)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition]]] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def _call(self, name: str, partitions: set[TopicPartition]) -> None:
        self.calls.append((name, partitions))
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        self.finished.append(name)

    async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        await self._call("assigned", partitions)

    async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        await self._call("revoked", partitions)


def _side(**options: Any) -> tuple[GroupSide, _Group, SubscriptionState]:
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="g", **options)
    subs = SubscriptionState(config, deque(), lambda name, args: None)
    group = _Group()
    io = _AsyncIo(asyncio.Event(), lambda: None)
    side = GroupSide(subs, config, group, HandedOut(), io, "AsyncConsumer")  # type: ignore[arg-type]
    side.subscribed = True
    return side, group, subs


async def _cancel_when(poll: asyncio.Task[Any], reached: asyncio.Event) -> None:
    await asyncio.wait_for(reached.wait(), 10)
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll  # promptly: the step does not hold the cancel back


def test_a_cancel_during_the_committed_lookup_of_an_assignment_does_not_drop_it() -> None:
    async def scenario() -> None:
        side, group, subs = _side()
        group.release.clear()
        group.events.append(GroupEvent(ASSIGNED, frozenset({A, B}), None))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, group.asked)
        group.release.set()
        await side.poll(timeout_ms=0, limit=10)
        assert subs.assignment() == {A, B}
        assert subs.position(A) == 7 and subs.position(B) == 7  # the committed offsets
        assert group.lookups == 1  # resumed, not asked again

    asyncio.run(scenario())


def test_a_cancel_inside_the_assigned_listener_lets_it_finish_once() -> None:
    async def scenario() -> None:
        side, group, subs = _side()
        listener = _Listener()
        side.listener = listener
        listener.release.clear()
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, listener.entered)
        listener.release.set()
        await side.poll(timeout_ms=0, limit=10)
        assert listener.cancelled == []
        assert listener.calls == [("assigned", {A})] and listener.finished == ["assigned"]
        assert subs.assignment() == {A}

    asyncio.run(scenario())


def test_a_cancel_inside_a_revocation_holds_the_partitions_until_it_is_finished() -> None:
    """The coordinator hands revoked partitions on only once `done` is
    resolved: a cancel must neither resolve it early (two owners) nor drop
    the revocation (never let go)."""

    async def scenario() -> None:
        side, group, subs = _side()
        listener = _Listener()
        side.listener = listener
        await side.poll(timeout_ms=0, limit=10)
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        listener.release.clear()
        listener.entered.clear()
        done = asyncio.get_running_loop().create_future()
        group.events.append(GroupEvent(REVOKED, frozenset({A}), done))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, listener.entered)
        assert not done.done() and subs.assignment() == {A}
        listener.release.set()
        await side.poll(timeout_ms=0, limit=10)
        assert done.done() and subs.assignment() == set()
        assert listener.cancelled == [] and listener.finished == ["assigned", "revoked"]

    asyncio.run(scenario())


def test_a_cancel_during_a_revocations_commit_neither_acknowledges_nor_keeps_it() -> None:
    """The cancel lands in the commit before a revocation: the partitions
    are neither acknowledged as revoked while still read here (two owners)
    nor kept forever; the commit and the revocation finish."""

    async def scenario() -> None:
        side, group, subs = _side(enable_auto_commit=True)
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        subs.seek(A, 9)  # a position not committed yet
        group.commit_release.clear()
        done = asyncio.get_running_loop().create_future()
        group.events.append(GroupEvent(REVOKED, frozenset({A}), done))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, group.committing)
        assert not done.done() and subs.assignment() == {A}
        group.commit_release.set()
        await side.poll(timeout_ms=0, limit=10)
        assert done.done() and subs.assignment() == set()
        assert group.commits == [{A: OffsetAndMetadata(9)}]

    asyncio.run(scenario())


def test_leaving_waits_for_a_step_a_cancel_left_running() -> None:
    """stop()/unsubscribe() after a cancel: the assignment under way is
    finished, then revoked, so the listener hears both, in order."""

    async def scenario() -> None:
        side, group, subs = _side()
        group.close = _no_op  # type: ignore[attr-defined]
        listener = _Listener()
        side.listener = listener
        listener.release.clear()
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, listener.entered)
        leave = asyncio.create_task(side.leave(leave=True))
        await asyncio.sleep(0.05)
        assert not leave.done()  # waits for the listener's assigned call
        listener.release.set()
        await asyncio.wait_for(leave, 10)
        assert [name for name, _ in listener.calls] == ["assigned", "revoked"]
        assert listener.cancelled == [] and subs.assignment() == set()

    asyncio.run(scenario())


def test_a_failed_lookup_of_committed_offsets_is_asked_again_by_the_next_poll() -> None:
    async def scenario() -> None:
        side, group, subs = _side()
        group.fail_next = True
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        with pytest.raises(TidelogTimeoutError):
            await side.poll(timeout_ms=0, limit=10)
        await side.poll(timeout_ms=0, limit=10)
        assert subs.assignment() == {A} and subs.position(A) == 7

    asyncio.run(scenario())


async def _no_op(leave: bool | None = None) -> None:
    pass


def test_a_cancelled_unsubscribe_still_ends_the_membership_before_the_next_join() -> None:
    """unsubscribe() cancelled while the membership closes: the close goes
    on (no membership left half closed), and a subscribe() that follows
    joins only once it is over."""

    async def scenario() -> None:
        side, group, subs = _side()
        listener = _Listener()
        side.listener = listener
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        log: list[str] = []
        closing = asyncio.Event()
        closed = asyncio.Event()

        async def close(leave: bool | None = None) -> None:
            log.append("close")
            closing.set()
            await closed.wait()
            log.append("closed")

        async def join(topics: list[str], pattern: str) -> None:
            log.append("join")

        group.close = close  # type: ignore[attr-defined]
        group.join = join  # type: ignore[attr-defined]
        unsubscribe = asyncio.create_task(side.leave(leave=True))
        await _cancel_when(unsubscribe, closing)
        subscribe = asyncio.create_task(side.subscribe(["t"], None, listener))
        await asyncio.sleep(0.05)
        assert not subscribe.done() and log == ["close"]
        closed.set()
        await asyncio.wait_for(subscribe, 10)
        assert log == ["close", "closed", "join"]
        assert listener.finished == ["assigned", "revoked"] and subs.assignment() == set()

    asyncio.run(scenario())


def test_a_listener_that_unsubscribes_does_not_wait_for_its_own_step() -> None:
    """unsubscribe() (or stop()) called by a listener, inside the step that
    runs it, is part of that step: it does not wait for the step to end
    (which would wait for it: a deadlock)."""

    async def scenario() -> None:
        side, group, _subs = _side()
        group.close = _no_op  # type: ignore[attr-defined]

        class Leaver(_Listener):
            async def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
                await super().on_partitions_assigned(partitions)
                await side.leave(leave=True)

            async def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
                # From a task the listener starts, too (as stop() does).
                await asyncio.ensure_future(super().on_partitions_revoked(partitions))

        listener = Leaver()
        side.listener = listener
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await asyncio.wait_for(side.poll(timeout_ms=0, limit=10), 10)
        assert listener.finished == ["assigned", "revoked"]
        assert not side.subscribed

    asyncio.run(scenario())


# ------------------------------------------------------------ stop()'s bound


class _Closing:
    """A stand-in membership close that records itself and takes `delay_s`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.log: list[str] = []
        self.delay_s = delay_s

    async def __call__(self, leave: bool | None = None) -> None:
        self.log.append("close")
        await asyncio.sleep(self.delay_s)
        self.log.append("closed")


def _only_this_task_left() -> bool:
    return asyncio.all_tasks() == {asyncio.current_task()}


def test_stops_bound_cuts_a_step_that_blocks_forever_and_still_ends_the_membership() -> None:
    """A cancelled getmany() left on_partitions_assigned running, and it
    never returns: at stop()'s bound (`_AsyncIo.expire_in`) the listener is
    cancelled, the close goes on to end the membership (taking longer than
    the bound: it is not cut), and no task is left behind."""

    async def scenario() -> None:
        side, group, subs = _side()
        closing = _Closing(delay_s=0.3)
        group.close = closing  # type: ignore[attr-defined]
        listener = _Listener()
        side.listener = listener
        listener.release.clear()  # never set: the listener blocks forever
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, listener.entered)
        side.io.expire_in(0.1)  # type: ignore[attr-defined]
        await asyncio.wait_for(side.close(), 10)
        assert listener.cancelled == ["assigned"]
        assert [name for name, _ in listener.calls] == ["assigned"]  # revoked: time was up
        assert closing.log == ["close", "closed"] and subs.assignment() == set()
        assert not side.io.stepping  # type: ignore[attr-defined]
        assert _only_this_task_left()

    asyncio.run(scenario())


def test_stops_bound_cuts_a_steps_request_too() -> None:
    """The pending step waits for committed offsets (request_timeout_ms is
    long): at stop()'s bound the lookup is cut, not waited out."""

    async def scenario() -> None:
        side, group, subs = _side(request_timeout_ms=600_000)
        closing = _Closing()
        group.close = closing  # type: ignore[attr-defined]
        group.release.clear()  # the coordinator never answers
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        poll = asyncio.create_task(side.poll(timeout_ms=10_000, limit=10))
        await _cancel_when(poll, group.asked)
        side.io.expire_in(0.1)  # type: ignore[attr-defined]
        await asyncio.wait_for(side.close(), 10)
        assert closing.log == ["close", "closed"] and subs.assignment() == set()
        assert _only_this_task_left()

    asyncio.run(scenario())


def test_stops_bound_cuts_a_revocation_listener_that_never_returns() -> None:
    """No step pending; stop()'s own on_partitions_revoked blocks forever:
    it is cancelled at the bound, and the membership still ends."""

    async def scenario() -> None:
        side, group, subs = _side()
        closing = _Closing()
        group.close = closing  # type: ignore[attr-defined]
        listener = _Listener()
        side.listener = listener
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        listener.release.clear()
        side.io.expire_in(0.2)  # type: ignore[attr-defined]
        await asyncio.wait_for(side.close(), 10)
        assert listener.cancelled == ["revoked"] and listener.finished == ["assigned"]
        assert closing.log == ["close", "closed"] and subs.assignment() == set()
        assert _only_this_task_left()

    asyncio.run(scenario())


def test_a_listener_that_returns_within_stops_bound_is_not_cut() -> None:
    async def scenario() -> None:
        side, group, _subs = _side()
        group.close = _Closing()  # type: ignore[attr-defined]
        listener = _Listener()
        side.listener = listener
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        side.io.expire_in(30)  # type: ignore[attr-defined]
        await asyncio.wait_for(side.close(), 10)
        side.io.cancel_expiry()  # type: ignore[attr-defined]
        assert listener.finished == ["assigned", "revoked"] and listener.cancelled == []

    asyncio.run(scenario())


# ------------------------------------------------------------ assign() after unsubscribe()


def test_an_assign_after_a_cancelled_unsubscribe_survives_the_pending_leave() -> None:
    """unsubscribe() cancelled inside its revocation's commit; the
    application assigns one of the group's partitions meanwhile. The leave
    that goes on must not drop it (nor move its position): the user's
    assign() wins."""

    async def scenario() -> None:
        side, group, subs = _side(enable_auto_commit=True)
        group.close = _Closing()  # type: ignore[attr-defined]
        group.events.append(GroupEvent(ASSIGNED, frozenset({A, B}), None))
        await side.poll(timeout_ms=0, limit=10)
        subs.seek(A, 9)  # consumed in the group, not committed yet
        group.commit_release.clear()
        unsubscribe = asyncio.create_task(side.leave(leave=True))
        await _cancel_when(unsubscribe, group.committing)
        side.assign([A])  # AsyncConsumer.assign(), not subscribed any more
        subs.seek(A, 3)
        group.commit_release.set()
        await asyncio.wait_for(side.finish_quietly(), 10)
        assert subs.assignment() == {A} and subs.position(A) == 3
        assert group.commits == [{A: OffsetAndMetadata(9)}]  # the group's position

    asyncio.run(scenario())


def test_an_assign_after_a_cancelled_unsubscribe_survives_its_listener() -> None:
    async def scenario() -> None:
        side, group, subs = _side()
        group.close = _Closing()  # type: ignore[attr-defined]
        listener = _Listener()
        side.listener = listener
        group.events.append(GroupEvent(ASSIGNED, frozenset({A, B}), None))
        await side.poll(timeout_ms=0, limit=10)
        listener.release.clear()
        listener.entered.clear()
        unsubscribe = asyncio.create_task(side.leave(leave=True))
        await _cancel_when(unsubscribe, listener.entered)
        side.assign([B])
        listener.release.set()
        await asyncio.wait_for(side.finish_quietly(), 10)
        assert subs.assignment() == {B}
        assert listener.finished == ["assigned", "revoked"]

    asyncio.run(scenario())


# ------------------------------------------------------------ a cancelled subscribe()


class _Joining:
    """A stand-in join that waits for `release`; `fail` makes the next one raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = False

    async def __call__(self, topics: list[str], pattern: str) -> None:
        self.calls.append((list(topics), pattern))
        self.entered.set()
        await self.release.wait()
        if self.fail:
            self.fail = False
            raise TidelogTimeoutError("no coordinator answered")


def _unsubscribed_side() -> tuple[GroupSide, _Group, _Joining]:
    side, group, _subs = _side()
    side.subscribed = False
    joining = _Joining()
    group.join = joining  # type: ignore[attr-defined]
    group.close = _Closing()  # type: ignore[attr-defined]
    return side, group, joining


def test_a_cancelled_subscribe_stands_and_its_join_goes_on() -> None:
    """subscribe() cancelled while it joins: the subscription stands (as
    Kafka's subscribe() records it), the join is not cut, and the next
    poll waits for it and then reads the assignment it brings."""

    async def scenario() -> None:
        side, group, joining = _unsubscribed_side()
        subscribe = asyncio.create_task(side.subscribe(["t"], None, None))
        await _cancel_when(subscribe, joining.entered)
        assert side.subscribed and side.subscription() == {"t"}
        joining.release.set()
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await asyncio.wait_for(side.poll(timeout_ms=0, limit=10), 10)
        assert joining.calls == [(["t"], "")]  # joined once, not again
        assert not side.must_join and side.subs.assignment() == {A}

    asyncio.run(scenario())


def test_a_cancelled_subscribe_whose_join_fails_is_joined_by_the_next_poll() -> None:
    async def scenario() -> None:
        side, _group, joining = _unsubscribed_side()
        joining.fail = True
        subscribe = asyncio.create_task(side.subscribe(["t"], None, None))
        await _cancel_when(subscribe, joining.entered)
        joining.release.set()
        with pytest.raises(TidelogTimeoutError):  # the join's failure, reported
            await asyncio.wait_for(side.poll(timeout_ms=0, limit=10), 10)
        assert side.subscribed and side.must_join
        await asyncio.wait_for(side.poll(timeout_ms=0, limit=10), 10)
        assert joining.calls == [(["t"], ""), (["t"], "")]
        assert side.subscribed and not side.must_join

    asyncio.run(scenario())


def test_a_subscribe_whose_join_fails_while_awaited_is_undone() -> None:
    """Not cancelled: the caller gets the error and is not subscribed (it
    may assign() instead), as before."""

    async def scenario() -> None:
        side, _group, joining = _unsubscribed_side()
        joining.fail = True
        joining.release.set()
        with pytest.raises(TidelogTimeoutError):
            await side.subscribe(["t"], None, None)
        assert not side.subscribed and side.subscription() == set()
        side.assign([A])
        assert side.subs.assignment() == {A}

    asyncio.run(scenario())


def test_a_commit_after_a_cancelled_unsubscribe_waits_for_the_leave() -> None:
    """assign() then commit() while a cancelled unsubscribe() still closes
    the membership: the commit is the assign()'s, sent once the member has
    left (not through the membership that is ending)."""

    async def scenario() -> None:
        side, group, subs = _side()
        log: list[str] = []
        closing = asyncio.Event()
        closed = asyncio.Event()

        async def close(leave: bool | None = None) -> None:
            log.append("close")
            closing.set()
            await closed.wait()
            log.append("closed")

        async def commit(offsets: Any) -> None:
            log.append(f"commit {dict(offsets)}")

        group.close = close  # type: ignore[attr-defined]
        group.commit = commit  # type: ignore[method-assign]
        group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
        await side.poll(timeout_ms=0, limit=10)
        unsubscribe = asyncio.create_task(side.leave(leave=True))
        await _cancel_when(unsubscribe, closing)
        side.assign([B])
        commit_task = asyncio.create_task(side.commit({B: 5}))
        await asyncio.sleep(0.05)
        assert not commit_task.done() and log == ["close"]
        closed.set()
        await asyncio.wait_for(commit_task, 10)
        assert log == ["close", "closed", f"commit { {B: OffsetAndMetadata(5)} }"]
        assert subs.assignment() == {B}

    asyncio.run(scenario())


# ------------------------------------------------------------ offsets after unsubscribe()


def _leaving_in_its_commit() -> tuple[GroupSide, _Group, SubscriptionState]:
    """A side whose unsubscribe() (its task cancelled) is still in its final
    commit of A at 9, held until `group.commit_release` is set."""
    side, group, subs = _side(enable_auto_commit=True)
    group.close = _Closing()  # type: ignore[attr-defined]
    group.events.append(GroupEvent(ASSIGNED, frozenset({A}), None))
    return side, group, subs


async def _cancel_an_unsubscribe_in_its_commit(side: GroupSide, group: _Group) -> None:
    await side.poll(timeout_ms=0, limit=10)
    side.subs.seek(A, 9)  # consumed in the group, not committed yet
    group.commit_release.clear()
    unsubscribe = asyncio.create_task(side.leave(leave=True))
    await _cancel_when(unsubscribe, group.committing)


def test_commit_async_and_commit_after_a_cancelled_unsubscribe_land_after_the_leave_in_order() -> (
    None
):
    """commit_async() then commit() while the leaving member's final commit
    is under way: neither is sent before it (the leave's commit would
    overwrite them), and they land in call order, as Kafka's commits do."""

    async def scenario() -> None:
        side, group, _subs = _leaving_in_its_commit()
        await _cancel_an_unsubscribe_in_its_commit(side, group)
        side.assign([B])
        results: list[Any] = []
        future = side.commit_async({B: 5}, lambda offsets, error: results.append(error))
        commit = asyncio.create_task(side.commit({B: 6}))
        await asyncio.sleep(0.05)
        assert group.commits == [{A: OffsetAndMetadata(9)}]  # only the leave's, waiting
        assert not future.done() and not commit.done()
        group.commit_release.set()
        await asyncio.wait_for(commit, 10)
        assert future.done()
        assert group.commits == [
            {A: OffsetAndMetadata(9)},
            {B: OffsetAndMetadata(5)},
            {B: OffsetAndMetadata(6)},
        ]
        side.run_callbacks()
        assert results == [None]

    asyncio.run(scenario())


@pytest.mark.parametrize("call", ["committed", "seek_to_committed"])
def test_committed_offsets_after_a_cancelled_unsubscribe_are_read_after_the_leave(
    call: str,
) -> None:
    """committed() (and seek_to_committed()'s lookup) while the leaving
    member's final commit is under way: read once it has landed, not
    before (which would answer the offset from before the leave)."""

    async def scenario() -> None:
        side, group, _subs = _leaving_in_its_commit()
        await _cancel_an_unsubscribe_in_its_commit(side, group)
        side.assign([A])
        asked = group.lookups  # the assignment's, before the leave
        lookup = asyncio.create_task(
            side.committed(A, False) if call == "committed" else side.committed_offsets([A])
        )
        await asyncio.sleep(0.05)
        assert group.lookups == asked and not lookup.done()
        group.commit_release.set()
        found = await asyncio.wait_for(lookup, 10)
        assert group.lookups == asked + 1
        assert found == (7 if call == "committed" else {A: OffsetAndMetadata(7)})

    asyncio.run(scenario())


def test_a_subscribe_whose_join_fails_leaves_the_group_client_without_a_subscription() -> None:
    """The failed join's subscription is dropped on the group client too
    (its close), so that commits after an assign() are the standalone
    consumer's, and the next poll has nothing to join."""

    async def scenario() -> None:
        side, group, joining = _unsubscribed_side()
        joining.fail = True
        joining.release.set()
        with pytest.raises(TidelogTimeoutError):
            await side.subscribe(["t"], None, None)
        assert group.close.log == ["close", "closed"]  # type: ignore[attr-defined]
        assert not side.must_join and side.topics == [] and side.pattern == ""

    asyncio.run(scenario())
