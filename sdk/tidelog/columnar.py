"""The columnar read: stored record batches decoded into pyarrow RecordBatches.

A fetch answer holds whole record batches whose bodies are already columnar
(docs/record-batch.md: little-endian arrays of offset deltas, timestamps and
lengths, then the concatenated keys and values). This module turns those
columns into Arrow arrays without a Python object per record: the number
columns become numpy arrays over the body's bytes, a binary column is the
body's payload bytes plus an Arrow offsets buffer computed from the lengths
with one cumulative sum, and a null is a bit in a validity bitmap. Python
work is per stored batch (a few thousand records), not per record. The body
is checked exactly as the per-record decoder checks it (`records._read_columns`
is shared), and a compressed body is decompressed first, within the same
limit.

The rows have the schema of Spark's Kafka source, so the same batches serve
the SDK's users (`Consumer.poll_arrow`) and the Spark data source
(`tidelog.spark`)::

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[us, UTC], timestampType int32,
    [headers list<struct<key string, value binary>>]   with include_headers

`headers` is null for a record without headers (as Spark's Kafka source
gives it). Header blocks are the one part decoded per record in Python: only
when asked for, and only for stored batches that carry headers.

Needs the `arrow` extra (`pip install 'tidelog[arrow]'`: pyarrow and numpy);
the rest of the SDK does not import this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tidelog.compression import CODEC_MASK, DEFAULT_MAX_UNCOMPRESSED_BYTES, decompress
from tidelog.errors import TidelogError, UndecodableBatchError
from tidelog.records import (
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    _decode_header_block,
    _read_columns,
    read_header,
    validate_batch,
)
from tidelog.types import ConsumerRecord

__all__ = [
    "HEADERS_TYPE",
    "arrow_schema",
    "decode_fetch",
    "empty_batch",
    "records_to_arrow",
]

#: Spark's Kafka source's `headers` column: an array of (key, value) structs.
HEADERS_TYPE = pa.list_(
    pa.field(
        "element",
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]),
    )
)
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", _TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
]
_SCHEMA = pa.schema(_FIELDS)
_SCHEMA_WITH_HEADERS = pa.schema([*_FIELDS, pa.field("headers", HEADERS_TYPE)])
# Arrow's binary arrays have int32 offsets: one RecordBatch column holds at
# most this many payload bytes (a fetch answer is far smaller).
_MAX_BINARY_BYTES = 2**31 - 1


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The schema of the batches this module builds (see the module doc)."""
    return _SCHEMA_WITH_HEADERS if include_headers else _SCHEMA


def empty_batch(include_headers: bool = False) -> pa.RecordBatch:
    """A RecordBatch of no rows with the schema above."""
    return pa.RecordBatch.from_pylist([], schema=arrow_schema(include_headers))


@dataclass
class _Pieces:
    """The columns of several stored batches, gathered before one RecordBatch
    is assembled from them (numpy arrays, and payload byte strings)."""

    offsets: list[np.ndarray] = field(default_factory=list)
    timestamps: list[np.ndarray] = field(default_factory=list)
    timestamp_types: list[np.ndarray] = field(default_factory=list)
    key_lengths: list[np.ndarray] = field(default_factory=list)
    value_lengths: list[np.ndarray] = field(default_factory=list)
    keys: list[memoryview] = field(default_factory=list)
    values: list[memoryview] = field(default_factory=list)
    #: Per stored batch: its records' header lists, or None when it has none.
    headers: list[tuple[int, list | None]] = field(default_factory=list)
    any_key: bool = False
    count: int = 0


def _le(typecode: str) -> np.dtype:
    return np.dtype(typecode).newbyteorder("<")


_U32 = _le("u4")
_I64 = _le("i8")
_I32 = _le("i4")


def _add_batch(
    pieces: _Pieces,
    header: BatchHeader,
    raw_body: memoryview,
    include_headers: bool,
    max_uncompressed_bytes: int,
) -> None:
    """Decode one stored batch's columns into `pieces` (raises TidelogError
    when the body does not agree with its header)."""
    body = decompress(header.attributes & CODEC_MASK, raw_body, max_uncompressed_bytes)
    columns = _read_columns(header, body)
    count = header.record_count
    base = header.base_offset
    if columns.deltas is not None:
        offsets = np.frombuffer(columns.deltas, dtype=_U32).astype(np.int64) + base
    else:
        offsets = np.arange(base, base + count, dtype=np.int64)
    if header.attributes & TIMESTAMP_TYPE_BIT:
        timestamps = np.full(count, header.max_timestamp, dtype=np.int64)
    elif columns.timestamps is not None:
        timestamps = np.frombuffer(columns.timestamps, dtype=_I64).astype(np.int64)
    else:
        timestamps = np.full(count, header.base_timestamp, dtype=np.int64)
    key_lengths = np.frombuffer(columns.key_lengths, dtype=_I32)
    value_lengths = np.frombuffer(columns.value_lengths, dtype=_I32)
    view = memoryview(body)
    pos = columns.payload_start
    key_bytes = int(key_lengths[key_lengths > 0].sum()) if count else 0
    value_bytes = int(value_lengths[value_lengths > 0].sum()) if count else 0
    pieces.keys.append(view[pos : pos + key_bytes])
    pos += key_bytes
    pieces.values.append(view[pos : pos + value_bytes])
    pos += value_bytes
    record_headers: list[list[dict[str, object]] | None] | None = None
    if include_headers and columns.header_lengths is not None:
        # The one per-record Python step, paid only when headers are asked
        # for and the batch has some.
        record_headers = []
        for length in columns.header_lengths:
            if length <= 0:
                record_headers.append(None)
                continue
            block = bytes(view[pos : pos + length])
            pos += length
            record_headers.append([{"key": k, "value": v} for k, v in _decode_header_block(block)])
    pieces.offsets.append(offsets)
    pieces.timestamps.append(timestamps)
    pieces.timestamp_types.append(np.full(count, header.timestamp_type, dtype=np.int32))
    pieces.key_lengths.append(key_lengths)
    pieces.value_lengths.append(value_lengths)
    pieces.headers.append((count, record_headers))
    pieces.any_key = pieces.any_key or key_bytes > 0 or bool((key_lengths >= 0).any())
    pieces.count += count


def _binary_array(lengths: np.ndarray, payloads: Sequence[memoryview]) -> pa.Array:
    """An Arrow binary array from a length column (-1: null) and the
    payloads concatenated in order: one cumulative sum, one join."""
    count = len(lengths)
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0).astype(np.int64)
    ends = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=ends[1:])
    total = int(ends[-1])
    if total > _MAX_BINARY_BYTES:
        raise ValueError(f"{total} payload bytes do not fit one Arrow binary column (2 GiB)")
    data = payloads[0] if len(payloads) == 1 else b"".join(payloads)
    null_count = count - int(np.count_nonzero(valid))
    validity = (
        None if null_count == 0 else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    )
    return pa.Array.from_buffers(
        pa.binary(),
        count,
        [validity, pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(data)],
        null_count,
    )


def _assemble(pieces: _Pieces, topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
    count = pieces.count
    offsets = np.concatenate(pieces.offsets)
    timestamps_us = np.concatenate(pieces.timestamps) * 1000
    columns: list[pa.Array] = [
        _binary_array(np.concatenate(pieces.key_lengths), pieces.keys)
        if pieces.any_key
        else pa.nulls(count, pa.binary()),
        _binary_array(np.concatenate(pieces.value_lengths), pieces.values),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(offsets, pa.int64()),
        pa.Array.from_buffers(_TIMESTAMP_TYPE, count, [None, pa.py_buffer(timestamps_us)]),
        pa.array(np.concatenate(pieces.timestamp_types), pa.int32()),
    ]
    if include_headers:
        if any(h is not None for _, h in pieces.headers):
            flat: list[list[dict[str, object]] | None] = []
            for n, record_headers in pieces.headers:
                flat.extend(record_headers if record_headers is not None else [None] * n)
            columns.append(pa.array(flat, HEADERS_TYPE))
        else:
            columns.append(pa.nulls(count, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def decode_fetch(
    buf: bytes | bytearray | memoryview,
    topic: str,
    partition: int,
    start: int = 0,
    end: int | None = None,
    *,
    include_headers: bool = False,
    check_crcs: bool = True,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> tuple[pa.RecordBatch, UndecodableBatchError | None]:
    """The records of a fetch answer's bytes (whole batches back to back)
    with offsets in [start, end), as one RecordBatch.

    Stored batches wholly outside the range are skipped undecoded. Decoding
    stops at a batch that cannot be decoded: the records before it are
    returned with an UndecodableBatchError naming it (else None), as the
    per-record consumer does. A trailing partial batch is ignored.
    """
    view = memoryview(buf)
    size = len(view)
    pieces = _Pieces()
    error: UndecodableBatchError | None = None
    pos = 0
    while pos + HEADER_SIZE <= size:
        header = read_header(view, pos)
        batch_size = header.size
        if pos + batch_size > size:
            break
        if header.next_offset <= start:
            pos += batch_size
            continue
        if end is not None and header.base_offset >= end:
            break
        try:
            if check_crcs:
                header = validate_batch(view, pos)
            _add_batch(
                pieces,
                header,
                view[pos + HEADER_SIZE : pos + batch_size],
                include_headers,
                max_uncompressed_bytes,
            )
        except TidelogError as exc:
            error = UndecodableBatchError(
                f"{topic}-{partition}: the batch at offset {header.base_offset} (to "
                f"{header.last_offset}) cannot be decoded: {exc.message}. Records before "
                f"it were returned; seek to {header.next_offset} to skip it",
                topic,
                partition,
                header.base_offset,
                header.next_offset,
            )
            break
        pos += batch_size
    if pieces.count == 0:
        return empty_batch(include_headers), error
    batch = _assemble(pieces, topic, partition, include_headers)
    offsets = batch.column(4).to_numpy()
    lo = int(np.searchsorted(offsets, start, side="left")) if offsets[0] < start else 0
    hi = (
        int(np.searchsorted(offsets, end, side="left"))
        if end is not None and offsets[-1] >= end
        else len(offsets)
    )
    if lo or hi < len(offsets):
        batch = batch.slice(lo, hi - lo)
    return batch, error


def records_to_arrow(
    records: Sequence[ConsumerRecord], include_headers: bool = False
) -> pa.RecordBatch:
    """ConsumerRecords (of any partitions) as a RecordBatch with the same
    schema: the per-record path, for records already decoded one by one."""
    columns: dict[str, list[object]] = {
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp": [r.timestamp * 1000 for r in records],
        "timestampType": [r.timestamp_type for r in records],
    }
    if include_headers:
        columns["headers"] = [
            [{"key": k, "value": v} for k, v in r.headers] if r.headers else None for r in records
        ]
    schema = arrow_schema(include_headers)
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[f.name], f.type) for f in schema], schema=schema
    )
