"""What one Spark task of the sink runs: its rows into Tidelog, exactly once.

Spark may run a task of a write more than once with the same input: a task
retried after a failure, or a whole micro-batch replayed with the same batch
id after the driver died between the tasks' writes and the batch's entry in
the checkpoint's commit log. Every attempt of one task is one *writer*, named
by a key (`writer_key`: query id, batch id and Spark partition in a stream;
a job id chosen on the driver and the Spark partition in a batch write).

The writer is an idempotent producer whose identity and numbering every
attempt derives alike, so that the broker's producer state (the five last
batches per producer id and partition, services/broker/.../producer_state.py)
refuses what an earlier attempt already wrote:

- identity: InitProducerId with the writer key as `producer_key` returns the
  same producer id to every attempt, and an epoch that counts the attempts.
  Every attempt writes with epoch 0 (the broker takes any epoch that
  InitProducerId handed out and that is not older than the partition's), so
  all attempts share one sequence space per partition; the epoch returned
  only tells an attempt whether an earlier one exists (epoch > 0: a replay);
- numbering: per target partition the writer's records are numbered 0..n-1
  in the order the task sees them, cut into batches by size only (no linger,
  so the cuts depend on the rows alone), and the last record of each
  partition goes alone in a batch of its own, the *seal*, whose sequence
  range (n-1, n-1) depends only on how many records the partition gets;
- first attempt (epoch 0): batches are sent as they fill, the seals at the
  end. A retried request repeats its batch, which the broker answers as a
  duplicate with the original offsets;
- replay (epoch > 0): the rows are cut as before and kept; per partition the
  seal is sent first. Written already (a duplicate) or appended now (the
  earlier attempt stopped just before it): the partition is complete, and
  nothing else is sent. Refused as out of order: the earlier attempt stopped
  earlier, so the batches are tried from the last one backwards until one is
  a duplicate or is appended (the first one the earlier attempt did not
  write), then the rest are sent in order.

What this needs: a replayed task sees the same rows per target partition
(Spark's replay of a deterministic query over a replayable source), and the
same `kafka.batch.size`. A complete earlier attempt is recognised whatever
the rows' order (the seal depends on the count alone). A partial one (a task
that failed half-way) needs the rows in the same order too: the broker
compares sequence numbers, not contents, so rows that come in another order
(possible after a shuffle) could be written twice and others not at all.
When nothing lines up at all (another count or cut), the task fails naming
this rather than write twice. Rows without key or partition are spread
round-robin by their position in the task, which keeps the counts per
partition deterministic.

Costs: one InitProducerId per task (a coordinator call and an etcd write),
one extra one-record batch per target partition, and on a replay the task's
output is kept in memory. Each writer key stays in etcd (see the report of
issue 11: producer keys do not expire yet).

Not thread-safe: a `TaskWriter` runs on the process's sink loop thread
(`run_task`), one task at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidelog._connection import Cluster, call_error
from tidelog._loop_thread import LoopThread
from tidelog._timeouts import within
from tidelog.config import ProducerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    TidelogError,
    UnknownTopicOrPartitionError,
    error_from_code,
)
from tidelog.partitioner import partition_for_key
from tidelog.records import HEADER_SIZE, encode_batch
from tidelog.types import TopicPartition
from tidelog.v1 import cluster_pb2, log_pb2

log = logging.getLogger(__name__)

#: The epoch every attempt writes with (see the module doc).
WRITE_EPOCH = 0
#: Batches of one partition in flight at once: no more than the broker
#: remembers per producer, so that any of them sent again is a duplicate.
IN_FLIGHT_MAX = 5
#: Bytes of a record's body besides key, value and headers (two lengths).
RECORD_OVERHEAD = 8
#: Most bytes of ready batches a first attempt collects before sending them
#: (four batches' worth, at most this).
SEND_THRESHOLD_BYTES = 4 * 1024 * 1024

Header = tuple[str, bytes | None]
#: Rows are grouped by topic id * this + partition (more than any topic has).
_MAX_PARTITIONS = 1 << 20


class ReplayMismatchError(TidelogError):
    """A replayed task's batches do not line up with what an earlier attempt
    of the same writer wrote (its rows came in another order or count)."""

    code_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class TaskResult:
    """What one task did, for the driver's commit (and the tests)."""

    writer_key: str
    producer_id: int
    #: True when an earlier attempt of this writer existed.
    replay: bool
    #: Records this task handed to the sink, per "topic-partition".
    records: dict[str, int] = field(default_factory=dict)
    #: On a replay, per "topic-partition": records sent after the batch
    #: where the replay lined up with the earlier attempt (0: that attempt
    #: had written the partition completely; see _replay_partition).
    resent: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.records.values())

    @property
    def total_resent(self) -> int:
        return sum(self.resent.values())


@dataclass
class _Batch:
    """One encoded batch of a partition: its first sequence and record count."""

    base_sequence: int
    count: int
    data: bytes


class _PartitionWriter:
    """The records of one target partition: numbered, cut, then sent."""

    def __init__(self, tp: TopicPartition, producer_id: int, batch_bytes: int, codec: Any) -> None:
        self.tp = tp
        self._producer_id = producer_id
        self._batch_bytes = batch_bytes
        self._codec = codec
        # Records not cut into a batch yet, and their encoded size.
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._headers: list[list[Header] | None] = []
        self._any_headers = False
        self._pending_bytes = 0
        #: Records numbered so far (the next record's sequence).
        self.count = 0
        #: Batches cut and not yet sent (all of them on a replay).
        self.ready: deque[_Batch] = deque()
        self.ready_bytes = 0

    def extend(
        self,
        keys: list[bytes | None],
        values: list[bytes | None],
        headers: list[list[Header] | None] | None,
        sizes: np.ndarray,
    ) -> None:
        """Add records in order; `sizes[i]`: record i's bytes in a batch body.

        The rule, as if record by record: a record that would take the
        pending records past batch.size cuts them into a batch first (so the
        cuts depend on the rows alone); a record alone larger than that
        still goes in a batch of its own. The last record stays pending
        until `seal`, so that it can be sealed alone."""
        total = len(values)
        ends = np.cumsum(sizes, dtype=np.int64)
        i = 0
        while i < total:
            # Bytes of records [i, r) = ends[r-1] - before; pending ones count too.
            before = (int(ends[i - 1]) if i else 0) - self._pending_bytes
            r = max(i, int(np.searchsorted(ends, before + self._batch_bytes, side="right")))
            if r == i:
                if self._values:
                    self._cut(len(self._values))
                    continue
                r = i + 1  # one record larger than batch.size: alone
            self._keys.extend(keys[i:r])
            self._values.extend(values[i:r])
            self._headers.extend(headers[i:r] if headers is not None else [None] * (r - i))
            self._pending_bytes = int(ends[r - 1]) - before
            if r < total:
                self._cut(len(self._values))
            i = r
        if headers is not None:
            self._any_headers = self._any_headers or any(headers)

    def seal(self) -> None:
        """The task's rows are all in: cut what is pending, its last record alone."""
        if self._values:
            if len(self._values) > 1:
                self._cut(len(self._values) - 1)
            self._cut(1)

    def _cut(self, count: int) -> None:
        keys, self._keys = self._keys[:count], self._keys[count:]
        values, self._values = self._values[:count], self._values[count:]
        headers, self._headers = self._headers[:count], self._headers[count:]
        data = encode_batch(
            values,
            keys=None if keys.count(None) == len(keys) else keys,
            base_timestamp=int(time.time() * 1000),
            headers=headers if self._any_headers else None,
            codec=self._codec,
            producer_id=self._producer_id,
            producer_epoch=WRITE_EPOCH,
            base_sequence=self.count,
        )
        self.ready.append(_Batch(self.count, count, data))
        self.ready_bytes += len(data)
        self.count += count
        # Only seal() cuts fewer than all pending records: what is left is
        # the one record it seals next.
        self._pending_bytes = _record_size(self._keys[0], self._values[0]) if self._values else 0


def _record_size(key: bytes | None, value: bytes | None) -> int:
    return RECORD_OVERHEAD + len(key or b"") + len(value or b"")


class _ProduceStreams:
    """One bidi Produce call per broker address; requests answered in order."""

    def __init__(self, cluster: Cluster, config: ProducerConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._calls: dict[str, Any] = {}
        self._waiting: dict[str, deque[asyncio.Future[log_pb2.ProduceResponse]]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._correlation = 0

    async def produce(
        self, address: str, parts: list[tuple[TopicPartition, bytes]]
    ) -> log_pb2.ProduceResponse:
        call: Any = self._calls.get(address)
        if call is None:
            call = self._cluster.log_stub(address).Produce()
            self._calls[address] = call
            self._waiting[address] = deque()
            self._readers[address] = asyncio.ensure_future(
                self._read(address, call, self._waiting[address])
            )
        self._correlation += 1
        request = log_pb2.ProduceRequest(
            correlation_id=self._correlation,
            acks=self._config.acks,  # type: ignore[arg-type]
            timeout_ms=self._config.request_timeout_ms,
            partitions=[
                log_pb2.PartitionRecords(topic=tp.topic, partition=tp.partition, records=data)
                for tp, data in parts
            ],
        )
        future: asyncio.Future[log_pb2.ProduceResponse] = asyncio.get_running_loop().create_future()
        # Answers come in the order of the writes: queue and write together.
        async with self._locks.setdefault(address, asyncio.Lock()):
            if address not in self._calls or self._calls[address] is not call:  # broke meanwhile
                raise BrokerNotAvailableError(f"the produce stream to {address} broke")
            self._waiting[address].append(future)
            try:
                await call.write(request)
            except Exception as exc:  # a stream that ended: every waiting request fails
                self._broken(address, exc)
        return await within(future, self._config.request_timeout_ms / 1000 + 5)

    async def _read(
        self,
        address: str,
        call: Any,
        waiting: deque[asyncio.Future[log_pb2.ProduceResponse]],
    ) -> None:
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:  # type: ignore[attr-defined]
                    raise BrokerNotAvailableError(f"{address} closed the produce stream")
                if waiting:
                    future = waiting.popleft()
                    if not future.done():
                        future.set_result(response)
        except (grpc.aio.AioRpcError, TidelogError) as exc:
            if self._calls.get(address) is call:
                self._broken(address, exc)

    def _broken(self, address: str, exc: BaseException) -> None:
        if isinstance(exc, grpc.aio.AioRpcError):
            error: TidelogError = call_error(exc, address)
        elif isinstance(exc, TidelogError):
            error = exc
        else:
            error = BrokerNotAvailableError(f"produce stream to {address} failed: {exc}")
        call = self._calls.pop(address, None)
        if call is not None:
            call.cancel()
        for future in self._waiting.pop(address, deque()):
            if not future.done():
                future.set_exception(error)
        reader = self._readers.pop(address, None)
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()

    async def close(self) -> None:
        for address in list(self._calls):
            self._broken(address, BrokerNotAvailableError("the writer is closed"))


class TaskWriter:
    """Writes one Spark task's rows (Arrow record batches) exactly once."""

    def __init__(self, config: ProducerConfig, default_topic: str | None, writer_key: str) -> None:
        self._config = config
        self._default_topic = default_topic
        self.writer_key = writer_key
        self._cluster = Cluster(config)
        self._streams = _ProduceStreams(self._cluster, config)
        self._partitions: dict[TopicPartition, _PartitionWriter] = {}
        self._partition_counts: dict[str, int] = {}
        self._topic_names: list[str] = []
        self._topic_ids: dict[str, int] = {}
        #: Round-robin position per topic (id) of the rows without key or partition.
        self._round_robin: dict[int, int] = {}
        self._producer_id = -1
        self._replay = False
        self._resent: dict[TopicPartition, int] = {}
        # A record larger than this can never be sent: refuse it by name.
        self._record_bytes_max = config.max_request_size - HEADER_SIZE - 1024
        self._send_threshold = min(SEND_THRESHOLD_BYTES, 4 * config.batch_size)

    # ------------------------------------------------------------- the task

    async def open(self) -> None:
        """Take the writer's producer id; learn whether this is a replay."""
        self._producer_id, epoch = await self._init_producer_id()
        self._replay = epoch > 0
        if self._replay:
            log.warning(
                "sink writer %s: attempt %d (an earlier one existed): writing only what it did not",
                self.writer_key,
                epoch + 1,
            )

    async def add(self, batch: pa.RecordBatch) -> None:
        """Take one Arrow batch of the task's rows (sending what filled up)."""
        await self._add(batch)

    async def finish(self) -> TaskResult:
        """The rows are all in: seal every partition and send the rest."""
        for writer in self._partitions.values():
            writer.seal()
        if self._replay:
            writers = self._partitions.values()
            await asyncio.gather(*(self._replay_partition(w) for w in writers))
        else:
            await self._send_ready()
        return TaskResult(
            self.writer_key,
            self._producer_id,
            self._replay,
            {str(tp): w.count for tp, w in self._partitions.items()},
            {str(tp): n for tp, n in self._resent.items()},
        )

    async def close(self) -> None:
        await self._streams.close()
        await self._cluster.close()

    async def _init_producer_id(self) -> tuple[int, int]:
        request = cluster_pb2.InitProducerIdRequest(producer_key=self.writer_key)
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        backoff_s = self._config.retry_backoff_ms / 1000
        while True:
            error: TidelogError | None = None
            for address in self._cluster.any_address():
                try:
                    reply = await self._cluster.cluster_stub(address).InitProducerId(
                        request, timeout=self._config.request_timeout_ms / 1000
                    )
                    return reply.producer_id, reply.producer_epoch
                except grpc.aio.AioRpcError as exc:
                    error = call_error(exc, address)
                    if not error.retriable:
                        raise error from None
            if time.monotonic() + backoff_s > deadline:
                raise error or BrokerNotAvailableError("no server to ask for a producer id")
            await asyncio.sleep(backoff_s)

    # ------------------------------------------------------------- rows

    async def _add(self, batch: pa.RecordBatch) -> None:
        """Route one Arrow batch's rows to their partitions, in order."""
        rows = batch.num_rows
        if rows == 0:
            return
        names = batch.schema.names
        value_column = _as_binary(batch.column(names.index("value")))
        key_column = _as_binary(batch.column(names.index("key"))) if "key" in names else None
        sizes = RECORD_OVERHEAD + _lengths(value_column)
        if key_column is not None:
            sizes += _lengths(key_column)
        headers = (
            _headers_list(batch.column(names.index("headers"))) if "headers" in names else None
        )
        if headers is not None:
            sizes += np.fromiter(
                (4 + sum(8 + len(k) + len(v or b"") for k, v in h) if h else 0 for h in headers),
                dtype=np.int64,
                count=rows,
            )
        too_large = int(sizes.max()) - RECORD_OVERHEAD
        if too_large > self._record_bytes_max:
            raise MessageTooLargeError(
                f"a record of {too_large} bytes (key, value and headers) does not fit in a "
                f"request of kafka.max.request.size={self._config.max_request_size} bytes"
            )
        values = value_column.to_pylist()
        keys = key_column.to_pylist() if key_column is not None else None
        topic_of = await self._topics(batch, names)
        partitions = await self._partitions_of(batch, names, topic_of, keys)
        # Rows grouped by (topic, partition), each group in the rows' order.
        group = topic_of * _MAX_PARTITIONS + partitions
        order = np.argsort(group, kind="stable")
        starts = np.flatnonzero(np.diff(group[order], prepend=-1))
        for first, last in zip(starts, [*starts[1:], rows], strict=True):
            idx = order[first:last]
            g = int(group[idx[0]])
            tp = TopicPartition(self._topic_names[g // _MAX_PARTITIONS], g % _MAX_PARTITIONS)
            writer = self._partitions.get(tp)
            if writer is None:
                writer = _PartitionWriter(
                    tp, self._producer_id, self._config.batch_size, self._config.compression_type
                )
                self._partitions[tp] = writer
            if len(idx) == rows:  # every row to one partition: no copies
                writer.extend(keys or [None] * rows, values, headers, sizes)
            else:
                picked = idx.tolist()
                writer.extend(
                    [keys[i] for i in picked] if keys is not None else [None] * len(picked),
                    [values[i] for i in picked],
                    [headers[i] for i in picked] if headers is not None else None,
                    sizes[idx],
                )
        if not self._replay and (
            sum(w.ready_bytes for w in self._partitions.values()) >= self._send_threshold
        ):
            await self._send_ready()

    async def _topics(self, batch: pa.RecordBatch, names: list[str]) -> np.ndarray:
        """Each row's topic, as an index into `_topic_names`."""
        rows = batch.num_rows
        column = batch.column(names.index("topic")) if "topic" in names else None
        if column is None or column.null_count == rows:
            topics: list[str | None] = [None]
            per_row = np.zeros(rows, dtype=np.int64)
        else:
            encoded = column.dictionary_encode()
            topics = encoded.dictionary.to_pylist()
            per_row = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            if encoded.indices.null_count:
                # Null topics: the option's (index len(topics)).
                per_row[np.asarray(encoded.indices.is_null())] = len(topics)
                topics.append(None)
        ids = np.empty(len(topics), dtype=np.int64)
        for i, topic in enumerate(topics):
            if topic is None:
                topic = self._default_topic
                if topic is None:
                    raise InvalidRequestError(
                        "a row has a null 'topic' and the sink has no 'topic' option to use instead"
                    )
            if topic not in self._topic_ids:
                await self._partition_count(topic)
                self._topic_ids[topic] = len(self._topic_names)
                self._topic_names.append(topic)
            ids[i] = self._topic_ids[topic]
        return ids[per_row]

    async def _partitions_of(
        self,
        batch: pa.RecordBatch,
        names: list[str],
        topic_of: np.ndarray,
        keys: list[bytes | None] | None,
    ) -> np.ndarray:
        """Each row's partition: its `partition` column, else its key's,
        else round-robin by position (per topic)."""
        rows = batch.num_rows
        counts = np.array([self._partition_counts[t] for t in self._topic_names], dtype=np.int64)[
            topic_of
        ]
        out = np.full(rows, -1, dtype=np.int64)
        if "partition" in names:
            column = batch.column(names.index("partition"))
            given = np.asarray(column.is_valid())
            out[given] = column.filter(column.is_valid()).to_numpy().astype(np.int64)
            bad = given & ((out < 0) | (out >= counts))
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                topic = self._topic_names[int(topic_of[row])]
                raise UnknownTopicOrPartitionError(
                    f"a row names partition {int(out[row])} of topic {topic!r}, which has "
                    f"partitions 0 to {int(counts[row]) - 1}"
                )
        if keys is not None:
            for row in np.flatnonzero(out < 0).tolist():
                key = keys[row]
                if key is not None:
                    out[row] = partition_for_key(key, int(counts[row]))
        rest = np.flatnonzero(out < 0)
        if len(rest):
            for t in np.unique(topic_of[rest]).tolist():
                mine = rest[topic_of[rest] == t]
                position = self._round_robin.get(t, 0)
                self._round_robin[t] = position + len(mine)
                out[mine] = (position + np.arange(len(mine))) % counts[mine]
        return out

    async def _partition_count(self, topic: str) -> int:
        meta = await self._cluster.topic(topic, timeout_s=self._config.request_timeout_ms / 1000)
        self._partition_counts[topic] = meta.partition_count
        return meta.partition_count

    # ------------------------------------------------------------- first attempt

    async def _send_ready(self) -> None:
        """Send every ready batch, in order per partition (first attempt)."""
        await asyncio.gather(
            *(self._send_in_order(w) for w in self._partitions.values() if w.ready)
        )

    async def _send_in_order(self, writer: _PartitionWriter) -> None:
        """Up to IN_FLIGHT_MAX batches of the partition in flight at once. When
        one fails for a reason worth retrying, those after it fail too (out of
        order): all of them are sent again from it, and those the broker had
        written come back as duplicates (it remembers the last five batches
        of a producer, and at most five were in flight)."""
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        backoff_s = self._config.retry_backoff_ms / 1000
        while writer.ready:
            window = [writer.ready[i] for i in range(min(IN_FLIGHT_MAX, len(writer.ready)))]
            errors = await asyncio.gather(*(self._send_once(writer.tp, b) for b in window))
            for batch, error in zip(window, errors, strict=True):
                if error is not None:
                    break
                writer.ready.popleft()
                writer.ready_bytes -= len(batch.data)
            else:
                continue
            if not error.retriable:
                raise error
            backoff_s = await self._back_off(writer.tp, error, deadline, backoff_s)

    async def _send(self, tp: TopicPartition, batch: _Batch) -> TidelogError | None:
        """Send one batch until it is written (or found written already):
        None; or the non-retriable error the broker answered. Retriable
        errors are retried, refreshing metadata, until delivery.timeout.ms."""
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        backoff_s = self._config.retry_backoff_ms / 1000
        while True:
            error = await self._send_once(tp, batch)
            if error is None or not error.retriable:
                return error
            backoff_s = await self._back_off(tp, error, deadline, backoff_s)

    async def _send_once(self, tp: TopicPartition, batch: _Batch) -> TidelogError | None:
        """One attempt: None when written (or a duplicate), else the error."""
        address = self._cluster.snapshot.leader_address(tp.topic, tp.partition)
        if address is None:
            return BrokerNotAvailableError(f"{tp}: no leader known")
        try:
            response = await self._streams.produce(address, [(tp, batch.data)])
        except TidelogError as exc:
            return exc
        except TimeoutError:
            return BrokerNotAvailableError(f"{tp}: no answer from {address}")
        result = response.partitions[0]
        if not result.HasField("error") or result.error.code == 0:
            return None
        return error_from_code(result.error.code, result.error.message)

    async def _back_off(
        self, tp: TopicPartition, error: TidelogError, deadline: float, backoff_s: float
    ) -> float:
        """Wait before a retry and refresh metadata; raise past the deadline.
        Returns the next backoff."""
        if time.monotonic() + backoff_s > deadline:
            raise type(error)(
                f"{tp}: not written within kafka.delivery.timeout.ms="
                f"{self._config.delivery_timeout_ms}: {error.message}"
            )
        await asyncio.sleep(backoff_s)
        with _suppress_tidelog():
            await self._cluster.refresh([tp.topic])
        return min(backoff_s * 2, self._config.retry_backoff_max_ms / 1000)

    # ------------------------------------------------------------- replay

    async def _replay_partition(self, writer: _PartitionWriter) -> None:
        """Send what an earlier attempt did not write (see the module doc)."""
        batches = list(writer.ready)
        if not batches:
            return
        start = len(batches)  # index of the first batch to send in order
        for index in range(len(batches) - 1, -1, -1):
            error = await self._send(writer.tp, batches[index])
            if error is None:
                # A duplicate (the earlier attempt wrote it, and so all before
                # it) or appended now (it was the next one): continue after it.
                start = index + 1
                break
            if not isinstance(error, OutOfOrderSequenceError):
                raise error
        else:
            raise ReplayMismatchError(
                f"{writer.tp}: writer {self.writer_key!r} is a replay, but none of its "
                f"{len(batches)} batches lines up with what the earlier attempt wrote: the "
                "task's rows came in another order or number than the first time"
            )
        for batch in batches[start:]:
            error = await self._send(writer.tp, batch)
            if error is not None:
                raise error
        self._resent[writer.tp] = sum(b.count for b in batches[start:])
        writer.ready.clear()


def _as_binary(column: pa.Array) -> pa.Array:
    """A binary or string column as binary (the same buffers)."""
    if pa.types.is_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary())
    return column


def _lengths(column: pa.Array) -> np.ndarray:
    """Each value's length in bytes (0 for nulls), from the offsets buffer."""
    return np.asarray(pc.binary_length(column).fill_null(0), dtype=np.int64)


def _headers_list(column: pa.Array) -> list[list[Header] | None]:
    out: list[list[Header] | None] = []
    for row in column.to_pylist():
        if not row:
            out.append(None)
            continue
        headers = []
        for item in row:
            key = item.get("key")
            if key is None:
                raise InvalidRequestError("a row has a header with a null key")
            headers.append((key, item.get("value")))
        out.append(headers)
    return out


class _suppress_tidelog:
    """`with _suppress_tidelog():` ignores TidelogError (a metadata refresh
    that fails is retried by the next attempt anyway)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, TidelogError)


_loop_thread: LoopThread | None = None
_loop_pid = -1


def _loop() -> LoopThread:
    """This process's event loop thread for the sink's gRPC work: Spark's
    Python workers run many tasks one after another, and grpc.aio does not
    survive a new event loop per task. Created after a fork, never before."""
    global _loop_thread, _loop_pid
    if _loop_thread is None or _loop_pid != os.getpid():
        _loop_thread = LoopThread("tidelog-spark-sink")
        _loop_pid = os.getpid()
    return _loop_thread


def run_task(
    config: ProducerConfig,
    default_topic: str | None,
    writer_key: str,
    batches: Iterator[pa.RecordBatch],
) -> TaskResult:
    """Write one task's rows. Spark's iterator is read on the calling thread;
    the gRPC work runs on the process's loop thread, one hop per Arrow batch."""
    loop = _loop()
    writer = TaskWriter(config, default_topic, writer_key)
    try:
        loop.run(writer.open())
        for batch in batches:
            loop.run(writer.add(batch))
        return loop.run(writer.finish())
    finally:
        loop.run(writer.close())
