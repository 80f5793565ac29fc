"""A full batch is ready at once (tidelog._accumulator): sealed and its sender
woken when no room is left for the smallest record, or when a keyless record
did not fit it, whether a lane (tidelog._cproduce) or the locked append filled
it. Never left waiting for linger_ms, which is 60 s here and never passes (the
clock stands still). Every test runs with the C lanes and with the Python
fallback (no tidelog._cproduce: every record takes the locked append). Without
I/O."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from tidelog import _accumulator
from tidelog._accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    ProducerBatch,
    RecordAccumulator,
    record_size,
)
from tidelog._futures import FutureRecordMetadata
from tidelog.compression import CompressionType
from tidelog.records import decode_batches

pytestmark = pytest.mark.timeout(60)

#: Bytes of one test record (a 10-byte value).
RECORD = RECORD_OVERHEAD + 10
LINGER_MS = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["c-lanes", "python"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether send() has lanes: "python" runs without tidelog._cproduce, as an
    install without a C compiler does."""
    if request.param == "python":
        monkeypatch.setattr(_accumulator, "_cproduce", None)
        return False
    if _accumulator._cproduce is None:
        pytest.skip("tidelog._cproduce is not built (needs a C compiler: `make install`)")
    return True


class Sender:
    """Stands for the sender: counts wake-ups, drains without moving the clock."""

    def __init__(self, batch_size: int, buffer_memory: int = 1 << 20) -> None:
        self.clock = Clock()
        self.wakes = 0
        self.acc = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=LINGER_MS,
            buffer_memory=buffer_memory,
            wake=self._wake,
            clock=self.clock,
            lane_max_record=1 << 20,
        )

    def _wake(self) -> None:
        self.wakes += 1

    def drain_and_sleep(self) -> list[ProducerBatch]:
        """One turn of the sender: what it drains now, then it falls asleep."""
        ready, _, _ = self.acc.drain(self.clock(), 120.0)
        assert self.acc.sender_waits() is True
        return ready

    def send(self, value: bytes, partition_count: int = 1) -> tuple[FutureRecordMetadata, bool]:
        """What Producer.send does for a keyless bytes record: the topic's lane
        first, the locked append when there is none or it refuses. Returns the
        future and whether the lane took the record."""
        lane = self.acc.lanes.get("t")
        future = None if lane is None else lane.append(value)
        if future is not None:
            return future, True
        size = record_size(None, value, None)
        return self.acc.append("t", -1, partition_count, None, value, None, 7, size, 1.0), False


def values_of(batch: ProducerBatch) -> list[bytes]:
    (decoded,) = decode_batches(batch.encode(CompressionType.NONE))
    return decoded.values


@pytest.mark.parametrize("slack", [0, RECORD_OVERHEAD - 1], ids=["exactly-full", "no-room-left"])
def test_a_batch_its_records_fill_is_drained_without_waiting_for_linger(
    lanes: bool, slack: int
) -> None:
    """Four records fill the batch: exactly, or leaving less room than the
    smallest record (an empty value: RECORD_OVERHEAD bytes) could use."""
    sender = Sender(batch_size=BATCH_OVERHEAD + 4 * RECORD + slack)
    first, _ = sender.send(b"0" * 10)
    assert sender.wakes == 1  # the new batch
    assert sender.drain_and_sleep() == []  # lingering: the sender sleeps
    sent = [sender.send(b"%d" % i * 10) for i in range(1, 4)]
    # With lanes, the records after the batch's first go through its lane.
    assert [through_lane for _, through_lane in sent] == [lanes] * 3
    assert all(future[0] is first[0] for future, _ in sent)
    # Full: the sender was woken and finds it ready, the clock unmoved.
    assert sender.wakes == 2
    (ready,) = sender.drain_and_sleep()
    assert values_of(ready) == [b"%d" % i * 10 for i in range(4)]
    assert "t" not in sender.acc.lanes
    # The room a lane did not use is given back: only the records count.
    assert sender.acc._buffered == 4 * RECORD
    # The next record starts a batch of its own (and, with lanes, a new lane).
    later, _ = sender.send(b"x" * 10)
    assert later[0] is not first[0] and later[1] == 0
    assert ("t" in sender.acc.lanes) == lanes


def test_a_batch_with_room_left_for_a_record_keeps_lingering(lanes: bool) -> None:
    """The other side of the line: RECORD_OVERHEAD bytes left take an empty
    record, so the batch is not full yet."""
    sender = Sender(batch_size=BATCH_OVERHEAD + 4 * RECORD + RECORD_OVERHEAD)
    for i in range(4):
        sender.send(b"%d" % i * 10)
    assert sender.drain_and_sleep() == []
    _, through_lane = sender.send(b"")
    assert through_lane == lanes
    (ready,) = sender.drain_and_sleep()
    assert values_of(ready) == [b"%d" % i * 10 for i in range(4)] + [b""]


def test_a_batch_a_keyless_record_did_not_fit_is_drained_when_it_moves_on(lanes: bool) -> None:
    """Two partitions: the fifth record does not fit the first batch and goes to
    the other partition's; the batch it left would get no more keyless records,
    so it is ready now, not after its linger."""
    sender = Sender(batch_size=BATCH_OVERHEAD + 4 * RECORD + RECORD // 2)
    first = [sender.send(b"%d" % i * 10, partition_count=2)[0] for i in range(4)]
    assert sender.drain_and_sleep() == []
    fifth, _ = sender.send(b"4" * 10, partition_count=2)
    assert fifth[0] is not first[0][0]
    assert sender.wakes == 2
    (ready,) = sender.drain_and_sleep()
    assert ready.result is first[0][0]
    assert values_of(ready) == [b"%d" % i * 10 for i in range(4)]
    assert ready.partition != fifth[0].partition


def test_append_columns_seals_a_batch_left_without_room(lanes: bool) -> None:
    sender = Sender(batch_size=BATCH_OVERHEAD + 3 * RECORD + RECORD_OVERHEAD - 1)
    sender.acc.append_columns("t", 0, 1, [b"a" * 10] * 3, None, None, [7] * 3, [RECORD] * 3, 1.0)
    (ready,) = sender.drain_and_sleep()
    assert values_of(ready) == [b"a" * 10] * 3


def test_a_lane_that_buffer_memory_cut_short_closes_and_its_batch_lingers(lanes: bool) -> None:
    """A lane is granted at most half of the free buffer memory: when that room
    is used up the lane closes (giving back what is left), but the batch still
    has room, so it is not sealed."""
    # After the first record 46 bytes are free: the lane gets 23, one record and
    # 5 bytes, too few for another.
    sender = Sender(batch_size=10_000, buffer_memory=RECORD + 46)
    sender.send(b"a" * 10)
    sender.drain_and_sleep()
    _, through_lane = sender.send(b"b" * 10)
    assert through_lane == lanes
    assert "t" not in sender.acc.lanes
    assert sender.acc._buffered == 2 * RECORD
    assert sender.drain_and_sleep() == []
    assert sender.wakes == 1


def test_a_locked_append_that_closes_a_full_lane_first_seals_its_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lane's on_full runs after its record is in, without the lock: a
    locked append of another thread (here a keyless record the lane did not
    take, which moves on to another partition of the topic) may close the
    lane first. It seals the full batch then, and the late on_full finds the
    lane closed and does nothing. (Lanes only.)"""
    if _accumulator._cproduce is None:
        pytest.skip("tidelog._cproduce is not built (needs a C compiler: `make install`)")
    sender = Sender(batch_size=BATCH_OVERHEAD + 3 * RECORD)
    late: list[Callable[[], None]] = []
    real = sender.acc._lane_filled
    monkeypatch.setattr(
        sender.acc, "_lane_filled", lambda batch, lane: late.append(lambda: real(batch, lane))
    )
    sender.send(b"a" * 10, partition_count=2)
    sender.drain_and_sleep()
    for _ in range(2):
        assert sender.send(b"b" * 10, partition_count=2)[1] is True
    assert len(late) == 1 and "t" in sender.acc.lanes  # on_full not run yet
    sticky = sender.acc._sticky_current["t"]
    other = 1 - sticky
    sender.acc.append("t", -1, 2, None, b"c", None, 7, record_size(None, b"c", None), 1.0)
    assert sender.acc._sticky_current["t"] == other
    ready = sender.drain_and_sleep()
    assert [(b.partition, len(b)) for b in ready] == [(sticky, 3)]
    late[0]()  # the lane's on_full, at last
    assert sender.drain_and_sleep() == []
    assert list(sender.acc._open["t"]) == [other]


def test_what_on_full_raises_is_reported_and_the_record_is_still_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record whose lane append went through is in its batch: its future is
    returned even if on_full fails (reported as unraisable; the batch then waits
    for its linger or next record, as before on_full)."""
    cproduce = _accumulator._cproduce
    if cproduce is None:
        pytest.skip("tidelog._cproduce is not built (needs a C compiler: `make install`)")
    batch = ProducerBatch("t", 0, 0, 0.0)

    def fail(lane: object) -> None:
        raise RuntimeError("on_full failed")

    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    lane = cproduce.Lane(
        batch.values, batch.timestamps, batch.result, FutureRecordMetadata, 2 * RECORD,
        1 << 20, RECORD_OVERHEAD, fail,
    )  # fmt: skip
    assert lane.append(b"a" * 10) is not None and reported == []
    future = lane.append(b"b" * 10)
    assert future is not None and future[1] == 1
    assert [str(e) for e in reported] == ["on_full failed"]
    assert batch.values == [b"a" * 10, b"b" * 10]
