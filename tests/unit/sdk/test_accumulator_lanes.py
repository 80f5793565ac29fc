"""The accumulator's lanes (tidelog._cproduce): send()'s lock-free appends to a
topic's sticky batch, against the locked appends, seals, drains and the buffer
memory they share. Without I/O."""

from __future__ import annotations

import threading
import time

import pytest
from tidelog import _accumulator, records
from tidelog._accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    BufferFullError,
    RecordAccumulator,
    record_size,
)
from tidelog.compression import CompressionType
from tidelog.records import decode_batches

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        _accumulator._cproduce is None,
        reason="tidelog._cproduce is not built (needs a C compiler: `make install`)",
    ),
]

MAX_RECORD = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    batch_size: int = 1000, linger_ms: int = 5, buffer_memory: int = 1 << 20
) -> tuple[RecordAccumulator, Clock]:
    clock = Clock()
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        buffer_memory=buffer_memory,
        wake=lambda: None,
        clock=clock,
        lane_max_record=MAX_RECORD,
    )
    return acc, clock


def locked(acc: RecordAccumulator, value: bytes, headers=None, partition: int = -1):  # type: ignore[no-untyped-def]
    """What Producer.send does when no lane takes the record."""
    return acc.append(
        "t", partition, 2, None, value, headers, 7, record_size(None, value, headers), 1.0
    )


def fast(acc: RecordAccumulator, value: bytes):  # type: ignore[no-untyped-def]
    """What Producer.send tries first: the topic's lane (None: none, or it refused)."""
    lane = acc.lanes.get("t")
    return None if lane is None else lane.append(value)


def send(acc: RecordAccumulator, value: bytes):  # type: ignore[no-untyped-def]
    return fast(acc, value) or locked(acc, value)


def values_of(batches) -> list[bytes]:  # type: ignore[no-untyped-def]
    out: list[bytes] = []
    for batch in batches:
        (decoded,) = decode_batches(batch.encode(CompressionType.NONE))
        out += decoded.values
    return out


def test_a_locked_keyless_append_opens_a_lane_that_takes_the_next_records() -> None:
    acc, _ = make(batch_size=1000)
    assert fast(acc, b"a" * 10) is None  # no lane before the first locked append
    first = locked(acc, b"a" * 10)
    lane = acc.lanes["t"]
    futures = [lane.append(b"b" * 10) for _ in range(3)]
    assert all(f is not None for f in futures)
    assert [f[0] for f in futures] == [first[0]] * 3  # the same batch's result
    assert [f[1] for f in futures] == [1, 2, 3]  # its indexes, after the locked record's
    # The whole room of the batch is reserved, whatever the lane has used yet.
    assert acc._buffered == 1000 - BATCH_OVERHEAD
    acc.seal_all()
    assert "t" not in acc.lanes and lane.closed
    assert lane.append(b"c") is None  # a closed lane refuses: the caller locks
    # The lane's records count in the batch; the unused room is given back.
    assert acc._buffered == 4 * (RECORD_OVERHEAD + 10)
    ready, _, _ = acc.drain(100.0, 120.0)
    assert values_of(ready) == [b"a" * 10] + [b"b" * 10] * 3
    assert acc.resolved(ready[0]) is False
    assert acc._buffered == 0


def test_a_full_lane_refuses_and_the_locked_path_starts_the_next_batch() -> None:
    acc, _ = make(batch_size=BATCH_OVERHEAD + 5 * (RECORD_OVERHEAD + 10))
    futures = [send(acc, b"%09d" % i + b"x") for i in range(12)]
    results = [f[0] for f in futures]
    # Five records a batch: the lane fills the rest of each after its locked first record.
    assert [results.index(r) for r in results] == [0] * 5 + [5] * 5 + [10] * 2
    assert [f[1] for f in futures] == [0, 1, 2, 3, 4] * 2 + [0, 1]
    acc.seal_all()
    ready, _, _ = acc.drain(100.0, 120.0)
    assert [len(b) for b in ready] == [5, 5, 2]
    assert values_of(ready) == [b"%09d" % i + b"x" for i in range(12)]


def test_records_the_lane_cannot_take_go_through_the_lock_in_order() -> None:
    acc, _ = make(batch_size=10_000)
    sent = []
    for i in range(20):
        value = b"%03d" % i
        if i % 5 == 3:
            # Headers and explicit partitions are the locked path's: the topic's lane
            # closes first, so the batch's records stay in send order.
            future = locked(acc, value, headers=[("h", b"1")])
        elif i % 7 == 6:
            future = locked(acc, value, partition=1)
        else:
            future = send(acc, value)
        sent.append((future, value))
    acc.seal_all()
    ready, _, _ = acc.drain(100.0, 120.0)
    by_result = {id(b.result): b for b in ready}
    for future, value in sent:
        batch = by_result[id(future[0])]
        (decoded,) = decode_batches(batch.encode(CompressionType.NONE))
        got = decoded.values[future[1]]
        assert got == value
    total = sum(record_size(None, v, [("h", b"1")] if int(v) % 5 == 3 else None) for _, v in sent)
    assert sum(b.size - BATCH_OVERHEAD for b in ready) == total


def test_a_lane_is_granted_no_more_than_the_free_buffer_memory() -> None:
    record = RECORD_OVERHEAD + 10
    acc, _ = make(batch_size=10_000, buffer_memory=4 * record)
    futures = [send(acc, b"v" * 10) for _ in range(4)]
    # After each locked record, a lane got half of the room left: 1.5 records
    # (1 used), then half a record (no lane); so locked, lane, locked, locked.
    assert [f[0] is futures[0][0] for f in futures] == [True] * 4
    assert "t" not in acc.lanes
    assert acc._buffered == 4 * record
    # The buffer is full: the locked path refuses (or waits), as without lanes.
    with pytest.raises(BufferFullError):
        acc.append("t", -1, 2, None, b"v" * 10, None, 7, record, None)


def test_a_drain_after_linger_closes_the_lane_of_the_batch_it_takes() -> None:
    acc, clock = make(batch_size=10_000, linger_ms=5)
    send(acc, b"a")
    lane = acc.lanes["t"]
    assert send(acc, b"b") is not None
    clock.now += 1.0
    ready, _, _ = acc.drain(clock(), 120.0)
    assert len(ready) == 1 and lane.closed and "t" not in acc.lanes
    # The next record starts a batch of its own.
    later = send(acc, b"c")
    assert later[0] is not ready[0].result and later[1] == 0
    assert values_of(ready) == [b"a", b"b"]


def test_close_takes_the_lanes_and_refuses_later_records() -> None:
    acc, _ = make()
    send(acc, b"a")
    lane = acc.lanes["t"]
    taken = acc.take_all()
    assert lane.closed and not acc.lanes
    assert values_of(taken) == [b"a"]
    assert fast(acc, b"b") is None


@pytest.mark.parametrize(
    ("batch_size", "linger_ms"),
    # 2,000 bytes leave room after the last 12-byte record; 1,982 are filled
    # exactly (160 records), so lanes fill and seal their batches themselves
    # (on_full), racing the drains; with linger 60 s only those seals, no
    # lingering, make batches ready.
    [(2_000, 0), (BATCH_OVERHEAD + 160 * 12, 0), (BATCH_OVERHEAD + 160 * 12, 60_000)],
)
def test_every_record_appended_while_the_sender_drains_lands_in_one_batch_once(
    batch_size: int, linger_ms: int
) -> None:
    """A thread sends as fast as it can while another drains (each drain closes
    the lane it takes; with linger 0, of the batch still open too): every record
    is in exactly one drained batch, in send order, at the index its future
    names."""
    acc, clock = make(batch_size=batch_size, linger_ms=linger_ms, buffer_memory=1 << 30)
    count = 20_000
    futures: list = []  # type: ignore[type-arg]
    done = threading.Event()

    def produce() -> None:
        for i in range(count):
            value = i.to_bytes(4, "big")
            lane = acc.lanes.get("t")
            if i % 25 == 0:
                # Let the drainer in between finding the lane and using it: the
                # lane it closes meanwhile must refuse.
                time.sleep(0)
            future = None if lane is None else lane.append(value)
            futures.append(future or locked(acc, value))
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
    values = values_of(drained)
    assert values == [i.to_bytes(4, "big") for i in range(count)]
    by_result = {id(b.result): b for b in drained}
    for i, future in enumerate(futures[:: count // 1000]):
        batch = by_result[id(future[0])]
        (decoded,) = decode_batches(batch.encoded)
        assert decoded.values[future[1]] == (i * (count // 1000)).to_bytes(4, "big")
    assert acc._buffered == 0


@pytest.mark.parametrize("timestamps", [None, [5, 3, 9, -1]])
def test_the_c_body_of_a_keyless_batch_is_the_python_one(
    timestamps: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = [b"", b"a", b"bc" * 300, b"\xff" * 7]
    kwargs = {"timestamps": timestamps, "base_timestamp": 42, "producer_id": 9}
    fast_batch = records.encode_batch(values, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(records, "_cproduce", None)
    assert fast_batch == records.encode_batch(values, **kwargs)  # type: ignore[arg-type]
    (decoded,) = decode_batches(fast_batch)
    assert decoded.values == values and decoded.keys == [None] * 4


def test_a_null_value_leaves_the_body_to_python() -> None:
    from tidelog import _cproduce

    assert _cproduce.plain_body([b"a", None], None) is None  # type: ignore[union-attr]
    (decoded,) = decode_batches(records.encode_batch([b"a", None]))
    assert decoded.values == [b"a", None]


def test_a_batch_whose_lane_a_record_bypassed_keeps_the_locked_path() -> None:
    """Mixed sends (a plain record, one with an explicit timestamp or a bytearray
    value, ...) would otherwise open and close a lane per record."""
    acc, _ = make(batch_size=10_000)
    send(acc, b"a")
    assert "t" in acc.lanes
    locked(acc, b"b")  # a record the lane had room for, sent the long way: bypassed
    send(acc, b"c")
    assert "t" not in acc.lanes
    acc.seal_all()
    send(acc, b"d")  # a new batch: lanes again
    assert "t" in acc.lanes
