"""The calling side of a consumer's group, written once for both consumers.

`GroupSide` does what membership means to the application, where it calls
poll() (the caller's thread for the sync Consumer, the event loop for
AsyncConsumer): subscribing and leaving; applying the events of
`_group_client` (commit and call the listener on revocation, read the
committed offsets on assignment, call the listener on loss); committing the
positions handed to the caller (`_consumer_common.HandedOut`), by hand or by
auto-commit; and the group's poll loop, which rejoins after the
max_poll_interval_ms watchdog made the consumer leave.

It is written once, as coroutines, and each consumer drives it through an
`Io`, which does the few things that differ between them: running I/O on the
membership's event loop, waking up, resolving a revocation's `done`, awaiting
a listener's result. AsyncConsumer awaits the coroutines on its own loop. The
sync Consumer runs them with `run_blocking`: its Io blocks the caller's thread
on the consumer's LoopThread for each piece of I/O, so they never suspend and
finish in one step. Hence the rule of this module: await nothing but `Io`.

A rebalance step (applying the queued events) runs through `Io.step`: for
AsyncConsumer a task of its own, so that a cancelled getmany() does not cut
it in half (an assignment dropped: partitions owned and never read; a
revocation acknowledged before its listener returned). The next poll, and
leave(), finish such a step before anything else (`Io.finish_step`).
Joining and leaving are steps too: subscribe() records the subscription
before it joins, so a cancelled subscribe() stands and the next poll finds
it joined (or joins again); a subscribe() whose join fails while it waits
is undone (`unsubscribed`). A cancelled unsubscribe() goes on leaving, and
an assign() made meanwhile wins over it (`assigns`); the offset calls made
meanwhile (commit, commit_async, committed, seek_to_committed) wait for it,
in call order (`after_leave`, `Io.spawn_after_step`).

Not thread-safe: the calling side only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from tidelog._consumer_common import HandedOut
from tidelog._group_client import ASSIGNED, LOST, REVOKED, GroupClient, GroupEvent
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    AuthorizationFailedError,
    IllegalStateError,
    SaslAuthenticationError,
    TidelogError,
)
from tidelog.group import OffsetAndMetadata, RebalanceListener
from tidelog.types import TopicPartition

log = logging.getLogger("tidelog.consumer")

T = TypeVar("T")

#: What commit() accepts: partition -> next offset to consume (or with metadata).
Offsets = Mapping[TopicPartition, int | OffsetAndMetadata]
#: commit_async's callback: (the offsets, None or the error).
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], Any]


class Io(Protocol):
    """What a consumer does for its `GroupSide` (see module doc)."""

    async def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        """Run `coro` on the membership's event loop; `timeout_s` None: a
        membership change (join, leave), which the async consumer does not bound."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> Any:
        """Start `coro` on the event loop without waiting; returns its future."""
        ...

    def spawn_after_step(self, coro: Coroutine[Any, Any, None]) -> Any:
        """spawn(), but `coro` starts only after the step a cancelled caller
        left running and what was spawned this way before it (in call
        order); finish_step() waits for those too. Its failure is its
        future's, not the step's."""
        ...

    def resolve(self, done: asyncio.Future[None]) -> None:
        """Resolve a group event's `done` (on the event loop)."""
        ...

    async def listener_done(self, result: Any) -> None:
        """What a rebalance listener method returned (maybe a coroutine)."""
        ...

    def clear(self) -> None:
        """Forget earlier wake-ups: the next wait() waits for a new one."""
        ...

    def notify(self) -> None:
        """Wake up wait() (data, a group event or a finished commit)."""
        ...

    async def wait(self, timeout_s: float) -> None:
        """Until notify() or `timeout_s`."""
        ...

    def check_wakeup(self) -> None:
        """Raise what stops a poll early (the sync Consumer: WakeupError
        after wakeup(), ClosedError after close() from another thread).
        Called where the poll has nothing half done: events are applied
        whole or not at all, so the membership survives."""
        ...

    async def step(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro`, a rebalance step (applying the group's events), to its
        end even if the caller is interrupted meanwhile (AsyncConsumer: its
        task cancelled): the interruption reaches the caller at once, and the
        next finish_step() waits for what it left running."""
        ...

    async def finish_step(self) -> None:
        """Wait for the end of a step that an interrupted caller left running
        (raising its error, if it failed), then for what spawn_after_step()
        queued behind it; at once when there is none."""
        ...


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a GroupSide coroutine whose Io blocks instead of awaiting: it runs
    to the end in one step (its result or its exception)."""
    try:
        coro.send(None)
    except StopIteration as finished:
        return finished.value
    coro.close()
    raise RuntimeError("a GroupSide coroutine awaited something other than its blocking Io")


async def _all_done(futures: list[Any]) -> None:
    """Until each future is done, on the event loop: asyncio's, or the sync
    Consumer's concurrent.futures (wrapped). Their outcomes are not ours."""
    await asyncio.wait([asyncio.wrap_future(f) for f in futures])


def resolve_future(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def normalize_offsets(offsets: Offsets) -> dict[TopicPartition, OffsetAndMetadata]:
    out = {}
    for tp, value in offsets.items():
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(int(value))
        if om.offset < 0:
            raise ValueError(f"offset for {tp} must be >= 0, got {om.offset}")
        out[TopicPartition(*tp)] = om
    return out


class GroupSide:
    """One consumer's group on its calling side (see module doc). `group` is
    None without a group_id: then only the checks (require_group) apply."""

    def __init__(
        self,
        subs: SubscriptionState,
        config: ConsumerConfig,
        group: GroupClient | None,
        handed: HandedOut,
        io: Io,
        owner: str,
    ) -> None:
        self.subs = subs
        self.config = config
        self.group = group
        self.handed = handed
        self.io = io
        #: The consumer's class name, for error messages.
        self.owner = owner
        self.timeout_s = config.request_timeout_ms / 1000
        #: close(timeout_ms=...): when the final commit must be done.
        self.commit_deadline: float | None = None
        self.listener: RebalanceListener | None = None
        self.subscribed = False
        #: The subscription (subscribe()'s topics or pattern), while subscribed.
        self.topics: list[str] = []
        self.pattern = ""
        #: The membership of the subscription is not started yet (a join cut
        #: short or failed): the next poll joins.
        self.must_join = False
        #: Counts the application's assign() calls: a leave that a cancel
        #: left running does not drop what was assigned after it began.
        self.assigns = 0
        self.next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        #: Positions committed last, so that auto-commit skips idle partitions.
        self.last_committed: dict[TopicPartition, int] = {}
        #: Finished commit_async calls whose callbacks are still to run (the
        #: future first: run_callbacks forgets it in `unfinished`).
        self.completed: deque[tuple[Any, CommitCallback | None, dict, BaseException | None]] = (
            deque()
        )
        #: commit_async futures whose callbacks have not run yet: close()
        #: waits for them. Changed on the calling side only (the futures'
        #: done callbacks run on the event loop, the sync Consumer's thread).
        self.unfinished: set[Any] = set()

    def require_group(self, what: str) -> GroupClient:
        if self.group is None:
            raise IllegalStateError(f"{what} needs a group_id ({self.owner}(group_id=...))")
        return self.group

    # ------------------------------------------------------------ membership

    async def subscribe(
        self,
        topics: Sequence[str] | str,
        pattern: str | None,
        listener: RebalanceListener | None,
    ) -> None:
        self.require_group("subscribe()")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise ValueError("subscribe to a list of topics or to a pattern (one of them)")
        if self.subs.assignment() and not self.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unassign first")
        if self.subscribed:
            await self.leave(leave=True)
        else:
            # An unsubscribe() cut short by a cancel ends before the join:
            # its close would otherwise end the new membership.
            await self.finish_quietly()
        # The subscription is recorded before the join (Kafka's subscribe()
        # only records it; poll joins): a cancel of this call from here on
        # leaves it standing, and the join, a step, goes on (the next poll
        # waits for it, or joins again if it failed). A join that fails
        # while this call waits for it undoes the subscription, on the
        # group client too (`unsubscribed`): the error is the caller's.
        self.listener = listener
        self.topics, self.pattern = topics, pattern or ""
        self.subscribed = True
        try:
            await self.io.step(self._join())
        except Exception:
            await self.unsubscribed()
            raise

    async def unsubscribed(self) -> None:
        """Back to not subscribed after a failed join, as before subscribe()
        (an earlier subscription's membership has already ended): nothing
        to join at the next poll, and the group client holds no
        subscription, so that assign() and its commits (AlterOffsets), or
        another subscribe(), start clean."""
        group = self.group
        assert group is not None
        self.subscribed = False
        self.listener = None
        self.must_join = False
        self.topics, self.pattern = [], ""
        await self.io.run(group.close(leave=True), None)

    async def _join(self) -> None:
        """Join with the recorded subscription (a step: a cancel of its
        caller does not leave a membership half started). Until it has
        succeeded, every poll tries again."""
        group = self.group
        assert group is not None
        self.must_join = True
        await self.io.run(group.join(self.topics, self.pattern), None)
        self.must_join = False

    def subscription(self) -> set[str]:
        if self.group is None or not self.subscribed:
            return set()
        return set(self.topics) or {self.pattern}

    async def leave(self, leave: bool | None, autocommit: bool = True) -> None:
        """Commit (auto-commit, unless `autocommit` is False), revoke what is
        owned, end the membership. `leave`: as GroupMembership.close (None: a
        static member stays)."""
        # A rebalance step that a cancelled getmany() left running ends
        # first: its partitions are added (or dropped) before they are
        # revoked here, and its listener call ends before ours begins.
        await self.finish_quietly()
        # Leaving is a step too: a cancelled unsubscribe() must not leave a
        # membership half closed (its heartbeats going on, no LeaveGroup).
        self.subscribed = False
        await self.io.step(self._leave(leave, autocommit))

    async def _leave(self, leave: bool | None, autocommit: bool) -> None:
        group = self.group
        assert group is not None
        owned = frozenset(self.subs.assignment())
        # Taken now: an assign() made while this step goes on (its caller
        # cancelled) moves positions that are not the group's to commit.
        offsets = (
            self.changed(self.positions(owned))
            if owned and self.config.enable_auto_commit and autocommit
            else {}
        )
        assigns = self.assigns
        try:
            if owned:
                if offsets:
                    await self.commit_logged(offsets)
                dynamic = not self.config.group_instance_id
                if dynamic or leave:
                    await self.call_listener("on_partitions_revoked", owned)
        finally:
            if self.assigns == assigns:
                self.drop(owned)
                self.handed.reset()
            else:
                # The application's assign() since unsubscribe() wins: the
                # partitions it named stay assigned, even those it shares
                # with the membership ending here.
                for tp in owned:
                    self.last_committed.pop(tp, None)
            try:
                await self.commits_answered()
            finally:
                await self.io.run(group.close(leave), None)
                group.events.clear()

    def assign(self, partitions: list[TopicPartition]) -> None:
        """The application's assign() (not subscribed): read exactly these."""
        self.assigns += 1
        self.handed.reset()
        self.subs.assign(partitions)

    async def close(self, autocommit: bool = True) -> None:
        """Leave as a consumer that closes does; a failure is only logged.
        `autocommit` False: commit nothing, even with enable_auto_commit."""
        try:
            if self.subscribed:
                self.run_callbacks()
                await self.leave(leave=None, autocommit=autocommit)
            else:
                await self.finish_quietly()  # an unsubscribe() a cancel left running
                if self.group is not None:
                    # assign() with a group id: its commits are answered
                    # (bounded as a final commit), then its connections close.
                    self.run_callbacks()
                    try:
                        await self.commits_answered()
                    finally:
                        await self.io.run(self.group.close(), None)
        except TidelogError as exc:
            log.warning("leaving the group cleanly failed: %s", exc)
        await self.callbacks_at_close()

    async def callbacks_at_close(self) -> None:
        """Run every commit_async() callback not run yet, as Kafka's close()
        does: those of commits answered while close() waited for them, and
        those it gave up on (their error: ClosedError). Every commit has its
        outcome by now (the group client is closed); their futures end
        within a few turns of the event loop."""
        if self.unfinished:
            try:
                await self.io.run(_all_done(list(self.unfinished)), self.timeout_s)
            except TidelogError as exc:
                log.warning("commit_async() calls still unfinished at close: %s", exc)
        self.run_callbacks()

    async def finish_quietly(self) -> None:
        """Io.finish_step(), its failure only logged: what the caller goes on
        to do (leave, join) matters more than an error nobody waited for."""
        try:
            await self.io.finish_step()
        except Exception:
            log.warning("a group step cut short by a cancel failed", exc_info=True)

    # ------------------------------------------------------------ offsets

    def positions(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Any]:
        """Next offsets to consume of the owned `partitions`: what poll(),
        getmany() and iteration have returned."""
        owned = self.subs.assignment()
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp in partitions:
            if tp in owned:
                position = self.subs.position(tp)
                if position is not None:
                    out[tp] = OffsetAndMetadata(position)
        self.handed.adjust(out)
        return out

    def changed(
        self, offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: om for tp, om in offsets.items() if self.last_committed.get(tp) != om.offset}

    def committed_ok(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            self.last_committed[tp] = om.offset

    async def after_leave(self) -> None:
        """Not subscribed: an unsubscribe() a cancel left running ends first
        (and commit_async() calls queued behind it, in order: commits apply
        in call order, as Kafka's). What follows is the assign()'s
        (AlterOffsets; offsets read after the leaving member's last commit),
        not the leaving member's. Subscribed: nothing to wait for."""
        if not self.subscribed:
            await self.finish_quietly()

    async def commit(self, offsets: Offsets | None) -> None:
        self.require_group("commit()")
        await self.after_leave()
        self.run_callbacks()
        normalized = (
            self.positions(self.subs.assignment())
            if offsets is None
            else normalize_offsets(offsets)
        )
        if normalized:
            await self.commit_now(normalized)

    def commit_timeout_s(self) -> float:
        """What a commit may take: request_timeout_ms, or less once close()
        has set when the final commit must be done."""
        if self.commit_deadline is None:
            return self.timeout_s
        return max(0.0, min(self.timeout_s, self.commit_deadline - time.monotonic()))

    async def commit_now(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        group = self.require_group("commit()")
        await self.io.run(group.commit(offsets), self.commit_timeout_s())
        self.committed_ok(offsets)

    async def commits_answered(self) -> None:
        """Wait until the commits made so far are answered, as long as a
        commit may take (commit_timeout_s): leaving, or closing, fails those
        still unanswered then (logged; their callbacks, if they run, say so)."""
        group = self.group
        assert group is not None
        try:
            await self.io.run(group.commits_answered(), self.commit_timeout_s())
        except TidelogError as exc:
            log.warning("commits not answered before leaving are dropped: %s", exc)

    async def commit_quietly(self, partitions: Iterable[TopicPartition]) -> None:
        offsets = self.changed(self.positions(partitions))
        if offsets:
            await self.commit_logged(offsets)

    async def commit_logged(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """commit_now(), a failure only logged (a commit before revoking)."""
        try:
            await self.commit_now(offsets)
        except TidelogError as exc:
            log.warning("committing %d offsets failed: %s", len(offsets), exc)

    def commit_async(self, offsets: Offsets | None, callback: CommitCallback | None) -> Any:
        """Start a commit; its callback runs in a later poll, commit or close
        (run_callbacks). Returns the Io's future."""
        group = self.require_group("commit_async()")
        normalized = (
            self.positions(self.subs.assignment())
            if offsets is None
            else normalize_offsets(offsets)
        )
        commit = group.commit(normalized)
        # Not subscribed: after a leave a cancel left running (see after_leave).
        future = self.io.spawn(commit) if self.subscribed else self.io.spawn_after_step(commit)
        self.unfinished.add(future)
        completed = self.completed
        notify = self.io.notify

        def done(f: Any) -> None:
            error = None if f.cancelled() else f.exception()
            completed.append((f, callback, normalized, error))
            notify()

        future.add_done_callback(done)
        return future

    def run_callbacks(self) -> None:
        while self.completed:
            future, callback, offsets, error = self.completed.popleft()
            self.unfinished.discard(future)
            if error is None:
                self.committed_ok(offsets)
            elif callback is None:
                log.warning("committing %d offsets failed: %s", len(offsets), error)
            if callback is None:
                continue
            try:
                callback(offsets, error)
            except Exception:
                log.exception("commit_async callback failed")

    async def committed(self, partition: TopicPartition, metadata: bool) -> Any:
        group = self.require_group("committed()")
        tp = TopicPartition(*partition)
        await self.after_leave()
        found = (await self.io.run(group.committed([tp]), self.timeout_s)).get(tp)
        if found is None:
            return None
        return found if metadata else found.offset

    async def committed_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets of `partitions` (those with one)."""
        group = self.require_group("seek_to_committed()")
        if not partitions:
            return {}
        await self.after_leave()
        found: dict[TopicPartition, OffsetAndMetadata] = await self.io.run(
            group.committed(partitions), self.timeout_s
        )
        return found

    def due_auto_commit(self) -> bool:
        if not (self.config.enable_auto_commit and self.subscribed):
            return False
        now = time.monotonic()
        if now < self.next_auto_commit:
            return False
        self.next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        return True

    # ------------------------------------------------------------ rebalances

    async def call_listener(self, method: str, partitions: frozenset[TopicPartition]) -> None:
        listener = self.listener
        if listener is None:
            return
        handler = getattr(listener, method, None)
        if handler is None and method == "on_partitions_lost":
            handler = listener.on_partitions_revoked
        if handler is None:
            return
        await self.io.listener_done(handler(set(partitions)))

    def drop(self, partitions: frozenset[TopicPartition]) -> frozenset[TopicPartition]:
        """Stop consuming `partitions`; returns those that were owned."""
        owned = self.subs.assignment()
        gone = frozenset(p for p in partitions if p in owned)
        if gone:
            self.subs.assign([tp for tp in owned if tp not in gone])
        for tp in gone:
            self.last_committed.pop(tp, None)
        return gone

    def add(
        self, partitions: frozenset[TopicPartition], committed: dict[TopicPartition, Any]
    ) -> None:
        owned = self.subs.assignment()
        new = [tp for tp in partitions if tp not in owned]
        positions = {tp: committed[tp].offset for tp in new if tp in committed}
        for tp, offset in positions.items():
            self.last_committed[tp] = offset
        self.subs.assign(sorted(owned) + new, positions)

    async def apply_events(self) -> None:
        """Apply what the membership reported (see _group_client), on the
        calling side: commit and call the listener on revocation, then let
        the membership acknowledge. Raises what the membership cannot get
        past alone: access denied, a refusal by the coordinator."""
        group = self.group
        assert group is not None
        membership = group.membership
        if membership is not None and isinstance(
            membership.error, AuthorizationFailedError | SaslAuthenticationError
        ):
            error, membership.error = membership.error, None
            raise error
        # A step cut short by a cancel is finished, never dropped: its
        # partitions would be owned here and never read (or never let go).
        await self.io.finish_step()
        if group.events:
            await self.io.step(self._apply_queued(group))
        refusal = group.refusal()
        if refusal is not None and not group.events:
            await self.io.step(self._end_refused(group, refusal))

    async def _end_refused(self, group: GroupClient, refusal: TidelogError) -> None:
        """The coordinator refused this member for good (a rejoin into a full
        group, say): raised from this poll, as Kafka's poll() raises a fatal
        group error, rather than only logged while the poll returns nothing
        for ever. The membership ends; what was still owned is lost (no
        commit: others may own it by now). The subscription stands: the next
        poll joins again, and raises the refusal again while it lasts."""
        owned = frozenset(self.subs.assignment())
        self.must_join = True
        try:
            await self.io.run(group.end_refused(), None)
            if owned:
                await self.call_listener("on_partitions_lost", owned)
        finally:
            self.drop(owned)
            self.handed.reset()
        raise refusal

    async def _apply_queued(self, group: GroupClient) -> None:
        while group.events:
            event = group.events.popleft()
            try:
                await self._apply_event(group, event)
            finally:
                if event.done is not None:
                    self.io.resolve(event.done)

    async def _apply_event(self, group: GroupClient, event: GroupEvent) -> None:
        owned = event.partitions & self.subs.assignment()
        if event.kind == REVOKED:
            if owned and self.config.enable_auto_commit:
                await self.commit_quietly(owned)
            try:
                if owned:
                    await self.call_listener("on_partitions_revoked", owned)
            finally:
                self.drop(owned)
        elif event.kind == LOST:
            try:
                if owned:
                    await self.call_listener("on_partitions_lost", owned)
            finally:
                self.drop(owned)
        elif event.kind == ASSIGNED:
            wanted = sorted(event.partitions)
            try:
                committed = await self.io.run(group.committed(wanted), self.timeout_s)
            except TidelogError:
                if group.membership is not None:
                    # They are ours all the same: the next poll asks again
                    # (without a membership, its LOST event or the rejoin
                    # that follows settles them).
                    group.events.appendleft(event)
                raise
            self.add(event.partitions, committed)
            await self.call_listener("on_partitions_assigned", event.partitions)

    # ------------------------------------------------------------ polling

    async def poll(
        self,
        timeout_ms: float,
        limit: int,
        only: frozenset[TopicPartition] | None = None,
        collect: Callable[[], dict[TopicPartition, Any]] | None = None,
    ) -> dict[TopicPartition, Any]:
        """poll()/getmany() of a subscribed consumer: apply group events,
        rejoin after the watchdog made it leave, auto-commit, then take up to
        `limit` records (of the owned partitions in `only` when given; with
        `collect`, what it takes: poll_arrow's batches), waiting up to
        `timeout_ms` for some."""
        group = self.group
        assert group is not None
        io = self.io
        group.in_poll = True
        try:
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                io.clear()
                io.check_wakeup()
                self.run_callbacks()
                await self.apply_events()
                if (self.must_join or group.left_for_poll_timeout) and not group.events:
                    log.info("joining group %r", group.group_id)
                    await io.step(self._join())
                if self.due_auto_commit():
                    offsets = self.changed(self.positions(self.subs.assignment()))
                    if offsets:
                        self.commit_async(offsets, None)
                owned = self.subs.assignment()
                if only is not None:
                    # A named partition revoked meanwhile is simply not read.
                    records = self.subs.collect(limit, only & owned) if only & owned else {}
                elif collect is not None:
                    records = collect() if owned else {}
                else:
                    records = self.subs.collect(limit) if owned else {}
                if records:
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return records
                await io.wait(min(remaining, 1.0))
        finally:
            group.last_poll = time.monotonic()
            group.in_poll = False
