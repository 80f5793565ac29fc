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
is shared; its length columns are totalled with numpy here, with the same
results and errors), and a compressed body is decompressed first, within the
same limit. A fetch of one stored batch gives columns over the fetched bytes
in place; the payloads of several are joined once, into a buffer of Arrow's
memory pool.

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

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa

from tidelog.compression import CODEC_MASK, DEFAULT_MAX_UNCOMPRESSED_BYTES, decompress
from tidelog.errors import InvalidRecordError, TidelogError, UndecodableBatchError
from tidelog.records import (
    _ALL_NULLS,
    _NO_NULLS,
    _SOME_NULLS,
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
_STRING = pa.string()
_INT32 = pa.int32()
_INT64 = pa.int64()
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
class _Stored:
    """The columns of one stored batch, as read (no copy of the payloads)."""

    base_offset: int
    count: int
    #: Offset deltas (uint32), or None: dense from base_offset.
    deltas: array | None
    #: Create times in ms (int64), or None: every record has `timestamp`.
    timestamps: array | None
    timestamp: int
    timestamp_type: int
    key_lengths: array
    value_lengths: array
    key_nulls: int
    value_nulls: int
    keys: memoryview
    values: memoryview
    #: Its records' header lists, or None when it has none (or none asked for).
    headers: list[list[dict[str, object]] | None] | None


def _numpy_payload_bytes(lengths: array, column: str) -> tuple[int, int]:
    """`records._payload_bytes` with numpy: the same totals, null kinds and
    error, in a few C passes instead of one Python-level step per record."""
    if not lengths:
        return 0, _ALL_NULLS
    view = np.frombuffer(lengths, dtype=np.int32)
    # One pass in the common case, as records._payload_bytes: read as
    # unsigned, a negative length counts 2^31 or more, so a total below 2^31
    # proves every length is >= 0.
    unsigned_total = int(view.view(np.uint32).sum(dtype=np.uint64))
    if unsigned_total < 2**31:
        return unsigned_total, _NO_NULLS
    smallest = int(view.min())
    if smallest < -1:
        raise InvalidRecordError(f"malformed batch body: a {column} length is {smallest}")
    if smallest >= 0:
        return int(view.sum(dtype=np.int64)), _NO_NULLS
    if int(view.max()) == -1:
        return 0, _ALL_NULLS  # every one null (all keys null, a common column)
    nulls = len(view) - int(np.count_nonzero(view + 1))
    return int(view.sum(dtype=np.int64)) + nulls, _SOME_NULLS


def _read_stored(
    header: BatchHeader,
    raw_body: memoryview,
    include_headers: bool,
    max_uncompressed_bytes: int,
) -> _Stored:
    """One stored batch's columns (raises TidelogError when the body does
    not agree with its header, as the per-record decoder does)."""
    body = decompress(header.attributes & CODEC_MASK, raw_body, max_uncompressed_bytes)
    columns = _read_columns(header, body, _numpy_payload_bytes)
    view = memoryview(body)
    pos = columns.payload_start
    keys = view[pos : pos + columns.key_bytes]
    pos += columns.key_bytes
    values = view[pos : pos + columns.value_bytes]
    pos += columns.value_bytes
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
    if header.attributes & TIMESTAMP_TYPE_BIT:
        timestamps, timestamp = None, header.max_timestamp
    else:
        timestamps, timestamp = columns.timestamps, header.base_timestamp
    return _Stored(
        header.base_offset,
        header.record_count,
        columns.deltas,
        timestamps,
        timestamp,
        header.timestamp_type,
        columns.key_lengths,
        columns.value_lengths,
        columns.key_nulls,
        columns.value_nulls,
        keys,
        values,
        record_headers,
    )


def _binary_array(
    lengths: Sequence[array], nulls: Sequence[int], payloads: Sequence[memoryview]
) -> pa.Array:
    """An Arrow binary array from length columns (-1: null) and their
    payloads (each column's concatenated bytes), in order: one cumulative
    sum, and the payloads joined in a buffer of Arrow's memory pool (which
    keeps its pages: a fresh ~1 MiB bytes object from malloc page-faults
    every time). A single payload is used in place, not copied."""
    count = sum(len(column) for column in lengths)
    if all(n == _ALL_NULLS for n in nulls):
        return pa.nulls(count, pa.binary())
    total = sum(len(p) for p in payloads)
    if total > _MAX_BINARY_BYTES:
        raise ValueError(f"{total} payload bytes do not fit one Arrow binary column (2 GiB)")
    sizes = (
        np.frombuffer(lengths[0], dtype=np.int32)
        if len(lengths) == 1
        else np.concatenate([np.frombuffer(column, dtype=np.int32) for column in lengths])
    )
    validity = None
    null_count = 0
    if any(n != _NO_NULLS for n in nulls):
        valid = sizes >= 0
        null_count = count - int(np.count_nonzero(valid))
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
        sizes = np.where(valid, sizes, 0)
    ends = np.empty(count + 1, dtype=np.int32)
    ends[0] = 0
    np.cumsum(sizes, out=ends[1:])  # no overflow: the total is below 2^31
    if len(payloads) == 1:
        data = pa.py_buffer(payloads[0])
    else:
        data = pa.allocate_buffer(total)
        target = memoryview(data).cast("B")
        at = 0
        for payload in payloads:
            target[at : at + len(payload)] = payload
            at += len(payload)
    return pa.Array.from_buffers(
        pa.binary(), count, [validity, pa.py_buffer(ends), data], null_count
    )


def _same_string(value: str, count: int) -> pa.Array:
    """A string column of `count` times `value`, from two buffers (the repeated
    bytes and evenly spaced offsets): the `topic` column of every batch, at a
    fraction of `pa.repeat`'s cost per fetch answer."""
    encoded = value.encode()
    size = len(encoded)
    if size * count > _MAX_BINARY_BYTES:
        return pa.repeat(pa.scalar(value, _STRING), count)
    ends = (
        np.arange(0, (count + 1) * size, size, dtype=np.int32)
        if size
        else np.zeros(count + 1, dtype=np.int32)
    )
    return pa.Array.from_buffers(
        _STRING, count, [None, pa.py_buffer(ends), pa.py_buffer(encoded * count)]
    )


def _same_int32(value: int, count: int) -> pa.Array:
    """An int32 column of `count` times `value` (as `_same_string`, for the
    `partition` and `timestampType` columns)."""
    return pa.Array.from_buffers(
        _INT32, count, [None, pa.py_buffer(np.full(count, value, dtype=np.int32))]
    )


def _offsets(stored: Sequence[_Stored], count: int) -> np.ndarray:
    first = stored[0]
    if all(s.deltas is None for s in stored) and all(
        b.base_offset == a.base_offset + a.count for a, b in pairwise(stored)
    ):
        return np.arange(first.base_offset, first.base_offset + count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    at = 0
    for s in stored:
        part = out[at : at + s.count]
        if s.deltas is None:
            part[:] = np.arange(s.base_offset, s.base_offset + s.count, dtype=np.int64)
        else:
            part[:] = np.frombuffer(s.deltas, dtype=np.uint32)
            part += s.base_offset
        at += s.count
    return out


def _timestamps_us(stored: Sequence[_Stored], count: int) -> np.ndarray:
    out = np.empty(count, dtype=np.int64)
    at = 0
    for s in stored:
        part = out[at : at + s.count]
        if s.timestamps is None:
            part.fill(s.timestamp * 1000)
        else:
            np.multiply(np.frombuffer(s.timestamps, dtype=np.int64), 1000, out=part)
        at += s.count
    return out


def _assemble(
    stored: Sequence[_Stored], topic: str, partition: int, include_headers: bool
) -> tuple[pa.RecordBatch, np.ndarray]:
    """One RecordBatch of the stored batches' records, and its offsets."""
    count = sum(s.count for s in stored)
    offsets = _offsets(stored, count)
    kinds = {s.timestamp_type for s in stored}
    columns: list[pa.Array] = [
        _binary_array(
            [s.key_lengths for s in stored], [s.key_nulls for s in stored], [s.keys for s in stored]
        ),
        _binary_array(
            [s.value_lengths for s in stored],
            [s.value_nulls for s in stored],
            [s.values for s in stored],
        ),
        _same_string(topic, count),
        _same_int32(partition, count),
        pa.Array.from_buffers(_INT64, count, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(
            _TIMESTAMP_TYPE, count, [None, pa.py_buffer(_timestamps_us(stored, count))]
        ),
        _same_int32(kinds.pop(), count)
        if len(kinds) == 1
        else pa.array(
            np.repeat([s.timestamp_type for s in stored], [s.count for s in stored]), _INT32
        ),
    ]
    if include_headers:
        if any(s.headers is not None for s in stored):
            flat: list[list[dict[str, object]] | None] = []
            for s in stored:
                flat.extend(s.headers if s.headers is not None else [None] * s.count)
            columns.append(pa.array(flat, HEADERS_TYPE))
        else:
            columns.append(pa.nulls(count, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers)), offsets


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
    stored: list[_Stored] = []
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
            stored.append(
                _read_stored(
                    header,
                    view[pos + HEADER_SIZE : pos + batch_size],
                    include_headers,
                    max_uncompressed_bytes,
                )
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
    if not stored:
        return empty_batch(include_headers), error
    batch, offsets = _assemble(stored, topic, partition, include_headers)
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
