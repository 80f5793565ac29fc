"""The fixed-rate pacer of the latency workloads (bench/_fixed_rate.py), on a clock the test
moves: each record is handed out once, when its time has come, and its lag is measured from
its own scheduled time."""

from __future__ import annotations

from bench._fixed_rate import STAMP, FixedRatePacer, padding, stamped


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000

    def __call__(self) -> int:
        return self.ns


def test_records_are_due_at_their_time_once_each_and_no_more_than_total() -> None:
    clock = Clock()
    pacer = FixedRatePacer(1000, 5, clock)  # one record a millisecond
    assert list(pacer.due()) == [0]  # the first at once
    assert list(pacer.due()) == []
    clock.ns += 2_500_000
    assert list(pacer.due()) == [1, 2]
    assert not pacer.finished
    clock.ns += 60_000_000
    assert list(pacer.due()) == [3, 4]
    assert pacer.finished
    assert list(pacer.due()) == []


def test_lag_and_elapsed_are_from_the_start() -> None:
    clock = Clock()
    pacer = FixedRatePacer(1000, 10, clock)
    clock.ns += 3_000_000
    assert pacer.lag_ms(2, clock()) == 1.0  # record 2 was due 2 ms after the start
    assert pacer.elapsed_s() == 0.003


def test_a_stamped_value_is_the_record_size_and_carries_time_and_sequence() -> None:
    value = stamped(7, padding(100), lambda: 42)
    assert len(value) == 100
    assert STAMP.unpack_from(value) == (42, 7)
    assert stamped(7, padding(4), lambda: 42) == STAMP.pack(42, 7)  # never shorter than a stamp
