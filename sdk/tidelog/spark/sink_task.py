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

Not thread-safe: one task runs one `TaskWriter` on its own event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pyarrow as pa

from tidelog._connection import Cluster, call_error
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
#: Bytes of a record's body besides key, value and headers (two lengths).
RECORD_OVERHEAD = 8
#: Most bytes of ready batches a first attempt collects before sending them
#: (four batches' worth, at most this).
SEND_THRESHOLD_BYTES = 4 * 1024 * 1024

Header = tuple[str, bytes | None]


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
        self.sealed = False

    def add(self, key: bytes | None, value: bytes | None, headers: list[Header] | None) -> None:
        size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        if headers:
            size += 4 + sum(8 + len(k) + len(v or b"") for k, v in headers)
        # Cut before a record that does not fit: the cut depends on the rows
        # alone. The record just added is held back until the next one comes,
        # so that the last one of the task can be sealed alone.
        if self._values and self._pending_bytes + size > self._batch_bytes:
            self._cut(len(self._values))
        self._keys.append(key)
        self._values.append(value)
        self._headers.append(headers)
        self._any_headers = self._any_headers or bool(headers)
        self._pending_bytes += size

    def seal(self) -> None:
        """The task's rows are all in: cut what is pending, its last record alone."""
        if self._values:
            if len(self._values) > 1:
                self._cut(len(self._values) - 1)
            self._cut(1)
        self.sealed = True

    def _cut(self, count: int) -> None:
        keys, self._keys = self._keys[:count], self._keys[count:]
        values, self._values = self._values[:count], self._values[count:]
        headers, self._headers = self._headers[:count], self._headers[count:]
        data = encode_batch(
            values,
            keys=keys if any(k is not None for k in keys) else None,
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
        self._pending_bytes = sum(
            RECORD_OVERHEAD + len(k or b"") + len(v or b"")
            for k, v in zip(self._keys, self._values, strict=True)
        )


class _ProduceStreams:
    """One bidi Produce call per broker address; requests answered in order."""

    def __init__(self, cluster: Cluster, config: ProducerConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._calls: dict[str, Any] = {}
        self._waiting: dict[str, deque[asyncio.Future[log_pb2.ProduceResponse]]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._correlation = 0

    async def produce(
        self, address: str, parts: list[tuple[TopicPartition, bytes]]
    ) -> log_pb2.ProduceResponse:
        call = self._calls.get(address)
        if call is None:
            call = self._cluster.log_stub(address).Produce()
            self._calls[address] = call
            self._waiting[address] = deque()
            self._readers[address] = asyncio.ensure_future(self._read(address, call))
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
        self._waiting[address].append(future)
        try:
            await call.write(request)
        except Exception as exc:  # a stream that ended: every waiting request fails
            self._broken(address, exc)
        return await asyncio.wait_for(future, self._config.request_timeout_ms / 1000 + 5)

    async def _read(self, address: str, call: Any) -> None:
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:  # type: ignore[attr-defined]
                    raise BrokerNotAvailableError(f"{address} closed the produce stream")
                waiting = self._waiting[address]
                if waiting:
                    future = waiting.popleft()
                    if not future.done():
                        future.set_result(response)
        except (grpc.aio.AioRpcError, TidelogError) as exc:
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
        #: Round-robin position per topic of the rows without key or partition.
        self._round_robin: dict[str, int] = {}
        self._producer_id = -1
        self._replay = False
        self._resent: dict[TopicPartition, int] = {}
        # A record larger than this can never be sent: refuse it by name.
        self._record_bytes_max = config.max_request_size - HEADER_SIZE - 1024
        self._send_threshold = min(SEND_THRESHOLD_BYTES, 4 * config.batch_size)

    # ------------------------------------------------------------- the task

    async def write(self, batches: Iterable[pa.RecordBatch]) -> TaskResult:
        try:
            self._producer_id, epoch = await self._init_producer_id()
            self._replay = epoch > 0
            if self._replay:
                log.warning(
                    "sink writer %s: attempt %d (an earlier one existed): writing only what "
                    "it did not",
                    self.writer_key,
                    epoch + 1,
                )
            for batch in batches:
                await self._add(batch)
            for writer in self._partitions.values():
                writer.seal()
            if self._replay:
                writers = self._partitions.values()
                await asyncio.gather(*(self._replay_partition(w) for w in writers))
            else:
                await self._send_ready()
        finally:
            await self._streams.close()
            await self._cluster.close()
        return TaskResult(
            self.writer_key,
            self._producer_id,
            self._replay,
            {str(tp): w.count for tp, w in self._partitions.items()},
            {str(tp): n for tp, n in self._resent.items()},
        )

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
        if batch.num_rows == 0:
            return
        names = batch.schema.names
        values = _binary_list(batch.column(names.index("value")))
        keys = _binary_list(batch.column(names.index("key"))) if "key" in names else None
        topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else None
        partitions = (
            batch.column(names.index("partition")).to_pylist() if "partition" in names else None
        )
        headers = (
            _headers_list(batch.column(names.index("headers"))) if "headers" in names else None
        )
        for i, value in enumerate(values):
            topic = topics[i] if topics is not None else None
            if topic is None:
                topic = self._default_topic
                if topic is None:
                    raise InvalidRequestError(
                        "a row has a null 'topic' and the sink has no 'topic' option to use instead"
                    )
            key = keys[i] if keys is not None else None
            row_headers = headers[i] if headers is not None else None
            size = len(value or b"") + len(key or b"")
            if size > self._record_bytes_max:
                raise MessageTooLargeError(
                    f"a record of {size} bytes (key and value) does not fit in a request of "
                    f"kafka.max.request.size={self._config.max_request_size} bytes"
                )
            count = self._partition_counts.get(topic)
            if count is None:
                count = await self._partition_count(topic)
            partition = partitions[i] if partitions is not None else None
            if partition is None:
                if key is not None:
                    partition = partition_for_key(key, count)
                else:
                    position = self._round_robin.get(topic, 0)
                    self._round_robin[topic] = position + 1
                    partition = position % count
            elif not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"a row names partition {partition} of topic {topic!r}, which has "
                    f"partitions 0 to {count - 1}"
                )
            tp = TopicPartition(topic, partition)
            writer = self._partitions.get(tp)
            if writer is None:
                writer = _PartitionWriter(
                    tp, self._producer_id, self._config.batch_size, self._config.compression_type
                )
                self._partitions[tp] = writer
            writer.add(key, value, row_headers)
        if not self._replay and (
            sum(w.ready_bytes for w in self._partitions.values()) >= self._send_threshold
        ):
            await self._send_ready()

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
        while writer.ready:
            batch = writer.ready[0]
            error = await self._send(writer.tp, batch)
            if error is not None:
                raise error
            writer.ready.popleft()
            writer.ready_bytes -= len(batch.data)

    async def _send(self, tp: TopicPartition, batch: _Batch) -> TidelogError | None:
        """Send one batch until it is written (or found written already):
        None; or the non-retriable error the broker answered. Retriable
        errors are retried, refreshing metadata, until delivery.timeout.ms."""
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        backoff_s = self._config.retry_backoff_ms / 1000
        while True:
            error: TidelogError
            address = self._cluster.snapshot.leader_address(tp.topic, tp.partition)
            if address is None:
                error = BrokerNotAvailableError(f"{tp}: no leader known")
            else:
                try:
                    response = await self._streams.produce(address, [(tp, batch.data)])
                    result = response.partitions[0]
                    if not result.HasField("error") or result.error.code == 0:
                        return None
                    error = error_from_code(result.error.code, result.error.message)
                except TidelogError as exc:
                    error = exc
                except TimeoutError:
                    error = BrokerNotAvailableError(f"{tp}: no answer from {address}")
            if not error.retriable:
                return error
            if time.monotonic() + backoff_s > deadline:
                raise type(error)(
                    f"{tp}: not written within kafka.delivery.timeout.ms="
                    f"{self._config.delivery_timeout_ms}: {error.message}"
                )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._config.retry_backoff_max_ms / 1000)
            with _suppress_tidelog():
                await self._cluster.refresh([tp.topic])

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


def _binary_list(column: pa.Array) -> list[bytes | None]:
    """A binary or string column as bytes (None for nulls)."""
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


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


def run_task(
    config: ProducerConfig,
    default_topic: str | None,
    writer_key: str,
    batches: Iterator[pa.RecordBatch],
) -> TaskResult:
    """Run one task's write on an event loop of its own (Spark's Python
    workers run one task at a time)."""
    return asyncio.run(TaskWriter(config, default_topic, writer_key).write(batches))
