"""The fixed-rate sender of the end-to-end latency workloads (bench/workloads.py,
bench/e2e_trace.py): the stamp each record carries and the pacer that says which records are
due.

No SDK import here: bench/e2e_trace.py imports this module in its traced broker process too.
Not thread-safe: one pacer per sending loop.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

#: What every record of a latency run starts with: its send time (``time.perf_counter_ns``,
#: CLOCK_MONOTONIC: one clock for every process of the machine) and its sequence number.
STAMP = struct.Struct(">QQ")

#: The sequence number of the record sent before the clock starts (metadata, connection):
#: above any run's count, so every reader skips it as it skips the trailers.
WARMUP_SEQUENCE = 1 << 62

#: The record size of the latency runs (e2e_latency_10k, Kafka's FixedRateLatency, e2e_trace).
E2E_RECORD_BYTES = 100

#: How long the sending loop sleeps between looks at the schedule. Below one interval at
#: 10,000 records/s (0.1 ms) the sleep itself would cost more than it saves; at 0.2 ms a
#: record leaves at most ~0.2 ms (plus the OS's timer slack) after its time, those due
#: meanwhile in one burst, and the lag is reported (send_schedule_lag_p99_ms).
PACER_SLEEP_S = 0.0002


def stamped(sequence: int, pad: bytes, clock: Callable[[], int] = time.perf_counter_ns) -> bytes:
    """A record's value: the stamp (now, `sequence`) then `pad`."""
    return STAMP.pack(clock(), sequence) + pad


def padding(record_bytes: int) -> bytes:
    """What follows the stamp so that a record's value is `record_bytes` long."""
    return b"\x00" * max(0, record_bytes - STAMP.size)


class FixedRatePacer:
    """`total` sends at `rate` per second from the pacer's creation: record i is due at
    ``start_ns + i * interval_ns``, and the first at once.

    The sending loop asks `due()` for the sequence numbers whose time has come (each handed
    out once), sends them, then sleeps PACER_SLEEP_S, until `finished`.
    """

    def __init__(
        self, rate: int, total: int, clock: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        self.total = total
        self.interval_ns = 1e9 / rate
        self._clock = clock
        self._next = 0
        self.start_ns = clock()

    @property
    def finished(self) -> bool:
        return self._next >= self.total

    def due(self) -> range:
        """The sequence numbers due now and not handed out yet (empty if none)."""
        upto = min(self.total, int((self._clock() - self.start_ns) / self.interval_ns) + 1)
        due = range(self._next, upto)
        self._next = max(self._next, upto)
        return due

    def lag_ms(self, sequence: int, sent_ns: int) -> float:
        """How late (ms) record `sequence`, handed to send() at `sent_ns`, left."""
        return (sent_ns - (self.start_ns + sequence * self.interval_ns)) / 1e6

    def elapsed_s(self) -> float:
        """Seconds since the pacer started."""
        return (self._clock() - self.start_ns) / 1e9
