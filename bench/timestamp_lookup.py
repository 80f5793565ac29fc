"""Micro-benchmark: what one ListOffsets timestamp lookup costs the broker.

A lookup by timestamp (`LogSegment.find_offset_for_timestamp`) reads the one
batch that holds the answer and looks for its first record whose timestamp
reaches the target; a ListOffsets request may ask for up to
MAX_LIST_OFFSETS_ENTRIES distinct timestamps, each such a lookup on the
broker's event loop. This measures, in one process, ms per lookup in a
segment holding one batch of 1 MiB (uncompressed body) of 10 B and of 100 B
values, uncompressed and with each codec installed, with and without a
header per record, the target being the last record's timestamp (the whole
batch is searched: the worst case). `decompress` is the floor that no lookup
of a compressed batch avoids: inflating the body.

Run: `python -m bench.timestamp_lookup` (a few seconds; one core).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tidelog.compression import CODEC_MASK, CompressionType, decompress, require_available
from tidelog.errors import UnsupportedCodecError
from tidelog.records import HEADER_SIZE, encode_batch, iter_batches
from tidelog_broker.storage.segment import AppendedBatch, LogSegment

BODY_BYTES = 1024 * 1024
BASE_TIMESTAMP_MS = 1_700_000_000_000
_HEADER = ("trace", b"0123456789")
# Bytes a record takes in the body's columns: a timestamp, a key length and
# a value length (and a header block length and block with headers).
_COLUMN_BYTES = 8 + 4 + 4
_HEADER_BYTES = 4 + 2 + 2 + len(_HEADER[0]) + 4 + len(_HEADER[1])


def _batch(value_bytes: int, codec: CompressionType, headers: bool) -> bytes:
    """One batch whose uncompressed body is about BODY_BYTES, timestamps one
    ms apart."""
    per_record = _COLUMN_BYTES + value_bytes + (_HEADER_BYTES if headers else 0)
    count = BODY_BYTES // per_record
    return encode_batch(
        [bytes([i % 251]) * value_bytes for i in range(count)],
        timestamps=[BASE_TIMESTAMP_MS + i for i in range(count)],
        headers=[[_HEADER]] * count if headers else None,
        codec=codec,
    )


def _segment(directory: Path, batch: bytes) -> LogSegment:
    segment = LogSegment.create(directory, base_offset=0)
    [(position, header)] = list(iter_batches(batch))
    placed = AppendedBatch(position, 0, header.last_offset_delta, header.max_timestamp)
    segment.append(batch, [placed], index_interval_bytes=4096, now_ms=0)
    return segment


def _best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _codecs() -> list[CompressionType]:
    available = []
    for codec in CompressionType:
        try:
            available.append(require_available(codec))
        except UnsupportedCodecError:
            print(f"({codec.name.lower()}: library not installed, skipped)")
    return available


def main() -> None:
    print("ms per lookup of the last record's timestamp in one 1 MiB batch, best of 20")
    print(f"{'workload':<28} {'records':>8} {'lookup':>9} {'decompress':>11}")
    for codec in _codecs():
        for value_bytes in (10, 100):
            for headers in (False, True):
                batch = _batch(value_bytes, codec, headers)
                [(_, header)] = list(iter_batches(batch))
                target = header.max_timestamp
                with tempfile.TemporaryDirectory() as directory:
                    segment = _segment(Path(directory), batch)
                    try:
                        assert segment.find_offset_for_timestamp(target) == (
                            header.last_offset_delta,
                            target,
                        )
                        lookup = _best_ms(partial(segment.find_offset_for_timestamp, target), 20)
                    finally:
                        segment.close()
                body = batch[HEADER_SIZE:]
                floor = _best_ms(partial(decompress, header.attributes & CODEC_MASK, body), 20)
                name = f"{codec.name.lower()} {value_bytes} B{' +header' if headers else ''}"
                print(f"{name:<28} {header.record_count:>8} {lookup:>9.3f} {floor:>11.3f}")


if __name__ == "__main__":
    main()
