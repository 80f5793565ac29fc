"""One client's Produce stream through the gateway.

Each client request is split by leader: the partitions led by one broker
go, in one request, down this stream's own Produce stream to that broker
(one per broker, opened on first use), with the client's acks and timeout.
Record batches pass through untouched. The answers are put back together in
the client's partition order and sent in the order the requests came, as a
broker does, so pipelining clients (the SDK) match them by correlation id.

Per partition, what cannot be routed is answered at once with its typed
error: an invalid name INVALID_TOPIC, an unknown topic or partition
UNKNOWN_TOPIC_OR_PARTITION, a partition without a live leader
NOT_LEADER_OR_FOLLOWER (retriable). A broker's own per-partition errors are
passed through. When a broker's stream breaks, the partitions of every
request still waiting on it get NOT_LEADER_OR_FOLLOWER, whose message names
the broker and what happened (tidelog_server.forwarding.failure_of: it
dropped the stream, overloaded or stopping; it was unavailable; ...): the
leader is gone, moving or overloaded, and the client retries (an idempotent
producer's retry is never written twice). The gateway does not send such a
request again itself: the broker may have appended it, and only the client
knows whether a second copy is acceptable.

Ordering per partition holds because one client stream maps to one stream
per broker, and a broker appends and answers in arrival order.

Memory: the stream reads the next client request only once the previous one
has been handed to the brokers' streams, and its record bytes count against
the gateway-wide produce budget until then; at most `max_pending_produce`
answers may be owed (then it stops reading, which pushes back on the client).
The end of the reading (the client's half-close, a refusal, the drain)
reaches the writer however many answers are owed
(tidelog_server.owed_answers): a client that pipelines without reading gets
its refusal, or the end of its stream, once it reads.

A request naming more partitions than --max-partitions-per-request is
refused before any of it is forwarded: the stream answers the requests
before it, then ends INVALID_ARGUMENT naming the limit, in words and in the
trailing metadata key `tidelog-max-partitions-per-request` (which the
stream's initial metadata also carries, log_servicer); the requests after
it are not read. None of the refused request is written, so the SDK sends
it (and those after it) again in requests within the limit.

Drain (SIGTERM): the stream stops reading requests, answers every request it
has forwarded, then ends with UNAVAILABLE and NOT_LEADER_OR_FOLLOWER in the
trailer (errors.abort_shutting_down); the SDK retries what was not answered
on a new stream, through another gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio
from tidelog.errors import (
    InvalidRequestError,
    NotLeaderOrFollowerError,
    PartitionsPerRequestError,
    TidelogError,
)
from tidelog.v1 import log_pb2
from tidelog_server.draining import next_unless_drained
from tidelog_server.forwarding import failure_of
from tidelog_server.owed_answers import OwedAnswers

from tidelog_gateway.channels import Channels
from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.config import GatewayConfig
from tidelog_gateway.errors import abort, abort_shutting_down, error_proto
from tidelog_gateway.limits import ByteBudget

log = logging.getLogger("tidelog.gateway.produce")

_VALID_ACKS = (-1, 0, 1)
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]


class UpstreamLostError(Exception):
    """A broker's Produce stream broke before answering."""


@dataclass
class _Part:
    """The part of one client request sent to one broker."""

    #: Index of each sub-request partition in the client's request.
    indexes: list[int]
    answer: asyncio.Future[log_pb2.ProduceResponse]


class _Upstream:
    """This stream's Produce stream to one broker, answers matched in order."""

    def __init__(self, address: str, channels: Channels) -> None:
        self.address = address
        self._call = channels.log_streams(address).Produce()
        self._waiting: deque[asyncio.Future[log_pb2.ProduceResponse]] = deque()
        self._write_lock = asyncio.Lock()
        self.broken = False
        self._reader = asyncio.ensure_future(self._read_loop())

    async def send(
        self, request: log_pb2.ProduceRequest, expects_answer: bool
    ) -> asyncio.Future[log_pb2.ProduceResponse] | None:
        answer: asyncio.Future[log_pb2.ProduceResponse] | None = None
        if expects_answer:
            answer = asyncio.get_running_loop().create_future()
            self._waiting.append(answer)
        async with self._write_lock:
            try:
                if self.broken:
                    raise UpstreamLostError(f"broker {self.address}: the stream is closed")
                await self._call.write(request)
            except grpc.aio.AioRpcError as exc:
                self._fail(UpstreamLostError(failure_of(exc, f"broker {self.address}")))
            except (asyncio.InvalidStateError, UpstreamLostError) as exc:
                self._fail(UpstreamLostError(f"broker {self.address}: writing failed: {exc}"))
        return answer

    async def _read_loop(self) -> None:
        error: Exception
        try:
            while True:
                response = await self._call.read()
                if response is _EOF:
                    error = UpstreamLostError(f"broker {self.address} ended the produce stream")
                    break
                if not self._waiting:
                    error = UpstreamLostError(
                        f"broker {self.address} answered a request never sent"
                    )
                    break
                answer = self._waiting.popleft()
                if not answer.done():
                    answer.set_result(response)
        except grpc.aio.AioRpcError as exc:
            error = UpstreamLostError(failure_of(exc, f"broker {self.address}"))
        except asyncio.CancelledError:
            self._fail(UpstreamLostError("the gateway closed the stream"))
            raise
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        self.broken = True
        self._call.cancel()
        while self._waiting:
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_exception(error)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class ProduceProxy:
    """One client Produce stream (see module doc)."""

    def __init__(
        self,
        view: ClusterView,
        channels: Channels,
        config: GatewayConfig,
        budget: ByteBudget,
        draining: asyncio.Event,
    ) -> None:
        self._view = view
        self._channels = channels
        self._config = config
        self._budget = budget
        self._draining = draining
        self._upstreams: dict[str, _Upstream] = {}

    async def run(
        self,
        request_iterator: AsyncIterator[log_pb2.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[log_pb2.ProduceResponse, None]:
        owed: OwedAnswers[asyncio.Future[log_pb2.ProduceResponse]] = OwedAnswers(
            self._config.max_pending_produce
        )
        reader = asyncio.ensure_future(self._read_requests(request_iterator, owed))
        try:
            while (answer := await owed.get()) is not None:
                yield await answer
            if owed.error is not None:
                await abort(context, owed.error, "producing through the gateway")
            if self._draining.is_set():
                await abort_shutting_down(context, "send unanswered requests again")
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            for left in owed.take_all():
                left.cancel()
            for upstream in self._upstreams.values():
                await upstream.close()

    async def _read_requests(
        self,
        requests: AsyncIterator[log_pb2.ProduceRequest],
        owed: OwedAnswers[asyncio.Future[log_pb2.ProduceResponse]],
    ) -> None:
        """Read, forward and owe the client's requests until its side ends, a
        request is refused (TidelogError, the stream's end) or the gateway
        drains; whatever ends it, `owed.end` tells the writer."""
        iterator = aiter(requests)
        drained = asyncio.ensure_future(self._draining.wait())
        try:
            # Stop reading at once on drain; a request already read is
            # always forwarded whole (never half its partitions).
            while (request := await next_unless_drained(iterator, drained)) is not None:
                answer = await asyncio.shield(self._forward(request))
                if answer is not None:
                    owed.push(answer)
                    # max_pending_produce answers owed: read no more until
                    # the client takes some (back-pressure).
                    await owed.room()
        except TidelogError as exc:
            owed.end(exc)
        except grpc.aio.AioRpcError:
            return  # the client went away
        finally:
            drained.cancel()
            owed.end()

    async def _forward(
        self, request: log_pb2.ProduceRequest
    ) -> asyncio.Future[log_pb2.ProduceResponse] | None:
        """Send the request's partitions to their leaders; the future of its
        answer (None for acks=0). Raises InvalidRequestError for a request
        that breaks the protocol."""
        if request.acks not in _VALID_ACKS:
            raise InvalidRequestError(f"acks must be -1 (all), 0 or 1, got {request.acks}")
        limit = self._config.max_partitions_per_request
        if len(request.partitions) > limit:
            # Before any of it is routed: refused whole, so the client may
            # split it and send it again without writing anything twice.
            raise PartitionsPerRequestError(
                f"a produce request names {len(request.partitions)} partitions, over the "
                f"limit of {limit} (--max-partitions-per-request): split it",
                limit,
            )
        if request.timeout_ms < 0:
            raise InvalidRequestError(f"timeout_ms must be >= 0, got {request.timeout_ms}")
        response = log_pb2.ProduceResponse(correlation_id=request.correlation_id)
        by_address: dict[str, tuple[log_pb2.ProduceRequest, list[int]]] = {}
        seen: set[tuple[str, int]] = set()
        size = 0
        for index, part in enumerate(request.partitions):
            result = response.partitions.add(topic=part.topic, partition=part.partition)
            key = (part.topic, part.partition)
            try:
                if key in seen:
                    raise InvalidRequestError(
                        f"{part.topic}-{part.partition} appears twice in one request: "
                        "put all its batches in one PartitionRecords"
                    )
                seen.add(key)
                address = self._view.leader_address(part.topic, part.partition)
            except TidelogError as exc:
                _fail_result(result, error_proto(exc, "routing a produce request"))
                continue
            sub, indexes = by_address.setdefault(
                address,
                (log_pb2.ProduceRequest(acks=request.acks, timeout_ms=request.timeout_ms), []),
            )
            sub.partitions.append(part)
            indexes.append(index)
            size += len(part.records)
        expects_answer = request.acks != 0
        await self._budget.acquire(size)
        parts: list[tuple[str, _Part]] = []
        try:
            for address, (sub, indexes) in by_address.items():
                upstream = self._upstream(address)
                answer = await upstream.send(sub, expects_answer)
                if answer is not None:
                    parts.append((address, _Part(indexes, answer)))
        finally:
            self._budget.release(size)
        if not expects_answer:
            return None
        return asyncio.ensure_future(_gather(response, parts))

    def _upstream(self, address: str) -> _Upstream:
        upstream = self._upstreams.get(address)
        if upstream is None or upstream.broken:
            # A broken stream's reader has ended (its call was cancelled).
            upstream = self._upstreams[address] = _Upstream(address, self._channels)
        return upstream


async def _gather(
    response: log_pb2.ProduceResponse, parts: list[tuple[str, _Part]]
) -> log_pb2.ProduceResponse:
    """The client's answer, once every broker has answered its part."""
    for _, part in parts:
        try:
            answer = await part.answer
        except UpstreamLostError as exc:
            # Not sent again from here (not even when the broker dropped the
            # stream unread): the broker may have appended the records, and
            # a resend the client does not know of could write them twice.
            error = error_proto(
                NotLeaderOrFollowerError(
                    f"{exc}; the gateway lost its produce stream to the leader, "
                    "the records may or may not be written: retry"
                ),
                "producing",
            )
            for index in part.indexes:
                _fail_result(response.partitions[index], error)
            continue
        for index, result in zip(part.indexes, answer.partitions, strict=False):
            response.partitions[index].CopyFrom(result)
    return response


def _fail_result(result: log_pb2.PartitionProduceResult, error: object) -> None:
    result.error.CopyFrom(error)  # type: ignore[arg-type]
    result.base_offset = -1
    result.log_append_time_ms = -1
