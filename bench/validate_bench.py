"""Micro-benchmark: what checking produced batches costs the broker, per MB.

Issue 16 items 3 and 4: the broker checks every produced body against its
header (record_policy.validated_batches: dense offsets, the claimed count
against the body's size, the length columns against the payload, header
blocks, a compressed body decompressed within max.message.bytes). This
measures, in one process, ms per MB of produced batches for

- `header+crc`: what the broker checked before (records.iter_batches);
- `full`: what it checks now (record_policy.validated_batches),

on 256 KiB batches (the Producer's default batch_size) of 10 B, 100 B and
1 KB values, without and with keys, and with a header per record; the
compressed ones per MB of uncompressed batches (what a producer sent).

Run: `python -m bench.validate_bench`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tidelog.compression import CompressionType
from tidelog.records import HEADER_SIZE, check_body, encode_batch, iter_batches
from tidelog_broker.record_policy import validated_batches

BATCH_BYTES = 256 * 1024
TOTAL_BYTES = 16 * 1024 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024 + 12


def _request(
    value_bytes: int, keys: bool, headers: bool, codec: CompressionType = CompressionType.NONE
) -> bytes:
    per_record = value_bytes + 8 + (8 if keys else 0) + (20 if headers else 0)
    count = max(1, BATCH_BYTES // per_record)
    values = [bytes([i % 251]) * value_bytes for i in range(count)]
    batch = encode_batch(
        values,
        keys=[b"key-%04d" % (i % 10_000) for i in range(count)] if keys else None,
        headers=[[("trace", b"0123456789")] for _ in range(count)] if headers else None,
        codec=codec,
    )
    return batch * max(1, TOTAL_BYTES // len(batch))


def _uncompressed_bytes(data: bytes) -> int:
    return sum(
        HEADER_SIZE + check_body(header, data[pos + HEADER_SIZE : pos + header.size])
        for pos, header in iter_batches(data)
    )


def _ms_per_mb(fn: Callable[[bytes], object], data: bytes, repeat: int = 5) -> float:
    """Best of `repeat` runs, in ms per MB of uncompressed batches."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(data)
        best = min(best, time.perf_counter() - start)
    return best * 1000 / (_uncompressed_bytes(data) / (1024 * 1024))


def main() -> None:
    print(f"{'workload':<32} {'header+crc':>12} {'full':>12} {'extra':>10}")
    print("(ms per MB of uncompressed batches, best of 5)")
    for codec in (CompressionType.NONE, CompressionType.ZSTD):
        for value_bytes in (10, 100, 1000):
            for keys, headers in ((False, False), (True, False), (True, True)):
                data = _request(value_bytes, keys, headers, codec)
                before = _ms_per_mb(lambda d: list(iter_batches(d, MAX_MESSAGE_BYTES)), data)
                after = _ms_per_mb(lambda d: validated_batches(d, MAX_MESSAGE_BYTES), data)
                name = (
                    f"{codec.name.lower()} {value_bytes} B"
                    f"{' +keys' if keys else ''}{' +headers' if headers else ''}"
                )
                print(f"{name:<32} {before:>12.3f} {after:>12.3f} {after - before:>10.3f}")


if __name__ == "__main__":
    main()
