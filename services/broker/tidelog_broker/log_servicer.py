"""gRPC front of the data plane (`tidelog.v1.Log`): validates requests, hands
the work to the PartitionManager, and maps errors (error_mapping).

A client can send anything; nothing it sends may stop the broker. Every
per-partition failure becomes an in-band typed error, and a malformed
request ends only its own call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from tidelog.errors import InvalidRequestError, TidelogError
from tidelog.request_limits import check_list_offsets_entries, distinct
from tidelog.v1 import log_pb2, log_pb2_grpc
from tidelog_server.authorizer import may_auto_create
from tidelog_server.draining import abort_draining
from tidelog_server.owed_answers import OwedAnswers
from tidelog_server.stream_refusal import StreamLimitError, refuse_stream_with

from tidelog_broker import fetch_wire
from tidelog_broker.config import BrokerConfig
from tidelog_broker.error_mapping import abort, error_proto
from tidelog_broker.fetch_limits import FetchBudget
from tidelog_broker.fetch_session import FetchSession
from tidelog_broker.list_offsets import answer_list_offsets
from tidelog_broker.metrics import BrokerMetrics
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.producer_epochs import ProducerEpochs, new_epochs

log = logging.getLogger("tidelog.broker")

_VALID_ACKS = (-1, 0, 1)
#: Answers a Produce stream may owe at once (acks=all ones wait for the HW):
#: beyond this the stream stops reading requests, which pushes back on the client.
MAX_PENDING_RESPONSES = 1024


#: An answer a Produce stream owes, in order: (the answer, the request's acks,
#: perf_counter at its arrival, 0.0 without metrics). A tuple, not a class:
#: one is made per request, and a tuple costs ~10x less to build.
_Pending = tuple[asyncio.Future[log_pb2.ProduceResponse], int, float]


class _Drained(Exception):
    """A Fetch stream's session ended because the broker drains."""


@dataclass
class _AckWait:
    """One partition of an acks=all request, waiting for the HW."""

    result: log_pb2.PartitionProduceResult
    last_offset: int
    leader_epoch: int


class LogServicer(log_pb2_grpc.LogServicer):
    """Produce, Fetch, ListOffsets and Metadata for the partitions of this broker."""

    def __init__(
        self,
        manager: PartitionManager,
        config: BrokerConfig,
        metadata: Callable[[log_pb2.MetadataRequest], Awaitable[log_pb2.MetadataResponse]]
        | None = None,
        producer_epochs: ProducerEpochs | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._manager = manager
        # None: no --metrics-port, nothing counted.
        self._metrics = metrics
        self._config = config
        # One budget for every Fetch stream of this broker (fetch_limits).
        self._fetch_budget = FetchBudget(config.fetch_limits)
        self._producer_epochs = producer_epochs
        # Cluster mode: Metadata comes from the broker's etcd view (ClusterLink).
        self._cluster_metadata = metadata
        # Set by `drain`, with the time by which a Produce stream stops
        # waiting for acks=all answers (loop time).
        self._draining = asyncio.Event()
        self._drain_deadline = 0.0

    async def Produce(
        self,
        request_iterator: AsyncIterator[log_pb2.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[log_pb2.ProduceResponse]:
        # Requests are appended in arrival order by one task; answers leave in
        # the same order (OwedAnswers), so several acks=all requests can wait
        # for their HW at once without reordering answers.
        loop = asyncio.get_running_loop()
        owed: OwedAnswers[_Pending] = OwedAnswers(MAX_PENDING_RESPONSES)
        metrics = self._metrics

        async def read_requests() -> None:
            # Cancelled on drain (see _drain_watch): only at an await, and
            # every await is either before a request is appended (nothing
            # done, the client sends it again) or after its answer is owed.
            try:
                async for request in request_iterator:
                    arrived = time.perf_counter() if metrics is not None else 0.0
                    if request.acks not in _VALID_ACKS:
                        raise InvalidRequestError(
                            f"acks must be -1 (all), 0 or 1, got {request.acks}"
                        )
                    # Read once: each access to a bytes field copies it.
                    payloads = [part.records for part in request.partitions]
                    if self._producer_epochs is not None:
                        # A new producer epoch must be one InitProducerId
                        # handed out: make sure the check in the append knows it.
                        await self._producer_epochs.confirm(new_epochs(payloads))
                    response, waits = self._append_request(request, payloads)
                    if request.acks == 0:
                        continue  # no answer at all
                    answer: asyncio.Future[log_pb2.ProduceResponse]
                    if waits:
                        timeout_ms = request.timeout_ms or self._config.produce_timeout_ms
                        answer = asyncio.ensure_future(
                            self._await_acks(response, waits, timeout_ms / 1000)
                        )
                    else:
                        answer = loop.create_future()
                        answer.set_result(response)
                    owed.push((answer, request.acks, arrived))
                    # MAX_PENDING_RESPONSES answers owed: read no more until
                    # the client takes some (back-pressure).
                    await owed.room()
            except Exception as exc:
                owed.end(exc)
            finally:
                owed.end()

        reader = asyncio.ensure_future(read_requests())
        drain_watch = self._drain_watch(reader)
        try:
            while (waiting := await owed.get()) is not None:
                answer, acks, arrived = waiting
                if not answer.done() and not await self._answered_in_drain(answer, drain_watch):
                    break  # unanswered: sent again elsewhere, never acknowledged
                try:
                    response = answer.result()
                except TidelogError as exc:
                    await abort(context, exc, "producing")
                if metrics is not None:
                    metrics.produce_duration[acks].observe(time.perf_counter() - arrived)
                yield response
            if owed.error is not None:
                if isinstance(owed.error, TidelogError):
                    await abort(context, owed.error, "producing")
                raise owed.error
            if self._draining.is_set():
                await abort_draining(
                    context,
                    f"broker {self._config.broker_id}",
                    "send unanswered requests again",
                )
        finally:
            drain_watch.cancel()
            reader.cancel()
            for left in owed.take_all():
                left[0].cancel()

    def _drain_watch(self, reader: asyncio.Future[None]) -> asyncio.Future[object]:
        """A future done once the broker drains, which then stops `reader`
        (a stream's reading of its client's requests)."""
        drained: asyncio.Future[object] = asyncio.ensure_future(self._draining.wait())
        drained.add_done_callback(lambda done: done.cancelled() or reader.cancel())
        return drained

    async def _answered_in_drain(
        self, answer: asyncio.Future[log_pb2.ProduceResponse], drained: asyncio.Future[object]
    ) -> bool:
        """Wait for `answer` (an acks=all one); once the broker drains, for
        at most what is left of `drain_answer_s` since it began: False if it
        is not answered by then, and the stream ends without it (so that it
        ends with its code within gRPC's grace)."""
        if not drained.done():
            await asyncio.wait((answer, drained), return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            remaining = self._drain_deadline - asyncio.get_running_loop().time()
            if remaining > 0:
                await asyncio.wait((answer,), timeout=remaining)
        return answer.done()

    def drain(self, answer_within_s: float) -> None:
        """The broker is stopping: every Produce stream stops reading and
        answers what it has appended (an acks=all answer waited for at most
        `answer_within_s` from now), every Fetch stream ends after the
        message it is sending, each with `abort_draining`; a stream opened
        from now on ends at once."""
        self._drain_deadline = asyncio.get_running_loop().time() + answer_within_s
        self._draining.set()

    def _append_request(
        self, request: log_pb2.ProduceRequest, payloads: list[bytes]
    ) -> tuple[log_pb2.ProduceResponse, list[_AckWait]]:
        """Append every partition of one request; with acks=all, also what
        its answer must wait for (each partition's last offset and epoch)."""
        response = log_pb2.ProduceResponse(correlation_id=request.correlation_id)
        waits: list[_AckWait] = []
        seen: set[tuple[str, int]] = set()
        for part, payload in zip(request.partitions, payloads, strict=True):
            result = response.partitions.add(topic=part.topic, partition=part.partition)
            key = (part.topic, part.partition)
            try:
                if key in seen:
                    raise InvalidRequestError(
                        f"{part.topic}-{part.partition} appears twice in one request: "
                        "put all its batches in one PartitionRecords"
                    )
                seen.add(key)
                appended = self._manager.append(
                    part.topic, part.partition, payload, acks=request.acks
                )
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"appending to {key[0]}-{key[1]}"))
                result.base_offset = -1
                result.log_append_time_ms = -1
                if self._metrics is not None:
                    self._metrics.produce_errors += 1
                continue
            if self._metrics is not None:
                self._metrics.produced(part.topic, len(payload))
            result.base_offset = appended.base_offset
            result.log_append_time_ms = appended.log_append_time_ms
            result.log_start_offset = appended.log_start_offset
            replication = self._manager.replication(part.topic, part.partition)
            if request.acks == -1 and replication is not None:
                waits.append(_AckWait(result, appended.last_offset, replication.leader_epoch))
        return response, waits

    async def _await_acks(
        self, response: log_pb2.ProduceResponse, waits: list[_AckWait], timeout_s: float
    ) -> log_pb2.ProduceResponse:
        """acks=all: the answer once the HW passed every partition's last
        offset; a partition that times out or loses its leadership gets its
        error (retriable) instead of an offset."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for wait in waits:
            result = wait.result
            try:
                await self._manager.wait_for_high_watermark(
                    result.topic,
                    result.partition,
                    wait.last_offset,
                    wait.leader_epoch,
                    max(0.0, deadline - asyncio.get_running_loop().time()),
                )
            except Exception as exc:
                result.error.CopyFrom(
                    error_proto(exc, f"waiting for acks=all of {result.topic}-{result.partition}")
                )
                result.base_offset = -1
                result.log_append_time_ms = -1
        return response

    async def Fetch(  # type: ignore[override]  # bytes: see add_log_servicer
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[fetch_wire.OutgoingResponse]:
        """Serialized FetchResponses (fetch_wire.OutgoingResponse): register with
        add_log_servicer."""
        peer = context.peer()
        try:
            self._fetch_budget.open_stream(peer)
        except StreamLimitError as exc:
            # After the client's first request: see tidelog_server.stream_refusal.
            await refuse_stream_with(request_iterator, context, exc)
        try:
            # aclosing: the session's finally blocks (its budget) run now,
            # not whenever the abandoned generator is collected.
            async with contextlib.aclosing(
                self._fetch(request_iterator, context, peer)
            ) as responses:
                async for response in responses:
                    yield response
        finally:
            self._fetch_budget.close_stream(peer)

    async def _fetch(
        self,
        request_iterator: AsyncIterator[log_pb2.FetchRequest],
        context: grpc.aio.ServicerContext,
        peer: str,
    ) -> AsyncGenerator[fetch_wire.OutgoingResponse, None]:
        session = FetchSession(self._manager, self._fetch_budget, peer, self._metrics)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    session.apply(request)
            except TidelogError as exc:
                session.fail(exc)
            except Exception as exc:
                session.fail(exc)
            else:
                session.close_input()

        reader = asyncio.ensure_future(read_requests())
        # On drain the session ends between two messages (FetchSession.fail
        # is seen before the next one is collected), waking from any wait.
        drain_watch = self._drain_watch(reader)

        def end_session(done: asyncio.Future[object]) -> None:
            if not done.cancelled():
                session.fail(_Drained("the broker drains"))

        drain_watch.add_done_callback(end_session)
        try:
            async with contextlib.aclosing(session.responses()) as responses:
                async for response in responses:
                    outgoing = fetch_wire.OutgoingResponse(response)
                    del response
                    yield outgoing
                    # Resumed once gRPC wrote it: gRPC and the interceptors
                    # still refer to it while this stream waits (fetch_wire).
                    outgoing.release()
        except _Drained:
            await abort_draining(
                context,
                f"broker {self._config.broker_id}",
                "fetch again from your positions",
            )
        except TidelogError as exc:
            await abort(context, exc, "fetching")
        finally:
            drain_watch.cancel()
            reader.cancel()

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        try:
            check_list_offsets_entries(len(request.partitions))
        except TidelogError as exc:
            await abort(context, exc, "listing offsets")
        return await answer_list_offsets(self._manager, request)

    async def Metadata(
        self, request: log_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.MetadataResponse:
        if self._cluster_metadata is not None:
            return await self._cluster_metadata(request)
        config = self._config
        response = log_pb2.MetadataResponse(responder_id=config.broker_id)
        response.brokers.add(
            broker_id=config.broker_id,
            host=config.advertised_host or config.host,
            port=config.port,
        )
        # Each name once, as in cluster mode (ClusterMetadata.answer).
        names = distinct(request.topics) or self._manager.topic_names()
        # Alone, this broker's registration is its own log manager.
        offline = set(self._manager.logs.offline_partitions())
        for name in names:
            topic_md = response.topics.add(name=name)
            try:
                topic = self._manager.ensure_topic(
                    name, request.allow_auto_topic_creation and may_auto_create(name)
                )
            except Exception as exc:
                topic_md.error.CopyFrom(error_proto(exc, f"describing topic {name}"))
                continue
            for partition in range(len(topic.logs)):
                topic_md.partitions.add(
                    partition=partition,
                    leader_id=config.broker_id,
                    leader_epoch=0,
                    replicas=[config.broker_id],
                    isr=[config.broker_id],
                    offline_replicas=[config.broker_id] if (name, partition) in offline else [],
                )
        return response


class _Captured:
    """Stands in for the server in the generated registration, to take its
    method handlers."""

    name = ""
    handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(
        self, name: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.name, self.handlers = name, dict(handlers)


def add_log_servicer(servicer: LogServicer, server: grpc.aio.Server) -> None:
    """`add_LogServicer_to_server`, with Fetch's responses passed to gRPC as
    the bytes FetchSession frames (fetch_wire) instead of serialized again."""
    captured = _Captured()
    log_pb2_grpc.add_LogServicer_to_server(servicer, cast(Any, captured))
    fetch = captured.handlers["Fetch"]
    assert fetch.stream_stream is not None
    captured.handlers["Fetch"] = grpc.stream_stream_rpc_method_handler(
        fetch.stream_stream,
        request_deserializer=fetch.request_deserializer,
        response_serializer=fetch_wire.serialize,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(captured.name, captured.handlers),)
    )
    # As the generated registration does (the stubs do not declare it yet).
    server.add_registered_method_handlers(  # type: ignore[attr-defined]
        captured.name, captured.handlers
    )
