"""What one thread wake-up costs on this machine today: the yardstick of the latency runs.

``python -m bench.wakeup_probe [--rate R] [--seconds S]``, and a row of ``python -m bench``
beside every end-to-end latency run (workload ``wakeup_10k``, system ``machine``).

An end-to-end record crosses several sleeping threads (docs/benchmarks.md: the producer's loop,
gRPC's pollers, the broker's loop, the consumer's poll()), and at 10,000 records/s each of them
goes back to sleep between records, so every crossing pays the machine's wake-up latency. That
latency is not Tidelog's: it is the kernel's and the hypervisor's (an idle virtual CPU is woken by
an inter-processor interrupt through the host), and it differs from one machine of the same kind
to the next by several times. On 2026-11-27, e2e p50 was 1.6-2.7 ms against 0.57-0.68 ms on
an earlier day with the same code and CPU cost per record, and Kafka's moved likewise. This probe
prices one such crossing alone, so that a latency run can be read against it:

- ``pipe``: a child process blocks in read() on a pipe; this process writes the send time
  (CLOCK_MONOTONIC) into it at `rate` per second, sleeping in between as the pacer of the
  latency runs does; the child takes now minus that time. One cross-process wake-up, no Python
  lock in the way (the broker -> consumer crossing).
- ``event``: the same between two threads of this process through a threading.Event (the
  consumer loop -> poll() crossing): the kernel's wake-up plus taking the GIL.

Latencies are in ms as the other latency rows; a figure of the machine, not of Tidelog.
"""

from __future__ import annotations

import argparse
import os
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
        [sys.executable, "-m", "bench.wakeup_probe", "--child", str(to_child_r), str(back_w)],
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


def event_latencies_ms(rate: int, seconds: float) -> list[float]:
    """One-way wake-up latencies (ms) of a thread of this process waiting on a threading.Event."""
    ready = threading.Event()
    sent = [0]
    latencies: list[float] = []
    done = threading.Event()
    ns = time.perf_counter_ns

    def waiter() -> None:
        while True:
            ready.wait()
            now = ns()
            ready.clear()
            if done.is_set():
                return
            latencies.append((now - sent[0]) / 1e6)

    thread = threading.Thread(target=waiter, name="wakeup-probe", daemon=True)
    thread.start()

    def send() -> None:
        sent[0] = ns()
        ready.set()

    _paced(rate, seconds, send)
    done.set()
    ready.set()
    thread.join(timeout=10)
    return latencies


def _percentiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)

    def at(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))], 4)

    return {"p50_ms": at(50), "p99_ms": at(99), "p999_ms": at(99.9)}


def measure(
    rate: int = 10_000, seconds: float = 3.0, workload: str = "wakeup_10k"
) -> dict[str, Any]:
    """A result row (bench/__main__'s shape) for the cross-process crossing, with the
    thread crossing under detail."""
    pipe = pipe_latencies_ms(rate, seconds)
    event = event_latencies_ms(rate, seconds)
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
            "thread_event": _percentiles(event),
        },
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(int(argv[1]), int(argv[2]))
    ap = argparse.ArgumentParser(prog="python -m bench.wakeup_probe", description=__doc__)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    row = measure(args.rate, args.seconds)
    thread = row["detail"]["thread_event"]
    print(
        f"wake-up at {args.rate:,}/s (ms)    p50      p99    p99.9\n"
        f"  process, pipe          {row['p50_ms']:8.4f} {row['p99_ms']:8.4f} "
        f"{row['p999_ms']:8.4f}\n"
        f"  thread, Event          {thread['p50_ms']:8.4f} {thread['p99_ms']:8.4f} "
        f"{thread['p999_ms']:8.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
