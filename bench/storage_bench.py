"""Append and read throughput of PartitionLog, in a temporary directory.

    python bench/storage_bench.py [total_mb] [batch_kb]

Appends `total_mb` MB (default 100) of `batch_kb` KB batches (default 256),
one batch per append as the broker does for a produce request, then reads it
all back with 1 MB fetches. Reads come from the page cache (the data was
just written), which is the common case for consumers that keep up. Appends
are not fsynced (flush.messages unset, the default).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.storage import LogConfig, PartitionLog

MB = 1024 * 1024


def main() -> None:
    total_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    batch_kb = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    record_bytes = 1024
    batch = encode_batch([b"v" * record_bytes] * (batch_kb * 1024 // (record_bytes + 8)))
    batch_count = total_mb * MB // len(batch)
    config = LogConfig(segment_bytes=64 * MB)
    with tempfile.TemporaryDirectory() as tmp:
        log = PartitionLog.open(Path(tmp) / "bench-0", "bench", 0, config)
        start = time.perf_counter()
        for _ in range(batch_count):
            records = bytearray(batch)
            log.append(records, list(iter_batches(records)))
        append_s = time.perf_counter() - start
        written = log.size_bytes

        start = time.perf_counter()
        offset, read_bytes = 0, 0
        while offset < log.log_end_offset:
            result = log.read(offset, MB)
            read_bytes += len(result.records)
            offset = result.next_offset
        read_s = time.perf_counter() - start

        start = time.perf_counter()
        log.flush()
        flush_s = time.perf_counter() - start
        segments = log.segment_count
        log.close()

    print(f"{batch_count} batches of {len(batch) / 1024:.0f} KB, {segments} segments")
    print(f"{'operation':<28}{'MB':>8}{'seconds':>10}{'MB/s':>10}")
    rows = [
        ("append (validate + write)", written / MB, append_s),
        ("read (1 MB fetches)", read_bytes / MB, read_s),
        ("flush (fsync at the end)", written / MB, flush_s),
    ]
    for name, size_mb, seconds in rows:
        print(f"{name:<28}{size_mb:>8.0f}{seconds:>10.3f}{size_mb / seconds:>10.0f}")


if __name__ == "__main__":
    main()
