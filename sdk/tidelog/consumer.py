"""`Consumer` (blocking) and `AsyncConsumer` (asyncio): consumer groups or manual assignment.

Both are fronts over the same parts: a `Fetcher` on an event loop that runs
credit-paced Fetch sessions and resets positions, a `SubscriptionState`
on the calling side that decodes record batches and tracks positions, and,
in a group, a `GroupClient` (`_group_client`) that runs the membership. The
synchronous Consumer runs the fetcher and the membership on its own
background loop (`LoopThread`) and decodes inside poll(), in the caller's
thread, where rebalance callbacks run too (as in Kafka).

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

from tidelog._connection import Cluster, check_known_partitions
from tidelog._fetcher import EARLIEST, LATEST, Fetcher
from tidelog._group_client import ASSIGNED, LOST, REVOKED, GroupClient, GroupEvent
from tidelog._loop_thread import LoopThread
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    ClosedError,
    IllegalStateError,
    TidelogError,
    TidelogTimeoutError,
)
from tidelog.group import OffsetAndMetadata, RebalanceListener
from tidelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

log = logging.getLogger("tidelog.consumer")

#: What commit() accepts: partition -> next offset to consume (or with metadata).
Offsets = Mapping[TopicPartition, int | OffsetAndMetadata]
#: commit_async's callback: (the offsets, None or the error).
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], Any]

__all__ = ["AsyncConsumer", "Consumer"]

#: Records one internal poll takes for iteration: large, so that the
#: per-poll cost is spread over many records.
_ITERATION_CHUNK = 10_000


def _make_config(
    topics: tuple[str, ...],
    bootstrap_servers: str | Sequence[str] | None,
    options: dict[str, Any],
) -> ConsumerConfig:
    config = ConsumerConfig(bootstrap_servers=bootstrap_servers, **options)
    if topics and config.group_id is None:
        raise IllegalStateError(
            f"subscribing to {', '.join(topics)} needs a group_id; without a group, "
            "create the consumer without topics and call assign()"
        )
    return config


def _normalize_offsets(offsets: Offsets) -> dict[TopicPartition, OffsetAndMetadata]:
    out = {}
    for tp, value in offsets.items():
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(int(value))
        if om.offset < 0:
            raise ValueError(f"offset for {tp} must be >= 0, got {om.offset}")
        out[TopicPartition(*tp)] = om
    return out


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _GroupSide:
    """What both consumers do on the calling side of a group, without I/O:
    which partitions they own, which positions to commit, calling the user's
    listener. Not thread-safe (the calling side only)."""

    def __init__(self, subs: SubscriptionState, config: ConsumerConfig) -> None:
        self.subs = subs
        self.config = config
        self.listener: RebalanceListener | None = None
        self.subscribed = False
        self.next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        #: Positions committed last, so that auto-commit skips idle partitions.
        self.last_committed: dict[TopicPartition, int] = {}
        #: Finished commit_async calls whose callbacks are still to run.
        self.completed: deque[tuple[CommitCallback | None, dict, BaseException | None]] = deque()

    def positions(
        self,
        partitions: Iterable[TopicPartition],
        chunk: dict[TopicPartition, list[ConsumerRecord]] | None = None,
        last: ConsumerRecord | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Next offsets to consume of `partitions`. `chunk`/`last`: records
        handed to iteration but not all returned yet (iteration returns
        them partition by partition in `chunk` order)."""
        owned = self.subs.assignment()
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp in partitions:
            if tp in owned:
                position = self.subs.position(tp)
                if position is not None:
                    out[tp] = OffsetAndMetadata(position)
        if chunk:
            # Partitions before `last`'s were fully returned (positions hold);
            # `last`'s is returned up to it; the ones after not at all.
            reached = last is None
            for tp, records in chunk.items():
                if tp not in out:
                    continue
                if not reached and last is not None and tp == (last.topic, last.partition):
                    out[tp] = OffsetAndMetadata(last.offset + 1)
                    reached = True
                elif reached:
                    out[tp] = OffsetAndMetadata(records[0].offset)
        return out

    def due_auto_commit(self) -> bool:
        if not (self.config.enable_auto_commit and self.subscribed):
            return False
        now = time.monotonic()
        if now < self.next_auto_commit:
            return False
        self.next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        return True

    def changed(
        self, offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: om for tp, om in offsets.items() if self.last_committed.get(tp) != om.offset}

    def committed_ok(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            self.last_committed[tp] = om.offset

    def call_listener(self, method: str, partitions: frozenset[TopicPartition]) -> Any:
        listener = self.listener
        if listener is None:
            return None
        handler = getattr(listener, method, None)
        if handler is None and method == "on_partitions_lost":
            handler = listener.on_partitions_revoked
        if handler is None:
            return None
        return handler(set(partitions))

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

    def run_callbacks(self) -> None:
        while self.completed:
            callback, offsets, error = self.completed.popleft()
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


def _check_partitions(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    out = []
    for tp in partitions:
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise TypeError(f"expected a TopicPartition, got {tp!r}")
        out.append(TopicPartition(*tp))
    return out


def _offsets_and_times(
    found: dict[TopicPartition, tuple[int, int]],
) -> dict[TopicPartition, OffsetAndTimestamp | None]:
    return {
        tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
        for tp, (offset, timestamp) in found.items()
    }


class Consumer:
    """A blocking consumer: of a group's partitions (`group_id` and topics,
    or subscribe()), or of assigned ones. Options: see
    `tidelog.config.ConsumerConfig`. Use it from one thread at a time."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        self._config = _make_config(topics, bootstrap_servers, options)
        self._loop_thread = LoopThread(f"tidelog-consumer-{self._config.client_id}")
        self._inbox: deque[tuple] = deque()
        self._data = threading.Event()
        self._cluster = Cluster(self._config)
        self._fetcher = Fetcher(self._cluster, self._config, self._inbox, self._data.set)
        self._subs = SubscriptionState(self._config, self._inbox, self._command)
        self._iterator: Iterator[ConsumerRecord] = iter(())
        # Iteration in a group: the records being handed out and the last one
        # returned, so that commit() commits exactly what was returned.
        self._chunk: dict[TopicPartition, list[ConsumerRecord]] | None = None
        self._last: ConsumerRecord | None = None
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._closed = False
        self._side = _GroupSide(self._subs, self._config)
        self._group = (
            None
            if self._config.group_id is None
            else GroupClient(self._cluster, self._config, self._data.set)
        )
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

    def _reset_iteration(self) -> None:
        self._iterator = iter(())
        self._chunk = None
        self._last = None

    # ------------------------------------------------------------ groups

    def _require_group(self, what: str) -> GroupClient:
        if self._group is None:
            raise IllegalStateError(f"{what} needs a group_id (Consumer(group_id=...))")
        return self._group

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
        group = self._require_group("subscribe()")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise ValueError("subscribe to a list of topics or to a pattern (one of them)")
        if self._subs.assignment() and not self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unassign first")
        if self._side.subscribed:
            self._leave_group(leave=True)
        self._side.listener = listener
        self._loop_thread.run(group.join(topics, pattern or ""), timeout=self._timeout_s)
        self._side.subscribed = True

    def subscription(self) -> set[str]:
        """The subscribed topics (or the pattern), empty when not subscribed."""
        if self._group is None or not self._side.subscribed:
            return set()
        return set(self._group.topics) or {self._group.pattern}

    def unsubscribe(self) -> None:
        """Leave the group (its partitions are revoked first)."""
        self._check_open()
        if self._side.subscribed:
            self._leave_group(leave=True)

    def _leave_group(self, leave: bool | None) -> None:
        """Commit (auto-commit), revoke what is owned, end the membership."""
        group = self._group
        assert group is not None
        self._side.subscribed = False
        owned = frozenset(self._subs.assignment())
        try:
            if owned:
                if self._config.enable_auto_commit:
                    self._commit_quietly(owned)
                dynamic = not self._config.group_instance_id
                if dynamic or leave:
                    self._side.call_listener("on_partitions_revoked", owned)
        finally:
            self._side.drop(owned)
            self._reset_iteration()
            self._loop_thread.run(group.close(leave), timeout=self._timeout_s)
            group.events.clear()

    def _commit_quietly(self, partitions: Iterable[TopicPartition]) -> None:
        offsets = self._side.changed(self._positions(partitions))
        if not offsets:
            return
        try:
            self._commit_now(offsets)
        except TidelogError as exc:
            log.warning("committing %d offsets failed: %s", len(offsets), exc)

    def _positions(self, partitions: Iterable[TopicPartition]) -> dict:
        return self._side.positions(partitions, self._chunk, self._last)

    def _commit_now(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        group = self._require_group("commit()")
        self._loop_thread.run(group.commit(offsets), timeout=self._timeout_s)
        self._side.committed_ok(offsets)

    def commit(self, offsets: Offsets | None = None) -> None:
        """Commit and wait: `offsets` (partition -> next offset to consume),
        or the position of every owned partition (what poll() and iteration
        have returned). Raises the typed error (ILLEGAL_GENERATION or
        UNKNOWN_MEMBER_ID when this member was fenced: it no longer owns
        those partitions)."""
        self._check_open()
        self._require_group("commit()")
        self._side.run_callbacks()
        normalized = (
            self._positions(self._subs.assignment())
            if offsets is None
            else _normalize_offsets(offsets)
        )
        if normalized:
            self._commit_now(normalized)

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> concurrent.futures.Future[None]:
        """Commit without waiting. `callback(offsets, error)` runs in a later
        poll(), commit() or close(), in the caller's thread."""
        self._check_open()
        group = self._require_group("commit_async()")
        normalized = (
            self._positions(self._subs.assignment())
            if offsets is None
            else _normalize_offsets(offsets)
        )
        future = asyncio.run_coroutine_threadsafe(group.commit(normalized), self._loop_thread.loop)
        side = self._side

        def done(f: concurrent.futures.Future[None]) -> None:
            error = None if f.cancelled() else f.exception()
            side.completed.append((callback, normalized, error))
            self._data.set()

        future.add_done_callback(done)
        return future

    def committed(self, partition: TopicPartition, metadata: bool = False) -> Any:
        """The group's committed offset of `partition` (an OffsetAndMetadata
        with `metadata=True`); None when nothing is committed."""
        self._check_open()
        group = self._require_group("committed()")
        tp = TopicPartition(*partition)
        got = self._loop_thread.run(group.committed([tp]), timeout=self._timeout_s)
        found = got.get(tp)
        if found is None:
            return None
        return found if metadata else found.offset

    def _apply_group_events(self) -> None:
        """Apply what the membership reported (see _group_client), here in the
        caller's thread: commit and call the listener on revocation, then let
        the membership acknowledge."""
        group = self._group
        assert group is not None
        while group.events:
            event = group.events.popleft()
            try:
                self._apply_group_event(group, event)
            finally:
                if event.done is not None:
                    self._loop_thread.call_soon(_resolve, event.done)

    def _apply_group_event(self, group: GroupClient, event: GroupEvent) -> None:
        owned = event.partitions & self._subs.assignment()
        if event.kind == REVOKED:
            if owned and self._config.enable_auto_commit:
                self._commit_quietly(owned)
            try:
                if owned:
                    self._side.call_listener("on_partitions_revoked", owned)
            finally:
                self._side.drop(owned)
        elif event.kind == LOST:
            try:
                if owned:
                    self._side.call_listener("on_partitions_lost", owned)
            finally:
                self._side.drop(owned)
        elif event.kind == ASSIGNED:
            wanted = sorted(event.partitions)
            committed = self._loop_thread.run(group.committed(wanted), timeout=self._timeout_s)
            self._side.add(event.partitions, committed)
            self._side.call_listener("on_partitions_assigned", event.partitions)

    def _poll_group(
        self, timeout_ms: float, limit: int
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        group = self._group
        assert group is not None
        group.in_poll = True
        try:
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                self._data.clear()
                self._side.run_callbacks()
                self._apply_group_events()
                if group.left_for_poll_timeout and not group.events:
                    log.info("rejoining group %r", group.group_id)
                    self._loop_thread.run(
                        group.join(group.topics, group.pattern), timeout=self._timeout_s
                    )
                if self._side.due_auto_commit():
                    offsets = self._side.changed(self._positions(self._subs.assignment()))
                    if offsets:
                        self.commit_async(offsets)
                records = self._subs.collect(limit) if self._subs.assignment() else {}
                if records:
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return records
                self._data.wait(min(remaining, 1.0))
        finally:
            group.last_poll = time.monotonic()
            group.in_poll = False

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment).
        New partitions start at auto_offset_reset until seek() says otherwise.
        Raises UnknownTopicOrPartitionError for a partition that metadata
        says does not exist (a topic not known yet is waited for)."""
        self._check_open()
        if self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unsubscribe first")
        tps = _check_partitions(partitions)
        self._loop_thread.run(self._cluster.check_partitions(tps), timeout=self._timeout_s)
        self._reset_iteration()
        self._subs.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return self._subs.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make `offset` the next record poll() returns for `partition`."""
        self._check_open()
        self._reset_iteration()
        self._subs.seek(TopicPartition(*partition), offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the earliest offset (all assigned partitions when none given)."""
        self._seek_by(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the offset the next record will get."""
        self._seek_by(partitions, "latest")

    def _seek_by(self, partitions: Sequence[TopicPartition], strategy: str) -> None:
        self._check_open()
        self._reset_iteration()
        for tp in _check_partitions(partitions) or sorted(self._subs.assignment()):
            self._subs.reset(tp, strategy)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record poll() returns for `partition`,
        waiting (up to `timeout`, default request_timeout_ms) for a reset."""
        self._check_open()
        tp = TopicPartition(*partition)
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        while True:
            self._data.clear()
            position = self._subs.position(tp)
            if position is None:
                self._subs.absorb()
                position = self._subs.position(tp)
            if position is not None:
                return position
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidelogTimeoutError(f"position of {tp.topic}-{tp.partition} not known")
            self._data.wait(remaining)

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as of the last fetched data."""
        return self._subs.highwater(TopicPartition(*partition))

    # ------------------------------------------------------------ polling

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched for the assigned partitions, by partition, waiting
        up to `timeout_ms` for some. Returns {} when none came in time."""
        self._check_open()
        limit = self._config.max_poll_records if max_records is None else max_records
        if self._side.subscribed:
            return self._poll_group(timeout_ms, limit)
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() or subscribe() first")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._data.clear()
            records = self._subs.collect(limit)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return records
            self._data.wait(remaining)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        record = next(self._iterator, None)
        if record is not None:
            self._last = record
            return record
        return self._next_slow()

    def _next_slow(self) -> ConsumerRecord:
        timeout_ms = self._config.consumer_timeout_ms
        # kafka-python users write float("inf") for "forever"; so does None.
        forever = timeout_ms is None or math.isinf(timeout_ms)
        deadline = None if forever else time.monotonic() + timeout_ms / 1000  # type: ignore[operator]
        while True:
            if self._closed:
                raise StopIteration
            wait_ms = 1000.0 if deadline is None else max((deadline - time.monotonic()) * 1000, 0)
            # In a group, a poll per max_poll_records keeps max_poll_interval_ms
            # meaningful and rebalances prompt; alone, big chunks are cheaper.
            chunk = self._config.max_poll_records if self._side.subscribed else _ITERATION_CHUNK
            self._chunk = self._last = None
            polled = self.poll(timeout_ms=wait_ms, max_records=chunk)
            if polled:
                self._iterator = chain.from_iterable(polled.values())
                if self._side.subscribed:
                    self._chunk = polled
                record = next(self._iterator)
                self._last = record
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise StopIteration

    # ------------------------------------------------------------ offsets

    def _list_offsets(
        self, query: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        self._check_open()
        return self._loop_thread.run(self._fetcher.list_offsets(query), timeout=self._timeout_s)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest offset still in each partition."""
        found = self._list_offsets(dict.fromkeys(_check_partitions(partitions), EARLIEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset the next record of each partition will get."""
        found = self._list_offsets(dict.fromkeys(_check_partitions(partitions), LATEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """The first offset at or after each time (ms); None when there is none."""
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        query = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return _offsets_and_times(self._list_offsets(query))

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """Partition numbers of `topic`, None when it does not exist."""
        self._check_open()
        snapshot = self._loop_thread.run(self._cluster.refresh([topic]), timeout=self._timeout_s)
        meta = snapshot.topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return set(range(meta.partition_count))

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop fetching and release connections. Idempotent."""
        if self._closed:
            return
        try:
            if self._side.subscribed:
                self._side.run_callbacks()
                self._leave_group(leave=None)
        except TidelogError as exc:
            log.warning("leaving the group cleanly failed: %s", exc)
        finally:
            self._closed = True
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
        self._config = _make_config(topics, bootstrap_servers, options)
        self._inbox: deque[tuple] = deque()
        self._data = asyncio.Event()
        self._cluster = Cluster(self._config)
        self._fetcher = Fetcher(self._cluster, self._config, self._inbox, self._data.set)
        self._subs = SubscriptionState(self._config, self._inbox, self._command)
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._started = False
        self._closed = False
        self._buffer: Iterator[ConsumerRecord] = iter(())
        self._topics = topics
        self._side = _GroupSide(self._subs, self._config)
        self._group = (
            None
            if self._config.group_id is None
            else GroupClient(self._cluster, self._config, self._data.set)
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

    # ------------------------------------------------------------ groups

    def _require_group(self, what: str) -> GroupClient:
        if self._group is None:
            raise IllegalStateError(f"{what} needs a group_id (AsyncConsumer(group_id=...))")
        return self._group

    async def subscribe(
        self,
        topics: Sequence[str] | str = (),
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Join the group (see Consumer.subscribe)."""
        self._check_open()
        group = self._require_group("subscribe()")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise ValueError("subscribe to a list of topics or to a pattern (one of them)")
        if self._subs.assignment() and not self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unassign first")
        if self._side.subscribed:
            await self._leave_group(leave=True)
        self._side.listener = listener
        await group.join(topics, pattern or "")
        self._side.subscribed = True

    def subscription(self) -> set[str]:
        if self._group is None or not self._side.subscribed:
            return set()
        return set(self._group.topics) or {self._group.pattern}

    async def unsubscribe(self) -> None:
        self._check_open()
        if self._side.subscribed:
            await self._leave_group(leave=True)

    async def _call_listener(self, method: str, partitions: frozenset[TopicPartition]) -> None:
        result = self._side.call_listener(method, partitions)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result

    async def _leave_group(self, leave: bool | None) -> None:
        group = self._group
        assert group is not None
        self._side.subscribed = False
        owned = frozenset(self._subs.assignment())
        try:
            if owned:
                if self._config.enable_auto_commit:
                    await self._commit_quietly(owned)
                if leave or not self._config.group_instance_id:
                    await self._call_listener("on_partitions_revoked", owned)
        finally:
            self._side.drop(owned)
            self._buffer = iter(())
            await group.close(leave)
            group.events.clear()

    async def _commit_quietly(self, partitions: Iterable[TopicPartition]) -> None:
        offsets = self._side.changed(self._side.positions(partitions))
        if not offsets:
            return
        try:
            await self._commit_now(offsets)
        except TidelogError as exc:
            log.warning("committing %d offsets failed: %s", len(offsets), exc)

    async def _commit_now(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        group = self._require_group("commit()")
        await asyncio.wait_for(group.commit(offsets), self._timeout_s)
        self._side.committed_ok(offsets)

    async def commit(self, offsets: Offsets | None = None) -> None:
        """Commit and wait (see Consumer.commit). Records taken from getmany()
        count as consumed; with getone()/iteration, so do the records of the
        last internal batch."""
        self._check_open()
        self._require_group("commit()")
        self._side.run_callbacks()
        normalized = (
            self._side.positions(self._subs.assignment())
            if offsets is None
            else _normalize_offsets(offsets)
        )
        if normalized:
            await self._commit_now(normalized)

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> asyncio.Future[None]:
        """Commit in the background; `callback(offsets, error)` runs in a later
        getmany(), commit() or stop()."""
        self._check_open()
        group = self._require_group("commit_async()")
        normalized = (
            self._side.positions(self._subs.assignment())
            if offsets is None
            else _normalize_offsets(offsets)
        )
        task = asyncio.ensure_future(group.commit(normalized))
        side = self._side

        def done(f: asyncio.Future[None]) -> None:
            error = None if f.cancelled() else f.exception()
            side.completed.append((callback, normalized, error))
            self._data.set()

        task.add_done_callback(done)
        return task

    async def committed(self, partition: TopicPartition, metadata: bool = False) -> Any:
        """The group's committed offset of `partition`; None when nothing is."""
        self._check_open()
        group = self._require_group("committed()")
        tp = TopicPartition(*partition)
        found = (await asyncio.wait_for(group.committed([tp]), self._timeout_s)).get(tp)
        if found is None:
            return None
        return found if metadata else found.offset

    async def _apply_group_events(self) -> None:
        group = self._group
        assert group is not None
        while group.events:
            event = group.events.popleft()
            try:
                owned = event.partitions & self._subs.assignment()
                if event.kind == REVOKED:
                    if owned and self._config.enable_auto_commit:
                        await self._commit_quietly(owned)
                    try:
                        if owned:
                            await self._call_listener("on_partitions_revoked", owned)
                    finally:
                        self._side.drop(owned)
                elif event.kind == LOST:
                    try:
                        if owned:
                            await self._call_listener("on_partitions_lost", owned)
                    finally:
                        self._side.drop(owned)
                elif event.kind == ASSIGNED:
                    committed = await asyncio.wait_for(
                        group.committed(sorted(event.partitions)), self._timeout_s
                    )
                    self._side.add(event.partitions, committed)
                    await self._call_listener("on_partitions_assigned", event.partitions)
            finally:
                if event.done is not None:
                    _resolve(event.done)

    async def _getmany_group(
        self, timeout_ms: float, limit: int
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        group = self._group
        assert group is not None
        group.in_poll = True
        try:
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                self._data.clear()
                self._side.run_callbacks()
                await self._apply_group_events()
                if group.left_for_poll_timeout and not group.events:
                    log.info("rejoining group %r", group.group_id)
                    await group.join(group.topics, group.pattern)
                if self._side.due_auto_commit():
                    offsets = self._side.changed(self._side.positions(self._subs.assignment()))
                    if offsets:
                        self.commit_async(offsets)
                records = self._subs.collect(limit) if self._subs.assignment() else {}
                if records:
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return records
                try:
                    await asyncio.wait_for(self._data.wait(), min(remaining, 1.0))
                except TimeoutError:
                    continue
        finally:
            group.last_poll = time.monotonic()
            group.in_poll = False

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """As Consumer.assign, but checked against cached metadata only (it
        does not wait); a partition found missing later fails getmany()."""
        self._check_open()
        if self._side.subscribed:
            raise IllegalStateError("assign() and subscribe() cannot be mixed: unsubscribe first")
        tps = _check_partitions(partitions)
        check_known_partitions(self._cluster.snapshot, tps)
        self._buffer = iter(())
        self._subs.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return self._subs.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._check_open()
        self._buffer = iter(())
        self._subs.seek(TopicPartition(*partition), offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_by(partitions, "earliest")

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_by(partitions, "latest")

    def _seek_by(self, partitions: Sequence[TopicPartition], strategy: str) -> None:
        self._check_open()
        self._buffer = iter(())
        for tp in _check_partitions(partitions) or sorted(self._subs.assignment()):
            self._subs.reset(tp, strategy)

    async def position(self, partition: TopicPartition) -> int:
        self._check_open()
        tp = TopicPartition(*partition)
        deadline = time.monotonic() + self._timeout_s
        while True:
            self._data.clear()
            position = self._subs.position(tp)
            if position is None:
                self._subs.absorb()
                position = self._subs.position(tp)
            if position is not None:
                return position
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidelogTimeoutError(f"position of {tp.topic}-{tp.partition} not known")
            try:
                await asyncio.wait_for(self._data.wait(), remaining)
            except TimeoutError:
                continue

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._subs.highwater(TopicPartition(*partition))

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition, waiting up to `timeout_ms` for some ({} if none).
        Naming partitions is not supported yet: all assigned ones are read."""
        self._check_open()
        if partitions:
            raise NotImplementedError("getmany(*partitions) is not supported yet")
        limit = self._config.max_poll_records if max_records is None else max_records
        if self._side.subscribed:
            return await self._getmany_group(timeout_ms, limit)
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() or subscribe() first")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._data.clear()
            records = self._subs.collect(limit)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return records
            try:
                await asyncio.wait_for(self._data.wait(), remaining)
            except TimeoutError:
                continue

    async def getone(self) -> ConsumerRecord:
        """The next record, waiting as long as it takes."""
        while True:
            record = next(self._buffer, None)
            if record is not None:
                return record
            chunk = self._config.max_poll_records if self._side.subscribed else _ITERATION_CHUNK
            polled = await self.getmany(timeout_ms=1000, max_records=chunk)
            if polled:
                self._buffer = chain.from_iterable(polled.values())

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
        return await asyncio.wait_for(self._fetcher.list_offsets(query), self._timeout_s)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self._list_offsets(dict.fromkeys(_check_partitions(partitions), EARLIEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self._list_offsets(dict.fromkeys(_check_partitions(partitions), LATEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        query = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return _offsets_and_times(await self._list_offsets(query))

    async def stop(self) -> None:
        """Stop fetching and release connections. Idempotent."""
        if self._closed:
            return
        try:
            if self._side.subscribed:
                self._side.run_callbacks()
                await self._leave_group(leave=None)
        except TidelogError as exc:
            log.warning("leaving the group cleanly failed: %s", exc)
        finally:
            self._closed = True
            await self._fetcher.close()
            await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
