"""A FetchResponse on the wire, framed around the stored record bytes.

A fetch response is nearly all record bytes. Built as a protobuf message,
they were copied into the message (`PartitionData(records=...)`) and copied
again when gRPC serialized it: ~30% of the broker's CPU per fetched byte
(profiled, 1 KiB records). Here each partition's small fields are serialized
by protobuf, and its `records` field and the `partitions` entry around it are
framed by hand: in protobuf's encoding a length-delimited field is its tag,
its length as a varint, then its bytes, and fields may come in any order, so
the result parses as the same FetchResponse. The records are copied once, into
the response bytes. The Fetch handler is registered with `serialize`, which
passes these bytes to gRPC as they are.

The handler yields each response in an `OutgoingResponse` and empties it once
gRPC has written it: gRPC's loop over a streaming handler, and the
interceptors around it (metrics, authorizer), keep the last item they were
given while they wait for the next, and a stream at the end of its logs waits
for records, maybe for hours. Bytes yielded as they are would stay in memory,
up to a whole response per waiting stream, outside the fetch budget.
"""

from __future__ import annotations

from google.protobuf.message import Message
from tidelog.v1 import log_pb2

_LENGTH_DELIMITED = 2


def _tag(message: type[Message], field: str) -> bytes:
    number = message.DESCRIPTOR.fields_by_name[field].number
    return _varint(number << 3 | _LENGTH_DELIMITED)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_PARTITIONS_TAG = _tag(log_pb2.FetchResponse, "partitions")
_RECORDS_TAG = _tag(log_pb2.PartitionData, "records")
_THROTTLE_TAG = _varint(
    log_pb2.FetchResponse.DESCRIPTOR.fields_by_name["throttle_time_ms"].number << 3
)


class OutgoingResponse:
    """A serialized FetchResponse on its way to gRPC, emptied by `release`
    once written (see the module doc). To the authorizer's quota it looks
    like a message: ByteSize() and a throttle_time_ms to set."""

    __slots__ = ("_throttle_ms", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._throttle_ms = 0

    def ByteSize(self) -> int:  # protobuf's name
        return len(self.data)

    @property
    def throttle_time_ms(self) -> int:
        return self._throttle_ms

    @throttle_time_ms.setter
    def throttle_time_ms(self, value: int) -> None:
        # Appended: parsers merge fields in any order, the last scalar wins.
        self._throttle_ms = value
        self.data += _THROTTLE_TAG + _varint(value)

    def release(self) -> None:
        self.data = b""


def partition_entry(
    data: log_pb2.PartitionData, records: bytes | memoryview = b""
) -> list[bytes | memoryview]:
    """The pieces of one `partitions` entry of a FetchResponse: `data` (without
    records) with `records` as its records field. Join the pieces of every
    entry to get the response."""
    head = data.SerializeToString()
    if not records:
        return [_PARTITIONS_TAG, _varint(len(head)), head]
    records_length = _varint(len(records))
    size = len(head) + len(_RECORDS_TAG) + len(records_length) + len(records)
    return [_PARTITIONS_TAG, _varint(size), head, _RECORDS_TAG, records_length, records]


def serialize(response: OutgoingResponse | bytes | Message) -> bytes:
    """The Fetch handler's response serializer: framed bytes as they are."""
    if isinstance(response, OutgoingResponse):
        return response.data
    if isinstance(response, bytes):
        return response
    return response.SerializeToString()
