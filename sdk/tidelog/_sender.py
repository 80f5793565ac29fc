"""The producer's sender: drains the accumulator and talks Produce to brokers.

One `Sender` task per producer, on the producer's event loop. It:

- drains batches that are ready (full, lingered, flushed, or due for retry),
  encodes them (`records.encode_batch`, compressed once), groups them by
  leader, and packs them into ProduceRequests of at most max_request_size
  and of at most as many partitions as the server takes in one request
  (tidelog._partition_limits: MAX_FETCH_PARTITIONS_PER_REQUEST, or a
  gateway's lower --max-partitions-per-request, which it names when the
  stream opens; a request it refused for that limit before the SDK knew it
  was not written, and is sent again, split);
- keeps one `ProduceStream` (a bidi Produce call) per broker address and
  pipelines up to max_in_flight_requests requests on it, matching answers by
  correlation_id (the broker answers in order); requests go out as bytes
  written by `_produce_wire` (the batches copied once);
- resolves each batch's result from its PartitionProduceResult; a retriable
  error (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS,
  NOT_ENOUGH_REPLICAS_AFTER_APPEND, UNKNOWN_TOPIC_OR_PARTITION, timeouts, a
  dropped stream) refreshes metadata where a leader may have moved and
  requeues the batch with exponential backoff (retry_backoff_ms
  doubling up to retry_backoff_max_ms, with jitter) until retries or
  delivery_timeout_ms run out, then fails it with an error that names the
  partition and the last error; other errors fail it at once;
- for an idempotent producer (`_idempotence.ProducerIdentity`): waits for a
  producer id before draining new batches, numbers batches as they are first
  drained, sends at most one batch per partition per request (so a retry
  repeats exactly one written batch, which the broker answers with its
  original offsets), and treats OUT_OF_ORDER_SEQUENCE_NUMBER as "retry after
  the earlier batch" while an earlier batch of the partition is unresolved.

Not thread-safe: everything runs on the event loop. The accumulator is the
only thing shared with the calling threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from tidelog._accumulator import ProducerBatch, RecordAccumulator
from tidelog._client_metrics import ProducerMetrics
from tidelog._connection import Cluster, call_error
from tidelog._futures import BatchResult
from tidelog._idempotence import ProducerIdentity
from tidelog._produce_wire import PartitionBatches, encode_request, open_stream
from tidelog._timeouts import within
from tidelog.config import ProducerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    ClosedError,
    InvalidProducerEpochError,
    InvalidRecordError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    TidelogError,
    TidelogTimeoutError,
    UnknownTopicOrPartitionError,
    error_from_code,
)
from tidelog.types import TopicPartition
from tidelog.v1 import log_pb2

log = logging.getLogger(__name__)

#: What a stream call's read() returns at the end (missing from grpc's stubs).
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]


@dataclass
class _InFlight:
    """One request awaiting its answer."""

    correlation_id: int
    sent_at: float
    #: (topic, partition) -> the batches concatenated in its PartitionRecords.
    batches: dict[tuple[str, int], list[ProducerBatch]] = field(default_factory=dict)


#: How long closing a produce stream waits for the broker to end it after
#: the half-close (what was written reaches the broker).
CLOSE_DRAIN_S = 5.0


class ProduceStream:
    """One bidi Produce call to one broker, with pipelined requests."""

    def __init__(self, sender: Sender, cluster: Cluster, address: str, config: ProducerConfig):
        self.address = address
        self._sender = sender
        self._config = config
        self._limits = cluster.partition_limits
        self._call = open_stream(cluster.channel(address))
        self._inflight: deque[_InFlight] = deque()
        self._slots = asyncio.Semaphore(config.max_in_flight_requests)
        self._has_inflight = asyncio.Event()
        self._next_correlation_id = 1
        #: monotonic time before which nothing is sent: the broker said the
        #: producer is over its quota (throttle_time_ms, Kafka's behaviour).
        self.throttled_until = 0.0
        self.broken = False
        self._closed = False
        #: The read loop's timer for the oldest request in flight (_watch_oldest).
        self._watchdog: asyncio.TimerHandle | None = None
        self._reader = asyncio.ensure_future(self._read_loop())

    async def send(self, partitions: list[PartitionBatches], entry: _InFlight) -> None:
        """Write one request of these partitions' batches (waits for a free
        in-flight slot first)."""
        await self._slots.acquire()
        wait_s = self.throttled_until - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        if self.broken:
            self._slots.release()
            self._sender.on_request_failed(
                entry, BrokerNotAvailableError(f"the produce stream to {self.address} closed")
            )
            return
        entry.correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        config = self._config
        request = encode_request(
            entry.correlation_id, int(config.acks), config.request_timeout_ms, partitions
        )
        entry.sent_at = now = time.monotonic()
        queue_time_ms = self._sender.metrics.queue_time_ms
        for group in entry.batches.values():
            for batch in group:
                if batch.attempts == 0:  # first send: how long it waited to go
                    queue_time_ms.record((now - batch.created) * 1000)
        expects_answer = self._config.acks != 0
        if expects_answer:
            self._inflight.append(entry)
            self._has_inflight.set()
        try:
            await self._call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # The reader sees the same failure and fails the in-flight
            # requests, this one included; only a fire-and-forget request
            # must be failed here.
            self._mark_broken()
            if not expects_answer:
                self._slots.release()
                self._sender.on_request_failed(entry, _stream_error(exc, self.address))
            return
        if not expects_answer:
            self._slots.release()
            self._sender.on_response(entry, None)

    async def _read_loop(self) -> None:
        timeout_s = self._config.request_timeout_ms / 1000
        error: TidelogError | None = None
        try:
            try:
                # One timeout for the stream's life, fired by a watchdog timer
                # when the oldest request in flight is overdue: an
                # asyncio.timeout() around each read scheduled and cancelled a
                # timer per answer (~10% of the loop thread's CPU when each
                # request holds one record).
                async with asyncio.timeout(None) as overdue:
                    self._watch_oldest(overdue, timeout_s)
                    # A gateway names its limit on partitions per request
                    # before it reads the first request
                    # (tidelog._partition_limits); a broker sends its headers
                    # with its first answer, which this loop waits for anyway
                    # (the watchdog runs meanwhile). Requests are packed by
                    # it from then on.
                    self._limits.learn(self.address, await self._call.initial_metadata())
                    error = await self._read_answers()
            except TimeoutError:
                error = RequestTimedOutError(
                    f"no produce answer from {self.address} in {timeout_s:.1f} s"
                )
        except grpc.aio.AioRpcError as exc:
            error = self._refusal_error(exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed or (task is not None and task.cancelling()):
                error = ClosedError("the producer is closed")
                raise
            # grpc.aio raises CancelledError from read() when the call itself
            # was cancelled (by _mark_broken after a failed write): a broken
            # stream, retriable, not a shutdown.
            error = BrokerNotAvailableError(f"the produce stream to {self.address} was reset")
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
            self._mark_broken()
            failed = list(self._inflight)
            self._inflight.clear()
            for entry in failed:
                self._slots.release()
                self._sender.on_request_failed(entry, error or ClosedError("stream closed"))

    def _refusal_error(self, exc: grpc.aio.AioRpcError) -> TidelogError:
        """The error to fail the requests in flight with when the stream
        ended with `exc`. A refusal of a request over the server's limit on
        partitions per request (a gateway's, named in the refusal or in the
        stream's initial metadata) is retriable: the gateway refused it
        whole before forwarding any of it, answered the requests before it
        and read none after it, so none of those in flight was written, and
        their batches are sent again (idempotently, with their sequence
        numbers) in requests packed within the limit."""
        error = _stream_error(exc, self.address)
        self._limits.learn_from(self.address, exc)
        largest = max((len(entry.batches) for entry in self._inflight), default=0)
        if not self._limits.refused_for_size(self.address, error, largest):
            return error
        log.info(
            "%s refused a produce request of %d partitions (%s); sending again in requests "
            "of at most %d",
            self.address,
            largest,
            error.message,
            self._limits.of(self.address),
        )
        return BrokerNotAvailableError(
            f"{self.address} refused a produce request of {largest} partitions "
            f"({error.message}); sending it again in requests of at most "
            f"{self._limits.of(self.address)} partitions"
        )

    def _watch_oldest(self, overdue: asyncio.Timeout, timeout_s: float) -> None:
        """Start a timer (`self._watchdog`) that fires `overdue` once the
        oldest request in flight has waited `timeout_s` for its answer; at an
        earlier look it schedules the next at the then-oldest request's
        deadline, so that answers cost it nothing."""
        loop = asyncio.get_running_loop()

        def look() -> None:
            now = loop.time()  # time.monotonic(), as sent_at
            due = self._inflight[0].sent_at + timeout_s if self._inflight else now + timeout_s
            if due <= now:
                overdue.reschedule(now)
                return
            self._watchdog = loop.call_at(due, look)

        self._watchdog = loop.call_at(loop.time() + timeout_s, look)

    async def _read_answers(self) -> TidelogError:
        """Read answers in order, each completing the oldest request in
        flight, until the stream ends or answers out of order: the error
        to fail what is still in flight with."""
        while True:
            if not self._inflight:
                self._has_inflight.clear()
                await self._has_inflight.wait()
            response = await self._call.read()
            if response is _EOF:
                return BrokerNotAvailableError(f"{self.address} ended the produce stream")
            entry = self._inflight.popleft()
            if response.correlation_id != entry.correlation_id:
                self._inflight.appendleft(entry)
                return BrokerNotAvailableError(
                    f"{self.address} answered correlation id {response.correlation_id}, "
                    f"expected {entry.correlation_id}; reconnecting"
                )
            if response.throttle_time_ms > 0:
                self.throttled_until = time.monotonic() + response.throttle_time_ms / 1000
            self._slots.release()
            metrics = self._sender.metrics
            metrics.requests.add(1)
            metrics.request_latency_ms.record((time.monotonic() - entry.sent_at) * 1000)
            self._sender.on_response(entry, response)

    async def _finish(self) -> None:
        await self._call.done_writing()
        while await self._call.read() is not _EOF:
            pass

    def _mark_broken(self) -> None:
        if not self.broken:
            self.broken = True
            self._sender.forget_stream(self)
            self._call.cancel()

    async def close(self) -> None:
        self._closed = True
        if not self.broken and not self._inflight:
            # Requests written without an answer to wait for (acks=0) may
            # still sit in gRPC's buffers: cancelling the call now would drop
            # them. Half-close and let the broker end the stream first.
            try:
                await within(self._finish(), CLOSE_DRAIN_S)
            except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # The broker did not end the stream (gone, or slower than
                # CLOSE_DRAIN_S): cancelled below, as before the half-close.
                log.debug("produce stream to %s not ended cleanly: %r", self.address, exc)
        self._mark_broken()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _count(undelivered: dict[TopicPartition, int], result: BatchResult) -> None:
    tp = TopicPartition(result.topic, result.partition)
    undelivered[tp] = undelivered.get(tp, 0) + len(result.timestamps)


def _stream_error(exc: grpc.aio.AioRpcError | Exception, address: str) -> TidelogError:
    if isinstance(exc, grpc.aio.AioRpcError):
        # A code the server named wins (a broker or gateway stopping names
        # NOT_LEADER_OR_FOLLOWER); a bare UNAVAILABLE is the transport's.
        return call_error(exc, f"produce stream to {address}")
    return BrokerNotAvailableError(f"produce stream to {address}: {exc}")


class Sender:
    """The producer's I/O task (see module doc)."""

    def __init__(self, cluster: Cluster, accumulator: RecordAccumulator, config: ProducerConfig):
        self._cluster = cluster
        self._acc = accumulator
        self._config = config
        self._codec = config.codec
        self._wakeup = asyncio.Event()
        self._streams: dict[str, ProduceStream] = {}
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._backoff_s = config.retry_backoff_ms / 1000
        self._backoff_max_s = max(config.retry_backoff_max_ms / 1000, self._backoff_s)
        self._delivery_timeout_s = config.delivery_timeout_ms / 1000
        self._metadata_wanted = False
        self._identity = ProducerIdentity(cluster, config)
        #: Set whenever a batch is resolved: an AsyncProducer waiting for
        #: buffer space awaits it.
        self.space_freed = asyncio.Event()
        #: What Producer.metrics() reports (per batch and request, never per record).
        self.metrics = ProducerMetrics()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def wake(self) -> None:
        """Look at the accumulator again (on the loop thread)."""
        self._wakeup.set()

    # ------------------------------------------------------------ main loop

    async def _run(self) -> None:
        identity = self._identity
        while True:
            self._wakeup.clear()
            if (
                identity.needs_id()
                and time.monotonic() >= identity.retry_at
                and (identity.producer_id < 0 or not self._acc.has_numbered_unresolved())
            ):
                await identity.init(self._backoff_s, self._backoff_max_s)
            now = time.monotonic()
            ready, expired, deadline = self._acc.drain(
                now, self._delivery_timeout_s, new_batches=identity.can_number
            )
            if identity.needs_id() and identity.retry_at > now:
                deadline = (
                    identity.retry_at if deadline is None else min(deadline, identity.retry_at)
                )
            for batch in expired:
                self._fail(batch, self._timed_out(batch, batch.last_error or identity.last_error))
            if identity.fatal is not None:
                for batch in ready:
                    self._fail(batch, identity.fatal)
                ready = []
            if self._metadata_wanted or self._cluster.is_stale():
                await self._refresh_metadata()
            if ready:
                await self._send(ready)
                continue
            if self._closing and self._acc.is_empty():
                return
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not self._acc.sender_waits():
                continue  # batches came since the drain, without waking us
            with contextlib.suppress(TimeoutError):
                await within(self._wakeup.wait(), timeout)

    async def _refresh_metadata(self) -> None:
        self._metadata_wanted = False
        try:
            await self._cluster.refresh()
        except TidelogError as exc:
            # Batches keep their own deadlines; the next round tries again.
            log.warning("metadata refresh failed: %s", exc)
            self._metadata_wanted = True
            await asyncio.sleep(self._backoff_s)

    def _timed_out(self, batch: ProducerBatch, last_error: BaseException | None) -> TidelogError:
        error = TidelogTimeoutError(
            f"{batch.topic}-{batch.partition}: {batch.record_count()} records not delivered "
            f"within delivery_timeout_ms={self._config.delivery_timeout_ms} "
            f"({batch.attempts} retries); last error: "
            + (f"{type(last_error).__name__}: {last_error}" if last_error else "none (never sent)")
        )
        error.__cause__ = last_error
        return error

    async def _send(self, ready: list[ProducerBatch]) -> None:
        identity = self._identity
        if identity.enabled and identity.producer_id >= 0:
            for batch in ready:
                if batch.base_sequence < 0:
                    identity.number(batch)
        snapshot = self._cluster.snapshot
        by_address: dict[str, list[ProducerBatch]] = {}
        leaderless: list[ProducerBatch] = []
        for batch in ready:
            address = snapshot.leader_address(batch.topic, batch.partition)
            if address is None:
                leaderless.append(batch)
            else:
                by_address.setdefault(address, []).append(batch)
        if leaderless:
            self._retry_or_fail(
                leaderless,
                UnknownTopicOrPartitionError(
                    f"no leader known for {leaderless[0].topic}-{leaderless[0].partition}"
                ),
            )
        for address, batches in by_address.items():
            stream = self._streams.get(address)
            if stream is None or stream.broken:
                stream = self._streams[address] = ProduceStream(
                    self, self._cluster, address, self._config
                )
            limit = self._cluster.partition_limits.of(address)
            for partitions, entry in self._requests(batches, limit):
                await stream.send(partitions, entry)

    def _requests(
        self, batches: list[ProducerBatch], max_partitions: int
    ) -> list[tuple[list[PartitionBatches], _InFlight]]:
        """Pack batches into requests of at most max_request_size bytes and
        `max_partitions` partitions (what the server takes in one request,
        tidelog._partition_limits): each request's partitions with their
        encoded batches, and its entry."""
        out: list[tuple[list[PartitionBatches], _InFlight]] = []
        limit = self._config.max_request_size
        codec = self._codec
        # Idempotent: one batch per partition per request, so that a retry
        # repeats exactly one batch the broker may have written.
        one_per_partition = self._identity.enabled
        current: dict[tuple[str, int], list[ProducerBatch]] = {}
        current_bytes = 0

        def finish() -> None:
            partitions: list[PartitionBatches] = [
                (topic, partition, [b.encoded or b"" for b in group])
                for (topic, partition), group in current.items()
            ]
            out.append((partitions, _InFlight(0, 0.0, dict(current))))

        for batch in batches:
            try:
                size = len(batch.encode(codec))
            except Exception as exc:
                # A record send() should have refused (the format cannot hold
                # it): its batch fails; the sender, and every other batch,
                # go on. Left to propagate, it stopped the sender for good.
                self._fail(
                    batch,
                    InvalidRecordError(
                        f"{batch.topic}-{batch.partition}: the batch cannot be encoded: {exc!r}"
                    ),
                )
                continue
            key = (batch.topic, batch.partition)
            if current and (
                current_bytes + size > limit
                or (one_per_partition and key in current)
                or (key not in current and len(current) >= max_partitions)
            ):
                finish()
                current = {}
                current_bytes = 0
            current.setdefault(key, []).append(batch)
            current_bytes += size
        if current:
            finish()
        return out

    # ------------------------------------------------------------ answers

    def on_response(self, entry: _InFlight, response: log_pb2.ProduceResponse | None) -> None:
        """Resolve the batches of one answered request (None: acks=0)."""
        if response is None:
            for group in entry.batches.values():
                for batch in group:
                    self._complete(batch, -1, -1)
            return
        answered: set[tuple[str, int]] = set()
        for result in response.partitions:
            key = (result.topic, result.partition)
            answered_group = entry.batches.get(key)
            if answered_group is None:
                log.warning("produce answer names %s-%d, which the request did not", *key)
                continue
            answered.add(key)
            if result.error.code:
                error = error_from_code(result.error.code, result.error.message)
                if isinstance(error, InvalidProducerEpochError):
                    fatal = self._identity.fence(error)
                    for batch in answered_group:
                        self._fail(batch, fatal)
                    continue
                if isinstance(error, OutOfOrderSequenceError):
                    self._out_of_order(answered_group, error)
                    continue
                self._retry_or_fail(answered_group, error)
                continue
            # Batches in one PartitionRecords get consecutive offsets.
            offset = result.base_offset
            for batch in answered_group:
                self._complete(batch, offset, result.log_append_time_ms)
                offset += batch.record_count()
        for key, group in entry.batches.items():
            if key not in answered:
                self._retry_or_fail(
                    group, BrokerNotAvailableError(f"produce answer left out {key[0]}-{key[1]}")
                )

    def on_request_failed(self, entry: _InFlight, error: TidelogError) -> None:
        for group in entry.batches.values():
            self._retry_or_fail(group, error)

    def forget_stream(self, stream: ProduceStream) -> None:
        if self._streams.get(stream.address) is stream:
            del self._streams[stream.address]

    def _complete(self, batch: ProducerBatch, base_offset: int, append_time_ms: int) -> None:
        self.metrics.batch_sent(batch.topic, batch.record_count(), len(batch.encoded or b""))
        batch.result.complete(base_offset, append_time_ms)
        self._resolved(batch)

    def _fail(self, batch: ProducerBatch, error: BaseException) -> None:
        self.metrics.batch_failed(batch.topic, batch.record_count())
        self._identity.failed_for_good(batch)
        batch.result.fail(error)
        self._resolved(batch)

    def _out_of_order(self, batches: list[ProducerBatch], error: OutOfOrderSequenceError) -> None:
        """A sequence gap: while an earlier batch of the partition is
        unresolved (it failed retriably and is being retried), the gap is
        that batch and closes when it lands, so retry after it; otherwise
        the broker lost records it had acknowledged (or never got them), and
        the batch fails."""
        for batch in batches:
            if self._acc.has_earlier_unresolved(batch):
                self._retry_or_fail(
                    [batch],
                    RequestTimedOutError(
                        f"{batch.topic}-{batch.partition}: waiting for an earlier batch "
                        f"({error.message})"
                    ),
                )
            else:
                self._fail(batch, error)

    def _resolved(self, batch: ProducerBatch) -> None:
        unmuted = self._acc.resolved(batch)
        self.space_freed.set()
        # Unmuted, or its partition's open batch held for it (linger while in
        # flight): batches wait for a drain that nothing else would trigger
        # once send() calls stop.
        if unmuted or self._closing or self._identity.reset_wanted:
            # close() waits for the run loop to see the accumulator empty.
            self.wake()

    def _backoff(self, attempts: int) -> float:
        """retry_backoff_ms doubled per attempt, capped, with 20 % jitter."""
        delay = min(self._backoff_s * 2 ** min(attempts, 30), self._backoff_max_s)
        return delay * random.uniform(0.8, 1.2)

    def _retry_or_fail(self, batches: list[ProducerBatch], error: TidelogError) -> None:
        if not batches:
            return
        now = time.monotonic()
        backoff_s = self._backoff(batches[0].attempts)
        retry: list[ProducerBatch] = []
        for batch in batches:
            batch.last_error = error
            if not error.retriable:
                self._fail(batch, error)
            elif now + backoff_s - batch.created >= self._delivery_timeout_s:
                self._fail(batch, self._timed_out(batch, error))
            elif batch.attempts >= self._config.retries:
                self._fail(batch, error)
            else:
                retry.append(batch)
                self.metrics.records_retried.add(batch.record_count())
        if retry:
            if isinstance(
                error,
                NotLeaderOrFollowerError
                | UnknownTopicOrPartitionError
                | BrokerNotAvailableError
                | RequestTimedOutError,
            ):
                self._metadata_wanted = True
            self._acc.requeue(retry, now + backoff_s)
            self.wake()

    # ------------------------------------------------------------ shutdown

    async def close(self, timeout_s: float | None) -> dict[TopicPartition, int]:
        """Send what is buffered (within `timeout_s`), then stop; batches still
        unsent fail with ClosedError. Returns how many records failed so, by
        partition."""
        undelivered: dict[TopicPartition, int] = {}
        self._closing = True
        self._acc.seal_all()
        self.wake()
        if self._task is not None:
            try:
                await within(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                log.warning("producer close timed out; failing unsent batches")
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for batch in self._acc.take_all():
            if not batch.result.done():
                _count(undelivered, batch.result)
            self._fail(batch, ClosedError("the producer closed before the batch was sent"))
        for stream in list(self._streams.values()):
            await stream.close()
        # Anything still unresolved was in flight on a stream just closed.
        for result in self._acc.incomplete():
            if not result.done():
                _count(undelivered, result)
                result.fail(ClosedError("the producer closed before the broker answered"))
        if undelivered:
            log.warning(
                "the producer closed with %d records not delivered (%s)",
                sum(undelivered.values()),
                ", ".join(
                    f"{tp.topic}-{tp.partition}: {n}" for tp, n in sorted(undelivered.items())
                ),
            )
        return undelivered
