"""The record batch: Tidelog's unit of production, storage and transfer.

A batch is a fixed 61-byte header followed by a body. Producers encode
batches, brokers check the header and checksum, assign offsets by patching
the header, and store and serve the bytes unchanged; consumers decode them.
This module owns the format; everything else goes through it.

Header (big-endian, the field order and widths of Kafka's v2 batch header)::

    offset size field
    0      8    base_offset             int64  offset of the first record
    8      4    batch_length            int32  bytes after this field
    12     4    partition_leader_epoch  int32  set by the leader
    16     1    magic                   int8   MAGIC (format version)
    17     4    crc                     uint32 CRC32C of bytes [21, end)
    21     2    attributes              int16  bits 0-2 codec (compression.py),
                                               bit 3 timestamp type (1 = LogAppendTime)
    23     4    last_offset_delta       int32  offset of the last record - base_offset
    27     8    base_timestamp          int64  ms since the epoch
    35     8    max_timestamp           int64  largest record timestamp (or append time)
    43     8    producer_id             int64  -1 when not idempotent
    51     2    producer_epoch          int16  -1 when not idempotent
    53     4    base_sequence           int32  -1 when not idempotent
    57     4    record_count            int32  >= 1

The CRC does not cover base_offset, batch_length or partition_leader_epoch, so
a broker assigns offsets and epochs without recomputing it. It does cover the
attributes, so setting LogAppendTime recomputes it (cheap: CRC32C runs at
~24 GB/s here).

Body, possibly compressed as a whole by the codec in the attributes. Its
layout is columnar, chosen for decode speed in Python: every per-record
number sits in one little-endian array that `array.frombytes` reads in C,
and the payloads are sliced out of one concatenated buffer. On this machine
that decodes ~10x faster than Kafka's per-record varint layout in pure
Python (see bench/codec_bench.py)::

    u8            body_flags: bit 0 OFFSET_DELTAS, bit 1 TIMESTAMPS, bit 2 HEADERS
    [N x uint32]  offset deltas, when OFFSET_DELTAS (else record i has delta i;
                  compaction leaves gaps, so they may be sparse)
    [N x int64]   timestamps (ms since the epoch), when TIMESTAMPS (else
                  every record has base_timestamp). Absolute, not deltas:
                  an array of them converts to and from a list in C, while
                  deltas would cost a Python operation per record both ways
    N x int32     key lengths (-1: null key)
    N x int32     value lengths (-1: null value, a tombstone)
    [N x int32]   header block lengths, when HEADERS
    keys, concatenated
    values, concatenated
    [header blocks, concatenated; each: u16 count, then per header
     u16 key length, key (UTF-8), int32 value length (-1 null), value]
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice, pairwise, repeat
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

import crc32c

from tidelog.compression import (
    CODEC_MASK,
    DEFAULT_MAX_UNCOMPRESSED_BYTES,
    CompressionType,
    compress,
    decompress,
)
from tidelog.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError

_crecords: ModuleType | None
try:  # the optional C loop (sdk/setup.py); without it, the same in Python
    from tidelog import _crecords
except ImportError:  # pragma: no cover - depends on the install
    _crecords = None
_cproduce: ModuleType | None
try:  # the producer's optional C body writer (sdk/setup.py); the same in Python without
    from tidelog import _cproduce
except ImportError:  # pragma: no cover - depends on the install
    _cproduce = None

MAGIC = 1
HEADER_SIZE = 61
# Bytes before batch_length's end: batch_length counts the bytes after this.
LOG_OVERHEAD = 12
# The CRC covers from the attributes to the end of the batch.
CRC_START = 21

TIMESTAMP_TYPE_BIT = 0x08
CREATE_TIME = 0
LOG_APPEND_TIME = 1

_FLAG_OFFSET_DELTAS = 0x01
_FLAG_TIMESTAMPS = 0x02
_FLAG_HEADERS = 0x04
_KNOWN_FLAGS = _FLAG_OFFSET_DELTAS | _FLAG_TIMESTAMPS | _FLAG_HEADERS

#: What one record's header block can hold (docs/record-batch.md): a u16
#: count of headers, and each key's UTF-8 bytes behind a u16 length.
MAX_HEADERS_PER_RECORD = 0xFFFF
MAX_HEADER_KEY_BYTES = 0xFFFF

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_LENGTH_PREFIX = struct.Struct(">qi")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
assert _HEADER.size == HEADER_SIZE

_NEEDS_BYTESWAP = sys.byteorder != "little"

Header = tuple[str, bytes | None]
#: A consumer's record type: a tuple subclass of (topic, partition, offset,
#: timestamp, timestamp_type, key, value, headers, leader_epoch).
RecordT = TypeVar("RecordT", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded fixed header of one batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> CompressionType:
        return CompressionType(self.attributes & CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else CREATE_TIME


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at `pos` without checking anything beyond its size."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidRecordError(
            f"truncated batch: {len(buf) - pos} bytes left, a header needs {HEADER_SIZE}"
        )
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def validate_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, max_batch_bytes: int | None = None
) -> BatchHeader:
    """Check the batch at `pos`: size, magic, counts, codec and CRC32C.

    Raises InvalidRecordError (truncated or malformed), MessageTooLargeError or
    CorruptRecordError with a message that names the problem.
    """
    available = len(buf) - pos
    header = read_header(buf, pos)
    size = header.size
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordError(
            f"malformed batch: batch_length {header.batch_length} is smaller than the header"
        )
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise MessageTooLargeError(
            f"batch of {size} bytes is larger than max.message.bytes={max_batch_bytes}"
        )
    if size > available:
        raise InvalidRecordError(
            f"truncated batch: header says {size} bytes, only {available} present"
        )
    if header.magic != MAGIC:
        raise InvalidRecordError(f"unsupported batch magic {header.magic}, expected {MAGIC}")
    if header.record_count < 1 or header.last_offset_delta < header.record_count - 1:
        raise InvalidRecordError(
            f"malformed batch: record_count {header.record_count}, "
            f"last_offset_delta {header.last_offset_delta}"
        )
    if header.attributes & CODEC_MASK > CompressionType.ZSTD:
        raise InvalidRecordError(f"unknown compression codec {header.attributes & CODEC_MASK}")
    actual = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + size])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch CRC32C mismatch: header says {header.crc:#010x}, body gives {actual:#010x}"
        )
    return header


def iter_batches(
    buf: bytes | bytearray | memoryview, max_batch_bytes: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Validate and yield (position, header) for each batch in a concatenation."""
    pos = 0
    end = len(buf)
    if end == 0:
        raise InvalidRecordError("no record batch: the records field is empty")
    while pos < end:
        header = validate_batch(buf, pos, max_batch_bytes)
        yield pos, header
        pos += header.size


def batch_boundaries(buf: bytes | bytearray | memoryview, limit: int | None = None) -> int:
    """Bytes of the longest prefix of `buf` made of whole batches (headers only,
    no CRC check), stopping before `limit` bytes when given. Used to trim a
    read to batch boundaries."""
    end = len(buf) if limit is None else min(limit, len(buf))
    pos = 0
    unpack = _LENGTH_PREFIX.unpack_from
    while pos + LOG_OVERHEAD <= end:
        size = unpack(buf, pos)[1] + LOG_OVERHEAD
        if pos + size > end:
            break
        pos += size
    return pos


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Patch the base offset of the batch at `pos` (outside the CRC)."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Patch the leader epoch of the batch at `pos` (outside the CRC)."""
    struct.pack_into(">i", buf, pos + 12, epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, append_time_ms: int) -> None:
    """Mark the batch at `pos` as LogAppendTime with the given time, and
    recompute its CRC (the attributes and max_timestamp are covered)."""
    header = read_header(buf, pos)
    _ATTRIBUTES.pack_into(buf, pos + 21, header.attributes | TIMESTAMP_TYPE_BIT)
    _TIMESTAMP.pack_into(buf, pos + 35, append_time_ms)
    crc = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.size])
    _CRC.pack_into(buf, pos + 17, crc)


# --------------------------------------------------------------------------- encoding


class BatchBuilder:
    """Accumulates records for one partition and encodes them as one batch.

    `append` is on the producer's per-record hot path, so it only stores
    references; what the body layout needs (null keys, mixed timestamps) is
    found at `build` time with C-speed scans. Not thread-safe: the producer's
    accumulator guards it.
    """

    __slots__ = ("_headers", "_keys", "_timestamps", "_values", "codec", "estimated_size")

    #: Per-record bytes of the body besides key and value (two length slots).
    RECORD_OVERHEAD = 8

    def __init__(self, codec: CompressionType = CompressionType.NONE) -> None:
        self.codec = codec
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._timestamps: list[int] = []
        # Created on the first record that has headers, so batches without
        # any pay nothing for them.
        self._headers: list[Sequence[Header] | None] | None = None
        #: Uncompressed bytes so far (an upper bound of the batch size).
        self.estimated_size = HEADER_SIZE + 1

    def __len__(self) -> int:
        return len(self._values)

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        timestamp_ms: int = 0,
        headers: Sequence[Header] | None = None,
    ) -> int:
        """Add one record; return its index in the batch."""
        values = self._values
        index = len(values)
        values.append(value)
        self._keys.append(key)
        self._timestamps.append(timestamp_ms)
        self.estimated_size += (
            self.RECORD_OVERHEAD
            + (0 if value is None else len(value))
            + (0 if key is None else len(key))
        )
        if headers or self._headers is not None:
            self._append_headers(index, headers)
        return index

    def _append_headers(self, index: int, headers: Sequence[Header] | None) -> None:
        if self._headers is None:
            self._headers = [None] * index
        self._headers.append(headers)
        if headers:
            self.estimated_size += 4 + sum(8 + len(k) + len(v or b"") for k, v in headers)

    def build(
        self,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
    ) -> bytes:
        """Encode the records as one batch with base offset 0."""
        values = self._values
        if not values:
            raise ValueError("cannot build an empty batch")
        keys = self._keys
        timestamps = self._timestamps
        any_key = keys.count(None) != len(keys)
        mixed_ts = min(timestamps) != max(timestamps)
        return encode_batch(
            values,
            keys=keys if any_key else None,
            timestamps=timestamps if mixed_ts else None,
            base_timestamp=timestamps[0],
            headers=self._headers,
            codec=self.codec,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            values_may_be_null=None in values,
        )


def _lengths(items: Sequence[bytes | None], may_be_null: bool) -> array:
    if may_be_null:
        return array("i", [-1 if item is None else len(item) for item in items])
    return array("i", map(len, items))  # type: ignore[arg-type]


def _le_bytes(arr: array) -> bytes:
    if _NEEDS_BYTESWAP:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _encode_headers(headers: Sequence[Header] | None) -> bytes:
    if not headers:
        return b""
    out = bytearray(_U16.pack(len(headers)))
    for key, value in headers:
        raw_key = key.encode()
        out += _U16.pack(len(raw_key))
        out += raw_key
        if value is None:
            out += _I32.pack(-1)
        else:
            out += _I32.pack(len(value))
            out += value
    return bytes(out)


def _body(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    timestamps: Sequence[int] | None,
    headers: Sequence[Sequence[Header] | None] | None,
    offset_deltas: Sequence[int] | None,
    values_may_be_null: bool,
) -> bytes:
    """encode_batch's uncompressed body: the flags byte, the columns, the blobs."""
    count = len(values)
    flags = 0
    parts: list[bytes] = []
    if offset_deltas is not None:
        flags |= _FLAG_OFFSET_DELTAS
        parts.append(_le_bytes(array("I", offset_deltas)))
    if timestamps is not None:
        flags |= _FLAG_TIMESTAMPS
        parts.append(_le_bytes(array("q", timestamps)))
    if keys is None:
        parts.append(_le_bytes(array("i", [-1])) * count)
        key_blob = b""
    else:
        parts.append(_le_bytes(_lengths(keys, True)))
        key_blob = b"".join([k for k in keys if k is not None])
    parts.append(_le_bytes(_lengths(values, values_may_be_null)))
    value_blob = (
        b"".join([v for v in values if v is not None]) if values_may_be_null else b"".join(values)  # type: ignore[arg-type]
    )
    header_blob = b""
    if headers is not None:
        flags |= _FLAG_HEADERS
        # One C pass where compiled (None: a type it leaves to the Python path).
        columns = (
            _cproduce.header_blocks(headers)
            if _cproduce is not None and type(headers) is list
            else None
        )
        if columns is None:
            blocks = [_encode_headers(h) for h in headers]
            parts.append(_le_bytes(array("i", map(len, blocks))))
            header_blob = b"".join(blocks)
        else:
            lengths, header_blob = columns
            parts.append(lengths)
    return b"".join([bytes((flags,)), *parts, key_blob, value_blob, header_blob])


def encode_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int] | None = None,
    base_timestamp: int = 0,
    headers: Sequence[Sequence[Header] | None] | None = None,
    offset_deltas: Sequence[int] | None = None,
    codec: CompressionType = CompressionType.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    timestamp_type: int = CREATE_TIME,
    values_may_be_null: bool = True,
) -> bytes:
    """Encode records as one batch.

    `keys`, `timestamps`, `headers` and `offset_deltas` are per-record columns
    (None: all keys null, every timestamp `base_timestamp`, no headers, dense
    offsets). With `timestamps`, base_timestamp is the first record's.
    """
    count = len(values)
    if count == 0:
        raise ValueError("a batch holds at least one record")
    if timestamps is not None:
        base_timestamp = timestamps[0]
        max_timestamp = max(timestamps)
    else:
        max_timestamp = base_timestamp
    last_offset_delta = count - 1 if offset_deltas is None else offset_deltas[-1]
    body = None
    if (
        _cproduce is not None
        and keys is None
        and headers is None
        and offset_deltas is None
        and type(values) is list
        and (timestamps is None or type(timestamps) is list)
    ):
        # A producer's keyless batch: one C pass (None: a value is not bytes).
        body = _cproduce.plain_body(values, timestamps)
    if body is None:
        body = _body(values, keys, timestamps, headers, offset_deltas, values_may_be_null)
    if codec != CompressionType.NONE:
        body = compress(codec, body)
    attributes = int(codec) | (TIMESTAMP_TYPE_BIT if timestamp_type == LOG_APPEND_TIME else 0)
    fields = struct.pack(
        ">hiqqqhii",
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    # The CRC covers the fields and the body; computed in two steps, so that
    # the body is copied once, into the batch.
    crc = crc32c.crc32c(body, crc32c.crc32c(fields))
    # batch_length counts everything after itself: epoch(4) + magic(1) + crc(4) + the rest.
    batch_length = 4 + 1 + 4 + len(fields) + len(body)
    return b"".join(
        [
            struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, MAGIC, crc),
            fields,
            body,
        ]
    )


# --------------------------------------------------------------------------- decoding


@dataclass(slots=True)
class DecodedBatch:
    """The records of one batch as columns (one list entry per record)."""

    header: BatchHeader
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header]]
    #: The key and value sizes in bytes, -1 for a null (the body's length
    #: columns, as read: the serialized sizes of records built with a
    #: deserializer, see `types._DeserializedRecord`).
    key_sizes: array
    value_sizes: array


def _read_array(typecode: str, body: bytes | memoryview, pos: int, count: int) -> tuple[array, int]:
    arr = array(typecode)
    end = pos + count * arr.itemsize
    if end > len(body):
        raise InvalidRecordError("truncated batch body: a length column runs past the end")
    arr.frombytes(body[pos:end])
    if _NEEDS_BYTESWAP:
        arr.byteswap()
    return arr, end


def _slice_column(
    blob: bytes, pos: int, lengths: array, nulls: int = 1
) -> tuple[list[bytes | None], int]:
    """Slice `len(lengths)` payloads from `blob` at `pos`; -1 is a null.
    `nulls` (from `_payload_bytes`): NO_NULLS spares a pass over `lengths`."""
    if nulls != _NO_NULLS and lengths and min(lengths) < 0:
        out: list[bytes | None] = []
        for n in lengths:
            if n < 0:
                out.append(None)
            else:
                out.append(blob[pos : pos + n])
                pos += n
        return out, pos
    ends = list(accumulate(lengths, initial=pos))
    end = ends[-1]
    return [blob[a:b] for a, b in pairwise(ends)], end


def _header_block_mismatch(declared: int, taken: int) -> InvalidRecordError:
    """The error for a header block whose headers do not fill exactly its
    declared bytes: what a broker answers a producer (check_body) and what a
    consumer's decoders raise for a stored one (a lying broker's)."""
    return InvalidRecordError(
        f"malformed record header block: {declared} bytes declared, its headers take {taken}"
    )


def _decode_header_blocks(blob: bytes, pos: int, lengths: array) -> tuple[list[list[Header]], int]:
    """The headers of the header blocks at `pos` in `blob`, one list per
    length in `lengths` ([] for a length <= 0: a record without headers),
    and where the blocks end. The walk of check_body (`_check_header_blocks`),
    building the headers, with its error: a block whose headers do not take
    exactly its bytes is refused (one that counted too few would drop the
    rest silently, one whose last value ran past it would cut it short).
    Raises InvalidRecordError; struct.error or UnicodeDecodeError for bytes
    that are not headers (the callers map them)."""
    u16 = _U16.unpack_from
    i32 = _I32.unpack_from
    out: list[list[Header]] = []
    for length in lengths:
        if length <= 0:
            out.append([])
            continue
        end = pos + length
        (count,) = u16(blob, pos)
        at = pos + 2
        headers: list[Header] = []
        for _ in range(count):
            (klen,) = u16(blob, at)
            key_end = at + 2 + klen
            key = blob[at + 2 : key_end].decode()
            (vlen,) = i32(blob, key_end)
            at = key_end + 4
            if vlen < 0:
                headers.append((key, None))
            else:
                headers.append((key, blob[at : at + vlen]))
                at += vlen
            if at > end:
                break
        if at != end:
            raise _header_block_mismatch(length, at - pos)
        out.append(headers)
        pos = end
    return out, pos


#: What a length column holds (`_payload_bytes`): no -1, some, only -1.
_NO_NULLS, _SOME_NULLS, _ALL_NULLS = 0, 1, 2


class _Columns(NamedTuple):
    """The number columns of a body, checked against each other, the header
    and the body's size (see `_read_columns`)."""

    flags: int
    deltas: array | None
    timestamps: array | None
    key_lengths: array
    value_lengths: array
    header_lengths: array | None
    #: Where the concatenated keys start.
    payload_start: int
    #: _NO_NULLS, _SOME_NULLS or _ALL_NULLS, for keys and for values.
    key_nulls: int = _SOME_NULLS
    value_nulls: int = _SOME_NULLS
    #: The bytes of all keys, of all values (nulls hold none).
    key_bytes: int = 0
    value_bytes: int = 0
    #: The bytes of all header blocks (0 without the HEADERS column).
    header_bytes: int = 0


#: How `_read_columns` totals a length column: (bytes, _NO_NULLS/...),
#: InvalidRecordError for a length below -1.
PayloadBytes = Callable[[array, str], tuple[int, int]]


def _payload_bytes(lengths: array, column: str) -> tuple[int, int]:
    """Bytes a length column claims (-1 is a null, which holds none), and
    whether it has nulls (_NO_NULLS, _SOME_NULLS, _ALL_NULLS)."""
    if not lengths or not lengths.tobytes().strip(b"\xff"):
        return 0, _ALL_NULLS  # every one -1 (all keys null, a common column)
    # One pass in the common case: read as unsigned, a negative length counts
    # 2^31 or more, so a total below 2^31 proves every length is >= 0.
    unsigned_total = sum(memoryview(lengths).cast("B").cast("I"))
    if unsigned_total < 2**31:
        return unsigned_total, _NO_NULLS
    smallest = min(lengths)
    if smallest < -1:
        raise InvalidRecordError(f"malformed batch body: a {column} length is {smallest}")
    # sum() and count() run in C over the array: no per-record Python work.
    if smallest < 0:
        return sum(lengths) + lengths.count(-1), _SOME_NULLS
    return sum(lengths), _NO_NULLS


def _read_columns(
    header: BatchHeader, body: bytes | memoryview, payload_bytes: PayloadBytes = _payload_bytes
) -> _Columns:
    """Read and check the columns of an (uncompressed) body before anything
    is allocated per record: the claimed record count must fit in the body,
    the offset deltas must increase strictly and end at last_offset_delta,
    and the length columns must add up to exactly the payload bytes.
    `payload_bytes` totals a length column (the columnar reader passes one
    that does it with numpy, with the same results and errors).

    Raises InvalidRecordError naming the field that does not agree.
    """
    count = header.record_count
    size = len(body)
    if size < 1:
        raise InvalidRecordError("malformed batch body: empty (a body starts with a flags byte)")
    flags = body[0]
    if flags & ~_KNOWN_FLAGS:
        raise InvalidRecordError(f"malformed batch body: unknown body flags {flags:#04x}")
    # Every record takes a key length and a value length, plus one slot in
    # each optional column: a count the bytes cannot back is refused here,
    # before any list of `count` items exists.
    per_record = (
        8
        + (4 if flags & _FLAG_OFFSET_DELTAS else 0)
        + (8 if flags & _FLAG_TIMESTAMPS else 0)
        + (4 if flags & _FLAG_HEADERS else 0)
    )
    if count < 1 or count > (size - 1) // per_record:
        raise InvalidRecordError(
            f"malformed batch: record_count {count} does not fit in a body of {size} bytes "
            f"(at most {(size - 1) // per_record} records of {per_record} column bytes each)"
        )
    pos = 1
    deltas = None
    if flags & _FLAG_OFFSET_DELTAS:
        deltas, pos = _read_array("I", body, pos, count)
        if deltas[-1] != header.last_offset_delta:
            raise InvalidRecordError(
                f"malformed batch: last_offset_delta {header.last_offset_delta} but the "
                f"body's last offset delta is {deltas[-1]}"
            )
        if not all(map(operator.lt, deltas, islice(deltas, 1, None))):
            raise InvalidRecordError("malformed batch body: offset deltas do not strictly increase")
    elif header.last_offset_delta != count - 1:
        raise InvalidRecordError(
            f"malformed batch: last_offset_delta {header.last_offset_delta} with "
            f"record_count {count} and dense offsets (expected {count - 1})"
        )
    timestamps = None
    if flags & _FLAG_TIMESTAMPS:
        timestamps, pos = _read_array("q", body, pos, count)
    key_lengths, pos = _read_array("i", body, pos, count)
    value_lengths, pos = _read_array("i", body, pos, count)
    header_lengths = None
    key_bytes, key_nulls = payload_bytes(key_lengths, "key")
    value_bytes, value_nulls = payload_bytes(value_lengths, "value")
    header_bytes = 0
    if flags & _FLAG_HEADERS:
        header_lengths, pos = _read_array("i", body, pos, count)
        header_bytes = payload_bytes(header_lengths, "header block")[0]
    payload = key_bytes + value_bytes + header_bytes
    if payload != size - pos:
        raise InvalidRecordError(
            f"malformed batch body: the length columns of {count} records add up to "
            f"{payload} bytes, the body holds {size - pos} after them"
        )
    return _Columns(
        flags,
        deltas,
        timestamps,
        key_lengths,
        value_lengths,
        header_lengths,
        pos,
        key_nulls,
        value_nulls,
        key_bytes,
        value_bytes,
        header_bytes,
    )


def _check_header_blocks_py(blocks: bytes, lengths: array) -> None:
    """Walk every header block (`blocks`: the body's tail, where they are
    concatenated) without building headers: each must hold exactly its
    declared headers, with UTF-8 keys. ~0.3 us per header in Python, paid
    only by batches that carry headers (tidelog._crecords walks them in C
    where it was compiled: `_check_header_blocks_c`)."""
    # Keys are nearly always ASCII: one C-speed scan spares a decode per key.
    check_utf8 = not blocks.isascii()
    u16 = _U16.unpack_from
    i32 = _I32.unpack_from
    pos = 0
    for length in lengths:
        if length <= 0:
            continue
        end = pos + length
        try:
            (count,) = u16(blocks, pos)
            at = pos + 2
            for _ in range(count):
                (klen,) = u16(blocks, at)
                if check_utf8:
                    str(blocks[at + 2 : at + 2 + klen], "utf-8")
                (vlen,) = i32(blocks, at + 2 + klen)
                at += 6 + klen + (vlen if vlen > 0 else 0)
                if at > end:
                    break
        except (struct.error, UnicodeDecodeError) as exc:
            raise InvalidRecordError(f"malformed record header block: {exc}") from exc
        if at != end:
            raise _header_block_mismatch(length, at - pos)
        pos = end


def _check_header_blocks_c(blocks: bytes, lengths: array) -> None:
    """`_check_header_blocks_py` as one C loop, raising the same errors."""
    assert _crecords is not None
    problem = _crecords.check_header_blocks(blocks, lengths, not blocks.isascii())
    if problem is None:
        return
    if problem[0] == "mismatch":
        raise _header_block_mismatch(int(problem[1]), int(problem[2]))
    raise InvalidRecordError(f"malformed record header block: {problem[1]}")


_check_header_blocks = _check_header_blocks_py if _crecords is None else _check_header_blocks_c


def _checked_columns(
    header: BatchHeader, raw_body: bytes | memoryview, max_uncompressed_bytes: int
) -> tuple[bytes | memoryview, _Columns]:
    """The uncompressed body and its columns, checked as a decode checks
    them (header blocks included) without building a record: what
    check_body and first_record_at_or_after share."""
    body = decompress(header.attributes & CODEC_MASK, raw_body, max_uncompressed_bytes)
    columns = _read_columns(header, body)
    lengths = columns.header_lengths
    if lengths is not None:
        # Header blocks come last: their bytes are the body's tail.
        _check_header_blocks(bytes(body[len(body) - columns.header_bytes :]), lengths)
    return body, columns


def check_body(
    header: BatchHeader,
    raw_body: bytes | memoryview,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> int:
    """Check that a body (as stored, maybe compressed) decodes into exactly
    what the header claims, without building records; return its
    uncompressed size. What a broker runs on every produced batch.

    Raises InvalidRecordError naming the field that lies, or
    MessageTooLargeError when the uncompressed body passes the limit.
    """
    return len(_checked_columns(header, raw_body, max_uncompressed_bytes)[0])


def _first_at_or_after_py(timestamps: array, target: int) -> int:
    """The index of the first of `timestamps` that is >= `target`, or -1.
    No Python frame per item (filter and index run in C), but each item is
    boxed into an int: ~40 ns per record here, which tidelog._crecords
    spares where it was compiled."""
    found = next(filter(target.__le__, timestamps), None)
    # The first item equal to the first one >= target is that one: no item
    # before it is >= target, so none before it equals it.
    return -1 if found is None else timestamps.index(found)


def _first_at_or_after_c(timestamps: array, target: int) -> int:
    """`_first_at_or_after_py` as one C loop over the array's buffer."""
    assert _crecords is not None
    return _crecords.first_at_or_after(timestamps, target)


_first_at_or_after = _first_at_or_after_py if _crecords is None else _first_at_or_after_c


def first_record_at_or_after(
    header: BatchHeader,
    raw_body: bytes | memoryview,
    timestamp_ms: int,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record, in offset order,
    whose timestamp is >= `timestamp_ms`, or None: what searching
    `decode_body`'s offsets and timestamps in order finds, with the same
    checks and errors, but without building a record (a broker's
    ListOffsets by timestamp). The first, not the one nearest the target:
    CreateTime timestamps are the producers' and need not increase within a
    batch, and Kafka answers the first one too.

    The body is decompressed (within `max_uncompressed_bytes`) and checked as
    `decode_body` checks it, header blocks included, so that a body it
    refuses is refused here with the same error type; then only the
    timestamp column is searched. Raises InvalidRecordError or
    MessageTooLargeError.
    """
    _body, columns = _checked_columns(header, raw_body, max_uncompressed_bytes)
    log_append_time = header.attributes & TIMESTAMP_TYPE_BIT
    timestamps = columns.timestamps
    if log_append_time or timestamps is None:
        # Every record has the same timestamp (as `_decode_columns` gives them).
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp
        index = 0 if timestamp >= timestamp_ms else -1
    else:
        index = _first_at_or_after(timestamps, timestamp_ms)
        timestamp = timestamps[index]
    if index < 0:
        return None
    delta = index if columns.deltas is None else columns.deltas[index]
    return header.base_offset + delta, timestamp


def decode_body(
    header: BatchHeader,
    raw_body: bytes,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> DecodedBatch:
    """Decode a batch body (still compressed, as stored) into columns.

    The body is checked against the header before anything is allocated per
    record (`_read_columns`); raises InvalidRecordError or
    MessageTooLargeError (uncompressed body over `max_uncompressed_bytes`).
    """
    body = bytes(decompress(header.attributes & CODEC_MASK, raw_body, max_uncompressed_bytes))
    return _decode_columns(header, _read_columns(header, body), body, 0)


def decode_batch_at(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> DecodedBatch:
    """`decode_body` of the batch at `pos` in `buf` (a fetched concatenation),
    without copying an uncompressed body out of `buf` first: keys and values
    are sliced from `buf` itself (one copy per value, as they must be bytes).
    """
    if header.attributes & CODEC_MASK:
        return decode_body(
            header, buf[pos + HEADER_SIZE : pos + header.size], max_uncompressed_bytes
        )
    start = pos + HEADER_SIZE
    body = memoryview(buf)[start : pos + header.size]
    if len(body) > max_uncompressed_bytes:
        raise MessageTooLargeError(
            f"batch body of {len(body)} bytes is larger than the limit of {max_uncompressed_bytes}"
        )
    return _decode_columns(header, _read_columns(header, body), buf, start)


def decode_records_at(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    record_type: type[RecordT],
    topic: str,
    partition: int,
    start: int,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> list[RecordT]:
    """The records of the batch at `pos` in `buf` with offset >= `start`, as
    `record_type` tuples of (topic, partition, offset, timestamp,
    timestamp_type, key, value, headers, leader_epoch): what a consumer
    returns, built without per-record Python code where tidelog._crecords
    was compiled. Checked as `decode_batch_at` checks; raises what it raises.
    """
    if header.attributes & CODEC_MASK:
        blob = bytes(
            decompress(
                header.attributes & CODEC_MASK,
                buf[pos + HEADER_SIZE : pos + header.size],
                max_uncompressed_bytes,
            )
        )
        body: bytes | memoryview = blob
        body_start = 0
    else:
        blob = buf
        body_start = pos + HEADER_SIZE
        body = memoryview(buf)[body_start : pos + header.size]
        if len(body) > max_uncompressed_bytes:
            raise MessageTooLargeError(
                f"batch body of {len(body)} bytes is larger than the limit of "
                f"{max_uncompressed_bytes}"
            )
    columns = _read_columns(header, body)
    return _build_records(header, columns, blob, body_start, record_type, topic, partition, start)


def _body_end(body_start: int, columns: _Columns) -> int:
    """Where a body whose columns are `columns` ends in its blob: after the
    keys, values and header blocks the columns add up to (checked)."""
    payload = columns.key_bytes + columns.value_bytes + columns.header_bytes
    return body_start + columns.payload_start + payload


#: A record without headers (shared by every such record).
_NO_HEADERS: tuple[()] = ()
_new_tuple = tuple.__new__


def records_of(
    batch: DecodedBatch,
    record_type: type[RecordT],
    topic: str,
    partition: int,
    start: int,
    keys: Sequence[Any] | None = None,
    values: Sequence[Any] | None = None,
    *more_columns: Iterable[Any],
) -> list[RecordT]:
    """The records of a decoded batch with offset >= `start`, as
    `record_type` tuples (see `decode_records_at`), built in Python with
    each step a C-level builtin (map, zip, repeat): no Python frame per
    record. `keys` / `values` replace the batch's (deserialized ones);
    `more_columns` follow leader_epoch (a record type with more fields)."""
    header = batch.header
    offsets = batch.offsets
    records = list(
        map(
            _new_tuple,
            repeat(record_type),
            zip(
                repeat(topic),
                repeat(partition),
                offsets,
                batch.timestamps,
                repeat(header.timestamp_type),
                batch.keys if keys is None else keys,
                batch.values if values is None else values,
                batch.headers or repeat(_NO_HEADERS),
                repeat(header.partition_leader_epoch),
                *more_columns,
                strict=False,
            ),
        )
    )
    if offsets[0] < start:
        return records[bisect_left(offsets, start) :]
    return records


def _build_records_py(
    header: BatchHeader,
    columns: _Columns,
    blob: bytes,
    body_start: int,
    record_type: type[RecordT],
    topic: str,
    partition: int,
    start: int,
) -> list[RecordT]:
    """`decode_records_at`'s records built in Python (`records_of`)."""
    batch = _decode_columns(header, columns, blob, body_start)
    return records_of(batch, record_type, topic, partition, start)


def _build_records_c(
    header: BatchHeader,
    columns: _Columns,
    blob: bytes,
    body_start: int,
    record_type: type[RecordT],
    topic: str,
    partition: int,
    start: int,
) -> list[RecordT]:
    """`decode_records_at`'s records built by tidelog._crecords: one C loop."""
    assert _crecords is not None
    log_append_time = header.attributes & TIMESTAMP_TYPE_BIT
    payload_start = body_start + columns.payload_start
    headers = None
    if columns.header_lengths is not None:
        # Header blocks follow the keys and values: parsed here, in Python
        # (batches with headers are rare; their cost is per header anyway).
        blocks_at = payload_start + columns.key_bytes + columns.value_bytes
        try:
            headers, _ = _decode_header_blocks(blob, blocks_at, columns.header_lengths)
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise InvalidRecordError(f"malformed batch body: {exc}") from exc
    # The C loop sees this body's bytes only, not the rest of a fetch answer.
    body = memoryview(blob)[: _body_end(body_start, columns)]
    try:
        return _crecords.build_records(
            record_type,
            topic,
            partition,
            header.timestamp_type,
            header.partition_leader_epoch,
            body,
            payload_start,
            header.base_offset,
            columns.deltas,
            None if log_append_time else columns.timestamps,
            header.max_timestamp if log_append_time else header.base_timestamp,
            columns.key_lengths,
            columns.value_lengths,
            headers,
            _NO_HEADERS,
            start,
        )
    except ValueError as exc:
        raise InvalidRecordError(str(exc)) from exc


_build_records = _build_records_py if _crecords is None else _build_records_c


def _decode_columns(
    header: BatchHeader, columns: _Columns, blob: bytes, start: int
) -> DecodedBatch:
    """The records' columns, the payloads sliced from `blob`, where the
    (uncompressed) body starts at `start`."""
    count = header.record_count
    try:
        if columns.deltas is not None:
            base = header.base_offset
            offsets = [base + d for d in columns.deltas]
        else:
            offsets = list(range(header.base_offset, header.base_offset + count))
        if header.attributes & TIMESTAMP_TYPE_BIT:
            timestamps = list(repeat(header.max_timestamp, count))
        elif columns.timestamps is not None:
            timestamps = columns.timestamps.tolist()
        else:
            timestamps = list(repeat(header.base_timestamp, count))
        key_lengths = columns.key_lengths
        pos = start + columns.payload_start
        if columns.key_nulls == _ALL_NULLS:
            keys: list[bytes | None] = list(repeat(None, count))
        else:
            keys, pos = _slice_column(blob, pos, key_lengths, columns.key_nulls)
        values, pos = _slice_column(blob, pos, columns.value_lengths, columns.value_nulls)
        if columns.header_lengths is not None:
            record_headers, pos = _decode_header_blocks(blob, pos, columns.header_lengths)
        else:
            record_headers = []
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise InvalidRecordError(f"malformed batch body: {exc}") from exc
    return DecodedBatch(
        header,
        offsets,
        timestamps,
        keys,
        values,
        record_headers,
        key_lengths,
        columns.value_lengths,
    )


def decode_batches(
    buf: bytes | bytearray | memoryview, verify_crc: bool = True
) -> Iterator[DecodedBatch]:
    """Decode every whole batch in a concatenation (as a fetch returns them).

    A trailing partial batch is ignored, as consumers must (the broker never
    sends one, but a reader of raw segment files may see one).
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    while pos + HEADER_SIZE <= end:
        header = read_header(view, pos)
        size = header.size
        if pos + size > end:
            break
        if verify_crc:
            header = validate_batch(view, pos)
        yield decode_body(header, bytes(view[pos + HEADER_SIZE : pos + size]))
        pos += size
