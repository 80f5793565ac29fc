"""The producer's accumulator and futures, without any I/O."""

from __future__ import annotations

import threading
import time

import pytest
from tidelog._accumulator import RecordAccumulator, record_size
from tidelog.errors import ClosedError, TidelogTimeoutError
from tidelog.records import decode_batches
from tidelog.types import RecordMetadata, TopicPartition

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(  # type: ignore[no-untyped-def]
    batch_size: int = 1000,
    linger_ms: int = 5,
    buffer_memory: int = 1 << 20,
    clock=None,
    linger_while_in_flight: bool = True,
):
    wakes: list[int] = []
    clock = clock or Clock()
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        buffer_memory=buffer_memory,
        wake=lambda: wakes.append(1),
        clock=clock,
        linger_while_in_flight=linger_while_in_flight,
    )
    return acc, wakes, clock


def append(acc, value=b"v" * 10, key=None, partition=0, count=1, headers=None, ts=1):  # type: ignore[no-untyped-def]
    return acc.append(
        "t", partition, count, key, value, headers, ts, record_size(key, value, headers), 1.0
    )


def test_records_of_a_partition_share_one_batch_until_full() -> None:
    acc, wakes, _ = make(batch_size=200)
    futures = [append(acc) for _ in range(6)]
    # 62 bytes of overhead + 18 per record: the batch fills at 8 records.
    assert {id(f[0]) for f in futures} == {id(futures[0][0])}
    assert [f[1] for f in futures] == list(range(6))
    assert len(wakes) == 1  # the new batch, not every record
    more = [append(acc) for _ in range(4)]
    assert more[-1][0] is not futures[0][0]
    # Sealed (full) and the next batch created, but the sender, woken for the
    # first batch, has not drained yet: it will see them without another wake.
    assert len(wakes) == 1


def test_sender_is_woken_only_when_it_sleeps() -> None:
    # (Partition 0's second batch would wait for its first's answer otherwise.)
    acc, wakes, clock = make(batch_size=200, linger_ms=0, linger_while_in_flight=False)
    append(acc, partition=0)
    assert len(wakes) == 1  # asleep until its first drain: woken
    ready, _, _ = acc.drain(clock(), 120.0)
    assert len(ready) == 1
    # Busy (between its drain and sender_waits): new batches wake nobody...
    append(acc, partition=0)
    append(acc, partition=1)
    assert len(wakes) == 1
    # ...and it may not sleep: it drains again and finds them.
    assert acc.sender_waits() is False
    ready, _, _ = acc.drain(clock(), 120.0)
    assert [b.tp.partition for b in ready] == [0, 1]
    assert acc.sender_waits() is True
    # Asleep: the next batch wakes it, once.
    append(acc, partition=0)
    append(acc, partition=1)
    assert len(wakes) == 2


def test_seal_all_always_wakes_the_sender() -> None:
    acc, wakes, clock = make(linger_ms=1000)
    acc.drain(clock(), 120.0)  # awake: appends alone would not wake it
    append(acc)
    acc.seal_all()  # flush and close must not depend on the sender's state
    assert len(wakes) == 1


def test_drain_returns_full_batches_at_once_and_open_ones_after_linger() -> None:
    acc, _, clock = make(batch_size=100, linger_while_in_flight=False)
    for _ in range(3):
        append(acc, partition=0)  # fills partition 0's batch
    append(acc, partition=1)
    ready, expired, deadline = acc.drain(clock(), 120.0)
    assert [b.tp for b in ready] == [TopicPartition("t", 0)]
    assert not expired
    assert deadline == pytest.approx(clock() + 0.005)
    clock.now += 0.006
    ready, _, _ = acc.drain(clock(), 120.0)
    assert [b.tp for b in ready] == [TopicPartition("t", 0), TopicPartition("t", 1)]


def test_a_partial_batch_waits_while_its_partition_has_a_batch_in_flight() -> None:
    acc, _, clock = make(linger_ms=0)
    append(acc, partition=0)
    (first,), _, _ = acc.drain(clock(), 120.0)
    append(acc, partition=0)
    append(acc, partition=0)
    append(acc, partition=1)
    ready, _, deadline = acc.drain(clock(), 120.0)
    # Partition 1 has nothing in flight; partition 0's batch is held, with no
    # deadline: the sender sleeps until the answer.
    assert [b.tp.partition for b in ready] == [1]
    assert deadline is None
    assert acc.sender_waits() is True
    assert acc.resolved(first) is True  # its open batch was held: look again
    (held,), _, _ = acc.drain(clock(), 120.0)
    assert held.tp.partition == 0 and held.record_count() == 2
    # Nothing of partition 0 is open now: answering the held batch needs no look.
    assert acc.resolved(held) is False
    assert acc.resolved(ready[0]) is False


def test_a_full_or_flushed_batch_goes_while_its_partition_has_one_in_flight() -> None:
    acc, _, clock = make(batch_size=100, linger_ms=0)
    append(acc, partition=0)
    acc.drain(clock(), 120.0)
    for _ in range(3):
        append(acc, partition=0)  # fills a batch (sealed) and opens the next
    (full,), _, _ = acc.drain(clock(), 120.0)
    assert full.record_count() == 2
    acc.seal_all()  # flush
    (flushed,), _, _ = acc.drain(clock(), 120.0)
    assert flushed.record_count() == 1


def test_a_batch_put_back_for_a_retry_holds_its_partition_until_resolved() -> None:
    acc, _, clock = make(linger_ms=0)
    append(acc, partition=0)
    (first,), _, _ = acc.drain(clock(), 120.0)
    append(acc, partition=0)
    acc.requeue([first], retry_at=clock())
    # Muted by the retry: only the retry goes, and it is in flight again.
    (retried,), _, _ = acc.drain(clock(), 120.0)
    assert retried is first
    assert acc.drain(clock(), 120.0)[0] == []
    assert acc.resolved(first) is True
    (later,), _, _ = acc.drain(clock(), 120.0)
    assert later is not first and later.record_count() == 1


def test_a_batch_failed_before_it_was_answered_releases_its_partition() -> None:
    acc, _, clock = make(linger_ms=0)
    append(acc, partition=0)
    (first,), _, _ = acc.drain(clock(), 120.0)
    append(acc, partition=0)
    assert acc.drain(clock(), 120.0)[0] == []
    first.result.fail(ClosedError("gone"))
    assert acc.resolved(first) is True
    assert [b.record_count() for b in acc.drain(clock(), 120.0)[0]] == [1]


def test_without_linger_while_in_flight_a_partial_batch_goes_at_its_linger() -> None:
    acc, _, clock = make(linger_ms=0, linger_while_in_flight=False)
    append(acc, partition=0)
    (first,), _, _ = acc.drain(clock(), 120.0)
    append(acc, partition=0)
    assert [b.record_count() for b in acc.drain(clock(), 120.0)[0]] == [1]
    assert acc.resolved(first) is False


def test_encoded_batch_round_trips() -> None:
    acc, _, clock = make()
    append(acc, value=b"a", key=b"k1", ts=10, headers=[("h", b"x")])
    append(acc, value=None, key=None, ts=11)
    acc.seal_all()
    (batch,), _, _ = acc.drain(clock(), 120.0)
    (decoded,) = decode_batches(batch.encode(batch_codec()))
    assert decoded.values == [b"a", None]
    assert decoded.keys == [b"k1", None]
    assert decoded.timestamps == [10, 11]
    assert decoded.headers == [[("h", b"x")], []]


def batch_codec():  # type: ignore[no-untyped-def]
    from tidelog.compression import CompressionType

    return CompressionType.NONE


def test_future_resolves_with_offsets_and_callbacks() -> None:
    acc, _, clock = make()
    futures = [append(acc, ts=50 + i) for i in range(3)]
    seen: list[RecordMetadata] = []
    futures[2].add_callback(seen.append)
    acc.seal_all()
    (batch,), _, _ = acc.drain(clock(), 120.0)
    assert not futures[0].done()
    batch.result.complete(base_offset=40)
    acc.resolved(batch)
    assert futures[1].get(0) == RecordMetadata("t", 0, 41, 51)
    assert seen == [RecordMetadata("t", 0, 42, 52)]
    late: list[RecordMetadata] = []
    futures[0].add_callback(late.append)  # already done: runs at once
    assert late[0].offset == 40
    assert acc.is_empty()


def test_future_failure_raises_the_typed_error() -> None:
    acc, _, clock = make()
    future = append(acc)
    errors: list[BaseException] = []
    future.add_errback(errors.append)
    acc.seal_all()
    (batch,), _, _ = acc.drain(clock(), 120.0)
    batch.result.fail(ClosedError("gone"))
    with pytest.raises(ClosedError):
        future.get(0)
    assert isinstance(future.exception(), ClosedError)
    assert isinstance(errors[0], ClosedError)


def test_get_times_out_while_pending() -> None:
    acc, _, _ = make()
    with pytest.raises(TidelogTimeoutError):
        append(acc).get(0.01)


def test_retry_mutes_the_partition_and_keeps_order() -> None:
    acc, _, clock = make(batch_size=116)  # exactly three 18-byte records
    for _ in range(9):
        append(acc)  # three full batches of partition 0
    ready, _, _ = acc.drain(clock(), 120.0)
    first, second, third = ready
    acc.requeue([second, first], retry_at=clock() + 1)
    for _ in range(3):
        append(acc)
    ready, _, deadline = acc.drain(clock(), 120.0)
    assert ready == []  # muted: nothing of partition 0 overtakes the retry
    assert deadline == pytest.approx(clock() + 1)
    clock.now += 1
    ready, _, _ = acc.drain(clock(), 120.0)
    assert ready[:2] == [first, second]
    for batch in (first, second, third):
        batch.result.complete(0)
        acc.resolved(batch)
    ready, _, _ = acc.drain(clock(), 120.0)
    assert ready  # unmuted


def test_sealed_batches_expire_after_the_delivery_timeout() -> None:
    acc, _, clock = make()
    append(acc)
    acc.seal_all()
    clock.now += 200
    ready, expired, _ = acc.drain(clock(), 120.0)
    assert not ready and len(expired) == 1


def test_send_blocks_for_buffer_memory_then_times_out() -> None:
    acc, _, _ = make(buffer_memory=100, clock=time.monotonic)  # the wait is real
    append(acc, value=b"x" * 80)
    with pytest.raises(TidelogTimeoutError):
        acc.append("t", 0, 1, None, b"y" * 80, None, 1, 88, 0.05)


def test_buffer_space_freed_by_a_resolved_batch_unblocks_send() -> None:
    acc, _, clock = make(buffer_memory=100)
    append(acc, value=b"x" * 80)
    acc.seal_all()
    (batch,), _, _ = acc.drain(clock(), 120.0)
    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(acc.append("t", 0, 1, None, b"y" * 80, None, 1, 88, 5.0))
    )
    thread.start()
    batch.result.complete(0)
    acc.resolved(batch)
    thread.join(5)
    assert result


def test_sticky_partition_for_keyless_records() -> None:
    acc, _, _ = make(batch_size=116)
    futures = [append(acc, partition=-1, count=3) for _ in range(3)]
    assert len({f[0].partition for f in futures}) == 1
    nxt = append(acc, partition=-1, count=3)
    # The sticky batch was full: the next keyless record moved elsewhere.
    assert nxt[0].partition != futures[0][0].partition


def test_closed_accumulator_rejects_records() -> None:
    acc, _, _ = make()
    acc.take_all()
    with pytest.raises(ClosedError):
        append(acc)
