"""The columnar read: stored record batches decoded into pyarrow RecordBatches.

A fetch answer holds whole record batches whose bodies are already columnar
(docs/record-batch.md: little-endian arrays of offset deltas, timestamps and
lengths, then the concatenated keys and values). This module turns those
columns into Arrow arrays without a Python object per record: the number
columns become Arrow buffers, a binary column is the body's payload bytes
plus an Arrow offsets buffer computed from the lengths, and a null is a bit
in a validity bitmap. The column pass (every body's columns checked, then
the buffers of the whole answer written) is one call into tidelog._crecords
(`_column_pass_c`) where it was compiled, else its Python twin
(`_column_pass_py`: records._read_columns per body, its length columns
totalled with numpy, then a few numpy calls per stored batch); both give
the same buffers and errors. The RecordBatch is then imported by pyarrow
from those buffers as one Arrow C array (`_assemble_c`, tidelog._crecords
.export_struct) instead of a pyarrow call per buffer and column
(`_assemble_py`, its twin, also used when headers are asked for). The body
is checked exactly as the per-record decoder checks it, and a compressed
body is decompressed first, within the same limit. A fetch of one stored
batch gives columns over the fetched bytes in place; the payloads of
several are joined once, into a buffer of Arrow's memory pool.

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

import struct
from array import array
from collections.abc import Callable, Sequence
from typing import NamedTuple

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
    _Columns,
    _crecords,
    _decode_header_blocks,
    _read_array,
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
_Build = Callable[[int], pa.Array]
#: export_struct's kind of a binary or string column; the other kinds are
#: the bytes per value of a fixed-width column.
_BINARY = 0
_INT32_BYTES = 4
_INT64_BYTES = 8
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


#: A buffer of the column pass: bytes (C) or a numpy array (Python).
Buffer = bytes | np.ndarray


class _Answer(NamedTuple):
    """What the column pass gives for the stored batches of one fetch answer
    (`_column_pass_c` and `_column_pass_py` give the same)."""

    #: How many bodies passed the checks, and the first failure's message.
    checked: int
    error: str | None
    #: Records in the checked bodies, and their int64 offsets and
    #: timestamps (microseconds).
    rows: int
    offsets: Buffer
    timestamps: Buffer
    #: Per payload column: Arrow's int32 offsets (rows + 1), the validity
    #: bitmap (None: no nulls) and the null count.
    key_ends: Buffer
    key_validity: Buffer | None
    key_nulls: int
    value_ends: Buffer
    value_validity: Buffer | None
    value_nulls: int
    #: Per checked body: (where its keys start, key bytes, value bytes,
    #: where its header-length column starts or -1).
    spans: list[tuple[int, int, int, int]]


def _timestamp_rule(header: BatchHeader) -> tuple[int, bool]:
    """Every record's timestamp when the column is not read, and whether it
    is read: LogAppendTime gives every record the batch's max_timestamp."""
    if header.attributes & TIMESTAMP_TYPE_BIT:
        return header.max_timestamp, False
    return header.base_timestamp, True


def _column_pass_c(bodies: list[memoryview], headers: list[BatchHeader]) -> _Answer:
    """The column pass in C (tidelog._crecords.arrow_columns): one call per
    answer instead of some twenty numpy calls per stored batch."""
    assert _crecords is not None
    batches = [
        (h.base_offset, h.record_count, h.last_offset_delta, *_timestamp_rule(h)) for h in headers
    ]
    return _Answer._make(_crecords.arrow_columns(bodies, batches))


def _column_pass_py(bodies: list[memoryview], headers: list[BatchHeader]) -> _Answer:
    """The column pass in Python, the twin of `_column_pass_c`: each body
    checked by `records._read_columns` (length totals with numpy), then
    the answer's buffers with a few numpy calls per stored batch."""
    read: list[_Columns] = []
    error = None
    for header, body in zip(headers, bodies, strict=True):
        try:
            read.append(_read_columns(header, body, _numpy_payload_bytes))
        except InvalidRecordError as exc:
            error = exc.message
            break
    headers = headers[: len(read)]
    count = sum(h.record_count for h in headers)
    for column in ("key", "value"):
        total = sum(getattr(c, f"{column}_bytes") for c in read)
        if total > _MAX_BINARY_BYTES:
            raise ValueError(f"{total} payload bytes do not fit one Arrow binary column (2 GiB)")
    offsets = np.empty(count, dtype=np.int64)
    timestamps = np.empty(count, dtype=np.int64)
    at = 0
    for header, columns in zip(headers, read, strict=True):
        n = header.record_count
        # int64 arithmetic wraps on a lying header, as the C pass does.
        part = offsets[at : at + n]
        if columns.deltas is None:
            part[:] = np.arange(n, dtype=np.int64)
        else:
            part[:] = np.frombuffer(columns.deltas, dtype=np.uint32)
        part += header.base_offset
        part = timestamps[at : at + n]
        timestamp, from_column = _timestamp_rule(header)
        if from_column and columns.timestamps is not None:
            part[:] = np.frombuffer(columns.timestamps, dtype=np.int64)
        else:
            part.fill(timestamp)
        part *= 1000
        at += n
    key_ends, key_validity, key_nulls = _arrow_lengths([c.key_lengths for c in read], count)
    value_ends, value_validity, value_nulls = _arrow_lengths([c.value_lengths for c in read], count)
    spans = [
        (
            c.payload_start,
            c.key_bytes,
            c.value_bytes,
            -1 if c.header_lengths is None else c.payload_start - 4 * h.record_count,
        )
        for h, c in zip(headers, read, strict=True)
    ]
    return _Answer(
        len(read),
        error,
        count,
        offsets,
        timestamps,
        key_ends,
        key_validity,
        key_nulls,
        value_ends,
        value_validity,
        value_nulls,
        spans,
    )


def _arrow_lengths(lengths: list[array], count: int) -> tuple[np.ndarray, bytes | None, int]:
    """Arrow's offsets, validity bitmap (None: no nulls) and null count of
    length columns (-1: null), joined: one cumulative sum."""
    sizes = (
        np.concatenate([np.frombuffer(column, dtype=np.int32) for column in lengths])
        if lengths
        else np.empty(0, dtype=np.int32)
    )
    validity = None
    valid = sizes >= 0
    null_count = count - int(np.count_nonzero(valid))
    if null_count:
        validity = np.packbits(valid, bitorder="little").tobytes()
        sizes = np.where(valid, sizes, 0)
    ends = np.empty(count + 1, dtype=np.int32)
    ends[0] = 0
    np.cumsum(sizes, out=ends[1:])  # no overflow: the total is below 2^31
    return ends, validity, null_count


_column_pass = _column_pass_py if _crecords is None else _column_pass_c


def _binary_array(
    count: int,
    ends: Buffer,
    validity: Buffer | None,
    null_count: int,
    payloads: Sequence[memoryview],
) -> pa.Array:
    """An Arrow binary array from the column pass's buffers and the payloads
    (each stored batch's concatenated bytes, in order, see `_joined`)."""
    if null_count == count:
        return pa.nulls(count, pa.binary())
    return pa.Array.from_buffers(
        pa.binary(),
        count,
        [
            None if validity is None else pa.py_buffer(validity),
            pa.py_buffer(ends),
            pa.py_buffer(_joined(payloads)),
        ],
        null_count,
    )


HeaderLists = list[list[dict[str, object]] | None]


def _record_headers(
    body: memoryview, count: int, span: tuple[int, int, int, int]
) -> HeaderLists | None:
    """One stored batch's header lists (None: it has no header column). The
    one per-record Python step, paid only when headers are asked for and
    the batch has some. Raises InvalidRecordError for a block that does not
    hold what it declares (as the per-record decoder does)."""
    payload_at, key_bytes, value_bytes, headers_at = span
    if headers_at < 0:
        return None
    lengths, _ = _read_array("i", body, headers_at, count)
    # One copy of the blocks (the body's tail): the values are bytes.
    blocks = bytes(body[payload_at + key_bytes + value_bytes :])
    try:
        lists, _ = _decode_header_blocks(blocks, 0, lengths)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise InvalidRecordError(f"malformed record header block: {exc}") from exc
    return [
        None if length <= 0 else [{"key": k, "value": v} for k, v in headers]
        for length, headers in zip(lengths, lists, strict=True)
    ]


#: The constant columns of a batch (topic, partition, timestampType) are
#: slices of a longer array built once per value and kept (Arrow arrays are
#: immutable): building one costs ~2.5 us a column per fetch answer, a
#: slice ~0.6. Bounded: at most this many arrays of at most this many rows
#: and bytes each (a few MiB in all); longer columns are built each time.
_CONSTANTS_KEPT = 16
_CONSTANT_ROWS = 1 << 16
_CONSTANT_BYTES = 1 << 18
_constants: dict[tuple[object, ...], tuple[pa.Array, Buffers]] = {}
#: An array's buffers (validity first; None: absent).
Buffers = tuple[pa.Buffer | None, ...]


def _kept(
    key: tuple[object, ...], count: int, row_bytes: int, build: _Build
) -> tuple[pa.Array, Buffers]:
    """A column of at least `count` rows (offset 0) built by `build(rows)`
    and kept for `key`, with its buffers; or `build(count)` when it is too
    long to keep."""
    kept = _constants.get(key)
    if kept is not None and len(kept[0]) >= count:
        return kept
    rows = max(1024, 1 << (count - 1).bit_length())
    if rows > _CONSTANT_ROWS or rows * row_bytes > _CONSTANT_BYTES:
        array = build(count)
        return array, tuple(array.buffers())
    if len(_constants) >= _CONSTANTS_KEPT:
        _constants.clear()  # many values in turn: start over (thread-safe, unlike an LRU)
    array = build(rows)
    kept = _constants[key] = array, tuple(array.buffers())
    return kept


def _constant(key: tuple[object, ...], count: int, row_bytes: int, build: _Build) -> pa.Array:
    """`build(count)`, or a slice of a kept longer `build(rows)` for `key`."""
    array, _ = _kept(key, count, row_bytes, build)
    return array if len(array) == count else array.slice(0, count)


def _constant_buffers(spec: tuple[tuple[object, ...], int, _Build], count: int) -> Buffers:
    """The buffers of a kept constant column of at least `count` rows, for
    `spec` (`_string_key`, `_int32_key`): what export_struct takes."""
    key, row_bytes, build = spec
    return _kept(key, count, row_bytes, build)[1]


def _string_key(value: str) -> tuple[tuple[object, ...], int, _Build]:
    encoded = value.encode()
    return (_STRING, value), len(encoded), lambda rows: _repeated_string(encoded, rows)


def _int32_key(value: int) -> tuple[tuple[object, ...], int, _Build]:
    return (
        (_INT32, value),
        _INT32_BYTES,
        lambda rows: pa.Array.from_buffers(
            _INT32, rows, [None, pa.py_buffer(np.full(rows, value, dtype=np.int32))]
        ),
    )


def _same_string(value: str, count: int) -> pa.Array:
    """A string column of `count` times `value` (the `topic` column)."""
    key, row_bytes, build = _string_key(value)
    return _constant(key, count, row_bytes, build)


def _repeated_string(encoded: bytes, count: int) -> pa.Array:
    """A string column of `count` times `encoded`, from two buffers (the
    repeated bytes and evenly spaced offsets), a fraction of `pa.repeat`'s
    cost."""
    size = len(encoded)
    if size * count > _MAX_BINARY_BYTES:
        return pa.repeat(pa.scalar(encoded.decode(), _STRING), count)
    ends = (
        np.arange(0, (count + 1) * size, size, dtype=np.int32)
        if size
        else np.zeros(count + 1, dtype=np.int32)
    )
    return pa.Array.from_buffers(
        _STRING, count, [None, pa.py_buffer(ends), pa.py_buffer(encoded * count)]
    )


def _same_int32(value: int, count: int) -> pa.Array:
    """An int32 column of `count` times `value` (the `partition` and
    `timestampType` columns)."""
    key, row_bytes, build = _int32_key(value)
    return _constant(key, count, row_bytes, build)


def _payloads(
    bodies: list[memoryview], spans: list[tuple[int, int, int, int]]
) -> tuple[list[memoryview], list[memoryview]]:
    """Each stored batch's concatenated keys, and values, in its body."""
    keys = []
    values = []
    for body, (at, key_bytes, value_bytes, _) in zip(bodies, spans, strict=False):
        keys.append(body[at : at + key_bytes])
        values.append(body[at + key_bytes : at + key_bytes + value_bytes])
    return keys, values


def _joined(payloads: Sequence[memoryview]) -> memoryview | pa.Buffer:
    """The payloads as one buffer: a single one in place, several joined
    in a buffer of Arrow's memory pool (which keeps its pages: a fresh
    ~1 MiB bytes object from malloc page-faults every time)."""
    if len(payloads) == 1:
        return payloads[0]
    data = pa.allocate_buffer(sum(len(p) for p in payloads))
    target = memoryview(data).cast("B")
    at = 0
    for payload in payloads:
        target[at : at + len(payload)] = payload
        at += len(payload)
    return data


def _timestamp_types(headers: list[BatchHeader], count: int) -> int | np.ndarray:
    """The timestampType of every record: one value, or an int32 array when
    the stored batches differ."""
    kinds = {h.timestamp_type for h in headers}
    if len(kinds) == 1:
        return kinds.pop()
    return np.repeat(
        np.array([h.timestamp_type for h in headers], dtype=np.int32),
        [h.record_count for h in headers],
    )


def _assemble_c(
    bodies: list[memoryview],
    headers: list[BatchHeader],
    answer: _Answer,
    header_lists: list[HeaderLists | None] | None,
    topic: str,
    partition: int,
) -> pa.RecordBatch:
    """`_assemble_py`'s RecordBatch imported by pyarrow in one call: the
    buffers handed over as one Arrow C array (tidelog._crecords
    .export_struct, which checks them). With headers, `_assemble_py`."""
    if header_lists is not None:
        return _assemble_py(bodies, headers, answer, header_lists, topic, partition)
    assert _crecords is not None
    count = answer.rows
    keys, values = _payloads(bodies, answer.spans)
    kinds = _timestamp_types(headers, count)
    kind_buffers = (
        _constant_buffers(_int32_key(kinds), count) if isinstance(kinds, int) else (None, kinds)
    )
    columns = [
        (count, answer.key_nulls, _BINARY, (answer.key_validity, answer.key_ends, _joined(keys))),
        (
            count,
            answer.value_nulls,
            _BINARY,
            (answer.value_validity, answer.value_ends, _joined(values)),
        ),
        (count, 0, _BINARY, _constant_buffers(_string_key(topic), count)),
        (count, 0, _INT32_BYTES, _constant_buffers(_int32_key(partition), count)),
        (count, 0, _INT64_BYTES, (None, answer.offsets)),
        (count, 0, _INT64_BYTES, (None, answer.timestamps)),
        (count, 0, _INT32_BYTES, kind_buffers),
    ]
    capsule, address = _crecords.export_struct(count, columns)
    batch = pa.RecordBatch._import_from_c(address, _SCHEMA)
    del capsule  # after the import: it frees the (moved-from) struct
    return batch


def _assemble_py(
    bodies: list[memoryview],
    headers: list[BatchHeader],
    answer: _Answer,
    header_lists: list[HeaderLists | None] | None,
    topic: str,
    partition: int,
) -> pa.RecordBatch:
    """One RecordBatch of the checked stored batches' records (with the
    headers column when `header_lists`, each batch's, are given)."""
    count = answer.rows
    keys, values = _payloads(bodies, answer.spans)
    kinds = _timestamp_types(headers, count)
    columns: list[pa.Array] = [
        _binary_array(count, answer.key_ends, answer.key_validity, answer.key_nulls, keys),
        _binary_array(count, answer.value_ends, answer.value_validity, answer.value_nulls, values),
        _same_string(topic, count),
        _same_int32(partition, count),
        pa.Array.from_buffers(_INT64, count, [None, pa.py_buffer(answer.offsets)]),
        pa.Array.from_buffers(_TIMESTAMP_TYPE, count, [None, pa.py_buffer(answer.timestamps)]),
        _same_int32(kinds, count)
        if isinstance(kinds, int)
        else pa.Array.from_buffers(_INT32, count, [None, pa.py_buffer(kinds)]),
    ]
    if header_lists is not None:
        if any(lists is not None for lists in header_lists):
            flat: HeaderLists = []
            for h, lists in zip(headers, header_lists, strict=True):
                flat.extend(lists if lists is not None else [None] * h.record_count)
            columns.append(pa.array(flat, HEADERS_TYPE))
        else:
            columns.append(pa.nulls(count, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(header_lists is not None))


_assemble = _assemble_py if _crecords is None else _assemble_c


def _undecodable(
    topic: str, partition: int, header: BatchHeader, message: str
) -> UndecodableBatchError:
    return UndecodableBatchError(
        f"{topic}-{partition}: the batch at offset {header.base_offset} (to "
        f"{header.last_offset}) cannot be decoded: {message}. Records before "
        f"it were returned; seek to {header.next_offset} to skip it",
        topic,
        partition,
        header.base_offset,
        header.next_offset,
    )


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
    headers: list[BatchHeader] = []
    bodies: list[memoryview] = []
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
            body = decompress(
                header.attributes & CODEC_MASK,
                view[pos + HEADER_SIZE : pos + batch_size],
                max_uncompressed_bytes,
            )
        except TidelogError as exc:
            error = _undecodable(topic, partition, header, exc.message)
            break
        headers.append(header)
        bodies.append(memoryview(body))
        pos += batch_size
    if not bodies:
        return empty_batch(include_headers), error
    # Every body's columns are checked (and the answer's Arrow buffers
    # written) in one pass; a body that fails stops the read there, as a
    # batch that fails its CRC does.
    answer = _column_pass(bodies, headers)
    if answer.checked < len(bodies):
        assert answer.error is not None
        error = _undecodable(topic, partition, headers[answer.checked], answer.error)
        del headers[answer.checked :], bodies[answer.checked :]
    header_lists: list[HeaderLists | None] | None = None
    if include_headers and bodies:
        header_lists = []
        for body, header, span in zip(bodies, headers, answer.spans, strict=False):
            try:
                header_lists.append(_record_headers(body, header.record_count, span))
            except InvalidRecordError as exc:
                error = _undecodable(topic, partition, header, exc.message)
                break
        if len(header_lists) < len(bodies):
            # A header block lies: the read stops at its batch. Rare; the
            # column pass runs again over the batches before it.
            del headers[len(header_lists) :], bodies[len(header_lists) :]
            if bodies:
                answer = _column_pass(bodies, headers)
    if not bodies:
        return empty_batch(include_headers), error
    batch = _assemble(bodies, headers, answer, header_lists, topic, partition)
    offsets = np.frombuffer(answer.offsets, dtype=np.int64)
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
