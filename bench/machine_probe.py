"""What this machine gives today, the yardsticks of a run: CPU speed and one wake-up.

``python -m bench.machine_probe [--rate R] [--seconds S]``, and two rows of ``python -m bench``
beside every end-to-end latency repeat (system ``machine``): ``python_speed`` and ``wakeup_10k``.

Machines of one kind are not equally fast. On 2026-11-27, with the code of the stop before
(send() through the lanes: 227 ns/record against 129-135 ns), this machine was ~1.7x slower per
operation; the e2e runs at 10,000 records/s then used ~90% of both cores, and their p50 rose from
0.57-0.68 ms to 1.6-2.7 ms by queueing alone. Read a run's rows against these two:

- ``python_speed`` (a throughput row): iterations per second of a fixed pure-Python loop shaped
  like the clients' per-record work (calls, attribute and dict access, struct packing, a bytes
  join), best of three one-second runs. It moves with the CPU the machine gives this process.
- ``wakeup_10k`` (a latency row): a child process blocks in read() on a pipe; this process writes
  the send time (CLOCK_MONOTONIC) into it at `rate` per second, sleeping in between as the pacer of
  the latency runs does; the child takes now minus that time: one cross-process wake-up, no Python
  lock in the way (the broker -> consumer crossing). Under detail, the same between two threads of
  this process through a queue.SimpleQueue (the consumer loop -> poll() crossing, GIL included).
  On 2026-11-27 it was 0.012 ms p50 and 0.05-0.07 ms p99 on the idle machine: not what made the
  e2e rows slow that day.

Figures of the machine, not of Tidelog.
"""

from __future__ import annotations

import argparse
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from array import array
from typing import Any

from bench._fixed_rate import PACER_SLEEP_S, FixedRatePacer

_STAMP = struct.Struct("=q")


def _child(read_fd: int, write_fd: int) -> int:
    """Read stamps until EOF; write back each one-way latency (ns) as one array of int64."""
    latencies = array("q")
    ns = time.perf_counter_ns
    os.write(write_fd, b"r")  # started: the sender begins only now
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        while True:
            data = source.read(_STAMP.size)
            if len(data) < _STAMP.size:
                break
            latencies.append(ns() - _STAMP.unpack(data)[0])
    with os.fdopen(write_fd, "wb") as sink:
        latencies.tofile(sink)
    return 0


def _paced(rate: int, seconds: float, send: Any) -> None:
    pacer = FixedRatePacer(rate, int(rate * seconds))
    while not pacer.finished:
        for _ in pacer.due():
            send()
        time.sleep(PACER_SLEEP_S)


def pipe_latencies_ms(rate: int, seconds: float) -> list[float]:
    """One-way wake-up latencies (ms) of a child process blocked on a pipe."""
    to_child_r, to_child_w = os.pipe()
    back_r, back_w = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.machine_probe", "--child", str(to_child_r), str(back_w)],
        pass_fds=(to_child_r, back_w),
    )
    os.close(to_child_r)
    os.close(back_w)
    if os.read(back_r, 1) != b"r":
        child.wait(timeout=30)
        raise RuntimeError("the wake-up probe's child process did not start")
    ns = time.perf_counter_ns
    try:
        _paced(rate, seconds, lambda: os.write(to_child_w, _STAMP.pack(ns())))
    finally:
        os.close(to_child_w)
    with os.fdopen(back_r, "rb") as results:
        data = results.read()
    child.wait(timeout=30)
    latencies = array("q")
    latencies.frombytes(data[: len(data) // 8 * 8])
    return [v / 1e6 for v in latencies]


def thread_latencies_ms(rate: int, seconds: float) -> list[float]:
    """One-way wake-up latencies (ms) of a thread of this process blocked on a
    queue.SimpleQueue (a lock, as the consumer's poll() blocks on an Event's)."""
    stamps: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    latencies: list[float] = []
    ns = time.perf_counter_ns

    def waiter() -> None:
        while (sent := stamps.get()) is not None:
            latencies.append((ns() - sent) / 1e6)

    thread = threading.Thread(target=waiter, name="wakeup-probe", daemon=True)
    thread.start()
    _paced(rate, seconds, lambda: stamps.put(ns()))
    stamps.put(None)
    thread.join(timeout=10)
    return latencies


class _Record:
    __slots__ = ("key", "offset", "value")

    def __init__(self, offset: int, key: bytes, value: bytes) -> None:
        self.offset = offset
        self.key = key
        self.value = value


def _python_iterations(seconds: float) -> float:
    """Iterations per second of the fixed loop (see the module doc), for `seconds`."""
    pack = _STAMP.pack
    positions: dict[int, int] = {}
    values = [b"k%d" % i for i in range(64)]
    done = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        for i in range(1_000):
            record = _Record(i, values[i & 63], pack(i))
            positions[i & 15] = record.offset + 1
            b"".join((record.key, record.value))
        done += 1_000
    return done / (time.perf_counter() - start)


def python_speed(workload: str = "python_speed") -> dict[str, Any]:
    """A throughput row (bench/__main__'s shape): the best of three one-second runs."""
    return speed_row(max(_python_iterations(1.0) for _ in range(3)), workload)


def speed_row(iterations_per_s: float, workload: str = "python_speed") -> dict[str, Any]:
    """The throughput row of a measured loop speed: the rate to a tenth, and
    as `records` the same rate as a whole number."""
    return {
        "workload": workload,
        "system": "machine",
        "records_per_s": round(iterations_per_s, 1),
        "mb_per_s": None,
        "records": round(iterations_per_s),
        "p50_ms": None,
        "p99_ms": None,
        "p999_ms": None,
        "rss_mb": None,
        "cpu_s_per_million": {"broker": None, "client": None},
        "detail": {"what": "iterations/s of a fixed pure-Python loop (bench/machine_probe.py)"},
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)

    def at(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))], 6)

    return {"p50_ms": at(50), "p99_ms": at(99), "p999_ms": at(99.9)}


def measure(
    rate: int = 10_000, seconds: float = 3.0, workload: str = "wakeup_10k"
) -> dict[str, Any]:
    """A result row (bench/__main__'s shape) for the cross-process crossing, with the
    thread crossing under detail."""
    pipe = pipe_latencies_ms(rate, seconds)
    thread = thread_latencies_ms(rate, seconds)
    return {
        "workload": workload,
        "system": "machine",
        "records_per_s": None,
        "mb_per_s": None,
        "records": len(pipe),
        **_percentiles(pipe),
        "rss_mb": None,
        "cpu_s_per_million": {"broker": None, "client": None},
        "detail": {
            "what": "one-way wake-up of a process blocked on a pipe, at the latency runs' rate",
            "rate": rate,
            "seconds": seconds,
            "thread_wakeup": _percentiles(thread),
        },
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(int(argv[1]), int(argv[2]))
    ap = argparse.ArgumentParser(prog="python -m bench.machine_probe", description=__doc__)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    speed = python_speed()
    row = measure(args.rate, args.seconds)
    thread = row["detail"]["thread_wakeup"]
    print(f"python speed: {speed['records_per_s'] / 1e6:.2f}M loop iterations/s")
    print(
        f"wake-up at {args.rate:,}/s (ms)    p50      p99    p99.9\n"
        f"  process, pipe          {row['p50_ms']:8.4f} {row['p99_ms']:8.4f} "
        f"{row['p999_ms']:8.4f}\n"
        f"  thread, queue          {thread['p50_ms']:8.4f} {thread['p99_ms']:8.4f} "
        f"{thread['p999_ms']:8.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
