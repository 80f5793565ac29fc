"""Time, injected: storage logic that tests must control never reads a global clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock and monotonic time in milliseconds."""

    def time_ms(self) -> int:
        """Wall-clock time, ms since the Unix epoch (record timestamps, segment.ms)."""
        ...

    def monotonic_ms(self) -> int:
        """Monotonic time in ms (intervals: flush.ms, check intervals)."""
        ...


class SystemClock:
    """The real clock. Thread-safe."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """Test seam: a clock that moves only when told to. Not thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._monotonic_ms = 0

    def time_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms
        self._monotonic_ms += ms


SYSTEM_CLOCK = SystemClock()
