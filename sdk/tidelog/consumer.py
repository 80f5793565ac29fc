"""`Consumer`, the blocking consumer: consumer groups or manual assignment.

A front over parts it shares with `AsyncConsumer` (`_async_consumer`): a
`Fetcher` that runs credit-paced Fetch sessions and resets positions, a
`SubscriptionState` on the calling side that decodes record batches and
tracks positions, and, in a group, a `GroupClient` (`_group_client`) that
runs the membership, with a `GroupSide` (`_consumer_group`) that applies it on
the calling side. The Consumer runs the fetcher and the membership on its
own background loop (`LoopThread`) and decodes inside poll(), in the
caller's thread, where rebalance callbacks run too (as in Kafka). poll()
waits on a `PollEvent` (tidelog._poll_wait) that the loop sets; the loop
never runs in the caller's thread (tidelog._loop_thread says why).

Ctrl-C: in the main thread, a blocking call (poll(), iteration, commit(),
close(), ...) defers SIGINT and raises KeyboardInterrupt itself at a safe
point, never inside the SDK's loop or half-way through taking records
(tidelog._sigint): the consumer stays usable, and close() still commits and
leaves the group.

In a group (needs a cluster: brokers with --etcd and a coordinator)::

    with Consumer("orders", group_id="billing", bootstrap_servers="127.0.0.1:9392",
                  enable_auto_commit=False) as consumer:
        for record in consumer:
            handle(record)
            consumer.commit()          # after processing: at-least-once

Or assign partitions and seek::

    with Consumer(bootstrap_servers="127.0.0.1:9392") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        for record in consumer:            # or consumer.poll(timeout_ms=100)
            handle(record)

Threads: a Consumer is used from one thread, but for `wakeup()` (Kafka's:
the poll waiting now, or the next one, raises WakeupError) and `close()`
(the poll waiting now raises ClosedError, iteration ends). Both wake the
poll through the data event it waits on, and iteration through
`HandedOut.interrupt()`: the per-record path takes no lock and reads no
flag; a poll checks once per wake-up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from tidelog import _sigint
from tidelog._async_consumer import AsyncConsumer
from tidelog._client_metrics import Metrics
from tidelog._connection import Cluster
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
    run_blocking,
)
from tidelog._fetcher import EARLIEST, LATEST, Fetcher
from tidelog._group_client import GroupClient
from tidelog._loop_thread import LoopHandle, client_loop
from tidelog._poll_wait import PollEvent
from tidelog._subscription import SubscriptionState
from tidelog.errors import ClosedError, IllegalStateError, TidelogTimeoutError, WakeupError
from tidelog.group import RebalanceListener
from tidelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
P = ParamSpec("P")

log = logging.getLogger("tidelog.consumer")

__all__ = ["AsyncConsumer", "CommitCallback", "Consumer", "Offsets"]

#: What a membership change (join, leave) may take beyond request_timeout_ms
#: before the caller's thread stops waiting for it (see _BlockingIo.run).
MEMBERSHIP_MARGIN_S = 5.0


def _guarded(
    method: Callable[Concatenate[Consumer, P], T],
) -> Callable[Concatenate[Consumer, P], T]:
    """A blocking method that defers Ctrl-C in the main thread and raises
    it as it returns (tidelog._sigint). poll() does the same inline (its
    hot path takes no wrapper)."""

    @functools.wraps(method)
    def call(self: Consumer, *args: P.args, **kwargs: P.kwargs) -> T:
        guarded = _sigint.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            _sigint.leave(guarded)

    return call


class _BlockingIo:
    """The Consumer's `Io` for its GroupSide: each piece of I/O blocks the
    caller's thread on the LoopThread, so GroupSide's coroutines never suspend
    (run them with `run_blocking`)."""

    def __init__(
        self,
        loop_thread: LoopHandle,
        data: PollEvent,
        timeout_s: float,
        run_io: Callable[[Coroutine[Any, Any, Any], float], Any],
        check_wakeup: Callable[[], None],
    ) -> None:
        self._loop_thread = loop_thread
        self._data = data
        self._timeout_s = timeout_s
        self._run_io = run_io
        self._check_wakeup = check_wakeup

    async def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        # A membership change is bounded here too: the caller's thread must
        # come back. A join bounds itself by request_timeout_ms and, failed,
        # ends the membership it began: the margin lets that finish rather
        # than cut it short.
        timeout = self._timeout_s + MEMBERSHIP_MARGIN_S if timeout_s is None else timeout_s
        result: T = self._run_io(coro, timeout)
        return result

    def spawn(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop_thread.loop)

    def spawn_after_step(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return self.spawn(coro)  # no step is ever left running (see step())

    def resolve(self, done: asyncio.Future[None]) -> None:
        self._loop_thread.call_soon(resolve_future, done)

    async def listener_done(self, result: Any) -> None:
        pass  # the listener ran in the caller's thread; what it returned is ignored

    def clear(self) -> None:
        self._data.clear()

    def notify(self) -> None:
        self._data.set()

    async def wait(self, timeout_s: float) -> None:
        self._data.wait(timeout_s)

    def check_wakeup(self) -> None:
        self._check_wakeup()

    async def step(self, coro: Coroutine[Any, Any, None]) -> None:
        await coro  # never suspends: nothing can cut it short between two pieces of I/O

    async def finish_step(self) -> None:
        pass


class Consumer:
    """A blocking consumer: of a group's partitions (`group_id` and topics,
    or subscribe()), or of assigned ones. Options: see
    `tidelog.config.ConsumerConfig`. Use it from one thread at a time; only
    wakeup() and close() may be called from another thread.

    A partition without a committed offset starts at auto_offset_reset,
    "earliest" by default (Kafka's clients: "latest"; see ConsumerConfig)."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        self._config = make_config(topics, bootstrap_servers, options)
        # Counted open until close() (or a failed construction): the last
        # to close puts SIGINT's default handler back (tidelog._sigint).
        _sigint.opened()
        self._sigint_open = True
        try:
            self._loop_thread = client_loop(
                f"tidelog-consumer-{self._config.client_id}", self._config.shared_loop_thread
            )
        except BaseException:
            self._release_sigint()
            raise
        try:
            self._inbox: deque[tuple] = deque()
            self._data = PollEvent()
            self._cluster = Cluster(self._config)
            self._fetcher = Fetcher(self._cluster, self._config, self._inbox, self._data.set)
            self._subs = SubscriptionState(self._config, self._inbox, self._command)
            self._subs.metrics = self._fetcher.metrics  # one set of counters
            # What iteration returned, so that commit() commits exactly that.
            self._handed = HandedOut()
            self._timeout_s = self._config.request_timeout_ms / 1000
            self._closed = False
            # wakeup() called and not raised yet; close() begun (both set
            # from any thread, read by the polling one: see _check_wakeup).
            self._woken = False
            self._closing = False
            # Held by a poll: a close() from another thread waits for the
            # poll it woke to let go before leaving the group under it.
            self._polling = threading.RLock()
            # Inside a poll (a rebalance listener's commit() or position()
            # leaves a wakeup to the poll: raising there would fail the
            # rebalance step).
            self._in_poll = False
            # In commit() or committed() outside a poll, whose I/O wakeup()
            # cancels; the loop's task doing that I/O (see _run_io).
            self._wakeable_io = False
            self._io_task: asyncio.Task[Any] | None = None
            group = (
                None
                if self._config.group_id is None
                else GroupClient(self._cluster, self._config, self._data.set)
            )
            io = _BlockingIo(
                self._loop_thread, self._data, self._timeout_s, self._run_io, self._check_wakeup
            )
            self._side = GroupSide(self._subs, self._config, group, self._handed, io, "Consumer")
        except BaseException:
            # The loop thread may be shared: give back this client's use of it.
            self._loop_thread.stop()
            self._release_sigint()
            raise
        if topics:
            try:
                self.subscribe(topics)
            except BaseException:
                self.close()
                raise

    def _command(self, name: str, args: tuple[Any, ...]) -> None:
        self._loop_thread.call_soon(getattr(self._fetcher, name), *args)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is closed")

    def wakeup(self) -> None:
        """Interrupt this consumer from any thread (Kafka's wakeup(), the
        one method that is thread-safe): the poll() waiting now raises
        WakeupError, or the next one when none is; so do poll_arrow(),
        iteration (at its next record: records it had fetched ahead are
        kept for the next read) and, outside a poll, commit(), committed()
        and position(), waiting or next (a commit interrupted may still
        land). Raised once per call (calls before it is raised count as
        one). The consumer stays usable: positions are unchanged, and a
        group member keeps its partitions."""
        self._woken = True
        self._handed.interrupt()
        self._data.set()
        task = self._io_task  # a commit() waiting: cancel its I/O
        if task is not None:
            self._loop_thread.call_soon(task.cancel)

    def _run_io(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """The group's I/O for the caller's thread (_BlockingIo.run): run on
        the loop thread and waited for. In commit() and committed() outside a
        poll, wakeup() cancels it (WakeupError), as Kafka's commitSync in
        progress raises WakeupException: a commit already sent may land."""
        if not self._wakeable_io:
            return self._loop_thread.run(coro, timeout=timeout_s)
        try:
            return self._loop_thread.run(self._cancelled_by_wakeup(coro), timeout=timeout_s)
        except concurrent.futures.CancelledError:
            if not self._woken:
                raise
            self._woken = False
            raise WakeupError("Consumer.wakeup() was called") from None

    async def _cancelled_by_wakeup(self, coro: Coroutine[Any, Any, T]) -> T:
        self._io_task = asyncio.current_task()
        try:
            # Set before the check: a wakeup() that did not see the task yet
            # is seen here (both run under the GIL, in this order).
            if self._woken:
                coro.close()
                raise asyncio.CancelledError
            return await coro
        finally:
            self._io_task = None

    def _run_wakeable(self, coro: Coroutine[Any, Any, T]) -> T:
        """run_blocking for commit() and committed(): a wakeup() pending, or
        one that comes while they wait, raises WakeupError, but inside a poll
        (a rebalance listener's call: the poll raises it instead)."""
        if self._in_poll:
            return run_blocking(coro)
        if self._woken:
            coro.close()
            self._woken = False
            raise WakeupError("Consumer.wakeup() was called")
        outer, self._wakeable_io = self._wakeable_io, True
        try:
            return run_blocking(coro)
        finally:
            self._wakeable_io = outer

    def _check_wakeup(self) -> None:
        """In a poll, once per wake-up: ClosedError after a close() from
        another thread, KeyboardInterrupt after a Ctrl-C (tidelog._sigint),
        WakeupError after wakeup()."""
        if self._closing:
            raise ClosedError("the consumer was closed while polling")
        _sigint.check()
        if self._woken:
            # Not atomic with wakeup()'s store: a wakeup() that races this
            # one is folded into it, as two wakeup() calls before a poll are.
            self._woken = False
            raise WakeupError("Consumer.wakeup() was called")

    def _check_wakeup_outside_poll(self) -> None:
        _sigint.check()
        if self._woken and not self._in_poll:
            self._woken = False
            raise WakeupError("Consumer.wakeup() was called")

    # ------------------------------------------------------------ groups

    @_guarded
    def subscribe(
        self,
        topics: Sequence[str] | str = (),
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Join the group and consume the partitions it assigns to this
        member, of `topics` or of every topic matching `pattern` (an RE2
        regular expression, at most 1000 characters, matched against whole
        names in linear time: no backreferences or lookarounds). `listener` is told,
        inside poll(), of partitions revoked (commit their offsets there),
        assigned and lost. Subscribing again replaces the subscription."""
        self._check_open()
        run_blocking(self._side.subscribe(topics, pattern, listener))

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
        """The subscribed topics (or the pattern), empty when not subscribed."""
        return self._side.subscription()

    @_guarded
    def unsubscribe(self) -> None:
        """Leave the group (its partitions are revoked first)."""
        self._check_open()
        if self._side.subscribed:
            run_blocking(self._side.leave(leave=True))

    @_guarded
    def commit(self, offsets: Offsets | None = None) -> None:
        """Commit and wait: `offsets` (partition -> next offset to consume),
        or the position of every owned partition (what poll() and iteration
        have returned). Raises the typed error (ILLEGAL_GENERATION or
        UNKNOWN_MEMBER_ID when this member was fenced: it no longer owns
        those partitions)."""
        self._check_open()
        self._run_wakeable(self._side.commit(offsets))

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> concurrent.futures.Future[None]:
        """Commit without waiting. `callback(offsets, error)` runs in a later
        poll(), commit() or close(), in the caller's thread."""
        self._check_open()
        future: concurrent.futures.Future[None] = self._side.commit_async(offsets, callback)
        return future

    @_guarded
    def committed(self, partition: TopicPartition, metadata: bool = False) -> Any:
        """The group's committed offset of `partition` (an OffsetAndMetadata
        with `metadata=True`); None when nothing is committed."""
        self._check_open()
        return self._run_wakeable(self._side.committed(partition, metadata))

    @_guarded
    def seek_to_committed(self, *partitions: TopicPartition) -> dict[TopicPartition, int | None]:
        """Move to the group's committed offsets (all assigned partitions
        when none given); a partition with none committed is reset by
        auto_offset_reset. Works in a group and with assign() plus a
        group_id (no membership needed). Returns partition -> the committed
        offset, or None."""
        self._check_open()
        tps = check_partitions(partitions) or sorted(self._subs.assignment())
        for tp in tps:
            self._subs.state(tp)  # assigned, or IllegalStateError
        found = run_blocking(self._side.committed_offsets(tps))
        self._handed.reset()
        for tp in tps:
            if tp in found:
                self._subs.seek(tp, found[tp].offset)
        self._subs.reset([tp for tp in tps if tp not in found], self._config.auto_offset_reset)
        return {tp: found[tp].offset if tp in found else None for tp in tps}

    # ------------------------------------------------------------ assignment

    @_guarded
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment).
        New partitions start at auto_offset_reset until seek() says otherwise.
        Raises UnknownTopicOrPartitionError for a partition that metadata
        says does not exist (a topic not known yet is waited for)."""
        self._check_open()
        if self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unsubscribe first")
        tps = check_partitions(partitions)
        self._loop_thread.run(self._cluster.check_partitions(tps), timeout=self._timeout_s)
        self._side.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return self._subs.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make `offset` the next record poll() returns for `partition`."""
        self._check_open()
        self._handed.reset()
        self._subs.seek(TopicPartition(*partition), offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the earliest offset (all assigned partitions when none given)."""
        self._seek_by(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the offset the next record will get."""
        self._seek_by(partitions, "latest")

    def _seek_by(self, partitions: Sequence[TopicPartition], strategy: str) -> None:
        self._check_open()
        self._handed.reset()
        self._subs.reset(check_partitions(partitions) or sorted(self._subs.assignment()), strategy)

    @_guarded
    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record poll() returns for `partition`,
        waiting (up to `timeout`, default request_timeout_ms) for a reset.
        Raises the error that keeps this partition's position unknown (such
        as NoOffsetForPartitionError), until a seek; another partition's
        errors are left to poll()."""
        self._check_open()
        tp = TopicPartition(*partition)
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        while True:
            self._data.clear()
            self._check_wakeup_outside_poll()
            position = self._subs.position_now(tp)
            if position is not None:
                return position
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidelogTimeoutError(f"position of {tp.topic}-{tp.partition} not known")
            self._data.wait(remaining)

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as of the last fetched data."""
        return self._subs.highwater(TopicPartition(*partition))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these assigned partitions; poll() returns none of
        their records until resume(). Their positions hold. A rebalance that
        revokes a partition forgets its pause (as in Kafka)."""
        self._check_open()
        self._subs.pause(check_partitions(partitions))

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch paused partitions again, from where they stopped."""
        self._check_open()
        self._subs.resume(check_partitions(partitions))

    def paused(self) -> set[TopicPartition]:
        """The partitions paused by pause()."""
        return self._subs.paused()

    # ------------------------------------------------------------ polling

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched for the assigned partitions, by partition, waiting
        up to `timeout_ms` for some. Returns {} when none came in time.
        Raises WakeupError after wakeup(), ClosedError when close() is
        called meanwhile (from another thread); in a group, the error of a
        join the coordinator refused (a full group: InvalidRequestError),
        and the next poll() joins again."""
        guarded = _sigint.enter()
        records: dict[TopicPartition, list[ConsumerRecord]] = {}
        try:
            with self._polling:
                outer, self._in_poll = self._in_poll, True
                try:
                    records = self._poll(timeout_ms, max_records)
                finally:
                    self._in_poll = outer
        finally:
            try:
                _sigint.leave(guarded)
            except KeyboardInterrupt:
                # A Ctrl-C while these were taken (up to leave() itself, whose
                # own entry may take it): they come again from the next poll.
                if records:
                    self._subs.unread(records)
                raise
        return records

    def _poll(
        self, timeout_ms: float, max_records: int | None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        self._check_open()
        limit = self._config.max_poll_records if max_records is None else max_records
        if self._handed.chunk:
            # Records iteration took but has not returned come first.
            self._subs.unread(self._handed.give_back())
        if self._side.subscribed:
            return run_blocking(self._side.poll(timeout_ms, limit))
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() or subscribe() first")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._data.clear()
            self._check_wakeup()
            # commit_async()'s callbacks, as a subscribed consumer's poll runs them.
            self._side.run_callbacks()
            records = self._subs.collect(limit)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return records
            self._data.wait(remaining)

    def poll_arrow(
        self, timeout_ms: float = 0, include_headers: bool = False
    ) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """poll() with the records as pyarrow RecordBatches: one per fetch
        answer (up to max_partition_fetch_bytes of stored batches), per
        partition in offset order, built from the stored columnar bodies
        with no Python object per record (`tidelog.columnar`; needs the
        `arrow` extra). Columns: key, value, topic, partition, offset,
        timestamp (UTC, microseconds), timestampType, and headers when
        `include_headers` (null for a record without). Positions, commits,
        pause/resume and group membership behave as with poll(); there is no
        max_records: a fetch answer is the unit. Returns {} when nothing came
        within `timeout_ms`. `pyarrow.Table.from_batches(batches)` joins a
        partition's batches without copying. Woken and closed as poll()."""
        guarded = _sigint.enter()
        batches: dict[TopicPartition, list[pa.RecordBatch]] = {}
        try:
            with self._polling:
                outer, self._in_poll = self._in_poll, True
                try:
                    batches = self._poll_arrow(timeout_ms, include_headers)
                finally:
                    self._in_poll = outer
        finally:
            try:
                _sigint.leave(guarded)
            except KeyboardInterrupt:
                # A Ctrl-C while these were taken (up to leave() itself): the
                # next poll fetches them again (a batch cannot be put back).
                if batches:
                    self._handed.reset()
                    for tp, taken in batches.items():
                        self._subs.seek(tp, taken[0].column("offset")[0].as_py())
                raise
        return batches

    def _poll_arrow(
        self, timeout_ms: float, include_headers: bool
    ) -> dict[TopicPartition, list[pa.RecordBatch]]:
        from tidelog._arrow_poll import collect_arrow  # pyarrow only when asked for

        self._check_open()
        if self._handed.chunk:
            self._subs.unread(self._handed.give_back())

        def collect() -> dict[TopicPartition, list[pa.RecordBatch]]:
            return collect_arrow(self._subs, include_headers)

        if self._side.subscribed:
            return run_blocking(self._side.poll(timeout_ms, 0, collect=collect))
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() or subscribe() first")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._data.clear()
            self._check_wakeup()
            self._side.run_callbacks()  # commit_async()'s, as in poll()
            batches = collect()
            if batches:
                return batches
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return batches
            self._data.wait(remaining)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        handed = self._handed
        record = next(handed.records, None)
        if record is not None:
            handed.last = record
            return record
        return self._next_slow()

    def _next_slow(self) -> ConsumerRecord:
        timeout_ms = self._config.consumer_timeout_ms
        # kafka-python users write float("inf") for "forever"; so does None.
        forever = timeout_ms is None or math.isinf(timeout_ms)
        deadline = None if forever else time.monotonic() + timeout_ms / 1000  # type: ignore[operator]
        while True:
            if self._closed or self._closing:
                raise StopIteration
            wait_ms = 1000.0 if deadline is None else max((deadline - time.monotonic()) * 1000, 0)
            chunk = self._config.max_poll_records if self._side.subscribed else ITERATION_CHUNK
            # No reset of the chunk here: a wakeup() or close() may have sent
            # iteration here before its end, and poll() gives back what was
            # not returned (nothing when all was).
            try:
                polled = self.poll(timeout_ms=wait_ms, max_records=chunk)
            except ClosedError:
                raise StopIteration from None  # closed from another thread meanwhile
            if polled:
                return self._handed.take(polled)
            if deadline is not None and time.monotonic() >= deadline:
                raise StopIteration

    # ------------------------------------------------------------ offsets

    @_guarded
    def _list_offsets(
        self, query: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        self._check_open()
        return self._loop_thread.run(self._fetcher.list_offsets(query), timeout=self._timeout_s)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest offset still in each partition."""
        found = self._list_offsets(dict.fromkeys(check_partitions(partitions), EARLIEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset the next record of each partition will get."""
        found = self._list_offsets(dict.fromkeys(check_partitions(partitions), LATEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The first offset at or after each time (ms); None when there is none."""
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        query = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return offsets_and_times(self._list_offsets(query))

    @_guarded
    def topics(self) -> set[str]:
        """Every topic in the cluster (that this client may see)."""
        self._check_open()
        found = self._loop_thread.run(self._cluster.all_topics(), timeout=self._timeout_s)
        return {name for name, meta in found.items() if meta.error is None}

    @_guarded
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """Partition numbers of `topic`, None when it does not exist."""
        self._check_open()
        snapshot = self._loop_thread.run(self._cluster.refresh([topic]), timeout=self._timeout_s)
        meta = snapshot.topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return set(range(meta.partition_count))

    # ------------------------------------------------------------ lifecycle

    def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Commit (when enable_auto_commit and `autocommit`) and leave the
        group, stop fetching and release connections. `timeout_ms` bounds
        the final commit (default request_timeout_ms): a commit not done by
        then is logged and dropped. Leaving the group is bounded by
        request_timeout_ms. Then the callbacks of commit_async() calls that
        have not run yet run here, with each commit's outcome (ClosedError
        for one dropped). Idempotent."""
        if self._closed:
            return
        guarded = _sigint.enter()
        try:
            self._close_guarded(autocommit, timeout_ms)
        finally:
            try:
                _sigint.leave(guarded)
            finally:
                if self._closed:
                    self._release_sigint()

    def _release_sigint(self) -> None:
        if self._sigint_open:
            self._sigint_open = False
            _sigint.closed()

    def _close_guarded(self, autocommit: bool, timeout_ms: float | None) -> None:
        if timeout_ms is not None:
            if timeout_ms < 0:
                raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
            self._side.commit_deadline = time.monotonic() + timeout_ms / 1000
        # Called from another thread than the polling one: wake its poll
        # (which raises ClosedError; iteration ends) and wait until it let go
        # (a wait of at most a second, or a group step bounded by
        # request_timeout_ms) before leaving the group under it.
        self._closing = True
        self._handed.interrupt()
        self._data.set()
        let_go = self._polling.acquire(timeout=self._timeout_s)
        if not let_go:
            log.warning("closing while a poll still runs in another thread")
        try:
            run_blocking(self._side.close(autocommit=autocommit))
        finally:
            self._closed = True
            if let_go:
                self._polling.release()
            try:
                self._loop_thread.run(self._close(), timeout=10)
            finally:
                self._loop_thread.stop()

    async def _close(self) -> None:
        await self._fetcher.close()
        await self._cluster.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
