"""The consumer side of the end-to-end latency workload, as a process of its
own (``workloads.end_to_end_latency(processes=2)``).

``python -m bench.e2e_consumer ADDRESS TOPIC TOTAL WARMUP OUTPUT`` positions a
Consumer at the tail of partition 0, prints ``ready``, then reads records
stamped by the producer (send time from ``time.perf_counter_ns``: on Linux
CLOCK_MONOTONIC, one clock for every process of the machine) until it has
every sequence number below TOTAL, and writes the latencies (ms, as doubles)
of those at or above WARMUP to OUTPUT. It stops early when its stdin closes.
With TIDELOG_BENCH_SWITCH_INTERVAL_S set (workloads.switch_interval), it runs with that
interpreter switch interval.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from array import array
from pathlib import Path

from tidelog import Consumer, TopicPartition

from bench._fixed_rate import STAMP
from bench.workloads import SWITCH_INTERVAL_ENV


def main(argv: list[str]) -> int:
    address, topic, total_s, warmup_s, output = argv
    if SWITCH_INTERVAL_ENV in os.environ:
        sys.setswitchinterval(float(os.environ[SWITCH_INTERVAL_ENV]))
    total, warmup = int(total_s), int(warmup_s)
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    tp = TopicPartition(topic, 0)
    latencies = array("d")
    seen = 0
    ns = time.perf_counter_ns
    unpack = STAMP.unpack_from
    with Consumer(bootstrap_servers=address, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        consumer.position(tp)
        print("ready", flush=True)
        while seen < total and not stop.is_set():
            polled = consumer.poll(timeout_ms=100)
            now = ns()
            for records in polled.values():
                for record in records:
                    sent, seq = unpack(record.value or b"")
                    if seq >= total:
                        continue  # the warm-up record and the trailers
                    if seq >= warmup:
                        latencies.append((now - sent) / 1e6)
                    seen += 1
    with Path(output).open("wb") as f:
        latencies.tofile(f)
    print(f"received {seen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
