"""One consumer's fetch stream: its positions, its credit, its long-poll.

The consumer paces the stream (ARCHITECTURE invariant 5): it grants byte
credit, and the session never sends more record bytes than granted, except
one whole batch when the credit left is smaller than the next batch (a batch
is never split, and the consumer must always be able to make progress).
Before answering, the session waits until `min_bytes` are available or
`max_wait_ms` has passed; when nothing at all is available it keeps waiting
instead of sending an empty response.

One message may carry several answers (`max_answers_per_message`): after an
answer the session reads again at once, within the credit left, and appends
what it finds, so a consumer catching up receives fewer, larger messages
(a message costs the consumer's gRPC more than its bytes do). Each answer
keeps `max_bytes`; answers are put together only while the message stays
within MAX_BUNDLED_MESSAGE_BYTES (plus one batch).

Idle partitions: a partition whose read at its position found nothing
(no record, no error) is idle, and is not read again until something can
change that answer: the log manager wakes it (an append, a high watermark
move, a new role, a log start move, a truncation, the log closing: see
LogManager.wake) or the consumer gives it a new position. The session
watches its partitions once (LogManager.watch), for as long as `responses`
runs, not at every wait; so an answer costs the partitions with something
to read, not all of them: a consumer of thousands of partitions at the
tail, where a few receive records, cost the broker a read of each per
answer and two passes over all of them per wait.

Memory (fetch_limits): a session has at most one response in flight, and
every response reserves its bytes from the broker-wide FetchBudget until
gRPC has taken it, whatever credit the consumer granted. Once taken, no
reference to it stays behind: a session waiting at the end of its logs holds
no record bytes.

Not thread-safe: one session lives on the broker's event loop, driven by the
servicer's `Fetch` handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field

from tidelog.errors import InvalidRequestError, TidelogError
from tidelog.request_limits import check_fetch_positions
from tidelog.v1 import log_pb2

from tidelog_broker.error_mapping import error_proto
from tidelog_broker.fetch_limits import FetchBudget, FetchLimits
from tidelog_broker.fetch_wire import partition_entry
from tidelog_broker.log_manager import TopicPartitionKey
from tidelog_broker.metrics import BrokerMetrics
from tidelog_broker.partition_manager import PartitionManager

DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_MIN_BYTES = 1
DEFAULT_MAX_WAIT_MS = 500
# A response is one gRPC message; keep it well under the channel's limit.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
#: The most answers one message may carry (FetchRequest.max_answers_per_message).
MAX_ANSWERS_PER_MESSAGE = 16
#: Answers are put together only while the message can stay within this
#: many record bytes. The saving is per message, so it matters for small
#: answers (the paper's 200 KB: 4 per message) and little for 1 MiB ones;
#: and messages of several MiB defeat the allocator tuning (malloc_tuning):
#: with 1 MiB answers four to a message, the broker faulted in fresh pages
#: again (~30-80k minor faults per million 1 KiB records against ~100).
MAX_BUNDLED_MESSAGE_BYTES = 1024 * 1024


@dataclass
class _Position:
    offset: int
    partition_max_bytes: int


class FetchSession:
    """Positions and credit of one Fetch stream; yields its responses."""

    def __init__(
        self,
        manager: PartitionManager,
        budget: FetchBudget | None = None,
        peer: str = "",
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._manager = manager
        self._metrics = metrics
        self._budget = budget if budget is not None else FetchBudget(FetchLimits())
        # The connection this stream came on (its share of the budget).
        self._peer = peer
        self._positions: dict[TopicPartitionKey, _Position] = {}
        # The positions to read: all but the idle ones (module doc), in the
        # order they became readable.
        self._ready: dict[TopicPartitionKey, None] = {}
        # Set by a wake of any of the positions (`_on_wake`).
        self._woken = asyncio.Event()
        # Whether the positions are watched (while `responses` runs).
        self._watching = False
        self._credit_bytes = 0
        self._max_bytes = DEFAULT_MAX_BYTES
        self._min_bytes = DEFAULT_MIN_BYTES
        self._max_wait_ms = DEFAULT_MAX_WAIT_MS
        self._answers_per_message = 1
        # Set whenever a request changes positions or credit.
        self._changed = asyncio.Event()
        # Rotates which partition is read first, so that one busy partition
        # cannot starve the others of a session's credit.
        self._next_start = 0
        # The consumer closed its side: no more credit will come.
        self._input_closed = False
        # Set when the request side failed; raised by responses().
        self._failure: BaseException | None = None

    def apply(self, request: log_pb2.FetchRequest) -> None:
        """Take in one request from the consumer. Raises InvalidRequestError,
        having changed nothing: the whole request is checked first."""
        if request.credit_bytes < 0:
            raise InvalidRequestError(f"credit_bytes must be >= 0, got {request.credit_bytes}")
        for name, value in (
            ("max_bytes", request.max_bytes),
            ("min_bytes", request.min_bytes),
            ("max_wait_ms", request.max_wait_ms),
        ):
            if value < 0:
                raise InvalidRequestError(
                    f"{name} must be >= 0 (0 keeps the current value), got {value}"
                )
        answers = request.max_answers_per_message
        if not 0 <= answers <= MAX_ANSWERS_PER_MESSAGE:
            raise InvalidRequestError(
                f"max_answers_per_message must be between 0 and {MAX_ANSWERS_PER_MESSAGE} "
                f"(0 keeps the current value), got {answers}"
            )
        check_fetch_positions(request.positions)
        max_credit = self._budget.limits.max_credit_bytes
        if self._credit_bytes + request.credit_bytes > max_credit:
            raise InvalidRequestError(
                f"credit_bytes would reach {self._credit_bytes + request.credit_bytes} "
                f"outstanding, over the limit of {max_credit} bytes: grant credit as "
                "responses are consumed"
            )
        if request.max_bytes:
            self._max_bytes = min(request.max_bytes, MAX_RESPONSE_BYTES)
        if request.min_bytes:
            self._min_bytes = request.min_bytes
        if request.max_wait_ms:
            self._max_wait_ms = request.max_wait_ms
        if answers:
            self._answers_per_message = answers
        removed = []
        for tp in request.remove:
            key = (tp.topic, tp.partition)
            if self._positions.pop(key, None) is not None:
                self._ready.pop(key, None)
                removed.append(key)
        if removed and self._watching:
            self._manager.logs.unwatch(removed, self._on_wake)
        added = []
        for position in request.positions:
            key = (position.topic, position.partition)
            if key not in self._positions:
                added.append(key)
            self._positions[key] = _Position(position.fetch_offset, position.partition_max_bytes)
            # A new position may have records (or an error) where the old
            # one had none.
            self._ready[key] = None
        if added and self._watching:
            self._manager.logs.watch(added, self._on_wake)
        self._credit_bytes += request.credit_bytes
        self._changed.set()

    def close_input(self) -> None:
        """The consumer sends no more requests: finish once the credit is spent."""
        self._input_closed = True
        self._changed.set()

    def fail(self, exc: BaseException) -> None:
        """The request side failed (for example a bad request) or the broker
        drains: end the stream. The first failure is the one raised: a
        client's bad request that meets a drain is what the client must be
        told (it would send it again to the next broker otherwise)."""
        if self._failure is None:
            self._failure = exc
        self._changed.set()

    async def responses(self) -> AsyncGenerator[bytes, None]:
        """Yield responses (serialized FetchResponses, see fetch_wire) until
        the consumer's side ends and its credit is spent; raise what `fail`
        was given."""
        self._watch()
        try:
            loop = asyncio.get_running_loop()
            while True:
                if self._failure is not None:
                    raise self._failure
                if self._credit_bytes <= 0 or not self._positions:
                    if self._input_closed:
                        return
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                self._changed.clear()
                if self._budget.available(self._peer) <= 0:
                    # Other streams' responses fill the broker's buffer: wait
                    # until gRPC has taken some (or this stream changed).
                    await self._wait_for(self._budget.wait_released(), None)
                    continue
                deadline = loop.time() + self._max_wait_ms / 1000
                while True:
                    batch = self._collect()
                    if batch.failed or batch.size >= self._min_bytes:
                        break
                    remaining = deadline - loop.time()
                    if batch.size > 0 and remaining <= 0:
                        break
                    # Nothing at all: wait for data with no deadline (no empty
                    # responses). Some, but under min_bytes: wait until the deadline.
                    await self._wait_for_data_or_change(remaining if batch.size > 0 else None)
                    if self._changed.is_set():
                        break
                if self._changed.is_set():
                    # Positions or credit moved while waiting: what was collected
                    # may be stale, so start over (positions were not advanced).
                    continue
                # Collected and reserved without an await in between, so the
                # budget cannot be overdrawn by streams racing for it. The
                # generator resumes only once gRPC has written the response (or
                # is closed), which is when its bytes leave the budget.
                pieces, size = self._take_answers(batch)
                try:
                    yield b"".join(pieces)
                finally:
                    self._budget.release(self._peer, size)
                # The response's record bytes leave memory with the budget: a
                # stream that caught up waits next, maybe for hours, and must not
                # keep its last response alive meanwhile (`pieces` is the list
                # `batch` holds).
                del batch, pieces
        finally:
            self._unwatch()

    def _watch(self) -> None:
        self._manager.logs.watch(self._positions, self._on_wake)
        self._watching = True
        # Idle partitions were found idle while watched only.
        self._ready = dict.fromkeys(self._positions)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._manager.logs.unwatch(self._positions, self._on_wake)

    def _on_wake(self, key: TopicPartitionKey) -> None:
        """LogManager.wake: a read of `key` may answer differently now."""
        if key in self._positions:
            self._ready[key] = None
        self._woken.set()

    def _take_answers(self, first: _Collected) -> tuple[list[bytes | memoryview], int]:
        """Commit `first` and the answers that follow it at once (up to
        max_answers_per_message, see module doc), reserving their bytes:
        the pieces of the message and its record bytes."""
        self._advance(first)
        self._budget.reserve(self._peer, first.size)
        pieces, size = first.pieces, first.size
        try:
            for _ in range(1, self._answers_per_message):
                if not self._positions or size + self._max_bytes > MAX_BUNDLED_MESSAGE_BYTES:
                    break  # (an answer's failed reads removed their positions)
                # Reads within what is left of the credit and of the budget
                # (both already charged with the answers taken).
                more = self._collect()
                if not more.size:
                    break  # nothing more now (a failed read goes on its own, next)
                self._advance(more)
                self._budget.reserve(self._peer, more.size)
                pieces += more.pieces
                size += more.size
        except BaseException:
            self._budget.release(self._peer, size)
            raise
        return pieces, size

    async def _wait_for_data_or_change(self, timeout_s: float | None) -> None:
        # Cleared right after a _collect, with no await in between: a wake
        # before it made its partition ready for that _collect, and one
        # after it sets the event again.
        self._woken.clear()
        await self._wait_for(self._woken.wait(), timeout_s)

    async def _wait_for(self, event: Awaitable[object], timeout_s: float | None) -> None:
        """Until `event`, a change of this session, or the timeout."""
        waited = asyncio.ensure_future(event)
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait(
                (waited, changed), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            changed.cancel()
            if waited is not event:  # a task of ours, not the caller's future
                waited.cancel()

    def _collect(self) -> _Collected:
        """Read what is available for every position not idle, within the
        credit, without moving the positions (see _advance); positions that
        read nothing become idle."""
        collected = _Collected()
        budget = min(self._max_bytes, self._credit_bytes, self._budget.available(self._peer))
        keys = list(self._ready)
        if not keys:
            return collected
        start = self._next_start % len(keys)
        for key in keys[start:] + keys[:start]:
            if collected.size >= budget:
                break
            position = self._positions[key]
            topic, partition = key
            limit = budget - collected.size
            if position.partition_max_bytes:
                limit = min(limit, position.partition_max_bytes)
            try:
                data, next_offset, partition_log = self._manager.read(
                    topic, partition, position.offset, limit
                )
            except TidelogError as exc:
                collected.pieces += partition_entry(
                    log_pb2.PartitionData(
                        topic=topic,
                        partition=partition,
                        error=error_proto(exc, f"reading {topic}-{partition}"),
                        fetch_offset=position.offset,
                        next_offset=position.offset,
                    )
                )
                collected.failed.append(key)
                continue
            if not data:
                # Read again after a wake of it or a new position (module doc).
                del self._ready[key]
                continue
            collected.pieces += partition_entry(
                log_pb2.PartitionData(
                    topic=topic,
                    partition=partition,
                    fetch_offset=position.offset,
                    next_offset=next_offset,
                    high_watermark=self._manager.high_watermark(partition_log),
                    log_start_offset=partition_log.log_start_offset,
                ),
                data,
            )
            collected.next_offsets[key] = next_offset
            collected.sizes.append((topic, len(data)))
            collected.size += len(data)
        return collected

    def _advance(self, collected: _Collected) -> None:
        """Commit a response about to be sent: move positions, spend credit,
        and stop reading partitions that failed (until a new position)."""
        for key, next_offset in collected.next_offsets.items():
            self._positions[key].offset = next_offset
        for key in collected.failed:
            del self._positions[key]
            self._ready.pop(key, None)
        if collected.failed and self._watching:
            self._manager.logs.unwatch(collected.failed, self._on_wake)
        self._credit_bytes -= collected.size
        self._next_start += 1
        if self._metrics is not None:
            for topic, size in collected.sizes:
                self._metrics.fetched(topic, size)


@dataclass
class _Collected:
    """A response being assembled, and what sending it will change."""

    #: The serialized FetchResponse, in pieces (fetch_wire.partition_entry).
    pieces: list[bytes | memoryview] = field(default_factory=list)
    size: int = 0
    next_offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    failed: list[TopicPartitionKey] = field(default_factory=list)
    #: (topic, record bytes) of each partition with records (metrics).
    sizes: list[tuple[str, int]] = field(default_factory=list)
