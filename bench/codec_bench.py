"""Micro-benchmark: the record batch body layout, columnar vs Kafka's varints.

Why Tidelog's body is columnar (ARCHITECTURE invariant 2): the consumer
decodes every record in Python, so the per-record cost decides consume
throughput. This measures, in one process and one run, ns per record to
encode and to decode a batch of 100-byte values (no keys, one timestamp) in

- `columnar`: tidelog.records (length arrays read by `array.frombytes`, then
  slices of one buffer);
- `kafka-v2`: Kafka's v2 record layout (per-record varint length, attributes,
  zigzag varint timestamp and offset deltas, key, value, header count),
  written here in straightforward pure Python as the baseline.

Run: `python -m bench.codec_bench` (also part of `make bench`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tidelog.records import decode_batches, encode_batch

RECORDS_PER_BATCH = 1000
VALUE_BYTES = 100


# ------------------------------------------------------------ Kafka v2 layout (baseline)


def _zigzag_varint(value: int, out: bytearray) -> None:
    value = (value << 1) ^ (value >> 63)
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), pos


def kafka_v2_encode(values: list[bytes], timestamp_delta: int = 0) -> bytes:
    """Kafka v2 records: length, attrs, ts delta, offset delta, key, value, headers."""
    out = bytearray()
    for index, value in enumerate(values):
        record = bytearray(b"\x00")  # attributes
        _zigzag_varint(timestamp_delta, record)
        _zigzag_varint(index, record)
        _zigzag_varint(-1, record)  # null key
        _zigzag_varint(len(value), record)
        record += value
        _zigzag_varint(0, record)  # no headers
        _zigzag_varint(len(record), out)
        out += record
    return bytes(out)


def kafka_v2_decode(buf: bytes, count: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Decode `count` Kafka v2 records into (offset delta, ts delta, key, value)."""
    pos = 0
    out = []
    for _ in range(count):
        _length, pos = _read_zigzag_varint(buf, pos)
        pos += 1  # attributes
        ts_delta, pos = _read_zigzag_varint(buf, pos)
        offset_delta, pos = _read_zigzag_varint(buf, pos)
        key_len, pos = _read_zigzag_varint(buf, pos)
        key = None
        if key_len >= 0:
            key = buf[pos : pos + key_len]
            pos += key_len
        value_len, pos = _read_zigzag_varint(buf, pos)
        value = None
        if value_len >= 0:
            value = buf[pos : pos + value_len]
            pos += value_len
        _headers, pos = _read_zigzag_varint(buf, pos)
        out.append((offset_delta, ts_delta, key, value))
    return out


# ------------------------------------------------------------ measurement


def _ns_per_record(fn: Callable[[], object], min_seconds: float = 0.5) -> float:
    """Best of several timed rounds, in ns per record."""
    fn()  # warm up
    best = float("inf")
    deadline = time.perf_counter() + min_seconds
    while True:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        if time.perf_counter() > deadline:
            break
    return best / RECORDS_PER_BATCH * 1e9


def run() -> list[dict[str, object]]:
    values = [os.urandom(VALUE_BYTES) for _ in range(RECORDS_PER_BATCH)]
    columnar = encode_batch(values, base_timestamp=1_700_000_000_000)
    kafka = kafka_v2_encode(values)
    assert [r[3] for r in kafka_v2_decode(kafka, RECORDS_PER_BATCH)] == values
    assert next(decode_batches(columnar)).values == values
    rows = [
        {
            "layout": "columnar (tidelog)",
            "encode_ns": _ns_per_record(lambda: encode_batch(values, base_timestamp=0)),
            "decode_ns": _ns_per_record(lambda: list(decode_batches(columnar))),
            "bytes_per_record": len(columnar) / RECORDS_PER_BATCH,
        },
        {
            "layout": "kafka-v2 varint (baseline)",
            "encode_ns": _ns_per_record(lambda: kafka_v2_encode(values)),
            "decode_ns": _ns_per_record(lambda: kafka_v2_decode(kafka, RECORDS_PER_BATCH)),
            "bytes_per_record": (len(kafka) + 61) / RECORDS_PER_BATCH,
        },
    ]
    return rows


def main() -> None:
    rows = run()
    print(f"record body layout, {RECORDS_PER_BATCH} x {VALUE_BYTES}-byte values per batch")
    print(f"{'layout':<28}{'encode ns/rec':>15}{'decode ns/rec':>15}{'bytes/rec':>11}")
    for row in rows:
        print(
            f"{row['layout']:<28}{row['encode_ns']:>15.0f}{row['decode_ns']:>15.0f}"
            f"{row['bytes_per_record']:>11.1f}"
        )
    base, ours = rows[1], rows[0]
    print(
        f"columnar is {base['encode_ns'] / ours['encode_ns']:.1f}x faster to encode, "  # type: ignore[operator]
        f"{base['decode_ns'] / ours['decode_ns']:.1f}x faster to decode"  # type: ignore[operator]
    )


if __name__ == "__main__":
    main()
