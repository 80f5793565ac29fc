"""The answer to a `Records.Produce` request, encoded without building a
message per record.

A request's answer holds one `RecordResult` per record, and building each
with protobuf's `add(...)` cost ~0.6 us, as much as everything else the
gateway does for a record. But the records of one batch share their topic,
partition and (nearly always) timestamp, and their offsets are consecutive:
their results differ only in the offset's varint. So this module writes the
response's wire bytes itself, a run of consecutive offsets at a time, with
C-speed joins of cached pieces (`_run`), and protobuf parses them back once
(~30 ns a result). What does not fit a run (an error, a run whose records
carry their own timestamps, negative numbers) is built as a message and
serialized: the slow path, the same bytes protobuf writes.

Wire format used (protos/tidelog/v1/records.proto)::

    RecordsProduceResponse: 1 correlation_id (varint), 2 results (message)
    RecordResult: 1 topic (string), 2 partition (varint), 3 offset (varint),
                  4 timestamp_ms (varint), 5 error (message)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import lru_cache
from itertools import repeat

from tidelog.v1 import records_pb2

_RESULTS_TAG = b"\x12"  # RecordsProduceResponse.results, length-delimited
_MASK64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """Protobuf's varint of an int64 (a negative one takes ten bytes)."""
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, value: int) -> bytes:
    """A varint field, left out when 0 (proto3's default)."""
    return bytes((tag,)) + varint(value) if value else b""


def _wrap(result: bytes) -> bytes:
    """One RecordResult as an element of RecordsProduceResponse.results."""
    return _RESULTS_TAG + varint(len(result)) + result


@lru_cache(maxsize=1024)
def _heads(prefix: bytes, tail_size: int) -> list[bytes]:
    """The 128 first pieces of the results of a run whose offsets share
    all but their lowest 7 bits: the element header and the fields before
    the offset, then the offset's first varint byte (the low 7 bits, with
    the continuation bit: these offsets are >= 128)."""
    size = len(prefix) + 1 + tail_size
    head = _RESULTS_TAG + varint(size) + prefix
    return [head + bytes((0x80 | low,)) for low in range(128)]


def _run(
    topic: bytes, partition: int, first_offset: int, count: int, timestamp: int
) -> list[bytes]:
    """The encoded results of `count` records of one partition with
    consecutive offsets from `first_offset` (>= 0) and one timestamp."""
    prefix = b"\x0a" + varint(len(topic)) + topic + _field(0x10, partition) + b"\x18"
    suffix = _field(0x20, timestamp)
    out: list[bytes] = []
    offset = first_offset
    end = first_offset + count
    while offset < end:
        if offset < 128:  # a one-byte varint, without the continuation bit
            out.append(_wrap(prefix + bytes((offset,)) + suffix))
            offset += 1
            continue
        high, low = divmod(offset, 128)
        stop = min(end, (high + 1) * 128)
        # varint(offset) = its low 7 bits with the continuation bit, then
        # varint(offset >> 7): the tail is the same for the whole block.
        tail = varint(high) + suffix
        heads = _heads(prefix, len(tail))
        out += map(operator.add, heads[low : low + stop - offset], repeat(tail))
        offset = stop
    return out


class ResponseBuilder:
    """Collects the encoded results of one request's records, by their
    position in the request, then builds the response."""

    __slots__ = ("_correlation_id", "_pieces")

    def __init__(self, correlation_id: int, count: int) -> None:
        self._correlation_id = correlation_id
        self._pieces: list[bytes] = [b""] * count

    def written(
        self,
        indices: Sequence[int],
        topic: str,
        partition: int,
        first_offset: int,
        timestamps: Sequence[int],
    ) -> None:
        """The records at `indices` (increasing) were written at consecutive
        offsets from `first_offset` (-1: not known, acks=0), with
        `timestamps` (one per record)."""
        count = len(indices)
        if not count:
            return
        stamp = timestamps[0]
        if first_offset >= 0 and stamp >= 0 and timestamps.count(stamp) == count:
            pieces = _run(topic.encode(), partition, first_offset, count, stamp)
        else:
            pieces = [
                _wrap(
                    records_pb2.RecordResult(
                        topic=topic,
                        partition=partition,
                        offset=first_offset + i if first_offset >= 0 else -1,
                        timestamp_ms=timestamps[i],
                    ).SerializeToString()
                )
                for i in range(count)
            ]
        self._place(indices, pieces)

    def failed(self, index: int, result: records_pb2.RecordResult) -> None:
        """The record at `index` has a result of its own (an error)."""
        self._pieces[index] = _wrap(result.SerializeToString())

    def _place(self, indices: Sequence[int], pieces: list[bytes]) -> None:
        first = indices[0]
        if indices[-1] - first == len(indices) - 1:
            # Consecutive positions (one group per request, the common case).
            self._pieces[first : first + len(pieces)] = pieces
        else:
            out = self._pieces
            for index, piece in zip(indices, pieces, strict=True):
                out[index] = piece

    def build(self) -> records_pb2.RecordsProduceResponse:
        data = _field(0x08, self._correlation_id) + b"".join(self._pieces)
        return records_pb2.RecordsProduceResponse.FromString(data)
