"""The producer's record accumulator: records grouped into per-partition batches.

`send()` on any thread appends a record here under one lock and gets back a
`FutureRecordMetadata`; the sender (on the event loop) drains batches that
are full, have waited `linger_ms`, or are flushed. This module owns:

- the open batch of each partition, stored as columns (values, keys,
  timestamps, headers) that `records.encode_batch` turns into one batch when
  drained: an append is three list appends, nothing else;
- the FIFO of sealed batches, which keeps per-partition order; a batch is
  sealed, and the sender woken, as soon as it is full: no room is left for
  the smallest record (`RECORD_OVERHEAD` bytes), or a keyless record did not
  fit and moved on to the next sticky partition (Kafka closes a batch a record
  did not fit, too). Neither waits for `linger_ms`, whichever path appended;
- holding a partition's next batch while one is in flight
  (`linger_while_in_flight`, Nagle's algorithm for batches): a batch that is
  not full, once its linger is over, waits while an earlier batch of its
  partition is drained and not yet answered, taking the records that arrive
  meanwhile; the answer (`resolved`) tells the sender to look again. A full
  or flushed batch never waits, so a busy producer still pipelines up to
  max_in_flight_requests requests. Under load this sends fewer, larger
  requests: every request costs both ends CPU (a gRPC message each way, a
  wake-up of the broker's and the consumer's threads), and on a shared
  machine that CPU is what the tail latency waits for;
- retries: a batch that failed with a retriable error waits here for its
  backoff, and its partition is *muted* (no later batch of it is drained)
  until the retry is resolved, so retries do not reorder that partition's
  later batches (already in-flight ones may still overtake, unless the
  producer is idempotent: brokers then refuse them as out of order and the
  sender retries them after the earlier batch; see `has_earlier_unresolved`);
- buffer memory accounting (`buffer_memory`): send() blocks while the bytes
  of unfinished batches exceed it;
- the sticky partition of keyless records (KIP-480);
- `append_columns`: many records of one partition (or of the sticky one) at
  once, as columns, for callers that already hold them (the gateway's
  record-level API). They land in the same open batches as `append`'s, so
  numbering, retries, lingering and order are exactly those of records sent
  one by one; only the per-record Python work is gone;
- the *lanes* (`lanes`, when tidelog._cproduce was compiled and the producer
  has no serializer and no partitioner): the sticky batch of a topic may hold
  a `Lane`, a grant of room that the producers' send() fills without this
  lock, one C call per keyless record with a bytes value or none (see
  _cproduce.c for why that is safe). The room is reserved in the buffer
  memory when the lane opens (the batch's room, at most half of what is free, so that lanes
  of many topics leave room for each other and for locked appends) and what
  was not used is given back when it closes. A lane opens after a locked
  append of such a record to the sticky batch, and closes, under the lock,
  before anything else reads or changes its batch: a locked append of a
  keyless record to the topic (or of any record to that batch), a seal, a
  drain, close, or the lane's own `on_full`, which the
  append that fills the lane calls (after its record is in, without the
  lock, which `_lane_filled` takes) to seal a batch left full. So a batch's
  columns and size are whole whenever the lock is held and the batch has no
  lane. A batch whose lane was closed by a record it had room for (a
  bytearray, an explicit partition or timestamp...) gets no other lane:
  mixed sends keep the locked path rather than open and close a lane per
  record. Except a record the lane did not take for its kind alone, which
  the batch's next lane takes (see `_settle`): a keyed record reaching the
  sticky batch, whose lane is then a keyed one that takes keyless records
  too (below);
- the *keyed lanes* (`keyed_lanes`): the same for records with a bytes key,
  per partition, tombstones (a null value) included. A topic's table is a
  list with a slot per partition, made for the partition count its length
  is; a locked append of a keyed record gives its partition's open batch a
  keyed lane (one that also appends to the batch's keys), in that slot.
  send() computes the key's partition from the count of the metadata
  snapshot, as the locked path does, and `_cproduce.keyed_append` finds the
  lane and appends in one C call, refusing when the table's length is not
  that count (the metadata changed: the next locked keyed append closes the
  table's lanes and makes a table for the new count). The rules of the keyless lane hold for each
  keyed lane: it closes, under the lock, before a locked append, seal, drain
  or close reaches its batch (`_settle`: the locked path closes the lane of
  any batch it is about to look at, whichever partition it is for), so a
  batch never has two lanes and a lane without the keys list is only ever
  on a batch with no keys. The sticky batch's keyed lane (a keyed record
  went to the sticky partition, or the sticky partition moved on to a
  batch with keys) is also the topic's keyless lane, in `lanes` as well as
  in its slot: made `keyless`, it appends a keyless record's None key to
  the keys, as the locked path does, so keyed and keyless records of a
  topic that mixes them both take lanes into that batch; closing it takes
  it out of both. Sequence numbers of idempotent producers are given when the
  sender drains a batch, after its lane is closed: lanes never see them.
  Many partitions' lanes together may reserve most of the free buffer
  memory (each is granted at most half of what is free): a locked append
  that would wait for memory first closes every lane (`_reclaim_lanes`), so
  reserved room never blocks a send, and waits only for memory that records
  fill;
- records with headers, in both kinds of lane: a lane opened on a batch
  that has a headers column (a record with headers is in it) is given that
  list and appends each record's headers to it (a tuple, as the locked path
  stores `tuple(headers)`; None for a record without), counted as
  `record_size` counts them. A lane opened before the batch had one refuses
  records with headers; the first such record takes the locked path, which
  gives the batch its column, and the batch's next lane has it (`_settle`
  does not count that record as one the lane had room for but bypassed). So
  a batch without headers never gets a headers column from a lane: a
  keyless one keeps the one-pass body of _cproduce.plain_body.

Thread-safe: every public method takes `_lock`. The sender is woken through
the `wake` callable (a hop to the event loop) only when a batch is created or
sealed, never per record, and only when the sender is asleep: between a
`drain` and the sender's `sender_waits` it is about to look again anyway, so
the appends of that time only mark the accumulator changed and `sender_waits`
tells it to look again instead of sleeping (no lost wake-up). With linger 0
every record opens a batch; records that arrive while the sender is busy
writing cost no hop to its loop (a hop per record otherwise: each one wakes the
loop's thread, which must take the GIL from the threads doing the work).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import accumulate, repeat
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from tidelog._futures import BatchResult, FutureRecordMetadata
from tidelog.compression import CompressionType
from tidelog.errors import ClosedError, TidelogTimeoutError
from tidelog.partitioner import StickyPartitioner
from tidelog.records import HEADER_SIZE, Header, encode_batch
from tidelog.types import TopicPartition

_cproduce: ModuleType | None
try:  # the optional C lane (sdk/setup.py); without it every record takes the lock
    from tidelog import _cproduce
except ImportError:  # pragma: no cover - depends on the install
    _cproduce = None

if TYPE_CHECKING:
    from tidelog._cproduce import Lane


def _no_keyed_append(
    table: list[Lane | None],
    partition_count: object,
    key: object,
    value: object,
    headers: object = None,
) -> FutureRecordMetadata | None:
    """keyed_append without tidelog._cproduce (never called: no lanes open then)."""
    return None


#: Producer.send's keyed fast path: _cproduce.keyed_append (see _cproduce.c).
keyed_append: Callable[
    [list[Lane | None], object, object, object, object], FutureRecordMetadata | None
]
keyed_append = _no_keyed_append if _cproduce is None else _cproduce.keyed_append

#: Per-record body bytes besides key and value (the two length slots);
#: BatchBuilder.RECORD_OVERHEAD.
RECORD_OVERHEAD = 8
#: Batch bytes besides its records: the header and the body flags byte.
BATCH_OVERHEAD = HEADER_SIZE + 1


class Placement(NamedTuple):
    """Where a run of appended records went: records `first` to
    `first + length - 1` of the batch whose outcome is `result` (so record
    `first + i`'s offset is result.base_offset + first + i)."""

    result: BatchResult
    first: int
    length: int


class BufferFullError(Exception):
    """Internal: the buffer is full and the caller asked not to block."""


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None) -> int:
    """Bytes a record adds to an uncompressed batch, as the accumulator counts
    them (keys of headers by their UTF-8 bytes). producer._check_headers
    counts headers the same way inside its check, the pass send() pays."""
    size = RECORD_OVERHEAD + (0 if value is None else len(value)) + (0 if key is None else len(key))
    if headers:
        size += 4
        for k, v in headers:
            size += 8 + (len(k) if k.isascii() else len(k.encode())) + (0 if v is None else len(v))
    return size


class ProducerBatch:
    """One partition's records on their way to the broker (columns until
    encoded). Owned by the accumulator until drained, then by the sender."""

    __slots__ = (
        "attempts",
        "base_sequence",
        "created",
        "encoded",
        "headers",
        "in_flight",
        "keys",
        "lane",
        "lane_refused",
        "last_error",
        "partition",
        "producer_epoch",
        "producer_id",
        "result",
        "retry_at",
        "sequence",
        "size",
        "timestamps",
        "topic",
        "tp",
        "values",
    )

    def __init__(self, topic: str, partition: int, sequence: int, now: float) -> None:
        self.topic = topic
        self.partition = partition
        self.tp = TopicPartition(topic, partition)
        #: Position among the partition's batches (orders retries).
        self.sequence = sequence
        self.created = now
        self.values: list[bytes | None] = []
        # None until the first keyed record / record with headers, so batches
        # without any pay nothing for them.
        self.keys: list[bytes | None] | None = None
        self.headers: list[Sequence[Header] | None] | None = None
        self.timestamps: list[int] = []
        self.size = BATCH_OVERHEAD
        self.result = BatchResult(topic, partition, self.timestamps)
        self.encoded: bytes | None = None
        self.attempts = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None
        # Idempotent producers: set by the sender when the batch is first
        # drained (-1 until then, and always without idempotence).
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        #: The open Lane into this batch, if any, keyless or keyed (the
        #: accumulator's, under its lock).
        self.lane: Lane | None = None
        #: A locked append closed a lane that had room for it: no more lanes.
        self.lane_refused = False
        #: Handed to the sender and not yet answered (nor put back for a
        #: retry): counted in the accumulator's `_in_flight`.
        self.in_flight = False

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, codec: CompressionType) -> bytes:
        """The batch's bytes (encoded once; retries resend the same bytes)."""
        if self.encoded is None:
            values = self.values
            timestamps = self.timestamps
            # One pass: whether the records' create times differ.
            mixed_ts = timestamps.count(timestamps[0]) != len(timestamps)
            self.encoded = encode_batch(
                values,
                keys=self.keys,
                timestamps=timestamps if mixed_ts else None,
                base_timestamp=timestamps[0],
                headers=self.headers,
                codec=codec,
                # With the C body, a null value only sends it to the Python
                # path: no pass over the values to look for one here.
                values_may_be_null=_cproduce is not None or None in values,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
            )
            # The columns are no longer needed; the timestamps stay (shared
            # with the result, which reports them).
            self.values = []
            self.keys = self.headers = None
        return self.encoded

    def record_count(self) -> int:
        return len(self.timestamps)


class RecordAccumulator:
    """Batches by partition, ready for the sender (see module doc)."""

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        wake: Callable[[], None],
        partitioner: StickyPartitioner | None = None,
        clock: Callable[[], float] = time.monotonic,
        lane_max_record: int | None = None,
        linger_while_in_flight: bool = True,
    ) -> None:
        """`lane_max_record`: open lanes for send(), whose records are at most
        that many bytes (None: no lanes; nor without tidelog._cproduce).
        `linger_while_in_flight`: a batch that is not full is not drained
        while an earlier batch of its partition is in flight (see the module
        docstring); False: drained once its linger is over, as Kafka's."""
        self._batch_size = batch_size
        # A batch is full (sealed at once) when its size is above this: no
        # room is left for even the smallest record, RECORD_OVERHEAD bytes.
        self._full_above = batch_size - RECORD_OVERHEAD
        self._linger_s = linger_ms / 1000
        self._buffer_memory = buffer_memory
        self._wake = wake
        self._sticky = partitioner or StickyPartitioner()
        self._clock = clock
        self._lock = threading.Lock()
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        self._space = threading.Condition(self._lock)
        # topic -> partition -> open batch
        self._open: dict[str, dict[int, ProducerBatch]] = {}
        self._sealed: deque[ProducerBatch] = deque()
        self._retries: dict[TopicPartition, list[ProducerBatch]] = {}
        self._muted: set[TopicPartition] = set()
        self._incomplete: dict[int, ProducerBatch] = {}
        self._linger_while_in_flight = linger_while_in_flight
        #: Batches of each partition handed to the sender and not yet
        #: answered or put back for a retry (only partitions with some).
        self._in_flight: dict[TopicPartition, int] = {}
        self._sequences: dict[tuple[str, int], int] = {}
        # The sticky partition of each topic, read on every keyless append.
        self._sticky_current: dict[str, int] = {}
        self._buffered = 0
        self.closed = False
        # The sender sleeps until woken (True until it first drains: wake it).
        self._sender_asleep = True
        # Something the sender must see was added since its last drain.
        self._changed = False
        #: topic -> the Lane into its sticky batch (read without the lock by
        #: Producer.send; changed only under it).
        self.lanes: dict[str, Lane] = {}
        #: topic -> its keyed lanes, one slot per partition (None: no lane),
        #: for the partition count the list is as long as (read without the
        #: lock by Producer.send through _cproduce.keyed_append; changed only
        #: under it; replaced, its lanes closed, for another count).
        self.keyed_lanes: dict[str, list[Lane | None]] = {}
        #: The largest record a lane takes (-1: no lanes).
        self._lane_max_record = (
            -1 if _cproduce is None or lane_max_record is None else lane_max_record
        )

    # ------------------------------------------------------------ caller side

    def append(
        self,
        topic: str,
        partition: int,
        partition_count: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None,
        timestamp_ms: int,
        size: int,
        max_block_s: float | None,
    ) -> FutureRecordMetadata:
        """Add a record; `partition` < 0 means "the sticky partition".

        Blocks up to `max_block_s` for buffer space (raising
        TidelogTimeoutError); max_block_s=None raises BufferFullError at once
        instead, for callers on the event loop that must not block it.
        """
        # Bound acquire/release in try/finally: measurably cheaper than
        # `with self._lock` on this hot path (one lock per record).
        # The kind of lane send() offered the record to: keyed, keyless (the
        # topic's), or none (an explicit partition of a keyless record).
        keyed: bool | None = True if key is not None else (False if partition < 0 else None)
        self._acquire()
        try:
            if partition < 0 and topic in self.lanes:
                # Only a keyless record may reach the sticky batch without
                # choosing its partition (or move the sticky partition on).
                self._close_topic_lane(topic, size, bool(headers))
            if self._buffered + size > self._buffer_memory or self.closed:
                self._wait_for_space(size, max_block_s)
            if key is not None and self._lane_max_record >= 0:
                table = self.keyed_lanes.get(topic)
                if table is not None and len(table) != partition_count:
                    # The metadata changed: this record's partition is of the
                    # new count, the table's lanes of the old one.
                    self._end_keyed_lanes(topic)
            by_partition = self._open.get(topic)
            chosen = self._sticky_current.get(topic, -1) if partition < 0 else partition
            batch = None if by_partition is None else by_partition.get(chosen)
            if (
                batch is not None
                and batch.lane is not None
                and not self._settle(batch, size, bool(headers), keyed)
            ):
                batch = None
            if batch is None or batch.size + size > self._batch_size:
                batch = self._batch_for(
                    topic, partition, partition_count, size, bool(headers), keyed
                )
            values = batch.values
            index = len(values)
            values.append(value)
            batch.timestamps.append(timestamp_ms)
            if key is not None or batch.keys is not None:
                if batch.keys is None:
                    batch.keys = [None] * index
                batch.keys.append(key)
            if headers or batch.headers is not None:
                if batch.headers is None:
                    batch.headers = [None] * index
                batch.headers.append(headers)
            batch.size += size
            self._buffered += size
            if batch.size > self._full_above:
                self._seal(batch)
                self._wake_sender()
            elif keyed is not None and size <= self._lane_max_record and not batch.lane_refused:
                # A record send() offers lanes (no explicit partition of a
                # keyless one): its batch gets a lane for the next ones.
                self._open_lane(batch, size, partition_count)
        finally:
            self._release()
        return FutureRecordMetadata((batch.result, index))

    def _lane_room(self, batch: ProducerBatch) -> int:
        """The room a lane into `batch` is granted (see the module doc)."""
        return min(self._batch_size - batch.size, (self._buffer_memory - self._buffered) // 2)

    def _open_lane(self, batch: ProducerBatch, size: int, partition_count: int) -> None:
        """Give the open `batch`, whose last record was keyed or keyless to
        the sticky partition, a lane (under the lock), when the room it can
        be granted takes at least one more record of `size`: a batch without
        keys (the sticky one) a keyless lane, the topic's; a batch with keys
        a keyed lane in its topic's table for `partition_count`, which is
        also the topic's keyless lane when the batch is the sticky one."""
        room = self._lane_room(batch)
        if room < size or self.closed:
            return
        topic = batch.topic
        # The topic's open batch of its sticky partition, which keyless
        # records reach through the topic's lane.
        sticky = self._sticky_current.get(topic) == batch.partition
        if batch.keys is None:
            if sticky:
                self.lanes[topic] = self._new_lane(batch, room, keyed=False)
            return
        if not 0 <= batch.partition < partition_count:
            return
        table = self.keyed_lanes.get(topic)
        if table is None or len(table) != partition_count:
            if table is not None:
                self._end_keyed_lanes(batch.topic)
            table = self.keyed_lanes[batch.topic] = [None] * partition_count
        # One open batch per partition, and a lane leaves its slot when it
        # closes: the slot of a batch without a lane is empty.
        assert table[batch.partition] is None
        lane = table[batch.partition] = self._new_lane(batch, room, keyed=True, keyless=sticky)
        if sticky:
            self.lanes[topic] = lane

    def _new_lane(self, batch: ProducerBatch, room: int, keyed: bool, keyless: bool = True) -> Lane:
        """A lane of `room` bytes into `batch` (under the lock), keyed or not
        (a keyed one taking keyless records too when `keyless`); the room
        counts as buffered from now on."""
        assert _cproduce is not None and batch.lane is None
        batch.lane = _cproduce.Lane(
            batch.values,
            batch.timestamps,
            batch.result,
            FutureRecordMetadata,
            room,
            self._lane_max_record,
            RECORD_OVERHEAD,
            partial(self._lane_filled, batch),
            batch.keys if keyed else None,
            batch.headers,
            keyless=keyless,
        )
        self._buffered += room
        return batch.lane

    def _end_keyed_lanes(self, topic: str) -> None:
        """Close every keyed lane of `topic` and drop its table (under the
        lock): the partition count changed."""
        for batch in list(self._open.get(topic, {}).values()):
            if batch.lane is not None and batch.lane.keyed:
                self._end_lane(batch)
        self.keyed_lanes.pop(topic, None)

    def _end_lane(self, batch: ProducerBatch) -> bool:
        """Close `batch`'s lane (under the lock) and seal the batch if the
        lane left it full; whether the batch is still open."""
        self._close_lane(batch)
        if batch.size > self._full_above:
            # The lane filled the batch and this came before its on_full
            # (which will find the lane closed): the batch must not wait
            # for the linger.
            self._seal(batch)
            self._wake_sender()
            return False
        return True

    def _settle(
        self, batch: ProducerBatch, size: int, headers: bool = False, keyed: bool | None = None
    ) -> bool:
        """Close `batch`'s lane before a locked append of a record of `size`
        bytes may reach the batch (under the lock): `_end_lane`, and when
        the lane had room for that record (it is one a lane does not take),
        the batch gets no other lane. Whether the batch is still open.

        Except when the lane could not take the record for its kind alone,
        which the batch's next lane takes once the record is in (so once per
        batch): a record with `headers` while the batch has no headers
        column (so its lane had none); a keyed record (`keyed` True) while
        the batch has no keys (a keyless lane: its next lane is keyed); a
        keyless record of the sticky partition (`keyed` False) and a lane
        that takes none (a keyed lane opened before the sticky partition
        moved to the batch: its next lane takes both kinds). `keyed` None:
        neither (an explicit partition of a keyless record, columns)."""
        lane = batch.lane
        assert lane is not None
        if not self._end_lane(batch):
            return False
        if (
            lane.room - lane.used >= size
            and not (headers and batch.headers is None)
            and not (keyed is True and not lane.keyed)
            and not (keyed is False and not lane.keyless)
        ):
            batch.lane_refused = True
        return True

    def _reclaim_lanes(self) -> None:
        """Close every lane (under the lock), giving back the room they were
        granted and did not use: before a locked append waits for buffer
        memory, which lanes must not hold from it (the keyed lanes of many
        partitions together may hold most of what is free)."""
        for by_partition in list(self._open.values()):
            for batch in list(by_partition.values()):
                if batch.lane is not None:
                    self._end_lane(batch)

    def _lane_filled(self, batch: ProducerBatch, lane: Lane) -> None:
        """`lane`'s on_full: an append left it less room than any record needs
        (called by that append in send()'s thread, after its record is in,
        without the lock). Close it, and seal its batch if that is full now
        (the lane's room may have been only part of the batch's: buffer
        memory). A lane closed meanwhile was closed by a seal, drain or close
        that took its batch, or by a locked append that sealed it if full."""
        self._acquire()
        try:
            if batch.lane is lane:
                self._end_lane(batch)
        finally:
            self._release()

    def _close_topic_lane(self, topic: str, size: int, headers: bool = False) -> None:
        """End the lane of `topic` before a locked append of a record of
        `size` bytes (with `headers`, as for `_settle`) to its sticky
        partition, which may move on (a keyless record, or columns of one).
        A record of a partition it chose reaches only that partition's
        batch, whose lane (maybe this one) its append settles: this lane
        stays open for the keyless records. A topic's lane is always its
        open sticky batch's: it opens on that batch, and the sticky
        partition only moves in a locked append of a keyless record, which
        ends it first."""
        batch = self._open[topic][self._sticky_current[topic]]
        assert batch.lane is not None and batch.lane is self.lanes[topic]
        # A full batch is sealed even when the record goes to another
        # partition: it must not wait for the linger.
        self._settle(batch, size, headers)

    def _close_lane(self, batch: ProducerBatch) -> None:
        """End `batch`'s lane (under the lock): the records appended through
        it count in the batch's size, the room left is given back."""
        lane = batch.lane
        assert lane is not None
        batch.lane = None
        # The sticky batch's keyed lane is in both places.
        if self.lanes.get(batch.topic) is lane:
            del self.lanes[batch.topic]
        table = self.keyed_lanes.get(batch.topic)
        if table is not None and batch.partition < len(table) and table[batch.partition] is lane:
            table[batch.partition] = None
        used = lane.close()
        batch.size += used
        self._buffered -= lane.room - used
        if lane.room > used:
            self._space.notify_all()

    def append_columns(
        self,
        topic: str,
        partition: int,
        partition_count: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header] | None] | None,
        timestamps: Sequence[int],
        sizes: Sequence[int],
        max_block_s: float | None,
    ) -> list[Placement]:
        """Add records given as columns, all for `partition` (< 0: the
        sticky partition). `keys`/`headers` None: no record has any;
        `sizes`: each record's `record_size`. Returns where the records
        went, in order: runs of consecutive records sharing a batch (a
        full batch is sealed and the rest go to the next one, on the next
        sticky partition for keyless records, as `append` does).

        Blocks for buffer space as `append` does, for all the records at
        once.
        """
        total = sum(sizes)
        # Record n's end, counted from the first record's start.
        ends = list(accumulate(sizes))
        placements: list[Placement] = []
        self._acquire()
        try:
            if partition < 0 and topic in self.lanes:
                self._close_topic_lane(topic, sizes[0] if sizes else 0)
            if self._buffered + total > self._buffer_memory or self.closed:
                self._wait_for_space(total, max_block_s)
            count = len(values)
            pos = 0
            done = 0  # bytes of the records before `pos`
            while pos < count:
                by_partition = self._open.get(topic)
                chosen = self._sticky_current.get(topic, -1) if partition < 0 else partition
                batch = None if by_partition is None else by_partition.get(chosen)
                if (
                    batch is not None
                    and batch.lane is not None
                    and not self._settle(batch, sizes[pos])
                ):
                    batch = None
                if batch is None or batch.size + sizes[pos] > self._batch_size:
                    batch = self._batch_for(topic, partition, partition_count, sizes[pos])
                # As many records as fit the batch's room (at least one: a
                # record larger than batch_size goes alone, as in append).
                room = self._batch_size - batch.size
                end = max(pos + 1, bisect_right(ends, done + room, pos))
                self._extend(batch, values, keys, headers, timestamps, pos, end)
                added = ends[end - 1] - done
                batch.size += added
                self._buffered += added
                placements.append(
                    Placement(batch.result, len(batch.values) - (end - pos), end - pos)
                )
                done = ends[end - 1]
                pos = end
                if batch.size > self._full_above:
                    self._seal(batch)
                    self._wake_sender()
        finally:
            self._release()
        return placements

    @staticmethod
    def _extend(
        batch: ProducerBatch,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header] | None] | None,
        timestamps: Sequence[int],
        start: int,
        end: int,
    ) -> None:
        """Append records [start, end) of the columns to the batch's columns
        (list slices and extends: C speed, no per-record Python)."""
        index = len(batch.values)
        whole = start == 0 and end == len(values)
        batch.values.extend(values if whole else values[start:end])
        batch.timestamps.extend(timestamps if whole else timestamps[start:end])
        if keys is not None or batch.keys is not None:
            if batch.keys is None:
                batch.keys = [None] * index
            batch.keys.extend(repeat(None, end - start) if keys is None else keys[start:end])
        if headers is not None or batch.headers is not None:
            if batch.headers is None:
                batch.headers = [None] * index
            batch.headers.extend(
                repeat(None, end - start) if headers is None else headers[start:end]
            )

    def _batch_for(
        self,
        topic: str,
        partition: int,
        partition_count: int,
        size: int,
        headers: bool = False,
        keyed: bool | None = None,
    ) -> ProducerBatch:
        """The slow path of append: the open batch is missing or full
        (`headers`, `keyed`: the record's, as for `_settle`)."""
        by_partition = self._open.get(topic)
        if by_partition is None:
            by_partition = self._open[topic] = {}
        if partition < 0:
            # Keyless record: its sticky partition's batch was sent or is full,
            # or there is no sticky partition yet. Move on, as KIP-480 does.
            current = self._sticky_current.get(topic)
            if current is not None:
                full = by_partition.get(current)
                if full is not None:
                    # The record did not fit: the batch is full for it, and
                    # keyless records move on, so it would wait out its linger
                    # (Kafka closes a batch a record did not fit, too).
                    self._seal(full)
                    self._wake_sender()
                self._sticky.on_new_batch(topic, partition_count, current)
            partition = self._sticky.partition(topic, partition_count)
            self._sticky_current[topic] = partition
            batch = by_partition.get(partition)
            if (
                batch is not None
                and batch.lane is not None
                and not self._settle(batch, size, headers, keyed)
            ):
                batch = None  # a keyed lane had filled it
            if batch is not None and batch.size + size <= self._batch_size:
                return batch
        old = by_partition.get(partition)
        if old is not None:
            self._seal(old)
        key = (topic, partition)
        sequence = self._sequences.get(key, 0)
        self._sequences[key] = sequence + 1
        batch = ProducerBatch(topic, partition, sequence, self._clock())
        by_partition[partition] = batch
        self._incomplete[id(batch)] = batch
        # The sender must learn of the new batch to time its linger.
        self._wake_sender()
        return batch

    def _wake_sender(self) -> None:
        """A batch was created or sealed (under the lock): wake the sender if
        it sleeps, else let it know when it asks `sender_waits`."""
        if self._sender_asleep:
            self._sender_asleep = False
            self._wake()
        else:
            self._changed = True

    def _wait_for_space(self, size: int, max_block_s: float | None) -> None:
        if self.closed:
            raise ClosedError("the producer is closed")
        if not self._buffered:
            return  # one record larger than the whole buffer still goes
        self._reclaim_lanes()
        if self._buffered + size <= self._buffer_memory:
            return
        if max_block_s is None:
            raise BufferFullError()
        deadline = self._clock() + max_block_s
        while self._buffered + size > self._buffer_memory and self._buffered and not self.closed:
            # Lanes opened meanwhile hold room this record may need.
            self._reclaim_lanes()
            if self._buffered + size <= self._buffer_memory:
                break
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise TidelogTimeoutError(
                    f"buffer_memory ({self._buffer_memory} bytes) stayed full for "
                    f"max_block_ms ({max_block_s * 1000:.0f} ms)"
                )
            self._space.wait(remaining)
        if self.closed:
            raise ClosedError("the producer closed while send() waited for buffer space")

    def _seal(self, batch: ProducerBatch) -> None:
        if batch.lane is not None:
            self._close_lane(batch)
        del self._open[batch.topic][batch.partition]
        self._sealed.append(batch)

    def seal_all(self) -> None:
        """Make every open batch ready now (flush, close)."""
        with self._lock:
            for by_partition in self._open.values():
                for batch in list(by_partition.values()):
                    self._seal(batch)
        self._wake()

    def incomplete(self) -> list[BatchResult]:
        """Results of every batch not yet delivered or failed."""
        with self._lock:
            return [b.result for b in self._incomplete.values()]

    # ------------------------------------------------------------ sender side

    def drain(
        self, now: float, delivery_timeout_s: float, new_batches: bool = True
    ) -> tuple[list[ProducerBatch], list[ProducerBatch], float | None]:
        """Take the batches ready to send, in order.

        Returns (ready, expired, next_deadline): `expired` batches waited
        longer than the delivery timeout and must be failed; next_deadline is
        when the next open batch's linger (or a retry's backoff) ends. With
        `new_batches` False only retries are taken (an idempotent producer
        waiting for its producer id), though sealed batches still expire.
        An open batch whose linger is over but whose partition has a batch in
        flight is held (`linger_while_in_flight`) and sets no deadline: the
        answer wakes the sender (`resolved` returns True).
        """
        ready: list[ProducerBatch] = []
        expired: list[ProducerBatch] = []
        next_deadline: float | None = None
        with self._lock:
            # The sender is awake and sees everything added so far.
            self._sender_asleep = False
            self._changed = False
            for tp, batches in list(self._retries.items()):
                if batches[0].retry_at <= now:
                    ready.extend(batches)
                    del self._retries[tp]
                else:
                    deadline = batches[0].retry_at
                    next_deadline = (
                        deadline if next_deadline is None else min(next_deadline, deadline)
                    )
            muted = self._muted
            if self._sealed:
                kept: deque[ProducerBatch] = deque()
                for batch in self._sealed:
                    if now - batch.created > delivery_timeout_s and batch.tp not in muted:
                        expired.append(batch)
                    elif batch.tp in muted or not new_batches:
                        kept.append(batch)
                    else:
                        ready.append(batch)
                self._sealed = kept
            if new_batches:
                next_deadline = self._drain_open(now, ready, next_deadline)
            self._take(ready)
        return ready, expired, next_deadline

    def _drain_open(
        self, now: float, ready: list[ProducerBatch], next_deadline: float | None
    ) -> float | None:
        """`drain`'s part for open batches (under the lock): those whose linger
        is over and that are not held go to `ready`; returns the next deadline."""
        muted = self._muted
        held = self._in_flight if self._linger_while_in_flight else {}
        for by_partition in self._open.values():
            for batch in list(by_partition.values()):
                deadline = batch.created + self._linger_s
                if batch.tp in muted:
                    continue
                if deadline > now:
                    next_deadline = (
                        deadline if next_deadline is None else min(next_deadline, deadline)
                    )
                elif batch.tp not in held:  # else: goes at its partition's answer, or when full
                    if batch.lane is not None:
                        self._close_lane(batch)
                    del by_partition[batch.partition]
                    ready.append(batch)
        return next_deadline

    def _take(self, ready: list[ProducerBatch]) -> None:
        """Count `ready` (drained, under the lock) as in flight."""
        in_flight = self._in_flight
        for batch in ready:
            if not batch.in_flight:
                batch.in_flight = True
                in_flight[batch.tp] = in_flight.get(batch.tp, 0) + 1

    def _returned(self, batch: ProducerBatch) -> bool:
        """`batch` is no longer in flight (answered, failed or put back for a
        retry; under the lock). True if it was its partition's last one in
        flight and that partition has an open batch, which may have been held
        for it."""
        if not batch.in_flight:
            return False
        batch.in_flight = False
        tp = batch.tp
        left = self._in_flight[tp] - 1
        if left:
            self._in_flight[tp] = left
            return False
        del self._in_flight[tp]
        return self._linger_while_in_flight and tp.partition in self._open.get(tp.topic, {})

    def sender_waits(self) -> bool:
        """The sender is about to sleep until woken (or its deadline): True
        if it may, False if batches were created or sealed since its last
        `drain` (it must drain again: nobody woke it for them)."""
        with self._lock:
            if self._changed:
                return False
            self._sender_asleep = True
            return True

    def has_earlier_unresolved(self, batch: ProducerBatch) -> bool:
        """Whether an earlier batch of the same partition, numbered by the
        same producer id and epoch, is still in flight or awaiting a retry
        (so a sequence gap the broker reported will close once it lands)."""
        with self._lock:
            return any(
                other.tp == batch.tp
                and other.sequence < batch.sequence
                and other.base_sequence >= 0
                and other.producer_id == batch.producer_id
                and other.producer_epoch == batch.producer_epoch
                for other in self._incomplete.values()
            )

    def has_numbered_unresolved(self) -> bool:
        """Whether any batch that has a producer sequence is unresolved."""
        with self._lock:
            return any(b.base_sequence >= 0 for b in self._incomplete.values())

    def requeue(self, batches: Iterable[ProducerBatch], retry_at: float) -> None:
        """Put batches back to be sent at `retry_at`, muting their partitions
        until they are resolved; keeps each partition's batches in order."""
        with self._lock:
            for batch in batches:
                self._returned(batch)  # its partition is muted until it is resolved
                batch.attempts += 1
                batch.retry_at = retry_at
                pending = self._retries.setdefault(batch.tp, [])
                pending.append(batch)
                pending.sort(key=lambda b: b.sequence)
                self._muted.add(batch.tp)

    def resolved(self, batch: ProducerBatch) -> bool:
        """A batch succeeded or failed for good: free its memory, unmute.
        Returns True when its partition was unmuted, or its open batch was
        held for this one (batches held back may now be drained: the sender
        must look again)."""
        with self._lock:
            if self._incomplete.pop(id(batch), None) is None:
                return False
            released = self._returned(batch)
            self._buffered -= batch.size - BATCH_OVERHEAD
            tp = batch.tp
            # Unmute once no batch of this partition awaits a retry or is
            # still out on a retry.
            if (
                tp in self._muted
                and tp not in self._retries
                and not any(b.tp == tp and b.attempts > 0 for b in self._incomplete.values())
            ):
                self._muted.discard(tp)
                unmuted = True
            else:
                unmuted = False
            self._space.notify_all()
            return unmuted or released

    def is_empty(self) -> bool:
        with self._lock:
            return not self._incomplete

    def take_all(self) -> list[ProducerBatch]:
        """Remove every batch not yet handed to the sender (close)."""
        with self._lock:
            self.closed = True
            out = list(self._sealed)
            self._sealed.clear()
            for by_partition in self._open.values():
                for batch in by_partition.values():
                    if batch.lane is not None:
                        self._close_lane(batch)
                out.extend(by_partition.values())
                by_partition.clear()
            for batches in self._retries.values():
                out.extend(batches)
            self._retries.clear()
            self.keyed_lanes.clear()  # every slot is empty by now
            self._space.notify_all()
            return out
