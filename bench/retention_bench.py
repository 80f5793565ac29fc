"""Produce latency while retention deletes a large segment set.

``python -m bench.retention_bench [--segments 600] [--segment-mb 4]``

One PartitionManager in this process, its event loop driven as the broker
drives it: a producer coroutine appends a 16 KB batch every millisecond
(through `PartitionManager.append`, the produce path without gRPC) and
records, for each append, the time from when it was due to when it
finished, so an event loop stalled by anything else shows up as latency.
Three phases in the same run, same log:

1. baseline: appends only;
2. retention as the broker does it: `apply_retention` renames the expired
   segments to `.deleted` on the loop and unlinks them in a worker thread;
3. for comparison, the naive way: the same deletion with every unlink on the
   event loop (what the broker does not do).

Prints p50 / p99 / max per phase. The segment set is written first, with
timestamps old enough to expire when retention.ms is lowered.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tidelog.records import encode_batch
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.storage.partition_log import unlink_files

HOUR_MS = 3_600_000


def _percentiles(samples_ms: list[float]) -> str:
    samples = sorted(samples_ms)
    p50 = statistics.median(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    return f"p50 {p50:6.3f} ms   p99 {p99:7.3f} ms   max {samples[-1]:7.2f} ms   n={len(samples)}"


async def _produce_for(
    manager: PartitionManager, topic: str, batch: bytes, seconds: float, done: asyncio.Event | None
) -> list[float]:
    """Append one batch per ms until `seconds` pass (or `done` is set after
    at least 0.3 s); each sample is due-time to completion, in ms. A stall
    delays every append that fell due during it, and each counts."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    latencies: list[float] = []
    due = start
    while True:
        now = loop.time()
        # Stop only once caught up: appends a stall delayed are samples too.
        finished = done is not None and done.is_set() and now - start > 0.3
        if now < due and (now - start >= seconds or finished):
            return latencies
        if now < due:
            await asyncio.sleep(due - now)
        manager.append(topic, 0, batch)
        latencies.append((loop.time() - due) * 1000)
        due += 0.001
        await asyncio.sleep(0)


async def _fill(manager: PartitionManager, topic: str, total_bytes: int, ts_ms: int) -> None:
    batch = encode_batch([b"x" * 1000] * 1000, base_timestamp=ts_ms)
    for _ in range(total_bytes // len(batch)):
        manager.append(topic, 0, batch)


async def main_async(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="retention-bench-", dir=args.dir))
    try:
        config = BrokerConfig(data_dir=root)
        manager = PartitionManager(config)
        manager.open()
        segment_bytes = args.segment_mb * 1024 * 1024
        old_ms = int(time.time() * 1000) - 10 * HOUR_MS
        live = {"segment.bytes": str(segment_bytes), "retention.ms": "-1"}
        for topic in ("bench-a", "bench-b"):
            manager.logs.create_topic(topic, 1, configs=live)
            print(f"writing {args.segments} segments of {args.segment_mb} MiB to {topic} ...")
            await _fill(manager, topic, args.segments * segment_bytes, old_ms)
            manager.partition_log(topic, 0).flush()
        batch = encode_batch([b"y" * 160] * 100, base_timestamp=int(time.time() * 1000))
        print(f"producing {len(batch)} B batches, one per ms, to bench-live")
        manager.logs.create_topic("bench-live", 1)

        baseline = await _produce_for(manager, "bench-live", batch, args.seconds, None)
        print(f"baseline             {_percentiles(baseline)}")

        # Retention as the broker runs it: renames on the loop, unlinks in a thread.
        manager.logs.alter_configs("bench-a", {"retention.ms": str(HOUR_MS)})
        done = asyncio.Event()

        async def retention() -> float:
            t0 = time.perf_counter()
            await manager.logs.apply_retention()
            done.set()
            return time.perf_counter() - t0

        task = asyncio.create_task(retention())
        threaded = await _produce_for(manager, "bench-live", batch, 60, done)
        took = await task
        print(f"deleting (thread)    {_percentiles(threaded)}   deletion took {took:.2f} s")

        # The naive way, for comparison: unlink on the event loop.
        manager.logs.alter_configs("bench-b", {"retention.ms": str(HOUR_MS)})
        log_b = manager.partition_log("bench-b", 0)
        done = asyncio.Event()

        async def naive() -> float:
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            unlink_files(log_b.delete_old_segments())  # blocks the loop
            done.set()
            return time.perf_counter() - t0

        task = asyncio.create_task(naive())
        inline = await _produce_for(manager, "bench-live", batch, 60, done)
        took = await task
        print(f"deleting (on loop)   {_percentiles(inline)}   deletion took {took:.2f} s")
        manager.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=600, help="segments per topic")
    parser.add_argument("--segment-mb", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="baseline duration")
    parser.add_argument("--dir", default=None, help="where to put the data (default: /tmp)")
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
