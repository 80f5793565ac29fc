"""The consumer's fetcher: Fetch sessions and position resets, on the event loop.

`Fetcher` owns, for one consumer:

- one `FetchSession` (a bidi Fetch call) per leader address, or several
  when the server limits how many partitions one stream may read (a
  gateway's --max-partitions-per-fetch, named in each stream's initial
  metadata and in its refusal: tidelog._partition_limits) and more of the
  consumer's partitions are led there: each partition is then read on the
  first of the address's sessions with room, a new one opened when all are
  full, up to MAX_FETCH_STREAMS_PER_SERVER (past it, poll() raises, for the
  partitions left over, why they are not read). A stream refused for that
  limit before the SDK knew it is dropped and its partitions placed again,
  spread; nothing of a refused request was applied, so nothing is read
  twice. A partition stays on its session until it is unplaced (pause,
  unassign, a leader change) or the session ends, so each partition's
  records come from one stream at a time, in order. The session's
  first request grants `window` bytes of credit; the broker streams
  responses while credit remains; the consumer grants bytes back as the
  application consumes them (`grant`), so at most `window` bytes of fetched
  data are ever buffered per session, however slow the application. It also lets the
  broker put up to fetch_answers_per_message answers into one message when
  several are ready at once: a message costs the receive path more than its
  bytes (bench.fetch_profile), and each answer is still taken on its own;
- the loop-side state of each assigned partition: its epoch (bumped by every
  seek, so the answers of an old position are recognised), the session that
  reads it (each session also keeps the set of partitions it reads, which
  the server's per-stream limit is kept by), and `fetch_next`, where a new
  session must resume;
- placing partitions in their leader's session: the partitions placed at one
  time (a reset round, an assignment, the seeks and resumes of one turn of
  the loop, the partitions a leader change or a dropped stream moved) go in
  one FetchRequest per session, each with its own position, split as it is
  written into requests of at most MAX_FETCH_PARTITIONS_PER_REQUEST
  partitions, or of the lower limit the server named
  (tidelog._partition_limits: a gateway's --max-partitions-per-request; a
  stream it refused for that limit before the SDK knew it is reopened and
  its partitions placed again, split). One request per partition put 1,200
  messages (and as many tasks) on the stream after a reset of 1,200
  partitions;
- position resets (auto_offset_reset, seek_to_beginning/end) via ListOffsets,
  gathered as Kafka's consumer gathers them: the resets pending at one time go
  in one round, one request per leader (split at MAX_LIST_OFFSETS_ENTRIES, or
  at the server's lower limit, learned up front or from its refusal),
  and resets asked while a round is under way wait for the next. One call per
  partition instead put thousands of calls on a broker at once: past the
  ~1,000 calls gRPC keeps waiting for a server's loop to take them
  (grpc.server.max_pending_requests), it drops them with CANCELLED;
- retriable partition errors (not leader, unknown partition) and dropped
  streams: refresh metadata and place the partition again after a backoff;
  a stream the broker refused with a verdict reconnecting cannot change
  (access denied, a stream limit) is raised from poll() instead;
- paused partitions (pause/resume): removed from their session and not
  placed again until resumed; `fetch_next` holds where fetching resumes.

It never decodes records. What the calling side needs goes into the `inbox`
deque (thread-safe append/popleft) as tuples:

    (DATA, session, tp, PartitionData)   record bytes (or a stale answer)
    (RESET, tp, epoch, offset)           the position resolved for `epoch`
    (ERROR, tp, epoch, TidelogError)     a partition error to raise from poll

and `notify()` is called once per broker response. The calling side
(`SubscriptionState`) returns credit for every DATA item it takes.

Not thread-safe: call it on the event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from tidelog import _fetch_wire
from tidelog._client_metrics import ConsumerMetrics
from tidelog._connection import Cluster, TopicMetadata, no_such_partition
from tidelog.config import ConsumerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TidelogError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_from_code,
    error_from_rpc,
    names_error_code,
)
from tidelog.request_limits import (
    MAX_FETCH_PARTITIONS_PER_REQUEST,
    MAX_LIST_OFFSETS_ENTRIES,
    in_requests_of,
)
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, log_pb2

log = logging.getLogger(__name__)

DATA = 0
RESET = 1
ERROR = 2

#: ListOffsets timestamps for the reset strategies.
EARLIEST = -2
LATEST = -1
STRATEGY_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}

_OUT_OF_RANGE = common_pb2.OFFSET_OUT_OF_RANGE
#: Kafka's reconnect.backoff.max.ms default.
_MAX_RECONNECT_BACKOFF_S = 1.0
#: Most Fetch streams the consumer opens to one server that limits the
#: partitions per stream: a server naming a tiny limit cannot make it open a
#: stream per partition of thousands (each with its own credit window), and
#: it stays well under the gateway's --max-streams-per-connection (512).
MAX_FETCH_STREAMS_PER_SERVER = 64


@dataclass
class _Partition:
    """Loop-side state of one assigned partition."""

    tp: TopicPartition
    epoch: int
    #: Next offset to fetch: where a new session resumes. None: being reset.
    fetch_next: int | None = None
    #: The last position sent to the broker: an error answer for it is current.
    sent_position: int | None = None
    session: FetchSession | None = None
    paused: bool = False


class FetchSession:
    """One bidi Fetch call to one broker (see module doc)."""

    _ids = itertools.count(1)

    def __init__(self, fetcher: Fetcher, address: str, config: ConsumerConfig) -> None:
        self.id = next(self._ids)
        self.address = address
        self._fetcher = fetcher
        self._config = config
        self.closed = False
        self._requests: asyncio.Queue[log_pb2.FetchRequest | None] = asyncio.Queue()
        self._first = True
        #: The most partitions one request written on the stream named: a
        #: refusal for the server's limit is told apart by it.
        self._largest_request = 0
        #: The stream ended as the server refused a request over its limit
        #: (on partitions per request, or per stream): its partitions are
        #: placed again, in requests and streams within it.
        self.refused_for_size = False
        #: The partitions the stream reads (those whose `_Partition.session`
        #: it is), and the most it has been asked to read at once: a
        #: server's limit on partitions per stream is kept by the first, a
        #: refusal for it told apart by the second.
        self.placed: set[TopicPartition] = set()
        self.most_placed = 0
        # When the stream last sent or received: a response's fetch latency
        # is the wait since then (ConsumerMetrics).
        self._last_event = time.monotonic()
        #: Credit to keep back from what the application returns, after the
        #: window shrank (`Fetcher.set_window`): granted credit cannot be
        #: taken back from the broker, only not renewed.
        self._withheld = 0
        # Responses parsed by _fetch_wire: records copied at most once, on
        # the calling side.
        fetch = fetcher.cluster.channel(address).stream_stream(
            "/tidelog.v1.Log/Fetch",
            request_serializer=log_pb2.FetchRequest.SerializeToString,
            response_deserializer=_fetch_wire.parse,
        )
        self._call = fetch(self._request_iterator())
        self._reader = asyncio.ensure_future(self._read_loop())

    async def _request_iterator(self) -> AsyncIterator[log_pb2.FetchRequest]:
        limits = self._fetcher.cluster.partition_limits
        while True:
            request = await self._requests.get()
            if request is None:
                return
            # Split as it is written, not as it is queued: the server's limit
            # may have arrived (the stream's initial metadata) in between.
            limit = min(MAX_FETCH_PARTITIONS_PER_REQUEST, limits.of(self.address))
            for piece in _split(request, limit):
                named = len(piece.positions) + len(piece.remove)
                self._largest_request = max(self._largest_request, named)
                yield piece

    def send(
        self,
        positions: Iterable[tuple[TopicPartition, int]] = (),
        remove: Iterable[TopicPartition] = (),
        credit_bytes: int = 0,
    ) -> None:
        if self.closed:
            return
        if credit_bytes and self._withheld:
            kept = min(credit_bytes, self._withheld)
            self._withheld -= kept
            credit_bytes -= kept
            if not credit_bytes and not positions and not remove:
                return
        request = log_pb2.FetchRequest(
            positions=[
                log_pb2.FetchPosition(
                    topic=tp.topic,
                    partition=tp.partition,
                    fetch_offset=offset,
                    partition_max_bytes=self._config.max_partition_fetch_bytes,
                )
                for tp, offset in positions
            ],
            remove=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in remove],
            credit_bytes=credit_bytes,
        )
        if self._first:
            # Session settings travel once; the window is the opening credit.
            self._first = False
            request.credit_bytes += self._fetcher.window
            request.max_bytes = self._config.response_max_bytes
            request.min_bytes = self._config.fetch_min_bytes
            request.max_wait_ms = self._config.fetch_max_wait_ms
            request.max_answers_per_message = self._config.fetch_answers_per_message
        self._last_event = time.monotonic()
        self._requests.put_nowait(request)

    def resize(self, delta: int) -> None:
        """The window changed by `delta` bytes: grant the growth (after any
        credit still kept back), or keep back the shrinkage."""
        if delta < 0:
            self._withheld -= delta
            return
        paid = min(delta, self._withheld)
        self._withheld -= paid
        if delta - paid:
            self.send(credit_bytes=delta - paid)

    async def _read_loop(self) -> None:
        error: TidelogError | None = None
        limits = self._fetcher.cluster.partition_limits
        try:
            # A gateway names its limit before it reads the first request
            # (tidelog._partition_limits); a broker sends its headers with
            # its first response, which the loop below waits for anyway.
            limits.learn(self.address, await self._call.initial_metadata())
            async for response in self._call:
                now = time.monotonic()
                self._fetcher.metrics.fetch_latency_ms.record((now - self._last_event) * 1000)
                self._last_event = now
                self._fetcher.on_response(self, response)
            error = BrokerNotAvailableError(f"{self.address} ended the fetch stream")
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and self.closed:
                return
            # A code the server named wins (a gateway stopping names
            # NOT_LEADER_OR_FOLLOWER); a bare UNAVAILABLE is the transport's.
            error = (
                BrokerNotAvailableError(f"fetch stream to {self.address}: {exc.details()}")
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not names_error_code(exc)
                else error_from_rpc(exc, address=self.address)
            )
            limits.learn_from(self.address, exc)
            if limits.refused_for_size(self.address, error, self._largest_request):
                # Refused whole, before any of it was applied, and the stream
                # with it: its partitions are placed again on a new one.
                self.refused_for_size = True
                error = BrokerNotAvailableError(
                    f"{self.address} refused a fetch request of {self._largest_request} "
                    f"partitions ({error.message}); placing them again in requests of at "
                    f"most {limits.of(self.address)}"
                )
            elif limits.refused_for_streams(self.address, error, self.most_placed):
                # The same, for the server's limit on partitions per stream:
                # placed again over several streams.
                self.refused_for_size = True
                error = BrokerNotAvailableError(
                    f"{self.address} refused a fetch stream of {self.most_placed} "
                    f"partitions ({error.message}); placing them again on streams of at "
                    f"most {limits.per_stream(self.address)}"
                )
        except asyncio.CancelledError:
            if self.closed:
                raise
            error = BrokerNotAvailableError(f"the fetch stream to {self.address} was reset")
        if not self.closed:
            self.close()
            self._fetcher.on_session_failed(self, error)

    def hold(self, tp: TopicPartition) -> None:
        """The stream reads `tp` from now on."""
        self.placed.add(tp)
        self.most_placed = max(self.most_placed, len(self.placed))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put_nowait(None)
            self._call.cancel()

    async def wait_closed(self) -> None:
        self.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Fetcher:
    """Fetch sessions and position resets for one consumer (see module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        inbox: deque[tuple],
        notify: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self._config = config
        self._inbox = inbox
        self._notify = notify
        self._partitions: dict[TopicPartition, _Partition] = {}
        #: Leader address -> its open sessions: one, unless the server names
        #: a limit on partitions per stream that its partitions exceed.
        self._sessions: dict[str, list[FetchSession]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Resets waiting for the next round: tp -> (partition, epoch, timestamp).
        self._resets: dict[TopicPartition, tuple[_Partition, int, int]] = {}
        #: The task sending reset rounds while resets are pending, else None.
        self._resetter: asyncio.Task[None] | None = None
        #: Partitions to place in their leaders' sessions, and partitions to
        #: remove from sessions, at the next turn of the loop, all together
        #: (`_place_pending`).
        self._placing: dict[TopicPartition, _Partition] = {}
        self._removing: dict[FetchSession, list[TopicPartition]] = {}
        self._place_scheduled = False
        self._backoff_s = config.retry_backoff_ms / 1000
        self._timeout_s = config.request_timeout_ms / 1000
        self._closed = False
        #: Credit window of each session (config.window_bytes unless changed
        #: by set_window).
        self.window = config.window_bytes
        # Session failures since the last response: reconnects back off
        # exponentially (up to _MAX_RECONNECT_BACKOFF_S) while a broker is down.
        self._failures = 0
        #: Fetch latency per response (the consumer shares it with its
        #: SubscriptionState: Consumer.metrics()).
        self.metrics = ConsumerMetrics()

    # ------------------------------------------------------------ commands

    def assign(self, assignment: dict[TopicPartition, tuple[int, int | None]]) -> None:
        """Fetch exactly these partitions: tp -> (epoch, offset or None to
        reset by auto_offset_reset)."""
        for tp in list(self._partitions):
            if tp not in assignment:
                self._unplace(self._partitions.pop(tp))
        to_reset: list[tuple[TopicPartition, int]] = []
        for tp, (epoch, offset) in assignment.items():
            if tp in self._partitions:
                continue
            self._partitions[tp] = _Partition(tp, epoch)
            if offset is None:
                to_reset.append((tp, epoch))
            else:
                self.seek(tp, epoch, offset)
        self.reset(to_reset, self._config.auto_offset_reset)

    def seek(self, tp: TopicPartition, epoch: int, offset: int) -> None:
        part = self._partitions.get(tp)
        if part is None:
            return
        part.epoch = epoch
        part.fetch_next = offset
        self._place_soon(part)

    def reset(self, partitions: Iterable[tuple[TopicPartition, int]], strategy: str) -> None:
        """Resolve the position of each (tp, epoch) by `strategy` ("earliest",
        "latest", "none"): all of them in the next round of ListOffsets."""
        for tp, epoch in partitions:
            part = self._partitions.get(tp)
            if part is None:
                continue
            part.epoch = epoch
            part.fetch_next = None
            if strategy == "none":
                self._resets.pop(tp, None)
                self._emit(
                    (
                        ERROR,
                        tp,
                        epoch,
                        NoOffsetForPartitionError(
                            f"no position for {tp.topic}-{tp.partition} "
                            "and auto_offset_reset='none'"
                        ),
                    )
                )
                continue
            self._resets[tp] = (part, epoch, STRATEGY_TIMESTAMPS[strategy])
        self._start_resetter()

    def pause(self, tp: TopicPartition) -> None:
        part = self._partitions.get(tp)
        if part is not None and not part.paused:
            part.paused = True
            # Answers already under way are dropped (their credit returned):
            # fetch_next still says where fetching resumes.
            self._unplace(part)

    def resume(self, tp: TopicPartition) -> None:
        part = self._partitions.get(tp)
        if part is not None and part.paused:
            part.paused = False
            if part.fetch_next is not None:
                self._place_soon(part)
            # else a reset is under way; it places the partition when done.

    def set_window(self, window_bytes: int) -> None:
        """Make `window_bytes` the credit window of every session, open or
        future (AsyncConsumer.set_fetch_window)."""
        delta = window_bytes - self.window
        self.window = window_bytes
        if delta:
            for session in self._all_sessions():
                session.resize(delta)

    def grant(self, credits: dict[int, int]) -> None:
        """Return consumed bytes to their sessions (session id -> bytes)."""
        # Once per poll: no list of the sessions built (_all_sessions).
        for sessions in self._sessions.values():
            for session in sessions:
                credit = credits.get(session.id)
                if credit:
                    session.send(credit_bytes=credit)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for session in self._all_sessions():
            await session.wait_closed()
        self._sessions.clear()

    # ------------------------------------------------------------ internals

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self._closed:
            coro.close()
            return None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fetcher task failed", exc_info=task.exception())

    def _all_sessions(self) -> list[FetchSession]:
        """Every open session, as a list (safe to await over)."""
        return [session for sessions in self._sessions.values() for session in sessions]

    def _session_for(self, part: _Partition, address: str) -> FetchSession | None:
        """The session of `address` to read `part` on: the one reading it
        already, else the first with room under the server's limit on
        partitions per stream (tidelog._partition_limits; none: the one
        session of the address), else a new one; None when the address
        already has MAX_FETCH_STREAMS_PER_SERVER sessions, all full."""
        sessions = self._sessions.setdefault(address, [])
        if part.session is not None and not part.session.closed and part.session in sessions:
            return part.session
        limit = self.cluster.partition_limits.per_stream(address)
        for session in sessions:
            if not session.closed and (limit is None or len(session.placed) < limit):
                return session
        if len(sessions) >= MAX_FETCH_STREAMS_PER_SERVER:
            return None
        session = FetchSession(self, address, self._config)
        sessions.append(session)
        return session

    def _detach(self, part: _Partition) -> None:
        """`part` is no longer read by its session."""
        if part.session is not None:
            part.session.placed.discard(part.tp)
            part.session = None

    def _emit(self, item: tuple) -> None:
        self._inbox.append(item)
        self._notify()

    def _unplace(self, part: _Partition) -> None:
        """Stop reading the partition: at once here (answers its session
        still sends are dropped, their credit returned), and in its session
        at the next turn of the loop, with the other removals and placements
        (`_place_pending`)."""
        if part.session is not None:
            self._removing.setdefault(part.session, []).append(part.tp)
            self._detach(part)
            self._schedule_placing()

    def _is_current(self, part: _Partition, epoch: int) -> bool:
        """Whether `part` is still assigned and not seeked since `epoch`."""
        return self._partitions.get(part.tp) is part and part.epoch == epoch

    def _start_resetter(self) -> None:
        if self._resets and self._resetter is None:
            self._resetter = self._spawn(self._send_resets())

    async def _send_resets(self) -> None:
        """Send rounds of resets while any is pending (see module doc)."""
        try:
            while self._resets and not self._closed:
                pending, self._resets = self._resets, {}
                await self._reset_round(
                    {tp: entry for tp, entry in pending.items() if self._is_current(*entry[:2])}
                )
        finally:
            self._resetter = None

    async def _reset_round(self, resets: dict[TopicPartition, tuple[_Partition, int, int]]) -> None:
        """One round: a ListOffsets per leader (and per MAX_LIST_OFFSETS_ENTRIES
        partitions) for all of `resets` at once. Each partition's answer is its
        own: an offset places it; a retriable error (a leader moving, a broker
        down, a call it dropped) asks again in a later round, after the retry
        backoff and a metadata refresh; another error is raised from poll()
        for that partition alone."""
        by_address: dict[str, list[TopicPartition]] = {}
        leaderless: dict[str, list[TopicPartition]] = {}
        for tp in resets:
            address = self.cluster.snapshot.leader_address(tp.topic, tp.partition)
            if address is None:
                leaderless.setdefault(tp.topic, []).append(tp)
            else:
                by_address.setdefault(address, []).append(tp)
        outcomes: dict[TopicPartition, int | TidelogError] = {}
        for topic, tps in leaderless.items():
            await self._without_leader(topic, tps, resets, outcomes)
        await asyncio.gather(
            *(self._reset_at(address, tps, resets, outcomes) for address, tps in by_address.items())
        )
        retry: dict[TopicPartition, tuple[_Partition, int, int]] = {}
        for tp, outcome in outcomes.items():
            part, epoch, _ = entry = resets[tp]
            if not self._is_current(part, epoch):
                continue  # seeked or unassigned meanwhile: this answer is stale
            if isinstance(outcome, TidelogError):
                if outcome.retriable:
                    retry[tp] = entry
                else:
                    self._inbox.append((ERROR, tp, epoch, outcome))
                continue
            part.fetch_next = outcome
            self._inbox.append((RESET, tp, epoch, outcome))
            self._place_soon(part)
        self._notify()
        if retry:
            tp = next(iter(retry))
            log.info("resetting %d partitions (%s: %s); retrying", len(retry), tp, outcomes[tp])
            self._spawn(self._reset_later(retry))

    async def _without_leader(
        self,
        topic: str,
        tps: list[TopicPartition],
        resets: dict[TopicPartition, tuple[_Partition, int, int]],
        outcomes: dict[TopicPartition, int | TidelogError],
    ) -> None:
        """The outcome of resetting `tps`, partitions of `topic` the metadata
        names no leader for: a partition the topic does not have is raised
        from poll() at once (waiting cannot make it; retriable as its class
        is, it would be asked for forever); the others wait for a leader."""
        try:
            meta = await self.cluster.topic(topic, timeout_s=self._timeout_s)
            if any(not 0 <= tp.partition < meta.partition_count for tp in tps):
                # Maybe a stale cache: ask once more before saying so.
                meta = await self._fresh_topic(topic)
        except TidelogError as exc:
            outcomes.update(dict.fromkeys(tps, exc))
            return
        for tp in tps:
            if 0 <= tp.partition < meta.partition_count:
                outcomes[tp] = BrokerNotAvailableError(f"no leader for {tp.topic}-{tp.partition}")
                continue
            part, epoch, _ = resets[tp]
            if self._is_current(part, epoch):
                error = no_such_partition(tp.topic, tp.partition, meta.partition_count)
                self._inbox.append((ERROR, tp, epoch, error))

    async def _reset_at(
        self,
        address: str,
        tps: list[TopicPartition],
        resets: dict[TopicPartition, tuple[_Partition, int, int]],
        outcomes: dict[TopicPartition, int | TidelogError],
    ) -> None:
        """ListOffsets of `tps` to their leader at `address`, in requests of at
        most MAX_LIST_OFFSETS_ENTRIES: each partition's offset or error."""
        for piece in in_requests_of(tps, self._list_offsets_size(address)):
            unanswered = BrokerNotAvailableError(f"{address} did not answer for the partition")
            outcomes.update(dict.fromkeys(piece, unanswered))
            try:
                response = await self._ask_list_offsets(
                    address, [(tp, resets[tp][2]) for tp in piece]
                )
            except TidelogError as exc:
                outcomes.update(dict.fromkeys(piece, exc))
                continue
            for result in response.partitions:
                tp = TopicPartition(result.topic, result.partition)
                if tp not in resets:
                    continue
                outcomes[tp] = (
                    error_from_code(result.error.code, result.error.message).about(
                        result.topic, result.partition
                    )
                    if result.error.code
                    else result.offset
                )

    async def _reset_later(self, retry: dict[TopicPartition, tuple[_Partition, int, int]]) -> None:
        """Ask again for `retry` in a later round, after the retry backoff and
        a metadata refresh (a leader may have moved)."""
        await asyncio.sleep(self._backoff_s)
        try:
            await self.cluster.refresh({tp.topic for tp in retry})
        except TidelogError as exc:
            log.info("metadata refresh failed: %s", exc)
        for tp, entry in retry.items():
            if tp not in self._resets and self._is_current(*entry[:2]):
                self._resets[tp] = entry
        self._start_resetter()

    def _place_soon(self, part: _Partition) -> None:
        """Place the partition in its leader's session at the next turn of
        the loop, with every partition placed meanwhile (see module doc).
        Its state is read then: a partition paused, unassigned or reset
        meanwhile is not placed, and one seeked again is placed once, at
        its last position."""
        self._placing[part.tp] = part
        self._schedule_placing()

    def _schedule_placing(self) -> None:
        if not self._place_scheduled and not self._closed:
            self._place_scheduled = True
            asyncio.get_running_loop().call_soon(self._place_pending)

    def _place_pending(self) -> None:
        """Send the positions of the partitions `_place_soon` was given to
        their leaders' sessions: one FetchRequest per session (which the
        session splits by its server's limit as it writes it), after one
        removing those unplaced or moving to another session."""
        self._place_scheduled = False
        pending, self._placing = self._placing, {}
        removals, self._removing = self._removing, {}
        if self._closed:
            return
        positions: dict[FetchSession, list[tuple[TopicPartition, int]]] = {}
        leaderless: list[_Partition] = []
        unplaceable: list[_Partition] = []
        for tp, part in pending.items():
            if self._partitions.get(tp) is not part or part.fetch_next is None or part.paused:
                continue  # unassigned, being reset or paused since
            address = self.cluster.snapshot.leader_address(tp.topic, tp.partition)
            if address is None:
                leaderless.append(part)
                continue
            session = self._session_for(part, address)
            if session is None:
                unplaceable.append(part)
                continue
            if part.session is not None and part.session is not session:
                removals.setdefault(part.session, []).append(tp)
                self._detach(part)
            part.session = session
            session.hold(tp)
            part.sent_position = part.fetch_next
            positions.setdefault(session, []).append((tp, part.fetch_next))
        # Removals first: a partition leaving a session stops being read
        # there before its new session reads it, and a partition paused
        # and resumed (unassigned and assigned) meanwhile is read again.
        # Each session splits what it writes by its server's limit.
        for session, tps in removals.items():
            session.send(remove=tps)
        for session, entries in positions.items():
            session.send(positions=entries)
        self._close_idle_extra_sessions()
        if leaderless:
            self._spawn(self._place_when_led(leaderless))
        for part in unplaceable:
            self._unplaceable(part)

    def _close_idle_extra_sessions(self) -> None:
        """Close the sessions that read nothing, but the first of each
        address: streams opened to spread partitions (a smaller assignment
        since, partitions paused) hold a credit window and a stream of the
        server's each; the first stays open, as one always did."""
        for sessions in self._sessions.values():
            for session in [s for s in sessions[1:] if not s.placed]:
                sessions.remove(session)
                self._spawn(session.wait_closed())

    def _unplaceable(self, part: _Partition) -> None:
        """poll() raises, for `part`, that its server's streams are all
        full: it stays unread until it is placed again (a seek, or a new
        assignment once fewer partitions are read through that server)."""
        address = self.cluster.snapshot.leader_address(part.tp.topic, part.tp.partition)
        limit = self.cluster.partition_limits.per_stream(address or "")
        if part.session is not None:
            self._removing.setdefault(part.session, []).append(part.tp)
            self._detach(part)
            self._schedule_placing()
        self._raise_for(
            [part],
            InvalidRequestError(
                f"cannot read {part.tp.topic}-{part.tp.partition}: {address} reads at most "
                f"{limit} partitions per fetch stream (a gateway's --max-partitions-per-fetch), "
                f"and this consumer already reads {MAX_FETCH_STREAMS_PER_SERVER} streams of "
                "them there: assign it fewer partitions, or raise the limit"
            ),
        )

    async def _place_when_led(self, parts: list[_Partition]) -> None:
        """Place again, after the retry backoff and a metadata refresh,
        partitions the metadata names no leader for; a partition its topic
        does not have is raised from poll() instead (waiting cannot make it),
        as is an error of the topic that is not retriable. Every way through
        here waits before the next look: the cached answer does not change by
        itself, so asking it again at once would spin."""
        by_topic: dict[str, list[_Partition]] = {}
        for part in parts:
            by_topic.setdefault(part.tp.topic, []).append(part)
        waiting: list[_Partition] = []
        for topic, led in by_topic.items():
            try:
                meta = await self.cluster.topic(topic, timeout_s=self._timeout_s)
                if any(not 0 <= part.tp.partition < meta.partition_count for part in led):
                    # Maybe a stale cache: ask once more before saying so.
                    meta = await self._fresh_topic(topic)
            except TidelogError as exc:
                if exc.retriable:
                    log.info("no leader for %s yet: %s", led[0].tp, exc)
                    waiting += led
                else:
                    self._raise_for(led, exc)
                continue
            for part in led:
                if 0 <= part.tp.partition < meta.partition_count:
                    # Known partition, no live leader right now (a broker
                    # is down or the partition is being created).
                    waiting.append(part)
                else:
                    error = no_such_partition(topic, part.tp.partition, meta.partition_count)
                    self._raise_for([part], error)
        if waiting:
            await self._place_later(waiting, grow=False)

    def _raise_for(self, parts: Iterable[_Partition], error: TidelogError) -> None:
        """poll() raises `error` for each of `parts` still assigned."""
        for part in parts:
            if self._partitions.get(part.tp) is part:
                self._emit((ERROR, part.tp, part.epoch, error))

    async def _fresh_topic(self, topic: str) -> TopicMetadata:
        """The topic's metadata from a new Metadata answer, not the cache."""
        snapshot = await self.cluster.refresh([topic])
        meta = snapshot.topics.get(topic)
        if meta is None or meta.error is not None:
            return await self.cluster.topic(topic, timeout_s=self._timeout_s)
        return meta

    async def _place_later(self, parts: list[_Partition], *, grow: bool = True) -> None:
        """Place `parts` again, all together, after a backoff and a metadata
        refresh (a leader may have moved). `grow`: the backoff grows with the
        session failures since the last response (a broker down), else it is
        the retry backoff."""
        delay = self._backoff_s
        if grow:
            delay = min(
                delay * (2 ** min(self._failures, 16)),
                max(_MAX_RECONNECT_BACKOFF_S, self._backoff_s),
            )
        await asyncio.sleep(delay)
        try:
            await self.cluster.refresh({part.tp.topic for part in parts})
        except TidelogError as exc:
            log.info("metadata refresh failed: %s", exc)
        for part in parts:
            self._place_soon(part)

    # ------------------------------------------------------------ answers

    def on_response(self, session: FetchSession, response: _fetch_wire.FetchedResponse) -> None:
        self._failures = 0
        returned = 0
        # Partitions answered a retriable error: placed again together.
        retry: list[_Partition] = []
        for data in response.partitions:
            # A plain tuple finds the TopicPartition key (equal hash and
            # value) without building a TopicPartition per answer.
            part = self._partitions.get((data.topic, data.partition))  # type: ignore[call-overload]
            if part is None or part.session is not session:
                # Unassigned or moved: nobody will consume it; give the
                # credit straight back.
                returned += data.records_size
                continue
            if data.error.code:
                self._on_partition_error(part, data, retry)
                continue
            fetch_next = part.fetch_next
            if fetch_next is not None and data.fetch_offset <= fetch_next < data.next_offset:
                part.fetch_next = data.next_offset
            self._inbox.append((DATA, session, part.tp, data))
        if returned:
            session.send(credit_bytes=returned)
        if retry:
            self._spawn(self._place_later(retry))
        self._notify()

    def _on_partition_error(
        self, part: _Partition, data: _fetch_wire.FetchedPartition, retry: list[_Partition]
    ) -> None:
        """Act on a partition's error answer; a retriable one (the leader
        moved, say) adds the partition to `retry`."""
        if data.fetch_offset not in (part.fetch_next, part.sent_position):
            return  # the answer to a position we have since moved away from
        error = error_from_code(data.error.code, data.error.message)
        # The broker stopped reading the partition: it needs a new position.
        part.sent_position = None
        if data.error.code == _OUT_OF_RANGE:
            strategy = self._config.auto_offset_reset
            if strategy == "none":
                self._inbox.append(
                    (ERROR, part.tp, part.epoch, OffsetOutOfRangeError(error.message))
                )
            else:
                log.info("%s: %s; resetting to %s", part.tp, error.message, strategy)
                self.reset([(part.tp, part.epoch)], strategy)
        elif error.retriable:
            log.info("%s: %s; retrying", part.tp, error.message)
            retry.append(part)
        else:
            self._inbox.append((ERROR, part.tp, part.epoch, error))

    def on_session_failed(self, session: FetchSession, error: TidelogError) -> None:
        sessions = self._sessions.get(session.address, [])
        if session in sessions:
            sessions.remove(session)
            if not sessions:
                del self._sessions[session.address]
        if self._closed:
            return
        if session.refused_for_size:
            # Expected once per stream a gateway with a lower limit refused
            # before its limit was known: not an outage.
            log.info("%s", error.message)
            orphans = [part for part in self._partitions.values() if part.session is session]
            for part in orphans:
                self._detach(part)
            if orphans:
                self._spawn(self._place_later(orphans, grow=False))
            return
        if _refused_for_good(error):
            # Reconnecting cannot help (until an operator grants access, or
            # the broker has room for the stream): poll() raises it, for
            # every partition of the stream, which it ended; a seek places
            # the partition again.
            for part in self._partitions.values():
                if part.session is session:
                    self._detach(part)
                    self._inbox.append((ERROR, part.tp, part.epoch, error))
            return
        # Warn once per outage; the retries that follow are expected.
        level = logging.WARNING if self._failures == 0 else logging.DEBUG
        log.log(level, "fetch session to %s failed: %s; reconnecting", session.address, error)
        self._failures += 1
        orphans = [part for part in self._partitions.values() if part.session is session]
        for part in orphans:
            self._detach(part)
        if orphans:
            self._spawn(self._place_later(orphans))

    # ------------------------------------------------------------ unary calls

    async def list_offsets(
        self, query: dict[TopicPartition, int], *, retry: bool = True
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for each tp (-1 latest, -2 earliest, else a time):
        tp -> (offset, timestamp). Raises the first partition's error that is
        not retriable, and UNKNOWN_TOPIC_OR_PARTITION. A retriable one (a
        leader moving, a partition whose log its broker is still opening, no
        leader yet) is asked again, for the partitions not answered yet, after
        the retry backoff and a metadata refresh, until request_timeout_ms has
        passed; then the last one is raised (Kafka's clients retry these calls
        within their API timeout). `retry` False: one try (a caller that loops
        itself)."""
        deadline = time.monotonic() + self._timeout_s
        for tp in query:
            if self.cluster.snapshot.leader_address(tp.topic, tp.partition) is None:
                # Waiting cannot make a partition the topic does not have.
                meta = await self.cluster.topic(tp.topic, timeout_s=self._timeout_s)
                if not 0 <= tp.partition < meta.partition_count:
                    raise no_such_partition(tp.topic, tp.partition, meta.partition_count)
        out: dict[TopicPartition, tuple[int, int]] = {}
        while True:
            pending = {tp: when for tp, when in query.items() if tp not in out}
            try:
                await self._list_offsets_once(pending, out)
                return out
            except TidelogError as exc:
                if (
                    not (retry and exc.retriable)
                    # The leader says the topic or partition is gone: said at
                    # once (a deleted topic; Spark's source re-lists then).
                    or isinstance(exc, UnknownTopicOrPartitionError)
                    or time.monotonic() + self._backoff_s > deadline
                ):
                    raise
                log.debug("listing offsets: %s; retrying", exc)
            await asyncio.sleep(self._backoff_s)
            try:
                await self.cluster.refresh({tp.topic for tp in pending})
            except TidelogError as exc:
                # The next try asks the leaders the cache still names, and
                # raises what they answer once the time is up.
                log.debug("listing offsets: metadata refresh failed: %s", exc)

    async def _list_offsets_once(
        self, query: dict[TopicPartition, int], out: dict[TopicPartition, tuple[int, int]]
    ) -> None:
        """ListOffsets to each leader of `query`'s partitions, in requests of
        at most MAX_LIST_OFFSETS_ENTRIES (the brokers' limit); each answer is
        put in `out` as it comes. Raises the first partition's error."""
        by_address: dict[str, list[TopicPartition]] = {}
        for tp in query:
            address = self.cluster.snapshot.leader_address(tp.topic, tp.partition)
            if address is None:
                raise BrokerNotAvailableError(f"no leader for {tp.topic}-{tp.partition}")
            by_address.setdefault(address, []).append(tp)
        for address, tps in by_address.items():
            for piece in in_requests_of(tps, self._list_offsets_size(address)):
                await self._list_offsets_of(address, piece, query, out)

    async def _list_offsets_of(
        self,
        address: str,
        tps: Sequence[TopicPartition],
        query: dict[TopicPartition, int],
        out: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        """One ListOffsets of `tps` to the leader at `address`."""
        response = await self._ask_list_offsets(address, [(tp, query[tp]) for tp in tps])
        for result in response.partitions:
            if result.error.code:
                raise error_from_code(result.error.code, result.error.message).about(
                    result.topic, result.partition
                )
            out[TopicPartition(result.topic, result.partition)] = (
                result.offset,
                result.timestamp_ms,
            )

    def _list_offsets_size(self, address: str) -> int:
        """The most entries one ListOffsets to `address` may have: the
        brokers' MAX_LIST_OFFSETS_ENTRIES, or the server's own lower limit
        (tidelog._partition_limits)."""
        return min(MAX_LIST_OFFSETS_ENTRIES, self.cluster.partition_limits.of(address))

    async def _ask_list_offsets(
        self, address: str, entries: Sequence[tuple[TopicPartition, int]]
    ) -> log_pb2.ListOffsetsResponse:
        """ListOffsets of (tp, timestamp) entries to the broker at `address`:
        one call, or several when the server refuses the entries for its
        limit on partitions per request (a gateway's; then the later calls
        are split by it at once), answered as one. A call the server
        cancelled raises a retriable BrokerNotAvailableError saying so
        (error_from_rpc)."""
        request = log_pb2.ListOffsetsRequest(
            partitions=[
                log_pb2.ListOffsetsPartition(
                    topic=tp.topic, partition=tp.partition, timestamp_ms=ts
                )
                for tp, ts in entries
            ]
        )
        try:
            response: log_pb2.ListOffsetsResponse = await self.cluster.log_stub(
                address
            ).ListOffsets(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            error = error_from_rpc(exc, address=address)
            limits = self.cluster.partition_limits
            limits.learn_from(address, exc)
            if not limits.refused_for_size(address, error, len(entries)):
                raise error from exc
            # A read: asked again in pieces within the limit; each piece is
            # smaller than this call, so this ends.
            response = log_pb2.ListOffsetsResponse()
            for piece in in_requests_of(entries, limits.of(address)):
                answer = await self._ask_list_offsets(address, piece)
                response.partitions.extend(answer.partitions)
        return response


def _split(request: log_pb2.FetchRequest, limit: int) -> list[log_pb2.FetchRequest]:
    """`request` as requests of at most `limit` partitions (positions and
    removals): its removals, then its positions, in order; the first one
    carries its credit and settings."""
    if len(request.positions) + len(request.remove) <= limit:
        return [request]
    pieces = [log_pb2.FetchRequest(remove=piece) for piece in in_requests_of(request.remove, limit)]
    pieces += [
        log_pb2.FetchRequest(positions=piece) for piece in in_requests_of(request.positions, limit)
    ]
    first = pieces[0]
    first.credit_bytes = request.credit_bytes
    first.max_bytes = request.max_bytes
    first.min_bytes = request.min_bytes
    first.max_wait_ms = request.max_wait_ms
    first.max_answers_per_message = request.max_answers_per_message
    return pieces


def _refused_for_good(error: TidelogError) -> bool:
    """Whether a fetch stream's end is a verdict that reconnecting cannot
    change: an error that is not retriable, such as access denied
    (AuthorizationFailedError, SaslAuthenticationError) or a stream over the
    broker's limit (InvalidRequestError naming it). UnknownServerError stays
    retried: it is also what a status gRPC raised itself (INTERNAL while a
    broker dies) decodes to."""
    return not error.retriable and not isinstance(error, UnknownServerError)
