"""`tidelog.v1.Records`: the record-level API (protos records.proto), for
clients that need nothing but generated code, or grpcurl and JSON.

The gateway does the client's work with the Python SDK it is built on:

- Produce: one `AsyncProducer` per acks level, shared by every stream,
  bootstrapped at the live brokers. It batches, encodes, partitions
  (murmur2 of the key) and retries; ACKS_ALL makes it idempotent. Each
  request's records are sent in order; the answer (one result per record)
  goes out once all of them are resolved, in request order. A record whose
  topic or partition the etcd view does not know is answered at once with
  its typed error (no wait for metadata).
- Consume: one `AsyncConsumer` per stream, on the partitions the client
  names; the client's credit is a number of records, and the consumer's
  fetch window follows it (`records_common.CreditWindow`), so a stream
  whose client stops reading holds about the records it granted. The
  streams' consumers are spread over `upstream_connections` connections
  to each broker. A partition that fails is reported in `errors` and no
  longer read until the client sends a new position.

- Consume in a group (the first request sets `group`): `records_group`.

Limits: RECORDS_PER_REQUEST records per produce request; a consume stream's
credit and response size (`records_common`); streams count against the
gateway's stream limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from operator import attrgetter, methodcaller
from typing import Any, NamedTuple

import grpc
import grpc.aio
from tidelog import AsyncConsumer, AsyncProducer, TopicPartition
from tidelog.errors import (
    InvalidRequestError,
    OffsetOutOfRangeError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.partitioner import partition_for_key
from tidelog.producer import Placement
from tidelog.v1 import log_pb2, records_pb2, records_pb2_grpc
from tidelog_server.draining import next_unless_drained
from tidelog_server.owed_answers import OwedAnswers
from tidelog_server.tls import client_options

from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.errors import abort, abort_shutting_down, error_proto
from tidelog_gateway.limits import StreamCounter
from tidelog_gateway.log_servicer import _open_stream
from tidelog_gateway.records_common import (
    MAX_RECORDS_PER_RESPONSE,
    POLL_MS,
    CreditWindow,
    add_records,
    apply_requests,
    check_credit,
    consumer_options,
)
from tidelog_gateway.records_group import GroupConsumeSession
from tidelog_gateway.records_results import ResponseBuilder, varint

log = logging.getLogger("tidelog.gateway.records")

RECORDS_PER_REQUEST = 10_000

_ACKS: dict[int, int | str] = {
    records_pb2.ACKS_UNSPECIFIED: 1,
    records_pb2.ACKS_LEADER: 1,
    records_pb2.ACKS_ALL: "all",
    records_pb2.ACKS_NONE: 0,
}


class RecordsServicer(records_pb2_grpc.RecordsServicer):
    def __init__(
        self,
        view: ClusterView,
        config: GatewayConfig,
        streams: StreamCounter,
        draining: asyncio.Event,
    ) -> None:
        self._view = view
        self._config = config
        self._streams = streams
        self._draining = draining
        self._producers: dict[int | str, AsyncProducer] = {}
        self._producer_lock = asyncio.Lock()
        self._consume_streams = 0

    async def close(self) -> None:
        producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            with contextlib.suppress(Exception):
                await producer.stop(5)

    def _bootstrap(self) -> list[str]:
        brokers = self._view.broker_addresses()
        if not brokers:
            raise UnknownTopicOrPartitionError("no broker is registered in the cluster: retry")
        return brokers

    async def _producer(self, acks: int | str) -> AsyncProducer:
        async with self._producer_lock:
            producer = self._producers.get(acks)
            if producer is None:
                producer = AsyncProducer(
                    self._bootstrap(),
                    acks=acks,
                    linger_ms=2,
                    max_block_ms=10_000,
                    request_timeout_ms=self._config.producer_request_timeout_ms,
                    **client_options(self._config.tls),
                )
                await producer.start()
                self._producers[acks] = producer
            return producer

    # ------------------------------------------------------------ produce

    async def Produce(
        self,
        request_iterator: AsyncIterator[records_pb2.RecordsProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[records_pb2.RecordsProduceResponse]:
        peer = await _open_stream(self._streams, request_iterator, context)
        owed: OwedAnswers[asyncio.Future[records_pb2.RecordsProduceResponse]] = OwedAnswers(
            self._config.max_pending_produce
        )

        async def read() -> None:
            producer: AsyncProducer | None = None
            requests = aiter(request_iterator)
            drained = asyncio.ensure_future(self._draining.wait())
            try:
                # Stop reading at once on drain (an idle stream too); a
                # request already read is always sent whole.
                while (request := await next_unless_drained(requests, drained)) is not None:
                    if producer is None:
                        if request.acks not in _ACKS:
                            raise InvalidRequestError(
                                f"acks must be one of ACKS_LEADER, ACKS_ALL, ACKS_NONE, "
                                f"got {request.acks}"
                            )
                        producer = await self._producer(_ACKS[request.acks])
                    if len(request.records) > RECORDS_PER_REQUEST:
                        raise InvalidRequestError(
                            f"a produce request holds {len(request.records)} records, over the "
                            f"limit of {RECORDS_PER_REQUEST}: split it"
                        )
                    owed.push(await self._send(producer, request))
                    # max_pending_produce answers owed: read no more until
                    # the client takes some (back-pressure).
                    await owed.room()
            except TidelogError as exc:
                owed.end(exc)
            except grpc.aio.AioRpcError:
                pass  # the client went away
            finally:
                drained.cancel()
                owed.end()

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await owed.get()) is not None:
                yield await answer
            if owed.error is not None:
                await abort(context, owed.error, "producing records")
            if self._draining.is_set():
                await abort_shutting_down(context, "send again")
        finally:
            reader.cancel()
            for left in owed.take_all():
                left.cancel()
            self._streams.release(peer)

    async def _send(
        self, producer: AsyncProducer, request: records_pb2.RecordsProduceRequest
    ) -> asyncio.Future[records_pb2.RecordsProduceResponse]:
        """Queue the request's records; the future of its answer.

        The records are read once into columns, one set per (topic,
        partition) they go to (`_Group`; keyless records without a partition
        form one group per topic, for the producer's sticky partition), and
        each set is handed to the producer at once (`AsyncProducer.
        send_batch`): no per-record call into the SDK, no per-record future.
        A record refused here (unknown topic or partition, a malformed
        field) is answered with its typed error; the others are unaffected.
        """
        records = request.records
        now_ms = time.time_ns() // 1_000_000
        plain = _plain_records(records)
        if plain is not None:
            groups, refused = await self._plain_groups(producer, plain, now_ms)
        else:
            groups, refused = await self._groups(producer, records, now_ms)
        placed: list[tuple[_Group, list[Placement] | BaseException]] = []
        for group in groups:
            try:
                placements: list[Placement] | BaseException = await producer.send_batch(
                    group.topic,
                    group.values,
                    timestamps=group.timestamps,
                    keys=group.keys,
                    headers=group.headers,
                    partition=None if group.partition < 0 else group.partition,
                )
            except (TidelogError, ValueError, TypeError) as exc:
                placements = exc
            placed.append((group, placements))
        return asyncio.ensure_future(_answer(request.correlation_id, records, placed, refused))

    async def _plain_groups(
        self, producer: AsyncProducer, plain: _Plain, now_ms: int
    ) -> tuple[list[_Group], dict[int, BaseException]]:
        """The groups of a request of plain records (`_plain_records`):
        one (the sticky partition) without keys, else one per partition
        the keys hash to."""
        count = len(plain.values)
        known = await self._topic(producer, plain.topic)
        if not isinstance(known, _Topic):
            return [], dict.fromkeys(range(count), known)
        if plain.keys is None:
            group = _Group(plain.topic, -1)
            group.indices = list(range(count))
            group.values = plain.values  # type: ignore[assignment]
            group.timestamps = [now_ms] * count
            return [group], {}
        partitions = known.producer_count
        chosen = [partition_for_key(key, partitions) for key in plain.keys]
        groups: dict[int, _Group] = {}
        for index, partition in enumerate(chosen):
            found = groups.get(partition)
            if found is None:
                found = groups[partition] = _Group(plain.topic, partition)
            found.indices.append(index)
        keys, values = plain.keys, plain.values
        for found in groups.values():
            found.values = [values[i] for i in found.indices]
            found.keys = [keys[i] for i in found.indices]
            found.timestamps = [now_ms] * len(found.indices)
        return list(groups.values()), {}

    async def _groups(
        self,
        producer: AsyncProducer,
        records: Sequence[records_pb2.ProduceRecord],
        now_ms: int,
    ) -> tuple[list[_Group], dict[int, BaseException]]:
        """The request's records as columns by (topic, partition), and the
        records refused (by position)."""
        groups: dict[tuple[str, int], _Group] = {}
        refused: dict[int, BaseException] = {}
        topics: dict[str, _Topic | TidelogError] = {}
        for index, record in enumerate(records):
            topic = record.topic
            known = topics.get(topic)
            if known is None:
                known = topics[topic] = await self._topic(producer, topic)
            if not isinstance(known, _Topic):
                refused[index] = known
                continue
            # Each field read builds a wrapper or crosses into C: read each
            # once, the common (unset) cases first.
            key = None if record.WhichOneof("key_kind") is None else _key(record)
            value = record.value or _value(record)
            if record.HasField("partition"):
                partition = record.partition
                if not 0 <= partition < known.view_count:
                    refused[index] = _no_partition(topic, partition, known.view_count)
                    continue
            elif key is not None:
                partition = partition_for_key(key, known.producer_count)
            else:
                partition = -1
            group = groups.get((topic, partition))
            if group is None:
                group = groups[(topic, partition)] = _Group(topic, partition)
            group.indices.append(index)
            group.values.append(value)
            group.timestamps.append(
                record.timestamp_ms if record.HasField("timestamp_ms") else now_ms
            )
            if key is not None or group.keys is not None:
                if group.keys is None:
                    group.keys = [None] * (len(group.values) - 1)
                group.keys.append(key)
            headers = record.headers  # each access builds a wrapper: once
            if headers or group.headers is not None:
                if group.headers is None:
                    group.headers = [None] * (len(group.values) - 1)
                group.headers.append([(h.key, h.value) for h in headers] if headers else None)
        return list(groups.values()), refused

    async def _topic(self, producer: AsyncProducer, topic: str) -> _Topic | TidelogError:
        """The partition counts of a topic (the etcd view's, which explicit
        partitions are checked against, and the producer's, which keys are
        hashed with), or why its records are refused."""
        try:
            count = len(self._view.topic(topic).replicas)
            return _Topic(count, await producer.partition_count(topic))
        except TidelogError as exc:
            return exc

    # ------------------------------------------------------------ consume

    async def Consume(
        self,
        request_iterator: AsyncIterator[records_pb2.ConsumeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[records_pb2.ConsumeResponse]:
        peer = await _open_stream(self._streams, request_iterator, context)
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None:
                return
            requests = _chain(first, request_iterator)
            session: _ConsumeSession | GroupConsumeSession
            # Round-robin over the gateway's connections to each broker.
            self._consume_streams += 1
            options = consumer_options(
                self._consume_streams % self._config.upstream_connections, self._config.tls
            )
            try:
                if first.HasField("group"):
                    session = GroupConsumeSession(self._view, self._bootstrap(), first, options)
                else:
                    session = _ConsumeSession(self._view, self._bootstrap(), options)
            except TidelogError as exc:
                await abort(context, exc, "consuming records")
            try:
                responses = session.run(requests, self._draining)
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        yield response
            except TidelogError as exc:
                await abort(context, exc, "consuming records")
            finally:
                await session.close()
            if self._draining.is_set():
                await abort_shutting_down(context, "consume again from your positions")
        finally:
            self._streams.release(peer)


async def _chain(
    first: records_pb2.ConsumeRequest, rest: AsyncIterator[records_pb2.ConsumeRequest]
) -> AsyncIterator[records_pb2.ConsumeRequest]:
    yield first
    async for request in rest:
        yield request


_TOPIC = attrgetter("topic")
_VALUE = attrgetter("value")
_KEY = attrgetter("key")
_BYTE_SIZE = methodcaller("ByteSize")


class _Plain(NamedTuple):
    """A request of plain records (`_plain_records`), as columns."""

    topic: str
    #: None: no record has a key.
    keys: list[bytes] | None
    values: list[bytes]


def _plain_records(records: Sequence[records_pb2.ProduceRecord]) -> _Plain | None:
    """The request as columns when every record names one topic and sets
    nothing but a non-empty bytes value and, on all records or none, a
    non-empty bytes key (no partition, headers or timestamp): the shape of
    most bulk producers, read here with C-speed passes over the records
    instead of a Python loop reading each field. Else None.

    The sizes prove it: a record whose `value` (`key`) is non-empty has its
    bytes value (key) set, which with its topic takes exactly the bytes
    counted here; any other field set would add at least two bytes to its
    ByteSize.
    """
    if not records:
        return None
    topic = records[0].topic
    values: list[bytes] = list(map(_VALUE, records))
    if not topic or not all(values) or list(map(_TOPIC, records)).count(topic) != len(records):
        return None
    name = len(topic.encode())
    value_field = _field_sizes(values)
    if value_field is None:
        return None
    # topic: tag, length, bytes; value: tag, length, bytes.
    sizes = list(map((1 + len(varint(name)) + name).__add__, value_field))
    keys: list[bytes] | None = list(map(_KEY, records))
    assert keys is not None
    if all(keys):
        key_field = _field_sizes(keys)
        if key_field is None:
            return None
        sizes = list(map(operator.add, sizes, key_field))
    elif any(keys):
        return None
    else:
        keys = None
    if list(map(_BYTE_SIZE, records)) != sizes:
        return None
    return _Plain(topic, keys, values)


def _field_sizes(column: list[bytes]) -> list[int] | None:
    """The bytes each item takes as a length-delimited field (tag, length,
    bytes), when every length prefix has the same size; else None (mixed
    sizes are not worth a per-item varint here)."""
    lengths = list(map(len, column))
    width = len(varint(max(lengths)))
    if len(varint(min(lengths))) != width:
        return None
    return list(map((1 + width).__add__, lengths))


def _no_partition(topic: str, partition: int, count: int) -> UnknownTopicOrPartitionError:
    return UnknownTopicOrPartitionError(
        f"partition {partition} of topic {topic!r} does not exist: "
        f"the topic has partitions 0 to {count - 1}"
    )


class _Topic(NamedTuple):
    #: Partitions in the gateway's etcd view.
    view_count: int
    #: Partitions as the producer knows them (the murmur2 modulus).
    producer_count: int


class _Group:
    """The records of one request bound for one (topic, partition), as
    columns (partition -1: keyless, the producer's sticky partition)."""

    __slots__ = ("headers", "indices", "keys", "partition", "timestamps", "topic", "values")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        #: Each record's position in the request.
        self.indices: list[int] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        # None until the first keyed record / record with headers.
        self.keys: list[bytes | None] | None = None
        self.headers: list[Sequence[tuple[str, bytes | None]] | None] | None = None


async def _answer(
    correlation_id: int,
    records: Sequence[records_pb2.ProduceRecord],
    placed: list[tuple[_Group, list[Placement] | BaseException]],
    refused: dict[int, BaseException],
) -> records_pb2.RecordsProduceResponse:
    """The request's answer, one result per record in request order, once
    every batch its records went to is resolved (encoded a run of records
    at a time: `records_results`)."""
    response = ResponseBuilder(correlation_id, len(records))
    for index, refusal in refused.items():
        response.failed(index, _error_result(records[index], refusal))
    for group, placements in placed:
        if isinstance(placements, BaseException):
            for index in group.indices:
                response.failed(index, _error_result(records[index], placements))
            continue
        start = 0
        for result, first, length in placements:
            indices = group.indices[start : start + length]
            start += length
            error: BaseException | None
            try:
                await result.wait_async()
            except asyncio.CancelledError as exc:
                error = exc
            else:
                error = result.error
            if error is not None:
                for index in indices:
                    response.failed(index, _error_result(records[index], error))
                continue
            response.written(
                indices,
                group.topic,
                result.partition,
                result.base_offset + first if result.base_offset >= 0 else -1,
                [result.log_append_time_ms] * length
                if result.log_append_time_ms >= 0
                else result.timestamps[first : first + length],
            )
    return response.build()


def _error_result(
    record: records_pb2.ProduceRecord, error: BaseException
) -> records_pb2.RecordResult:
    result = records_pb2.RecordResult(topic=record.topic, offset=-1, timestamp_ms=-1)
    if record.HasField("partition"):
        result.partition = record.partition
    if isinstance(error, TidelogError):
        result.error.CopyFrom(error_proto(error, "producing a record"))
    else:
        result.error.CopyFrom(
            error_proto(InvalidRequestError(f"the record was refused: {error}"), "producing")
        )
    return result


def _key(record: records_pb2.ProduceRecord) -> bytes | None:
    kind = record.WhichOneof("key_kind")
    if kind == "key":
        return record.key
    if kind == "key_text":
        return record.key_text.encode()
    return None


def _value(record: records_pb2.ProduceRecord) -> bytes | None:
    kind = record.WhichOneof("value_kind")
    if kind == "value":
        return record.value
    if kind == "value_text":
        return record.value_text.encode()
    return None


class _ConsumeSession:
    """One Consume stream: its consumer, credit and settings."""

    def __init__(self, view: ClusterView, bootstrap: list[str], options: dict[str, Any]) -> None:
        self._view = view
        self._consumer = AsyncConsumer(
            bootstrap_servers=bootstrap, auto_offset_reset="none", **options
        )
        self._window = CreditWindow(self._consumer, view)
        self._assignment: set[TopicPartition] = set()
        self._credit = 0
        self._text = False
        self._max_records = MAX_RECORDS_PER_RESPONSE
        self._first = True
        self._errors: list[records_pb2.PartitionError] = []
        self._changed = asyncio.Event()
        self._input_closed = False
        self._failure: BaseException | None = None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._consumer.stop()

    async def run(
        self, requests: AsyncIterator[records_pb2.ConsumeRequest], draining: asyncio.Event
    ) -> AsyncGenerator[records_pb2.ConsumeResponse]:
        await self._consumer.start()
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while not draining.is_set():
                if self._failure is not None:
                    raise self._failure
                if self._errors:
                    errors, self._errors = self._errors, []
                    yield records_pb2.ConsumeResponse(errors=errors)
                    continue
                if self._credit <= 0 or not self._assignment:
                    if self._input_closed:
                        return
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(POLL_MS / 1000):
                            await self._changed.wait()
                    continue
                try:
                    batch = await self._consumer.getmany(
                        timeout_ms=POLL_MS, max_records=min(self._credit, self._max_records)
                    )
                except TidelogError as exc:
                    self._fail_partition(exc)
                    continue
                response = records_pb2.ConsumeResponse()
                add_records(response, batch.values(), self._text)
                if response.records:
                    self._credit -= len(response.records)
                    self._window.sent(response)
                    self._window.update(self._credit)
                    yield response
        finally:
            reader.cancel()

    async def _read(self, requests: AsyncIterator[records_pb2.ConsumeRequest]) -> None:
        failure = await apply_requests(requests, self._apply)
        if failure is not None:
            self._failure = failure
        self._input_closed = True
        self._changed.set()

    async def _apply(self, request: records_pb2.ConsumeRequest) -> None:
        check_credit(request, self._credit)
        if request.HasField("group") and not self._first:
            raise InvalidRequestError("group is read from the first request of a stream only")
        if request.HasField("commit"):
            raise InvalidRequestError("commits need a group stream: set group in the first request")
        named = len(request.positions) + len(request.remove)
        if named > RECORDS_PER_REQUEST:
            raise InvalidRequestError(
                f"a consume request names {named} partitions, over the limit of "
                f"{RECORDS_PER_REQUEST}"
            )
        if self._first:
            self._first = False
            self._text = request.text
        if request.max_records:
            self._max_records = request.max_records
        removed = {TopicPartition(tp.topic, tp.partition) for tp in request.remove}
        placed: list[tuple[TopicPartition, records_pb2.ConsumePosition]] = []
        for position in request.positions:
            tp = TopicPartition(position.topic, position.partition)
            try:
                self._check(position)
            except TidelogError as exc:
                self._report(tp, exc)
                removed.add(tp)
                continue
            placed.append((tp, position))
        assignment = (self._assignment - removed) | {tp for tp, _ in placed}
        if assignment != self._assignment:
            self._consumer.assign(assignment)
            self._assignment = assignment
            self._window.assigned(assignment)
        for tp, position in placed:
            if position.WhichOneof("start") == "offset":
                self._consumer.seek(tp, position.offset)
            elif position.spec == log_pb2.LATEST:
                await self._consumer.seek_to_end(tp)
            else:
                await self._consumer.seek_to_beginning(tp)
        self._credit += request.credit_records
        self._window.update(self._credit)
        self._changed.set()

    def _check(self, position: records_pb2.ConsumePosition) -> None:
        start = position.WhichOneof("start")
        if start == "offset" and position.offset < 0:
            raise InvalidRequestError(
                f"offset must be >= 0 for {position.topic}-{position.partition}, "
                f"got {position.offset}"
            )
        if start == "spec" and position.spec not in (log_pb2.EARLIEST, log_pb2.LATEST):
            raise InvalidRequestError("spec must be EARLIEST or LATEST")
        self._view.leader_address(position.topic, position.partition)

    def _report(self, tp: TopicPartition, exc: TidelogError) -> None:
        self._errors.append(
            records_pb2.PartitionError(
                topic=tp.topic, partition=tp.partition, error=error_proto(exc, "consuming")
            )
        )
        self._changed.set()

    def _fail_partition(self, exc: TidelogError) -> None:
        """A partition the consumer could not read: report it, stop reading it."""
        if exc.topic is None or exc.partition is None:
            raise exc
        tp = TopicPartition(exc.topic, exc.partition)
        if tp not in self._assignment or not isinstance(
            exc, OffsetOutOfRangeError | UnknownTopicOrPartitionError
        ):
            raise exc
        self._report(tp, exc)
        self._assignment.discard(tp)
        self._consumer.assign(self._assignment)
        self._window.assigned(self._assignment)
