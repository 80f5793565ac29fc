"""The accumulator's keyed lanes (tidelog._cproduce): send()'s lock-free appends
of keyed records to their partition's open batch, against the locked appends,
seals, drains, partition count changes and the buffer memory they share. What
each path builds is compared byte for byte. Without I/O."""

from __future__ import annotations

import random
import threading
import time

import pytest
from tidelog import _accumulator
from tidelog._accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    BufferFullError,
    ProducerBatch,
    RecordAccumulator,
    keyed_append,
    record_size,
)
from tidelog.compression import CompressionType
from tidelog.errors import TidelogTimeoutError
from tidelog.partitioner import partition_for_key
from tidelog.records import decode_batches

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        _accumulator._cproduce is None,
        reason="tidelog._cproduce is not built (needs a C compiler: `make install`)",
    ),
]

MAX_RECORD = 1 << 20
COUNT = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    batch_size: int = 1000,
    linger_ms: int = 5,
    buffer_memory: int = 1 << 20,
    lanes: bool = True,
) -> tuple[RecordAccumulator, Clock]:
    clock = Clock()
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        buffer_memory=buffer_memory,
        wake=lambda: None,
        clock=clock,
        lane_max_record=MAX_RECORD if lanes else None,
    )
    return acc, clock


def key_for(partition: int, count: int = COUNT, start: int = 0) -> bytes:
    """A key whose murmur2 partition is `partition`."""
    i = start
    while partition_for_key(b"k%d" % i, count) != partition:
        i += 1
    return b"k%d" % i


def locked(  # type: ignore[no-untyped-def]
    acc: RecordAccumulator,
    key: bytes,
    value: bytes,
    count: int = COUNT,
    headers=None,
    timestamp: int | None = None,
    max_block_s: float | None = 1.0,
):
    """What Producer.send does with a keyed record no lane takes."""
    return acc.append(
        "t",
        partition_for_key(key, count),
        count,
        key,
        value,
        headers,
        time.time_ns() // 1_000_000 if timestamp is None else timestamp,
        record_size(key, value, headers),
        max_block_s,
    )


def fast(acc: RecordAccumulator, key: bytes, value: bytes, count: int = COUNT):  # type: ignore[no-untyped-def]
    """What Producer.send tries first (None: no table, no lane, or it refused)."""
    table = acc.keyed_lanes.get("t")
    return None if table is None else keyed_append(table, count, key, value)


def send(acc: RecordAccumulator, key: bytes, value: bytes, count: int = COUNT):  # type: ignore[no-untyped-def]
    return fast(acc, key, value, count) or locked(acc, key, value, count)


def drain_all(acc: RecordAccumulator) -> list[ProducerBatch]:
    acc.seal_all()
    ready, _, _ = acc.drain(100.0, 120.0)
    return ready


def records_of(batch: ProducerBatch) -> list[tuple[bytes | None, bytes | None]]:
    (decoded,) = decode_batches(batch.encode(CompressionType.NONE))
    return list(zip(decoded.keys, decoded.values, strict=True))


def test_a_locked_keyed_append_opens_its_partitions_lane() -> None:
    acc, _ = make(batch_size=1000)
    k0, k0b, k1 = key_for(0), key_for(0, start=100), key_for(1)
    assert fast(acc, k0, b"a") is None  # no table before the first locked append
    first = locked(acc, k0, b"a" * 10)
    table = acc.keyed_lanes["t"]
    assert len(table) == COUNT and [lane is None for lane in table] == [False, True, True, True]
    lane = table[0]
    assert lane is not None and lane.keyed
    futures = [keyed_append(table, COUNT, k, b"b" * 10) for k in (k0b, k0, k0b)]
    assert all(f is not None for f in futures)
    assert [f[0] for f in futures] == [first[0]] * 3  # the same batch's result
    assert [f[1] for f in futures] == [1, 2, 3]
    # Another partition has no lane yet; a keyless append never enters a keyed lane.
    assert keyed_append(table, COUNT, k1, b"c") is None
    assert lane.append(b"c") is None
    # The batch's whole room is reserved, whatever the lane has used yet.
    assert acc._buffered == 1000 - BATCH_OVERHEAD
    ready = drain_all(acc)
    assert lane.closed and table[0] is None
    assert keyed_append(table, COUNT, k0, b"d") is None  # the locked path takes it
    used = sum(
        record_size(k, v, None)
        for k, v in [(k0, b"a" * 10)] + [(k, b"b" * 10) for k in (k0b, k0, k0b)]
    )
    assert acc._buffered == used
    assert records_of(ready[0]) == [
        (k0, b"a" * 10),
        (k0b, b"b" * 10),
        (k0, b"b" * 10),
        (k0b, b"b" * 10),
    ]
    acc.resolved(ready[0])
    assert acc._buffered == 0


def test_the_c_calls_refuse_what_the_locked_path_must_take() -> None:
    acc, _ = make(batch_size=1000)
    k0 = key_for(0)
    locked(acc, k0, b"a")
    table = acc.keyed_lanes["t"]
    lane = table[0]
    assert lane is not None
    for key, value, count in [
        (bytearray(k0), b"v", COUNT),  # not exactly bytes: Producer converts it, locked
        (k0, bytearray(b"v"), COUNT),
        (k0, None, COUNT),  # a tombstone
        (None, b"v", COUNT),
        (k0, b"v", None),  # the topic's count is not known
        (k0, b"v", COUNT + 1),  # the table was made for another count
        (k0, b"v", True),
        (k0, b"v", 1 << 70),
        (k0, b"x" * 1000, COUNT),  # more than the lane's room
    ]:
        assert keyed_append(table, count, key, value) is None, (key, value, count)
    assert lane.append_keyed(None, b"v") is None
    assert lane.append_keyed(k0, b"v") is not None
    assert len(acc._open["t"][0].values) == len(acc._open["t"][0].keys or []) == 2
    # The largest record a lane takes is max_record, keys counted.
    small = _accumulator._cproduce.Lane(  # type: ignore[union-attr]
        [],
        [],
        None,
        _accumulator.FutureRecordMetadata,
        1000,
        RECORD_OVERHEAD + 4,
        RECORD_OVERHEAD,
        None,
        [],
    )
    assert small.append_keyed(b"kk", b"vvv") is None
    assert small.append_keyed(b"kk", b"vv") is not None
    with pytest.raises(ValueError, match="as long as"):
        _accumulator._cproduce.Lane(  # type: ignore[union-attr]
            [b"a"], [1], None, _accumulator.FutureRecordMetadata, 10, 10, 8, None, []
        )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_keyed_lanes_build_the_bytes_the_locked_path_builds(seed: int) -> None:
    """Random keys (empty ones too) and values through the lanes and, with the
    same create times, through the locked path alone: the same batches, byte for
    byte, and each future names its record."""
    rng = random.Random(seed)
    keys = [rng.randbytes(rng.choice([0, 1, 3, 8, 17])) for _ in range(50)]
    sent = [(rng.choice(keys), rng.randbytes(rng.randrange(0, 200))) for _ in range(3000)]
    batch_size = 4000
    acc, _ = make(batch_size=batch_size, buffer_memory=1 << 30)
    futures = [send(acc, key, value) for key, value in sent]
    assert any(lane is not None for lane in acc.keyed_lanes["t"])
    with_lanes = drain_all(acc)
    # The create time the lane (or the locked append) gave each record.
    timestamps = [future[0].timestamps[future[1]] for future in futures]
    plain, _ = make(batch_size=batch_size, buffer_memory=1 << 30, lanes=False)
    plain_futures = [
        locked(plain, key, value, timestamp=ts)
        for (key, value), ts in zip(sent, timestamps, strict=True)
    ]
    without = drain_all(plain)
    assert not plain.keyed_lanes
    assert len(with_lanes) == len(without) > 3 * COUNT

    def by_partition(batches: list[ProducerBatch]) -> dict[int, list[bytes]]:
        out: dict[int, list[bytes]] = {}
        for batch in sorted(batches, key=lambda b: (b.partition, b.sequence)):
            out.setdefault(batch.partition, []).append(batch.encode(CompressionType.NONE))
        return out

    assert by_partition(with_lanes) == by_partition(without)
    assert [f[1] for f in futures] == [f[1] for f in plain_futures]
    decoded = {id(b.result): records_of(b) for b in with_lanes}
    for (key, value), future in zip(sent, futures, strict=True):
        assert future[0].partition == partition_for_key(key, COUNT)
        assert decoded[id(future[0])][future[1]] == (key, value)
    assert sum(b.size for b in with_lanes) == sum(b.size for b in without)


def test_a_keyed_lane_that_fills_its_batch_seals_it_and_the_next_record_starts_one() -> None:
    k0 = key_for(0)
    record = record_size(k0, b"v" * 10, None)
    acc, _ = make(batch_size=BATCH_OVERHEAD + 3 * record)
    futures = [send(acc, k0, b"v" * 10) for _ in range(7)]
    results = [f[0] for f in futures]
    assert [results.index(r) for r in results] == [0] * 3 + [3] * 3 + [6]
    # The two full batches were sealed by their lanes' appends (on_full), not a linger.
    assert len(acc._sealed) == 2
    assert acc.keyed_lanes["t"][0] is not None  # the third batch's
    ready = drain_all(acc)
    assert [len(b) for b in ready] == [3, 3, 1]


def test_records_the_keyed_lanes_cannot_take_go_through_the_lock_in_partition_order() -> None:
    """Keyed records mixed with records with headers, keyless ones and explicit
    partitions: each partition's records stay in send order at the indexes
    their futures name, and the sizes add up."""
    acc, _ = make(batch_size=10_000)
    rng = random.Random(7)
    keys = [b"key-%d" % i for i in range(40)]
    sent = []
    for i in range(2000):
        key = rng.choice(keys)
        value = b"%05d" % i
        kind = i % 11
        if kind == 3:
            future = locked(acc, key, value, headers=[("h", b"1")])
            sent.append((future, key, value, [("h", b"1")]))
            continue
        if kind == 5:
            lane = acc.lanes.get("t")
            future = (lane.append(value) if lane else None) or acc.append(
                "t", -1, COUNT, None, value, None, 7, record_size(None, value, None), 1.0
            )
            sent.append((future, None, value, None))
            continue
        if kind == 7:
            future = acc.append(
                "t", 2, COUNT, key, value, None, 7, record_size(key, value, None), 1.0
            )
        else:
            future = send(acc, key, value)
        sent.append((future, key, value, None))
    ready = drain_all(acc)
    decoded = {id(b.result): records_of(b) for b in ready}
    for future, key, value, _ in sent:
        assert decoded[id(future[0])][future[1]] == (key, value)
    # Per partition, the batches in sequence hold the records in send order.
    for p in range(COUNT):
        got = [
            r
            for b in sorted(ready, key=lambda b: b.sequence)
            if b.partition == p
            for r in records_of(b)
        ]
        want = [(k, v) for f, k, v, _ in sent if f[0].partition == p]
        assert got == want
    assert sum(b.size - BATCH_OVERHEAD for b in ready) == sum(
        record_size(k, v, h) for _, k, v, h in sent
    )
    assert acc._buffered == sum(b.size - BATCH_OVERHEAD for b in ready)


def test_a_partition_count_change_retires_the_topics_keyed_lanes() -> None:
    acc, _ = make(batch_size=10_000)
    keys = [b"key-%d" % i for i in range(30)]
    for key in keys:
        send(acc, key, b"v", count=2)
    old = acc.keyed_lanes["t"]
    old_lanes = [lane for lane in old if lane is not None]
    assert len(old) == 2 and len(old_lanes) == 2
    # A send with the new count: the old table refuses it (it was made for 2).
    key = next(k for k in keys if partition_for_key(k, 3) != partition_for_key(k, 2))
    assert keyed_append(old, 3, key, b"w") is None
    future = send(acc, key, b"w", count=3)
    assert future[0].partition == partition_for_key(key, 3)
    new = acc.keyed_lanes["t"]
    assert new is not old and len(new) == 3
    assert all(lane.closed for lane in old_lanes) and old == [None, None]
    # A thread that still holds the old table and count finds nothing in it.
    assert keyed_append(old, 2, key, b"x") is None
    # Records that follow with the new count take the new lanes.
    later = [send(acc, k, b"y", count=3) for k in keys]
    assert all(f[0].partition == partition_for_key(k, 3) for f, k in zip(later, keys, strict=True))
    assert sum(lane is not None for lane in new) >= 2
    ready = drain_all(acc)
    assert sum(len(b) for b in ready) == 2 * len(keys) + 1
    assert acc._buffered == sum(b.size - BATCH_OVERHEAD for b in ready)


def test_lanes_give_back_their_unused_room_before_a_send_would_wait_for_it() -> None:
    """Each partition's lane is granted half of the free buffer memory: a few of
    them hold nearly all of it. A record that fits the memory the records use
    must not wait (or fail) for room that lanes hold but never filled."""
    record = record_size(key_for(0), b"v" * 40, None)
    memory = 64 * record
    # A real clock: max_block_s runs out.
    acc = RecordAccumulator(
        batch_size=100 * record,
        linger_ms=5,
        buffer_memory=memory,
        wake=lambda: None,
        lane_max_record=MAX_RECORD,
    )
    for p in range(COUNT):
        locked(acc, key_for(p), b"v" * 40)
    assert sum(lane is not None for lane in acc.keyed_lanes["t"]) >= 3
    big = b"w" * (5 * record)
    assert acc._buffered + record_size(key_for(1), big, None) > memory  # reserved
    # max_block_s None: BufferFullError were it to wait.
    future = locked(acc, key_for(1, start=500), big, max_block_s=None)
    assert future[0].partition == 1
    assert acc._buffered <= memory
    # Records that really fill the buffer still wait, and time out, as without lanes.
    with pytest.raises(BufferFullError):
        for i in range(memory):
            key = key_for(i % COUNT)
            fast(acc, key, b"v" * 40) or locked(acc, key, b"v" * 40, max_block_s=None)
    assert not any(acc.keyed_lanes["t"])  # all closed: what is buffered is records
    assert acc._buffered + record > memory
    with pytest.raises(TidelogTimeoutError, match="buffer_memory"):
        locked(acc, key_for(3), b"v" * 40, max_block_s=0.05)
    ready = drain_all(acc)
    for batch in ready:
        acc.resolved(batch)
    assert acc._buffered == 0


def test_a_drain_after_linger_and_close_end_the_keyed_lanes() -> None:
    acc, clock = make(batch_size=10_000, linger_ms=5)
    k0, k1 = key_for(0), key_for(1)
    send(acc, k0, b"a")
    send(acc, k1, b"a")
    table = acc.keyed_lanes["t"]
    lane0 = table[0]
    assert lane0 is not None and send(acc, k0, b"b") is not None
    clock.now += 1.0
    ready, _, _ = acc.drain(clock(), 120.0)
    assert len(ready) == 2 and lane0.closed and table == [None] * COUNT
    later = send(acc, k0, b"c")
    assert later[0] is not ready[0].result and later[1] == 0
    lane = table[0]
    assert lane is not None
    taken = acc.take_all()
    assert lane.closed and not acc.keyed_lanes and table == [None] * COUNT
    assert [records_of(b) for b in taken] == [[(k0, b"c")]]
    assert fast(acc, k0, b"d") is None


def test_a_batch_whose_keyed_lane_a_record_bypassed_keeps_the_locked_path() -> None:
    acc, _ = make(batch_size=10_000)
    k0 = key_for(0)
    send(acc, k0, b"a")
    assert acc.keyed_lanes["t"][0] is not None
    locked(acc, k0, b"b", headers=[("h", b"1")])  # the lane had room for it: bypassed
    send(acc, k0, b"c")
    assert acc.keyed_lanes["t"][0] is None
    acc.seal_all()
    send(acc, k0, b"d")  # a new batch: lanes again
    assert acc.keyed_lanes["t"][0] is not None


def test_a_keyless_lane_and_keyed_lanes_of_one_topic_keep_to_their_batches() -> None:
    """The sticky batch's keyless lane and a keyed lane are never one batch's:
    a keyed record to the sticky partition closes the keyless lane first."""
    acc, _ = make(batch_size=10_000)
    value = b"v"
    acc.append("t", -1, COUNT, None, value, None, 7, record_size(None, value, None), 1.0)
    sticky = acc._sticky_current["t"]
    assert "t" in acc.lanes
    key = key_for(sticky)
    send(acc, key, value)
    assert "t" not in acc.lanes
    for batch in acc._open["t"].values():
        assert batch.lane is None or batch.lane.keyed
    ready = drain_all(acc)
    assert records_of(ready[0]) == [(None, value), (key, value)]


@pytest.mark.parametrize(
    ("batch_size", "linger_ms", "change_count"),
    # 2,000 bytes leave room after the last record; BATCH_OVERHEAD + 100 * 20 are
    # filled exactly (8-byte keys, 4-byte values), so lanes fill and seal their
    # batches themselves (on_full), racing the drains; with linger 60 s only
    # those seals make batches ready; and a partition count that grows midway.
    [
        (2_000, 0, False),
        (BATCH_OVERHEAD + 100 * 20, 0, False),
        (BATCH_OVERHEAD + 100 * 20, 60_000, False),
        (2_000, 0, True),
    ],
)
def test_every_keyed_record_appended_while_the_sender_drains_lands_once_in_order(
    batch_size: int, linger_ms: int, change_count: bool
) -> None:
    """A thread sends keyed records as fast as it can while another drains:
    every record is in exactly one drained batch, each partition's in send
    order, at the index its future names, and the memory comes back."""
    acc, clock = make(batch_size=batch_size, linger_ms=linger_ms, buffer_memory=1 << 30)
    count = 20_000
    keys = [b"%08d" % i for i in range(1000)]
    sent: list = []  # type: ignore[type-arg]
    misplaced: list[int] = []
    done = threading.Event()

    def produce() -> None:
        partitions = COUNT
        for i in range(count):
            if change_count and i == count // 2:
                partitions = COUNT + 2
            key = keys[i % len(keys)]
            value = i.to_bytes(4, "big")
            table = acc.keyed_lanes.get("t")
            if i % 25 == 0:
                # Let the drainer in between finding the table and using it: a
                # lane it closes meanwhile must refuse.
                time.sleep(0)
            future = None if table is None else keyed_append(table, partitions, key, value)
            future = future or locked(acc, key, value, partitions)
            # The key's partition for the count this send read, lane or not.
            if future[0].partition != partition_for_key(key, partitions):
                misplaced.append(i)
            sent.append((future, key, value))
        done.set()

    drained = []
    thread = threading.Thread(target=produce)
    thread.start()
    while not done.is_set() or not acc.is_empty():
        if done.is_set():
            acc.seal_all()
        ready, _, _ = acc.drain(clock(), 120.0)
        for batch in ready:
            batch.encode(CompressionType.NONE)
            drained.append(batch)
            acc.resolved(batch)
    thread.join()
    assert not misplaced
    decoded = {id(b.result): records_of(b) for b in drained}
    assert sum(len(r) for r in decoded.values()) == count
    for p in range(COUNT + 2):
        got = [
            r
            for b in sorted(drained, key=lambda b: b.sequence)
            if b.partition == p
            for r in decoded[id(b.result)]
        ]
        assert got == [(k, v) for f, k, v in sent if f[0].partition == p]
    for future, key, value in sent[:: count // 1000]:
        assert decoded[id(future[0])][future[1]] == (key, value)
    assert acc._buffered == 0


def test_keyless_records_moving_on_to_a_partition_with_a_keyed_lane_close_it_first() -> None:
    """The sticky partition moves (two partitions: to the other one) to a batch
    whose keyed lane has nearly filled it: the lane's records count before the
    keyless record is placed, so it starts a new batch rather than overfill
    that one, and lands after them."""
    batch_size = 400
    acc, _ = make(batch_size=batch_size)
    first = acc.append(
        "t", -1, 2, None, b"s" * 20, None, 7, record_size(None, b"s" * 20, None), 1.0
    )
    sticky = first[0].partition
    other = 1 - sticky
    key = key_for(other, count=2)
    keyed = [send(acc, key, b"k" * 20, count=2) for _ in range(11)]
    lane = acc.keyed_lanes["t"][other]
    assert lane is not None and lane.used == 10 * record_size(key, b"k" * 20, None)
    keyless = [first]
    while True:  # fill the sticky batch (through its keyless lane) until a record moves on
        value = b"s" * 20
        lane = acc.lanes.get("t")
        future = (lane.append(value) if lane else None) or acc.append(
            "t", -1, 2, None, value, None, 7, record_size(None, value, None), 1.0
        )
        keyless.append(future)
        if future[0].partition == other:
            break
    ready = drain_all(acc)
    assert all(b.size <= batch_size for b in ready)
    assert keyless[-1][0] is not keyed[0][0]  # not into the keyed batch it would overfill
    assert records_of(next(b for b in ready if b.result is keyed[0][0])) == [(key, b"k" * 20)] * 11
    assert acc._buffered == sum(b.size - BATCH_OVERHEAD for b in ready)


def test_columns_appended_to_a_partition_with_a_keyed_lane_follow_its_records() -> None:
    """append_columns (the gateway's send_batch) to a partition whose batch has a
    keyed lane: the lane closes first, so the columns land after its records
    and the batch is not overfilled."""
    batch_size = 400
    acc, _ = make(batch_size=batch_size)
    key = key_for(1)
    keyed = [send(acc, key, b"k" * 20) for _ in range(10)]
    assert acc.keyed_lanes["t"][1] is not None
    values = [b"c%02d" % i for i in range(10)]
    keys = [b"x"] * 10
    sizes = [record_size(k, v, None) for k, v in zip(keys, values, strict=True)]
    placements = acc.append_columns("t", 1, COUNT, values, keys, None, [7] * 10, sizes, 1.0)
    assert acc.keyed_lanes["t"][1] is None
    ready = drain_all(acc)
    assert all(b.size <= batch_size for b in ready)
    got = [r for b in sorted(ready, key=lambda b: b.sequence) for r in records_of(b)]
    assert got == [(key, b"k" * 20)] * 10 + list(zip(keys, values, strict=True))
    assert placements[0].result is keyed[0][0] and placements[0].first == 10
