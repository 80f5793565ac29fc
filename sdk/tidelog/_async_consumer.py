"""`AsyncConsumer`, the asyncio consumer (aiokafka's shape): consumer groups
or manual assignment.

The same parts as the blocking `Consumer` (see `consumer`), all on the
application's event loop: the `Fetcher`, the `SubscriptionState` (decoding
happens inside getmany()), and in a group the `GroupClient` and the
`GroupSide` (`_consumer_group`), whose coroutines it awaits directly.
Rebalance listener methods may be coroutines; they run inside getmany().
Cancelling a getmany() cancels its wait for records, never a rebalance step
(`_AsyncIo.step`) nor stop()'s leaving: those go on, and the next call
waits for them (docs/python-sdk.md, "waking a consumer"). stop() is bounded
all the same (`_AsyncIo.expire_in`): at its timeout, listener calls and
requests still under way are cut short; ending the membership is not.

    async with AsyncConsumer("orders", group_id="billing",
                             bootstrap_servers="127.0.0.1:9392") as consumer:
        async for record in consumer:
            handle(record)
            await consumer.commit()    # exactly the records returned so far
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from tidelog._client_metrics import Metrics
from tidelog._connection import Cluster, check_known_partitions
from tidelog._consumer_common import (
    ITERATION_CHUNK,
    HandedOut,
    check_partitions,
    make_config,
    offsets_and_times,
)
from tidelog._consumer_group import (
    CommitCallback,
    GroupSide,
    Offsets,
    resolve_future,
)
from tidelog._fetcher import EARLIEST, LATEST, Fetcher
from tidelog._group_client import GroupClient
from tidelog._subscription import SubscriptionState
from tidelog._timeouts import within
from tidelog.errors import ClosedError, IllegalStateError, TidelogTimeoutError
from tidelog.group import RebalanceListener
from tidelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

T = TypeVar("T")

__all__ = ["AsyncConsumer"]


#: The `_AsyncIo` whose step the current task runs in (tasks started there,
#: stop()'s among them, inherit it): a listener that calls unsubscribe() or
#: stop() is part of that step, which must not wait for itself.
_step_of: contextvars.ContextVar[_AsyncIo | None] = contextvars.ContextVar(
    "tidelog_step_of", default=None
)


class _AsyncIo:
    """The AsyncConsumer's `Io` for its GroupSide: everything on its own loop."""

    def __init__(self, data: asyncio.Event, check_wakeup: Callable[[], None]) -> None:
        self._data = data
        self._check_wakeup = check_wakeup
        #: The rebalance step under way, as a task of its own: a cancel of
        #: the getmany() awaiting it does not reach it.
        self._step: asyncio.Future[None] | None = None
        #: The last of the commits queued behind it (spawn_after_step).
        self._queued: asyncio.Future[None] | None = None
        #: stop()'s bound (`expire_in`): once it has passed, listener calls
        #: and requests are cut (`_cuttable`); ending the membership is not.
        self._expiry: asyncio.TimerHandle | None = None
        self._expired = False
        #: Listener calls and requests under way, which the expiry cancels.
        self._cuttable: set[asyncio.Future[Any]] = set()

    async def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        if timeout_s is None:
            return await coro  # a join or a leave: bounded by the membership itself
        try:
            if _step_of.get() is not self:
                # The application's own commit() or committed(): stop() does
                # not wait for it, so there is nothing to cut. A task all the
                # same, started after those spawned before (commit_async()'s):
                # commits are queued in the order their tasks start.
                return await within(asyncio.ensure_future(coro), timeout_s)
            if self._expired:
                coro.close()
                raise self._expired_error("the request")
            return await self._cut_at_expiry(within(coro, timeout_s), "the request")
        except TimeoutError:
            raise TidelogTimeoutError(
                f"the operation did not finish in {timeout_s:.3f} s"
            ) from None

    def expire_in(self, timeout_s: float) -> None:
        """stop()'s bound: after `timeout_s`, a listener call or a step's
        request (commit, committed offsets) under way or to come is cancelled and
        fails with TidelogTimeoutError, so that a step that would block
        forever (a listener that never returns) ends, and stop() goes on to
        end the membership and close the connections."""
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    def _expire(self) -> None:
        self._expired = True
        for future in self._cuttable:
            future.cancel()

    @staticmethod
    def _expired_error(what: str) -> TidelogTimeoutError:
        return TidelogTimeoutError(f"{what} was cut short: stop()'s timeout has passed")

    async def _cut_at_expiry(self, awaitable: Awaitable[T], what: str) -> T:
        """Await `awaitable` as a task the expiry may cancel."""
        future = asyncio.ensure_future(awaitable)
        self._cuttable.add(future)
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._expired and future.cancelled() and not (task and task.cancelling()):
                raise self._expired_error(what) from None
            raise  # our own task was cancelled
        finally:
            self._cuttable.discard(future)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        return asyncio.ensure_future(coro)

    def spawn_after_step(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        before = [f for f in (self._step, self._queued) if f is not None and not f.done()]
        if not before or _step_of.get() is self:
            # Nothing to wait for; or called from inside the step (its
            # listener): part of it, which must not wait for itself.
            return self.spawn(coro)
        self._queued = asyncio.ensure_future(self._after(before, coro))
        return self._queued

    @staticmethod
    async def _after(before: list[asyncio.Future[None]], coro: Coroutine[Any, Any, None]) -> None:
        try:
            # asyncio.wait: their outcome is not this one's (the step's error
            # is its next waiter's, a queued commit's is its own callback's).
            await asyncio.wait(before)
        except BaseException:
            coro.close()
            raise
        await coro

    def resolve(self, done: asyncio.Future[None]) -> None:
        resolve_future(done)

    async def listener_done(self, result: Any) -> None:
        if not (asyncio.iscoroutine(result) or isinstance(result, asyncio.Future)):
            return
        if self._expired:
            # stop()'s time is up: the listener is not awaited any more.
            if asyncio.iscoroutine(result):
                result.close()
            else:
                result.cancel()
            raise self._expired_error("the rebalance listener")
        await self._cut_at_expiry(result, "the rebalance listener")

    def clear(self) -> None:
        self._data.clear()

    def notify(self) -> None:
        self._data.set()

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await within(self._data.wait(), timeout_s)

    def check_wakeup(self) -> None:
        # No wakeup(): asyncio's way to interrupt a getmany() is to cancel
        # its task. Only stop() from another task wakes it (ClosedError).
        self._check_wakeup()

    async def step(self, coro: Coroutine[Any, Any, None]) -> None:
        if _step_of.get() is self:
            await coro  # called from inside the step (a listener): part of it
            return
        try:
            await self.finish_step()  # one step at a time
        except BaseException:
            coro.close()
            raise
        self._step = asyncio.ensure_future(self._run_step(coro))
        await self.finish_step()

    async def _run_step(self, coro: Coroutine[Any, Any, None]) -> None:
        _step_of.set(self)  # in this task's own context
        await coro

    @property
    def stepping(self) -> bool:
        """A step is under way (one that a cancelled caller left running)."""
        return self._step is not None

    async def finish_step(self) -> None:
        if _step_of.get() is self:
            return
        step = self._step
        failed: Exception | None = None
        if step is not None:
            try:
                # shield: the caller's cancel propagates now, the step goes on.
                await asyncio.shield(step)
            except Exception as exc:
                failed = exc  # raised once what was queued behind it is done too
            finally:
                if step.done():
                    self._step = None
        queued = self._queued
        if queued is not None:
            # Their errors are their callbacks' (run_callbacks), not ours.
            await asyncio.wait([queued])
            if self._queued is queued:
                self._queued = None
        if failed is not None:
            raise failed


class AsyncConsumer:
    """The asyncio consumer (aiokafka's shape): of a group's partitions
    (`group_id` and topics, or subscribe()), or of assigned ones. Options:
    see `tidelog.config.ConsumerConfig`. Use it from one event loop.
    Rebalance listener methods may be coroutines; they run inside getmany()."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        self._config = make_config(topics, bootstrap_servers, options)
        self._inbox: deque[tuple] = deque()
        self._data = asyncio.Event()
        self._cluster = Cluster(self._config)
        self._fetcher = Fetcher(self._cluster, self._config, self._inbox, self._data.set)
        self._subs = SubscriptionState(self._config, self._inbox, self._command)
        self._subs.metrics = self._fetcher.metrics  # one set of counters
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._started = False
        self._closed = False
        #: stop()'s work, as a task of its own: a cancelled stop() leaves the
        #: group all the same, and another stop() waits for it.
        self._stopping: asyncio.Future[None] | None = None
        # stop() begun: a getmany() waiting in another task raises ClosedError.
        self._closing = False
        # What getone() and iteration returned, so that commit() commits exactly that.
        self._handed = HandedOut()
        self._topics = topics
        group = (
            None
            if self._config.group_id is None
            else GroupClient(self._cluster, self._config, self._data.set)
        )
        self._io = _AsyncIo(self._data, self._check_closing)
        self._side = GroupSide(
            self._subs, self._config, group, self._handed, self._io, "AsyncConsumer"
        )

    def _command(self, name: str, args: tuple[Any, ...]) -> None:
        getattr(self._fetcher, name)(*args)

    async def start(self) -> None:
        """Connect to the cluster (checks that a broker answers). Idempotent."""
        if not self._started:
            self._started = True
            await self._cluster.refresh()
            if self._topics:
                await self.subscribe(self._topics)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is stopped")
        if not self._started:
            raise IllegalStateError("call `await consumer.start()` first")

    def _check_closing(self) -> None:
        if self._closing:
            raise ClosedError("the consumer was stopped while waiting for records")

    # ------------------------------------------------------------ groups

    async def subscribe(
        self,
        topics: Sequence[str] | str = (),
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Join the group (see Consumer.subscribe)."""
        self._check_open()
        await self._side.subscribe(topics, pattern, listener)

    def metrics(self) -> Metrics:
        """kafka-python's shape: group -> name -> value.
        "consumer-fetch-manager-metrics": records-consumed-total/-rate,
        bytes-consumed-total/-rate, fetch-total/-rate, fetch-size-avg,
        records-per-request-avg, fetch-latency-avg/-max (ms), records-lag-max
        (the most records any assigned partition is behind its high
        watermark); "consumer-fetch-manager-metrics.<topic>-<partition>":
        records-lag; "consumer-coordinator-metrics": assigned-partitions.
        Rates, averages and maxima cover the last 30-60 s; totals, the
        consumer's life. Cheap: counters are kept per fetch response."""
        return self._subs.metrics_snapshot()

    def subscription(self) -> set[str]:
        return self._side.subscription()

    async def unsubscribe(self) -> None:
        self._check_open()
        if self._side.subscribed:
            await self._side.leave(leave=True)

    async def commit(self, offsets: Offsets | None = None) -> None:
        """Commit and wait (see Consumer.commit): without `offsets`, exactly
        what getmany(), getone() and iteration have returned."""
        self._check_open()
        await self._side.commit(offsets)

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> asyncio.Future[None]:
        """Commit in the background; `callback(offsets, error)` runs in a later
        getmany(), commit() or stop()."""
        self._check_open()
        task: asyncio.Future[None] = self._side.commit_async(offsets, callback)
        return task

    async def committed(self, partition: TopicPartition, metadata: bool = False) -> Any:
        """The group's committed offset of `partition`; None when nothing is."""
        self._check_open()
        return await self._side.committed(partition, metadata)

    async def seek_to_committed(
        self, *partitions: TopicPartition
    ) -> dict[TopicPartition, int | None]:
        """Move to the group's committed offsets (see Consumer.seek_to_committed)."""
        self._check_open()
        tps = check_partitions(partitions) or sorted(self._subs.assignment())
        for tp in tps:
            self._subs.state(tp)  # assigned, or IllegalStateError
        found = await self._side.committed_offsets(tps)
        self._handed.reset()
        for tp in tps:
            if tp in found:
                self._subs.seek(tp, found[tp].offset)
        self._subs.reset([tp for tp in tps if tp not in found], self._config.auto_offset_reset)
        return {tp: found[tp].offset if tp in found else None for tp in tps}

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """As Consumer.assign, but checked against cached metadata only (it
        does not wait); a partition found missing later fails getmany()."""
        self._check_open()
        if self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unsubscribe first")
        tps = check_partitions(partitions)
        check_known_partitions(self._cluster.snapshot, tps)
        # Through the GroupSide: an unsubscribe() a cancel left running
        # leaves these partitions assigned.
        self._side.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return self._subs.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._check_open()
        self._handed.reset()
        self._subs.seek(TopicPartition(*partition), offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_by(partitions, "earliest")

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_by(partitions, "latest")

    def _seek_by(self, partitions: Sequence[TopicPartition], strategy: str) -> None:
        self._check_open()
        self._handed.reset()
        self._subs.reset(check_partitions(partitions) or sorted(self._subs.assignment()), strategy)

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record for `partition` (see Consumer.position)."""
        self._check_open()
        tp = TopicPartition(*partition)
        deadline = time.monotonic() + self._timeout_s
        while True:
            self._data.clear()
            position = self._subs.position_now(tp)
            if position is not None:
                return position
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidelogTimeoutError(f"position of {tp.topic}-{tp.partition} not known")
            try:
                await within(self._data.wait(), remaining)
            except TimeoutError:
                continue

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._subs.highwater(TopicPartition(*partition))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions (see Consumer.pause)."""
        self._check_open()
        self._subs.pause(check_partitions(partitions))

    def resume(self, *partitions: TopicPartition) -> None:
        self._check_open()
        self._subs.resume(check_partitions(partitions))

    def paused(self) -> set[TopicPartition]:
        return self._subs.paused()

    def set_fetch_window(self, window_bytes: int) -> None:
        """Change `fetch_buffer_bytes`, the credit window of each fetch
        session (one per leader), while consuming: a larger window is
        granted to the brokers at once; a smaller one is reached as fetched
        data is consumed (credit already granted cannot be taken back). 0
        fetches nothing more. For a program that must bound what it holds by
        what its own readers want (the gateway, per client stream)."""
        if window_bytes < 0:
            raise ValueError(f"window_bytes must be >= 0, got {window_bytes}")
        self._subs.set_window(window_bytes)
        self._fetcher.set_window(window_bytes)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition, waiting up to `timeout_ms` for some ({} if
        none): of the named partitions only, or of every assigned one.
        Interrupt it by cancelling its task (it takes no records then);
        stop() from another task makes it raise ClosedError."""
        self._check_open()
        only = frozenset(check_partitions(partitions)) if partitions else None
        limit = self._config.max_poll_records if max_records is None else max_records
        if self._handed.chunk:
            # Records getone() took but has not returned come first.
            self._subs.unread(self._handed.give_back())
        if self._side.subscribed:
            return await self._side.poll(timeout_ms, limit, only)
        if self._io.stepping:
            # An unsubscribe() a cancel left running: its partitions go first.
            await self._side.finish_quietly()
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() or subscribe() first")
        if only is not None:
            for tp in only:
                self._subs.state(tp)  # assigned, or IllegalStateError
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._data.clear()
            self._check_closing()
            # commit_async()'s callbacks, as a subscribed consumer's getmany runs them.
            self._side.run_callbacks()
            records = self._subs.collect(limit, only)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return records
            try:
                await within(self._data.wait(), remaining)
            except TimeoutError:
                continue

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of the named partitions only, when given),
        waiting as long as it takes."""
        if partitions:
            while True:
                polled = await self.getmany(*partitions, timeout_ms=1000, max_records=1)
                for records in polled.values():
                    return records[0]
        handed = self._handed
        record = next(handed.records, None)
        if record is not None:
            handed.last = record
            return record
        chunk = self._config.max_poll_records if self._side.subscribed else ITERATION_CHUNK
        handed.reset()  # every record of the last chunk was returned
        while True:
            polled = await self.getmany(timeout_ms=1000, max_records=chunk)
            if polled:
                return handed.take(polled)

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        if self._closed:
            raise StopAsyncIteration
        try:
            return await self.getone()
        except ClosedError:
            raise StopAsyncIteration from None

    async def _list_offsets(
        self, query: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        self._check_open()
        return await within(self._fetcher.list_offsets(query), self._timeout_s)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self._list_offsets(dict.fromkeys(check_partitions(partitions), EARLIEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self._list_offsets(dict.fromkeys(check_partitions(partitions), LATEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        query = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return offsets_and_times(await self._list_offsets(query))

    async def topics(self) -> set[str]:
        """Every topic in the cluster."""
        self._check_open()
        found = await within(self._cluster.all_topics(), self._timeout_s)
        return {name for name, meta in found.items() if meta.error is None}

    async def partitions_for_topic(self, topic: str) -> set[int] | None:
        """Partition numbers of `topic`, None when it does not exist."""
        self._check_open()
        snapshot = await within(self._cluster.refresh([topic]), self._timeout_s)
        meta = snapshot.topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return set(range(meta.partition_count))

    async def stop(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Commit (when enable_auto_commit and `autocommit`) and leave the
        group, stop fetching and release connections (see Consumer.close).
        Idempotent.

        Bounded, as Kafka's close(timeout): the group's work on this side
        (a rebalance step a cancelled getmany() left running, the final
        commit, the listener's on_partitions_revoked) gets `timeout_ms`
        (default: request_timeout_ms). What is still under way then is cut
        short: a listener coroutine is cancelled (CancelledError inside it;
        one called later is not awaited), a commit or an offset lookup
        fails; each is logged. Then the membership ends (LeaveGroup, itself
        bounded by request_timeout_ms) and the connections close. A
        listener that catches the CancelledError and carries on keeps
        stop() waiting for it, as it would asyncio.timeout()."""
        if self._closed:
            return
        if self._stopping is None:
            if timeout_ms is not None:
                if timeout_ms < 0:
                    raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
                self._side.commit_deadline = time.monotonic() + timeout_ms / 1000
            self._io.expire_in(self._timeout_s if timeout_ms is None else timeout_ms / 1000)
            # A getmany() waiting in another task: wake it (ClosedError; `async
            # for` ends) instead of leaving it to sleep out its timeout.
            self._closing = True
            self._data.set()
            self._stopping = asyncio.ensure_future(self._stop(autocommit))
        # A cancel of this call propagates at once, but the leaving goes on:
        # cut short, the member would hold its partitions until its session
        # timed out, and its listener would not hear of the revocation.
        await asyncio.shield(self._stopping)

    async def _stop(self, autocommit: bool) -> None:
        try:
            await self._side.close(autocommit=autocommit)
        finally:
            self._io.cancel_expiry()
            self._closed = True
            await self._fetcher.close()
            await self._cluster.close()

    async def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """The same as stop() (kafka-python's name)."""
        await self.stop(autocommit=autocommit, timeout_ms=timeout_ms)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
