"""Writing a ProduceRequest onto the wire with its records copied once.

Built by protobuf, a request's batches were copied three times before gRPC
took it: joined into each partition's `records`, copied into the message
(and again into the request when the partition message was added to it), and
serialized. Each copy went to a fresh ~1 MiB block that the allocator faults
in page by page: ~1.3 ms of the sender's ~1.9 ms per 1 MiB request here
(bench/produce_profile.py, py-spy). `encode_request` writes protobuf's
encoding of the same message by hand (tag, varint, length-delimited fields)
around the batches, in one join; the Produce stream is opened without a
request serializer (`open_stream`), so gRPC sends these bytes as they are.
The broker parses them as any ProduceRequest (the tests compare with
protobuf's own encoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc.aio

from tidelog.v1 import log_pb2

#: The Produce method of the Log service (as the generated stub names it).
PRODUCE_METHOD = "/tidelog.v1.Log/Produce"

_REQUEST = log_pb2.ProduceRequest.DESCRIPTOR.fields_by_name
_PARTITION = log_pb2.PartitionRecords.DESCRIPTOR.fields_by_name
_VARINT, _LEN = 0, 2


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint; negative values as their 64-bit two's complement
    (how an int32 or int64 field encodes them)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_CORRELATION_ID = _tag(_REQUEST["correlation_id"].number, _VARINT)
_ACKS = _tag(_REQUEST["acks"].number, _VARINT)
_TIMEOUT_MS = _tag(_REQUEST["timeout_ms"].number, _VARINT)
_PARTITIONS = _tag(_REQUEST["partitions"].number, _LEN)
_TOPIC = _tag(_PARTITION["topic"].number, _LEN)
_PARTITION_NUMBER = _tag(_PARTITION["partition"].number, _VARINT)
_RECORDS = _tag(_PARTITION["records"].number, _LEN)

#: One partition's part of a request: (topic, partition, its encoded batches in order).
PartitionBatches = tuple[str, int, Sequence[bytes]]


def encode_request(
    correlation_id: int, acks: int, timeout_ms: int, partitions: Sequence[PartitionBatches]
) -> bytes:
    """The wire bytes of ProduceRequest(correlation_id, acks, timeout_ms, partitions=[
    PartitionRecords(topic, partition, records=b"".join(batches)), ...])."""
    parts: list[bytes] = [
        _CORRELATION_ID,
        _varint(correlation_id),
        _ACKS,
        _varint(acks),
        _TIMEOUT_MS,
        _varint(timeout_ms),
    ]
    for topic, partition, batches in partitions:
        raw_topic = topic.encode()
        records_length = sum(map(len, batches))
        head = b"".join(
            [
                _TOPIC,
                _varint(len(raw_topic)),
                raw_topic,
                _PARTITION_NUMBER,
                _varint(partition),
                _RECORDS,
                _varint(records_length),
            ]
        )
        parts += [_PARTITIONS, _varint(len(head) + records_length), head, *batches]
    return b"".join(parts)


def open_stream(channel: grpc.aio.Channel) -> Any:
    """A Produce call that takes `encode_request`'s bytes (no request serializer)
    and answers ProduceResponse messages."""
    method: Any = channel.stream_stream(
        PRODUCE_METHOD,
        request_serializer=None,
        response_deserializer=log_pb2.ProduceResponse.FromString,
    )
    # No request iterator: the sender writes each request with call.write().
    return method()
