"""Broker CPU per answer of a fetch session over many partitions of which one
receives records, before and after a change to the broker, alternated in one
run (``python -m bench.idle_partitions_ab --base main --partitions 1000``).

Each run starts a fresh broker whose PYTHONPATH selects its side
(bench._checkout exports `--base` with its own compiled modules; the client
is this work tree's for both), creates a topic of `--partitions` partitions,
and has one Consumer assign them all at their end. A producer thread then
sends one record at a time (each flushed: one answer each, about) to
partition 0 at `--rate` records per second; after `--warm-s`, the broker's
CPU (user + system, from /proc via psutil) is taken over `--seconds`, and
divided by the records the consumer received meanwhile.

Not part of ``make bench``: it needs a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _checkout  # noqa: E402
from bench._processes import cpu_s, tidelog_broker, tmpdir  # noqa: E402

THIS = "this"
TOPIC = "idle-partitions"


def _run(
    pythonpath: str | None, partitions: int, rate: float, warm_s: float, seconds: float
) -> dict[str, float]:
    from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition

    with contextlib.ExitStack() as stack:
        # Only the broker gets the side's PYTHONPATH; the clients are this tree's.
        with _checkout.children_run(pythonpath):
            broker = stack.enter_context(tidelog_broker())
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic(TOPIC, partitions, 1)])
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        with (
            Consumer(bootstrap_servers=broker.address) as consumer,
            Producer(broker.address, linger_ms=0) as producer,
        ):
            consumer.assign(tps)
            consumer.seek_to_end()
            for tp in tps:
                consumer.position(tp, timeout=120)
            stop = threading.Event()

            def produce() -> None:
                interval, next_at = 1 / rate, time.monotonic()
                while not stop.is_set():
                    producer.send(TOPIC, b"x" * 100, partition=0)
                    producer.flush()
                    next_at += interval
                    time.sleep(max(0.0, next_at - time.monotonic()))

            producer_thread = threading.Thread(target=produce, daemon=True)
            producer_thread.start()
            try:
                start = time.monotonic()
                counted = 0
                cpu0: float | None = None
                while True:
                    now = time.monotonic()
                    if cpu0 is None and now - start >= warm_s:
                        cpu0, t0, counted = cpu_s(broker.pid), now, 0
                    if cpu0 is not None and now - t0 >= seconds:
                        cpu1, t1 = cpu_s(broker.pid), now
                        break
                    for records in consumer.poll(timeout_ms=100).values():
                        counted += len(records)
            finally:
                stop.set()
                producer_thread.join(10)
        cpu = cpu1 - cpu0
        return {
            "cpu_s": cpu,
            "records": counted,
            "ms_per_record": 1000 * cpu / max(1, counted),
            "cpu_share": cpu / (t1 - t0),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git ref of the 'before' side")
    parser.add_argument("--pairs", type=int, default=3, help="rounds (each runs both sides)")
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="records per second")
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {args.base: [], THIS: []}
    with tmpdir("tidelog-idle-ab-") as export_dir:
        sides = {args.base: _checkout.export(args.base, export_dir), THIS: None}
        order = [args.base, THIS]
        for r in range(args.pairs):
            for label in order if r % 2 == 0 else order[::-1]:
                result = _run(sides[label], args.partitions, args.rate, args.warm_s, args.seconds)
                runs[label].append(result)
                print(
                    f"round {r} {label:>6}: broker CPU {result['cpu_s']:.2f} s over "
                    f"{args.seconds:.0f} s ({100 * result['cpu_share']:.0f}% of a core), "
                    f"{result['records']:.0f} records, {result['ms_per_record']:.3f} ms/record",
                    flush=True,
                )
    for label, results in runs.items():
        print(
            f"{label:>6} medians ({args.partitions} partitions): broker CPU "
            f"{statistics.median(r['cpu_s'] for r in results):.2f} s, "
            f"{statistics.median(r['records'] for r in results):.0f} records, "
            f"{statistics.median(r['ms_per_record'] for r in results):.3f} ms/record"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
