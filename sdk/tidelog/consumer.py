"""`Consumer` (blocking) and `AsyncConsumer` (asyncio), with manual assignment.

Both are fronts over the same parts: a `Fetcher` on an event loop that runs
credit-paced Fetch sessions and resets positions, and a `SubscriptionState`
on the calling side that decodes record batches and tracks positions. The
synchronous Consumer runs the fetcher on its own background loop
(`LoopThread`) and decodes inside poll(), in the caller's thread.

Consumer groups (group_id, subscribe, commit) come later; for now assign
partitions and seek::

    with Consumer(bootstrap_servers="127.0.0.1:9392") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        for record in consumer:            # or consumer.poll(timeout_ms=100)
            handle(record)
"""

from __future__ import annotations

import asyncio
import threading
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

from tidelog._connection import Cluster
from tidelog._fetcher import EARLIEST, LATEST, Fetcher
from tidelog._loop_thread import LoopThread
from tidelog._subscription import SubscriptionState
from tidelog.config import DEFAULT_BOOTSTRAP, ConsumerConfig
from tidelog.errors import (
    ClosedError,
    GroupsNotSupportedError,
    IllegalStateError,
    TidelogTimeoutError,
)
from tidelog.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

__all__ = ["AsyncConsumer", "Consumer"]

#: Records one internal poll takes for iteration: large, so that the
#: per-poll cost is spread over many records.
_ITERATION_CHUNK = 10_000


def _make_config(
    topics: tuple[str, ...], bootstrap_servers: str | Sequence[str], options: dict[str, Any]
) -> ConsumerConfig:
    if topics:
        raise GroupsNotSupportedError(
            f"subscribing to {', '.join(topics)} needs consumer groups, which are not "
            "available yet: create the consumer without topics and call assign()"
        )
    config = ConsumerConfig(bootstrap_servers=bootstrap_servers, **options)
    if config.group_id is not None:
        raise GroupsNotSupportedError(
            f"group_id={config.group_id!r}: consumer groups are not available yet; "
            "leave group_id unset and use assign() and seek()"
        )
    return config


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
    """A blocking consumer of assigned partitions. Options: see
    `tidelog.config.ConsumerConfig`. Use it from one thread at a time."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP,
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
        self._timeout_s = self._config.request_timeout_ms / 1000
        self._closed = False

    def _command(self, name: str, args: tuple[Any, ...]) -> None:
        self._loop_thread.call_soon(getattr(self._fetcher, name), *args)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is closed")

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment).
        New partitions start at auto_offset_reset until seek() says otherwise."""
        self._check_open()
        self._iterator = iter(())
        self._subs.assign(_check_partitions(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._subs.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make `offset` the next record poll() returns for `partition`."""
        self._check_open()
        self._iterator = iter(())
        self._subs.seek(TopicPartition(*partition), offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the earliest offset (all assigned partitions when none given)."""
        self._seek_by(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the offset the next record will get."""
        self._seek_by(partitions, "latest")

    def _seek_by(self, partitions: Sequence[TopicPartition], strategy: str) -> None:
        self._check_open()
        self._iterator = iter(())
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
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() first")
        limit = self._config.max_poll_records if max_records is None else max_records
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
            polled = self.poll(timeout_ms=wait_ms, max_records=_ITERATION_CHUNK)
            if polled:
                self._iterator = chain.from_iterable(polled.values())
                return next(self._iterator)
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
    """The asyncio consumer of assigned partitions (aiokafka's shape). Options:
    see `tidelog.config.ConsumerConfig`. Use it from one event loop."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP,
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

    def _command(self, name: str, args: tuple[Any, ...]) -> None:
        getattr(self._fetcher, name)(*args)

    async def start(self) -> None:
        """Connect to the cluster (checks that a broker answers). Idempotent."""
        if not self._started:
            self._started = True
            await self._cluster.refresh()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is stopped")
        if not self._started:
            raise IllegalStateError("call `await consumer.start()` first")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._check_open()
        self._buffer = iter(())
        self._subs.assign(_check_partitions(partitions))

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
        if not self._subs.assignment():
            raise IllegalStateError("no partitions assigned: call assign() first")
        limit = self._config.max_poll_records if max_records is None else max_records
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
            polled = await self.getmany(timeout_ms=1000, max_records=_ITERATION_CHUNK)
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
        self._closed = True
        await self._fetcher.close()
        await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
