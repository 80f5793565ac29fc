"""Compaction throughput: one cleaner round over a dirty log, MB/s.

``python -m bench.compaction_bench [--mb 128] [--keys 100000] [--value-bytes 200]``

Writes a partition log of keyed records (uniformly random keys, so most
records are superseded; 100 records per batch, uncompressed, 16 MiB
segments), then runs the cleaner as the broker does, minus the thread hop:
`plan_cleaning`, `cleaner.clean` (offset map + rewrite, fsync), and the
swap. Reports the log bytes the round read per second (map pass + rewrite
pass each read the dirty log once, and the input size is what users care
about) and the time of the swap on the event loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import tempfile
import time
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.storage import LogConfig, PartitionLog, cleaner
from tidelog_broker.storage.partition_log import unlink_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="size of the dirty log")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--codec", default="none")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="compaction-bench-"))
    try:
        config = dataclasses.replace(
            LogConfig(),
            segment_bytes=16 * 1024 * 1024,
            cleanup_policy="compact",
            min_cleanable_dirty_ratio=0.0,
        )
        log = PartitionLog.open(root / "bench-0", "bench", 0, config)
        rng = random.Random(1)
        value = b"v" * args.value_bytes
        from tidelog.compression import CompressionType

        codec = CompressionType.parse(args.codec)
        records = 0
        while log.log_bytes < args.mb * 1024 * 1024:
            keys = [b"key-%08d" % rng.randrange(args.keys) for _ in range(100)]
            batch = bytearray(encode_batch([value] * 100, keys=keys, codec=codec))
            log.append(batch, list(iter_batches(batch)))
            records += 100
        log.flush()
        before = log.log_bytes
        print(
            f"log: {before / 1e6:.1f} MB, {records} records, {args.keys} keys, "
            f"{log.segment_count} segments, codec {args.codec}"
        )
        plan = log.plan_cleaning(10_000_000, force=True)
        assert plan is not None
        t0 = time.perf_counter()
        result = cleaner.clean(plan)
        clean_s = time.perf_counter() - t0
        assert result is not None
        t0 = time.perf_counter()
        doomed = log.finish_cleaning(result)
        swap_s = time.perf_counter() - t0
        unlink_files(doomed)
        dirty = sum(s.size_bytes for s in plan.segments)
        print(
            f"cleaned {dirty / 1e6:.1f} MB in {clean_s:.2f} s: {dirty / clean_s / 1e6:.1f} MB/s "
            f"of log ({result.records_read / clean_s:,.0f} records/s); "
            f"{result.records_removed} of {result.records_read} records removed; "
            f"{result.bytes_written / 1e6:.1f} MB written; map {result.map_entries} keys; "
            f"swap on the event loop {swap_s * 1000:.1f} ms"
        )
        log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
