"""`Producer` (blocking, thread-safe) and `AsyncProducer` (asyncio).

Both are thin fronts over the same parts: a `RecordAccumulator` that batches
records per partition, a `Sender` task that ships batches over Produce
streams, and a `Cluster` for connections and metadata. The synchronous
Producer runs the sender on its own background event loop (`LoopThread`);
`send()` only appends to the accumulator in the calling thread, so the cost
of a record is an append under one lock plus a tuple-sized future; for a
bytes record (keyless, keyed or a tombstone, with headers or not) with
nothing to serialize, one C call into its lane (tidelog._accumulator,
_cproduce.c) without the lock.

Usage, as with kafka-python and aiokafka::

    with Producer("127.0.0.1:9392", linger_ms=5) as producer:
        future = producer.send("orders", b"value", key=b"k")
        metadata = future.get(timeout=10)

    async with AsyncProducer("127.0.0.1:9392") as producer:
        metadata = await producer.send_and_wait("orders", b"value")
"""

from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tidelog._accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    BufferFullError,
    Placement,
    RecordAccumulator,
    keyed_append,
)
from tidelog._client_metrics import Metrics, ProducerMetrics
from tidelog._connection import Cluster
from tidelog._futures import FutureRecordMetadata, failed_future
from tidelog._loop_thread import client_loop
from tidelog._sender import Sender
from tidelog._timeouts import within
from tidelog.config import ProducerConfig
from tidelog.errors import (
    ClosedError,
    MessageTooLargeError,
    TidelogTimeoutError,
    UnknownTopicOrPartitionError,
)
from tidelog.partitioner import partition_for_key
from tidelog.records import MAX_HEADER_KEY_BYTES, MAX_HEADERS_PER_RECORD, Header
from tidelog.types import RecordMetadata, TopicPartition

_T = TypeVar("_T")

__all__ = ["AsyncProducer", "FutureRecordMetadata", "Placement", "Producer"]

_now_ns = time.time_ns


def _as_bytes(data: object, what: str) -> bytes:
    """bytes-like to bytes; anything else is a usage error (use a serializer)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(
        f"{what} must be bytes-like, not {type(data).__name__}; "
        f"pass {what}_serializer= to convert other types"
    )


def _column_sizes(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header] | None] | None,
) -> list[int]:
    """Each record's `record_size`, from columns. Checks the types (bytes or
    None; headers as in send) at C speed where it can: a wrong type would
    otherwise surface only when the sender encodes the batch."""
    if not set(map(type, values)) <= _BYTES_OR_NONE:
        raise TypeError("send_batch: values must be bytes or None")
    if None in values:
        sizes = [RECORD_OVERHEAD if v is None else RECORD_OVERHEAD + len(v) for v in values]
    else:
        sizes = list(map(RECORD_OVERHEAD.__add__, map(len, values)))  # type: ignore[arg-type]
    if keys is not None:
        if len(keys) != len(values):
            raise ValueError(f"send_batch: {len(keys)} keys for {len(values)} values")
        if not set(map(type, keys)) <= _BYTES_OR_NONE:
            raise TypeError("send_batch: keys must be bytes or None")
        if None in keys:
            sizes = [s if k is None else s + len(k) for s, k in zip(sizes, keys, strict=True)]
        else:
            sizes = list(map(operator.add, sizes, map(len, keys)))  # type: ignore[arg-type]
    if headers is not None:
        if len(headers) != len(values):
            raise ValueError(f"send_batch: {len(headers)} header lists for {len(values)} values")
        for i, record_headers in enumerate(headers):
            if record_headers:
                sizes[i] += _check_headers(record_headers)[1]
    return sizes


_BYTES_OR_NONE = {bytes, type(None)}


def _check_headers(headers: Sequence[Header]) -> tuple[tuple[Header, ...], int]:
    """`headers` as a tuple, checked, and the bytes they add to a record
    (what `_accumulator.record_size` counts for them), in one pass: send() pays it per
    record. A tuple, as send()'s lanes store them too (_cproduce.c `lane_headers`): a
    tuple passed in is kept as it is, and the garbage collector stops tracking a tuple
    of str, bytes and such tuples, where a list per record waiting in its batch would
    be walked by every collection.

    Raises TypeError for an item that is not a (str, bytes | None) tuple, and
    ValueError past what a header block can hold (MAX_HEADERS_PER_RECORD
    headers, keys of MAX_HEADER_KEY_BYTES in UTF-8): caught here, such a
    record would otherwise fail its whole batch when the sender encodes it."""
    out = tuple(headers)
    if len(out) > MAX_HEADERS_PER_RECORD:
        raise ValueError(
            f"a record has {len(out)} headers, over the limit of {MAX_HEADERS_PER_RECORD} "
            "(MAX_HEADERS_PER_RECORD)"
        )
    size = 4
    for item in out:
        if (
            type(item) is not tuple
            or len(item) != 2
            or type(item[0]) is not str
            or not (item[1] is None or type(item[1]) is bytes)
        ) and not _is_header(item):
            raise TypeError(f"a header must be a (str, bytes | None) tuple, got {item!r}")
        key, value = item
        key_bytes = len(key) if key.isascii() else len(key.encode())
        if key_bytes > MAX_HEADER_KEY_BYTES:
            raise ValueError(
                f"a header key is {key_bytes} bytes in UTF-8, over the limit of "
                f"{MAX_HEADER_KEY_BYTES} (MAX_HEADER_KEY_BYTES)"
            )
        size += 8 + key_bytes + (0 if value is None else len(value))
    return out, size


def _is_header(item: object) -> bool:
    """A (str, bytes | None) tuple, subclasses allowed (the exact-type test
    of `_check_headers` is the fast path)."""
    return (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and (item[1] is None or isinstance(item[1], bytes))
    )


class _ProducerCore:
    """What both producers share: config, accumulator, record checks."""

    def __init__(self, config: ProducerConfig, wake: Callable[[], None]) -> None:
        self.config = config
        self.cluster = Cluster(config, allow_auto_topic_creation=True)
        # The largest record that fits a request on its own.
        self.max_record_size = config.max_request_size - BATCH_OVERHEAD
        self.key_serializer = config.key_serializer
        self.value_serializer = config.value_serializer
        self.partitioner = config.partitioner
        #: No serializer: bytes go in as they are (the send() fast path).
        self.plain_bytes = self.key_serializer is None and self.value_serializer is None
        self.accumulator = RecordAccumulator(
            batch_size=config.batch_size,
            linger_ms=config.linger_ms,
            linger_while_in_flight=config.linger_while_in_flight,
            buffer_memory=config.buffer_memory,
            wake=wake,
            # Lanes take keyless records to the sticky partition as they are.
            lane_max_record=(
                self.max_record_size if self.plain_bytes and self.partitioner is None else None
            ),
        )
        self.sender: Sender | None = None
        # The partitioner's partition lists, per topic, for the metadata
        # snapshot they were made from (rebuilt when metadata changes).
        self._partition_lists: dict[str, tuple[object, list[int], list[int]]] = {}

    def metrics(self) -> Metrics:
        """See Producer.metrics (zeros before the sender has started)."""
        sent = self.sender.metrics if self.sender is not None else ProducerMetrics()
        return sent.snapshot()

    def prepare(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Sequence[Header] | None,
        timestamp_ms: int | None,
    ) -> tuple[bytes | None, bytes | None, tuple[Header, ...] | None, int, int]:
        """Serialize and check one record: (key, value, headers, size, timestamp)."""
        if self.key_serializer is not None:
            key = self.key_serializer(key)
        if self.value_serializer is not None:
            value = self.value_serializer(value)
        if value is not None and type(value) is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key")
        if headers:
            checked, size = _check_headers(headers)
            size += (
                RECORD_OVERHEAD
                + (0 if value is None else len(value))
                + (0 if key is None else len(key))
            )
        else:
            checked = None
            size = (
                RECORD_OVERHEAD
                + (0 if value is None else len(value))
                + (0 if key is None else len(key))
            )
        if timestamp_ms is None:
            timestamp_ms = _now_ns() // 1_000_000
        return key, value, checked, size, timestamp_ms

    def too_large(self, topic: str, partition: int | None, size: int) -> FutureRecordMetadata:
        return failed_future(
            topic,
            -1 if partition is None else partition,
            MessageTooLargeError(
                f"the record is {size} bytes, more than max_request_size "
                f"({self.config.max_request_size}) allows"
            ),
        )

    def choose_partition(
        self, topic: str, key: bytes | None, partition: int | None, count: int
    ) -> int:
        """Explicit partition, else the partitioner's choice, else the key's
        murmur2 partition, else -1 (sticky)."""
        if partition is not None:
            if not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"partition {partition} of {topic!r} does not exist "
                    f"(the topic has {count} partitions)"
                )
            return partition
        if self.partitioner is not None:
            return self._partitioner_choice(topic, key, count)
        if key is not None:
            return partition_for_key(key, count)
        return -1

    def _partitioner_choice(self, topic: str, key: bytes | None, count: int) -> int:
        assert self.partitioner is not None
        snapshot = self.cluster.snapshot
        cached = self._partition_lists.get(topic)
        if cached is None or cached[0] is not snapshot or len(cached[1]) != count:
            meta = snapshot.topics.get(topic)
            leaders = meta.leaders if meta is not None else ()
            every = list(range(count))
            available = [p for p in every if p < len(leaders) and leaders[p] >= 0]
            cached = self._partition_lists[topic] = (snapshot, every, available)
        # Copies: a partitioner that changes its arguments cannot change ours.
        chosen = self.partitioner(key, list(cached[1]), list(cached[2]))
        if type(chosen) is not int or not 0 <= chosen < count:
            raise UnknownTopicOrPartitionError(
                f"the partitioner returned {chosen!r} for topic {topic!r}, which has "
                f"partitions 0 to {count - 1}"
            )
        return chosen


class Producer:
    """A thread-safe producer that batches records and sends them in the
    background. Options: see `tidelog.config.ProducerConfig`.
    """

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._config = ProducerConfig(bootstrap_servers=bootstrap_servers, **options)
        self._loop_thread = client_loop(
            f"tidelog-producer-{self._config.client_id}", self._config.shared_loop_thread
        )
        try:
            self._core = _ProducerCore(self._config, self._wake_sender)
            self._acc = self._core.accumulator
            self._lanes = self._acc.lanes
            self._keyed_lanes = self._acc.keyed_lanes
            self._cluster = self._core.cluster
            self._max_block_s = self._config.max_block_ms / 1000
            self._closed = False
            self._loop_thread.run(self._start())
        except BaseException:
            # The loop thread may be shared: give back this client's use of it.
            self._loop_thread.stop()
            raise

    async def _start(self) -> None:
        self._core.sender = Sender(self._core.cluster, self._acc, self._config)
        self._core.sender.start()

    def _wake_sender(self) -> None:
        sender = self._core.sender
        if sender is not None:
            self._loop_thread.call_soon(sender.wake)

    def _partition_count(self, topic: str) -> int:
        """Block (up to max_block_ms) for the topic's metadata."""
        if self._closed:
            raise ClosedError("the producer is closed")
        meta = self._loop_thread.run(
            self._core.cluster.topic(topic, timeout_s=self._max_block_s),
            timeout=self._max_block_s + 1,
        )
        return meta.partition_count

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[Header] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; return a future of its RecordMetadata.

        Blocks only for the topic's first metadata lookup or when
        buffer_memory is full (both bounded by max_block_ms). Errors of
        delivery are reported through the future; usage errors (wrong types,
        closed producer) raise here.
        """
        if partition is None and timestamp_ms is None:
            if key is None:
                # The topic's lane (tidelog._accumulator): one C call, no lock,
                # for a bytes value (or None) and headers it takes that fit;
                # None sends it the long way.
                lane = self._lanes.get(topic)
                if lane is not None:
                    future = lane.append(value, headers)
                    if future is not None:
                        return future
            else:
                # A keyed record: its partition's lane, found and filled in one
                # C call for the partition count the long path would read.
                table = self._keyed_lanes.get(topic)
                if table is not None:
                    future = keyed_append(
                        table,
                        self._cluster.snapshot.partition_counts.get(topic),
                        key,
                        value,
                        headers,
                    )
                    if future is not None:
                        return future
        core = self._core
        if (
            type(value) is bytes
            and (key is None or type(key) is bytes)
            and not headers
            and timestamp_ms is None
            and core.plain_bytes
        ):
            # The common cases, checked in one expression: a bytes value, a
            # bytes key or none, nothing to serialize (saves a call per record).
            size = RECORD_OVERHEAD + len(value) + (0 if key is None else len(key))
            timestamp_ms = _now_ns() // 1_000_000
        else:
            key, value, headers, size, timestamp_ms = core.prepare(
                topic, value, key, headers, timestamp_ms
            )
        if size > core.max_record_size:
            return core.too_large(topic, partition, size)
        count = core.cluster.snapshot.partition_counts.get(topic)
        if count is None:
            count = self._partition_count(topic)
        if partition is None and key is None and core.partitioner is None:
            chosen = -1
        else:
            chosen = core.choose_partition(topic, key, partition, count)
        return self._acc.append(
            topic, chosen, count, key, value, headers, timestamp_ms, size, self._max_block_s
        )

    def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[Header] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        timeout: float | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for it: sends at once, without lingering."""
        future = self.send(topic, value, key, headers, partition, timestamp_ms)
        self._acc.seal_all()
        return future.get(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until every record sent so
        far is delivered or failed. Raises TidelogTimeoutError on timeout."""
        self._acc.seal_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in self._acc.incomplete():
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not result.wait(remaining):
                raise TidelogTimeoutError(f"flush did not finish in {timeout} s")

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of `topic` (created if auto-creation is on)."""
        return set(range(self._partition_count(topic)))

    def metrics(self) -> Metrics:
        """kafka-python's shape: group -> name -> value. "producer-metrics":
        record-send-total/-rate, record-error-*, record-retry-*, byte-total/
        -rate, batch-size-avg/-max (bytes as sent), records-per-request-avg,
        record-queue-time-avg/-max and request-latency-avg/-max (ms),
        request-total/-rate; "producer-topic-metrics.<topic>": record-send-*,
        byte-*, record-error-*. Rates, averages and maxima cover the last
        30-60 s (tidelog._client_metrics); totals, the producer's life."""
        return self._core.metrics()

    def close(self, timeout: float | None = None) -> dict[TopicPartition, int]:
        """Send what is buffered (waiting up to `timeout` seconds, forever
        when None), then release connections. Records not delivered by then
        fail with ClosedError (their futures say so); returns how many, by
        partition (empty when everything buffered was delivered; records
        that failed earlier are not counted, their futures hold the error).
        Idempotent: a second call returns {}."""
        if self._closed:
            return {}
        self._closed = True
        try:
            return self._loop_thread.run(self._close(timeout))
        finally:
            self._loop_thread.stop()

    async def _close(self, timeout: float | None) -> dict[TopicPartition, int]:
        undelivered: dict[TopicPartition, int] = {}
        if self._core.sender is not None:
            undelivered = await self._core.sender.close(timeout)
        await self._core.cluster.close()
        return undelivered

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncProducer:
    """The asyncio producer: call it from one event loop. Options: see
    `tidelog.config.ProducerConfig`.

    `await send(...)` queues the record and returns a future to await
    (aiokafka's shape): ``fut = await producer.send(t, v); md = await fut``.
    """

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, **options: Any):
        self._config = ProducerConfig(bootstrap_servers=bootstrap_servers, **options)
        self._core = _ProducerCore(self._config, self._wake_sender)
        self._acc = self._core.accumulator
        self._lanes = self._acc.lanes
        self._keyed_lanes = self._acc.keyed_lanes
        self._max_block_s = self._config.max_block_ms / 1000
        self._started = False
        self._closed = False

    def _wake_sender(self) -> None:
        if self._core.sender is not None:
            self._core.sender.wake()

    async def start(self) -> None:
        """Connect to the cluster. Idempotent."""
        if self._started:
            return
        self._started = True
        self._core.sender = Sender(self._core.cluster, self._acc, self._config)
        self._core.sender.start()
        await self._core.cluster.refresh()

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[Header] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; return an awaitable future of its RecordMetadata."""
        if not self._started or self._closed:
            raise ClosedError(
                "call `await producer.start()` first"
                if not self._closed
                else "the producer is closed"
            )
        if partition is None and timestamp_ms is None:
            # As in Producer.send: the topic's lane (keyed: its partition's) first.
            if key is None:
                lane = self._lanes.get(topic)
                if lane is not None:
                    future = lane.append(value, headers)
                    if future is not None:
                        return future
            else:
                table = self._keyed_lanes.get(topic)
                if table is not None:
                    future = keyed_append(
                        table,
                        self._core.cluster.snapshot.partition_counts.get(topic),
                        key,
                        value,
                        headers,
                    )
                    if future is not None:
                        return future
        key, value, headers, size, timestamp_ms = self._core.prepare(
            topic, value, key, headers, timestamp_ms
        )
        if size > self._core.max_record_size:
            return self._core.too_large(topic, partition, size)
        count = self._core.cluster.snapshot.partition_counts.get(topic)
        if count is None:
            meta = await self._core.cluster.topic(topic, timeout_s=self._max_block_s)
            count = meta.partition_count
        if partition is None and key is None and self._core.partitioner is None:
            chosen = -1
        else:
            chosen = self._core.choose_partition(topic, key, partition, count)
        try:
            return self._acc.append(
                topic, chosen, count, key, value, headers, timestamp_ms, size, None
            )
        except BufferFullError:
            return await self._append_when_space(
                lambda: self._acc.append(
                    topic, chosen, count, key, value, headers, timestamp_ms, size, None
                )
            )

    async def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        timestamps: Sequence[int],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[Header] | None] | None = None,
        partition: int | None = None,
    ) -> list[Placement]:
        """Queue many records of one partition at once, given as columns
        (one entry per record; `keys`/`headers` None: none has any;
        `timestamps`: create times in ms). For callers that already hold
        bytes (no serializers run) and have already partitioned: every
        record goes to `partition`, or with None to the sticky partition
        (keyless records; a keyed record's partition is the caller's to
        choose, e.g. `partitioner.partition_for_key`).

        The records join the partition's open batches exactly as records
        queued by `send` do (same numbering, retries, order and lingering),
        without per-record Python work. Returns where they went, in order:
        `Placement(result, first, length)` runs; the i-th record of a run has
        offset ``result.base_offset + first + i`` once `result` is done (a
        record over max_request_size gets a run of its own whose result has
        already failed with MessageTooLargeError). Await a run's records
        with ``await result.wait_async()``.
        """
        if not self._started or self._closed:
            raise ClosedError(
                "call `await producer.start()` first"
                if not self._closed
                else "the producer is closed"
            )
        if len(timestamps) != len(values):
            raise ValueError(f"send_batch: {len(timestamps)} timestamps for {len(values)} values")
        if not values:
            return []
        sizes = _column_sizes(values, keys, headers)
        core = self._core
        count = core.cluster.snapshot.partition_counts.get(topic)
        if count is None:
            meta = await core.cluster.topic(topic, timeout_s=self._max_block_s)
            count = meta.partition_count
        if partition is not None and not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of {topic!r} does not exist "
                f"(the topic has {count} partitions)"
            )
        chosen = -1 if partition is None else partition
        if max(sizes) > core.max_record_size:
            return await self._send_runs(topic, chosen, count, values, keys, headers,
                                         timestamps, sizes)  # fmt: skip
        return await self._append_columns(
            topic, chosen, count, values, keys, headers, timestamps, sizes
        )

    async def _send_runs(
        self,
        topic: str,
        partition: int,
        count: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header] | None] | None,
        timestamps: Sequence[int],
        sizes: list[int],
    ) -> list[Placement]:
        """send_batch with records over max_request_size among them: each
        fails alone, the runs between them are queued."""
        out: list[Placement] = []
        start = 0
        limit = self._core.max_record_size
        for i, size in enumerate([*sizes, 0]):
            if i < len(sizes) and size <= limit:
                continue
            if i > start:
                out += await self._append_columns(
                    topic,
                    partition,
                    count,
                    values[start:i],
                    None if keys is None else keys[start:i],
                    None if headers is None else headers[start:i],
                    timestamps[start:i],
                    sizes[start:i],
                )
            if i < len(sizes):
                failed = self._core.too_large(topic, None if partition < 0 else partition, size)
                out.append(Placement(failed[0], 0, 1))
            start = i + 1
        return out

    async def _append_columns(
        self,
        topic: str,
        partition: int,
        count: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header] | None] | None,
        timestamps: Sequence[int],
        sizes: list[int],
    ) -> list[Placement]:
        def append() -> list[Placement]:
            return self._acc.append_columns(
                topic, partition, count, values, keys, headers, timestamps, sizes, None
            )

        try:
            return append()
        except BufferFullError:
            return await self._append_when_space(append)

    async def _append_when_space(self, append: Callable[[], _T]) -> _T:
        """`append` again each time the sender frees buffer memory, until it
        fits; TidelogTimeoutError once max_block_ms has passed (the first
        attempt, already refused, is the caller's: the common path takes
        no closure)."""
        deadline = time.monotonic() + self._max_block_s
        sender = self._core.sender
        assert sender is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidelogTimeoutError(
                    f"buffer_memory stayed full for max_block_ms ({self._config.max_block_ms})"
                )
            sender.space_freed.clear()
            with contextlib.suppress(TimeoutError):
                await within(sender.space_freed.wait(), remaining)
            try:
                return append()
            except BufferFullError:
                continue

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[Header] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its RecordMetadata (no lingering)."""
        future = await self.send(topic, value, key, headers, partition, timestamp_ms)
        self._acc.seal_all()
        return await future

    async def flush(self) -> None:
        """Send everything buffered and wait until all of it is resolved."""
        self._acc.seal_all()
        for result in self._acc.incomplete():
            await result.wait_async()

    async def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has, as the producer partitions it
        (its metadata; asked of the cluster only when not known yet)."""
        count = self._core.cluster.snapshot.partition_counts.get(topic)
        if count is None:
            meta = await self._core.cluster.topic(topic, timeout_s=self._max_block_s)
            count = meta.partition_count
        return count

    async def partitions_for(self, topic: str) -> set[int]:
        meta = await self._core.cluster.topic(topic, timeout_s=self._max_block_s)
        return set(range(meta.partition_count))

    def metrics(self) -> Metrics:
        """As Producer.metrics (not a coroutine: it only reads counters)."""
        return self._core.metrics()

    async def stop(self, timeout: float | None = None) -> dict[TopicPartition, int]:
        """Flush (up to `timeout` seconds) and close; returns the records not
        delivered by then, by partition (see Producer.close). Idempotent."""
        if self._closed:
            return {}
        self._closed = True
        undelivered: dict[TopicPartition, int] = {}
        if self._core.sender is not None:
            undelivered = await self._core.sender.close(timeout)
        await self._core.cluster.close()
        return undelivered

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
