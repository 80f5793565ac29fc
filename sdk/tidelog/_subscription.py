"""The consumer's calling-side state: assignment, positions, decoded records.

`SubscriptionState` lives where the application calls poll(): the caller's
thread for the sync Consumer, the event loop for AsyncConsumer. It takes the
fetcher's inbox items (see `_fetcher`), decodes record batches right there
(so decoding never runs on, or waits for, the I/O loop), and hands records
out in offset order. Per partition it keeps:

- `epoch`: bumped by every seek; fetcher answers for an older epoch are
  dropped;
- `fetched_to`: the offset after the last record taken from the inbox
  (None while a reset is pending). A DATA answer is used when its range
  [fetch_offset, next_offset) contains `fetched_to`; anything else is an
  answer to an old position. Accepting any covering answer (rather than
  chaining exact fetch offsets) stays correct after a seek, since offsets
  never change meaning, and cannot stall on answers whose boundaries differ;
- the decoded records not yet returned. The position (next offset poll()
  returns) is the first of them, or `fetched_to` when there are none;
- `error`: a batch at the position that cannot be decoded. The records
  before it are returned first; then every poll raises it (an
  UndecodableBatchError naming the partition and offset) until the
  application seeks, as Kafka's consumer does with a corrupt record;
- `stopped_by`: the fetcher's error about the current position (no offset
  to reset to, access denied, no such partition, ...): the fetcher stopped
  reading the partition until the application seeks. poll() raises each
  such error once, in the order they came, whatever partition it concerns;
  a read of named partitions raises theirs only; and position(tp), while
  tp's position is unknown, raises tp's (never another partition's), as
  Kafka's consumer does;
- `paused`: pause() stops the fetcher reading the partition and keeps its
  decoded records out of poll() until resume(); the position holds. A
  partition that leaves the assignment (a rebalance revoking it) forgets
  its pause, as in Kafka's consumers.

Not thread-safe: one caller at a time, as with Kafka's consumer.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tidelog._client_metrics import ConsumerMetrics, Metrics, lags_of
from tidelog._fetch_wire import FetchedPartition
from tidelog._fetcher import DATA, RESET
from tidelog._memory_reuse import keep_freed_memory
from tidelog.config import GRPC_MAX_MESSAGE_BYTES, ConsumerConfig
from tidelog.errors import IllegalStateError, TidelogError, UndecodableBatchError
from tidelog.records import (
    HEADER_SIZE,
    DecodedBatch,
    decode_batch_at,
    decode_records_at,
    read_header,
    records_of,
    validate_batch,
)
from tidelog.types import ConsumerRecord, TopicPartition, _DeserializedRecord

_EMPTY: list[ConsumerRecord] = []


#: Young objects moved to the oldest generation by `_gc_paused` after which
#: one full collection runs (see there): ~1 GB of 100-byte records.
_PROMOTED_BEFORE_FULL_COLLECTION = 10_000_000
_promoted = 0


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector off the records of a batch.

    ConsumerRecord is a tuple subclass, and CPython untracks only exact
    tuples when a collection finds them holding no containers: every record
    stays tracked for its whole life. Decoding allocates one per record; with
    the collector on, each fetch of ~10,000 records set off young collections
    that traversed them, then promoted them, then full collections over the
    whole window of records the consumer holds (measured: ~300 ns per 100-byte
    record, half of all the consumer's work).

    So the collector is off while a batch is decoded, and afterwards every
    young object (the new records, and whatever else the application made
    since the last collection) moves to the oldest generation untraversed
    (`gc.freeze()` + `gc.unfreeze()`: two list splices). Reference counting
    frees records as usual; the oldest generation is traversed only by full
    collections. A garbage cycle the application made just before a poll
    waits for the next full collection instead of the next young one: the
    interpreter still runs those, and one is forced here after
    _PROMOTED_BEFORE_FULL_COLLECTION promoted objects, so none is kept for
    good. An application that froze objects itself (gc.freeze() before a
    fork) is left alone: unfreeze would thaw its objects too.
    """
    global _promoted
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            _promoted += gc.get_count()[0]
            gc.freeze()
            gc.unfreeze()
        gc.enable()
        if _promoted > _PROMOTED_BEFORE_FULL_COLLECTION:
            _promoted = 0
            gc.collect()


class _PartitionState:
    __slots__ = (
        "epoch",
        "error",
        "fetched_to",
        "highwater",
        "index",
        "paused",
        "records",
        "stopped_by",
        "tp",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.epoch = 0
        self.fetched_to: int | None = None
        self.records: list[ConsumerRecord] = _EMPTY
        self.index = 0
        self.highwater: int | None = None
        self.error: UndecodableBatchError | None = None
        self.stopped_by: TidelogError | None = None
        self.paused = False

    def position(self) -> int | None:
        if self.index < len(self.records):
            return self.records[self.index].offset
        return self.fetched_to


class SubscriptionState:
    """Assigned partitions, positions and decoded records (see module doc).

    `commands` receives the fetcher calls to make on the event loop, as
    (method name, args) pairs; `grant` receives the credit to return.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        inbox: deque[tuple],
        commands: Callable[[str, tuple[Any, ...]], None],
    ) -> None:
        self._config = config
        self._inbox = inbox
        self._commands = commands
        self._states: dict[TopicPartition, _PartitionState] = {}
        # Partitions holding decoded records not yet returned, in arrival order.
        self._ready: deque[_PartitionState] = deque()
        # Partition errors taken from the inbox that poll() has not raised
        # yet, oldest first, with the epoch each is about: (state, epoch, error).
        self._unraised: deque[tuple[_PartitionState, int, TidelogError]] = deque()
        # Consumed bytes not yet granted back, per fetch session id.
        self._credit: dict[int, int] = {}
        self._credit_total = 0
        self._grant_threshold = max(config.window_bytes // 4, 1)
        #: Records and bytes taken (Consumer.metrics(); shared with the Fetcher).
        self.metrics = ConsumerMetrics()
        self._check_crcs = config.check_crcs
        # Records are made and dropped by the million: keep their memory for
        # the next fetch's instead of faulting it in again (_memory_reuse).
        keep_freed_memory(config.freed_memory_kept_bytes)
        self._key_deserializer = config.key_deserializer
        self._value_deserializer = config.value_deserializer
        # A batch decompressing past this is refused (a decompression bomb
        # cannot make the consumer allocate more than one fetch's worth).
        # fetch_max_bytes is not an absolute maximum (as in Kafka: a batch
        # larger than it is returned whole), so a small fetch size must not
        # refuse what the producer's default batches hold: at least what one
        # fetch message may carry.
        self._max_batch_bytes = max(config.fetch_max_bytes, GRPC_MAX_MESSAGE_BYTES)
        # Partitions stopped at a batch that cannot be decoded.
        self._failed: dict[TopicPartition, _PartitionState] = {}

    # ------------------------------------------------------------ assignment

    def assign(
        self, tps: list[TopicPartition], positions: dict[TopicPartition, int] | None = None
    ) -> None:
        """Read exactly `tps`. A partition new to the assignment starts at
        `positions[tp]` when given (a committed offset), else it is reset by
        auto_offset_reset; partitions kept keep their position."""
        wanted = dict.fromkeys(tps)
        for tp in list(self._states):
            if tp not in wanted:
                del self._states[tp]
                self._failed.pop(tp, None)
        self._ready = deque(s for s in self._ready if s.tp in wanted)
        assignment: dict[TopicPartition, tuple[int, int | None]] = {}
        for tp in wanted:
            state = self._states.get(tp)
            if state is None:
                state = self._states[tp] = _PartitionState(tp)
                if positions is not None:
                    state.fetched_to = positions.get(tp)
            assignment[tp] = (state.epoch, state.fetched_to)
        self._commands("assign", (assignment,))

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def metrics_snapshot(self) -> Metrics:
        """Consumer.metrics(): the counters, and the lag of each assigned
        partition whose position and high watermark are known."""
        states = list(self._states.values())
        return self.metrics.snapshot(lags_of(states), len(states))

    def state(self, tp: TopicPartition) -> _PartitionState:
        state = self._states.get(tp)
        if state is None:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def _restart(self, state: _PartitionState, fetched_to: int | None) -> None:
        state.epoch += 1
        state.fetched_to = fetched_to
        state.records = _EMPTY
        state.index = 0
        state.error = None
        state.stopped_by = None
        self._failed.pop(state.tp, None)
        if state in self._ready:
            self._ready.remove(state)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        state = self.state(tp)
        self._restart(state, offset)
        self._commands("seek", (tp, state.epoch, offset))

    def reset(self, tps: Iterable[TopicPartition], strategy: str) -> None:
        """Reset each of `tps` by `strategy`: one command, so that the fetcher
        resolves them together (one ListOffsets per leader, not per partition)."""
        states = [self.state(tp) for tp in tps]  # all assigned, or nothing changes
        for state in states:
            self._restart(state, None)
        self._commands("reset", ([(state.tp, state.epoch) for state in states], strategy))

    def position(self, tp: TopicPartition) -> int | None:
        """The next offset poll() returns; None while a reset is pending."""
        return self.state(tp).position()

    def position_now(self, tp: TopicPartition) -> int | None:
        """Consumer.position(): the position, taking what the fetcher sent
        when it is not known yet; None while tp's reset is under way. Raises
        the error that keeps tp's position unknown (until a seek), and no
        other partition's: those wait for poll()."""
        state = self.state(tp)
        position = state.position()
        if position is None:
            self.absorb()
            position = state.position()
            if position is None and state.stopped_by is not None:
                raise state.stopped_by
        return position

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.state(tp).highwater

    # ------------------------------------------------------------ pause

    def pause(self, tps: list[TopicPartition]) -> None:
        """Stop fetching `tps` and returning their records; positions hold."""
        states = [self.state(tp) for tp in tps]  # all assigned, or nothing changes
        for state in states:
            if not state.paused:
                state.paused = True
                if state in self._ready:
                    self._ready.remove(state)  # its records wait for resume()
                self._commands("pause", (state.tp,))

    def resume(self, tps: list[TopicPartition]) -> None:
        states = [self.state(tp) for tp in tps]
        for state in states:
            if state.paused:
                state.paused = False
                if state.index < len(state.records):
                    self._ready.append(state)
                self._commands("resume", (state.tp,))

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, state in self._states.items() if state.paused}

    def unread(self, returned: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Put records taken by collect() but never given to the caller back
        in front of their partitions (iteration's chunk, before getmany() or
        a read of named partitions): the positions move back to them."""
        for tp, records in returned.items():
            state = self._states.get(tp)
            if state is None or not records:
                continue
            held = state.records[state.index :]
            if held and held[0].offset <= records[-1].offset:
                continue  # seeked since: these records are no longer next
            had = bool(held)
            state.records = records + held
            state.index = 0
            if not had and not state.paused and state not in self._ready:
                self._ready.appendleft(state)

    # ------------------------------------------------------------ polling

    def collect(
        self, max_records: int, only: frozenset[TopicPartition] | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Take up to `max_records` records from what has been fetched,
        without waiting (of the partitions in `only` when given). Raises a
        partition error only when no records are returned with it (otherwise
        on the next call)."""
        if only is not None:
            return self._collect_only(max_records, only)
        self._raise_unraised()
        self._raise_undecodable()
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        ready = self._ready
        inbox = self._inbox
        try:
            while count < max_records:
                if ready:
                    state = ready[0]
                    start = state.index
                    records = state.records
                    end = min(len(records), start + max_records - count)
                    taken = records[start:end] if start or end < len(records) else records
                    state.index = end
                    if end >= len(records):
                        state.records = _EMPTY
                        state.index = 0
                        ready.popleft()
                    got = out.get(state.tp)
                    if got is None:
                        out[state.tp] = taken
                    else:
                        got.extend(taken)
                    count += end - start
                    continue
                if not inbox or self._unraised:
                    break  # an error comes after the records before it
                self._take(inbox.popleft())
        finally:
            if self._credit_total >= self._grant_threshold:
                self.flush_credit()
        if not out:
            self._raise_unraised()
            self._raise_undecodable()
        return out

    def _collect_only(
        self, max_records: int, only: frozenset[TopicPartition]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """collect() of some partitions: decode everything fetched (at most a
        window), then take from the named partitions only."""
        for tp in only:
            self.state(tp)
        self.absorb()
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        for state in list(self._ready):
            if count >= max_records:
                break
            if state.tp not in only:
                continue
            start, records = state.index, state.records
            end = min(len(records), start + max_records - count)
            out[state.tp] = records[start:end]
            count += end - start
            state.index = end
            if end >= len(records):
                state.records = _EMPTY
                state.index = 0
                self._ready.remove(state)
        if not out:
            self._raise_unraised(only)
            for tp in only:
                state = self._states[tp]
                if state.error is not None and state.index >= len(state.records):
                    raise state.error
        return out

    def _raise_unraised(self, only: frozenset[TopicPartition] | None = None) -> None:
        """Raise the oldest partition error poll() has not raised (of the
        partitions in `only` when given; the others keep waiting). An error
        about a position since abandoned (a seek, a revoke) is dropped."""
        if not self._unraised:
            return  # every poll() asks: nothing to allocate then
        kept: list[tuple[_PartitionState, int, TidelogError]] = []
        try:
            while self._unraised:
                entry = self._unraised.popleft()
                state, epoch, error = entry
                if self._states.get(state.tp) is not state or state.epoch != epoch:
                    continue
                if only is not None and state.tp not in only:
                    kept.append(entry)
                    continue
                raise error
        finally:
            self._unraised.extendleft(reversed(kept))

    def _raise_undecodable(self) -> None:
        """Raise the error of a partition stopped at a batch it cannot decode,
        once the records before that batch have all been returned."""
        for state in self._failed.values():
            if state.error is not None and not state.paused and state.index >= len(state.records):
                raise state.error

    def absorb(self) -> None:
        """Take every inbox item (resets, errors, data) without returning
        records or raising: position() uses it while waiting for a reset."""
        inbox = self._inbox
        try:
            while inbox:
                self._take(inbox.popleft())
        finally:
            if self._credit_total >= self._grant_threshold:
                self.flush_credit()

    def set_window(self, window_bytes: int) -> None:
        """The fetch window changed: credit goes back in quarters of it."""
        self._grant_threshold = max(window_bytes // 4, 1)

    def flush_credit(self) -> None:
        if self._credit_total:
            credit, self._credit = self._credit, {}
            self._credit_total = 0
            self._commands("grant", (credit,))

    def _take(self, item: tuple) -> None:
        kind = item[0]
        if kind == DATA:
            _, session, tp, data = item
            size = data.records_size
            if size:
                self._credit[session.id] = self._credit.get(session.id, 0) + size
                self._credit_total += size
                self.metrics.bytes_consumed.add(size)
            self._take_data(tp, data)
            return
        _, tp, epoch, payload = item
        state = self._states.get(tp)
        if state is None or state.epoch != epoch:
            return  # about a position since abandoned
        if kind == RESET:
            # Records fetched before the reset point stay: they were valid.
            state.fetched_to = payload
            return
        # An error: kept for poll() and for position(tp), not raised here
        # (absorb() takes every partition's, for a caller asking about one).
        if payload.topic is None:
            payload.about(tp.topic, tp.partition)
        state.stopped_by = payload
        self._unraised.append((state, epoch, payload))

    def _take_data(self, tp: TopicPartition, data: FetchedPartition) -> None:
        state = self._states.get(tp)
        if state is None:
            return
        fetched_to = state.fetched_to
        if fetched_to is None or not data.fetch_offset <= fetched_to < data.next_offset:
            return  # an answer for an old position
        if state.error is not None:
            return  # stopped at a bad batch until the application seeks
        state.highwater = data.high_watermark
        # Decoded where gRPC's message holds the records: each value is
        # copied out once, by the record loop, and the answer never is.
        response, begin, end = data.records_span()
        records, error = self._decode(tp, response, fetched_to, begin, end)
        if error is None:
            state.fetched_to = data.next_offset
        else:
            # The position stops at the bad batch: poll() returns the records
            # before it, then raises until the application seeks.
            state.fetched_to = max(fetched_to, error.offset)
            state.error = error
            self._failed[tp] = state
        if not records:
            return
        self.metrics.records_consumed.add(len(records))
        if state.index < len(state.records):
            # Still holding records (absorb() ran outside collect): keep them.
            state.records = state.records[state.index :] + records
        else:
            state.records = records
            if not state.paused:
                self._ready.append(state)
        state.index = 0

    def _decode(
        self, tp: TopicPartition, buf: bytes, start: int, begin: int = 0, end: int | None = None
    ) -> tuple[list[ConsumerRecord], UndecodableBatchError | None]:
        """Decode whole batches from `buf[begin:end]` (all of it by default),
        keeping records at offset >= start; stop at a batch that cannot be
        decoded and return its error too."""
        with _gc_paused():
            return self._decode_batches(tp, buf, start, begin, len(buf) if end is None else end)

    def _decode_batches(
        self, tp: TopicPartition, buf: bytes, start: int, begin: int, end: int
    ) -> tuple[list[ConsumerRecord], UndecodableBatchError | None]:
        out: list[ConsumerRecord] = []
        topic, partition = tp
        pos = begin
        view = memoryview(buf)
        # Without deserializers the serialized sizes are len(key) and
        # len(value), computed on access: records.decode_records_at builds
        # plain ConsumerRecords (in C where it was compiled).
        plain = self._key_deserializer is None and self._value_deserializer is None
        max_batch_bytes = self._max_batch_bytes
        while pos + HEADER_SIZE <= end:
            header = read_header(view, pos)
            size = header.size
            if pos + size > end:
                break  # a partial batch is never sent, but never trust it
            if header.next_offset <= start:
                pos += size  # entirely before the position: skip, undecoded
                continue
            try:
                if self._check_crcs:
                    header = validate_batch(view, pos)
                if plain:
                    records = decode_records_at(
                        buf, pos, header, ConsumerRecord, topic, partition, start, max_batch_bytes
                    )
                else:
                    batch = decode_batch_at(buf, pos, header, max_batch_bytes)
            except TidelogError as exc:
                return out, UndecodableBatchError(
                    f"{topic}-{partition}: the batch at offset {header.base_offset} (to "
                    f"{header.last_offset}) cannot be decoded: {exc.message}. Records before "
                    f"it were returned; seek to {header.next_offset} to skip it",
                    topic,
                    partition,
                    header.base_offset,
                    header.next_offset,
                )
            pos += size
            if not plain:
                records = self._deserialized_records(tp, batch, start)
            if out:
                out.extend(records)
            else:
                out = records
        return out, None

    def _deserialized_records(
        self, tp: TopicPartition, batch: DecodedBatch, start: int
    ) -> list[ConsumerRecord]:
        """The records of a decoded batch, keys and values through the
        deserializers, offsets >= start; each keeps its serialized sizes."""
        keys = batch.keys
        values = batch.values
        if (key_deserializer := self._key_deserializer) is not None:
            keys = [None if k is None else key_deserializer(k) for k in keys]
        if (value_deserializer := self._value_deserializer) is not None:
            values = [None if v is None else value_deserializer(v) for v in values]
        return records_of(
            batch,
            _DeserializedRecord,
            tp.topic,
            tp.partition,
            start,
            keys,
            values,
            batch.key_sizes,
            batch.value_sizes,
        )
