"""The producer's hand-written ProduceRequest bytes (tidelog._produce_wire) against
protobuf's own encoding of the same message."""

from __future__ import annotations

import pytest
from tidelog._produce_wire import encode_request
from tidelog.v1 import log_pb2


def protobuf_request(
    correlation_id: int, acks: int, timeout_ms: int, partitions: list[tuple[str, int, list[bytes]]]
) -> log_pb2.ProduceRequest:
    return log_pb2.ProduceRequest(
        correlation_id=correlation_id,
        acks=acks,
        timeout_ms=timeout_ms,
        partitions=[
            log_pb2.PartitionRecords(topic=t, partition=p, records=b"".join(batches))
            for t, p, batches in partitions
        ],
    )


@pytest.mark.parametrize("acks", [-1, 0, 1])
@pytest.mark.parametrize(
    "partitions",
    [
        [("orders", 0, [b"x" * 70])],
        # Multi-byte varints: a partition above 127, records over 16 KiB, a
        # non-ASCII topic (its length in bytes, not characters).
        [("t", 300, [b"a" * 20_000, b"b" * 130]), ("tópico-ü", 2**31 - 1, [b"c"])],
        [("empty-batches", 1, [])],
    ],
)
def test_the_bytes_parse_as_the_message_protobuf_writes(
    acks: int, partitions: list[tuple[str, int, list[bytes]]]
) -> None:
    for correlation_id in (0, 1, 300, 2**62):
        raw = encode_request(correlation_id, acks, 30_000, partitions)
        expected = protobuf_request(correlation_id, acks, 30_000, partitions)
        # (Not byte for byte: protobuf leaves out fields at their defaults, these
        # bytes do not, which parses the same.)
        assert log_pb2.ProduceRequest.FromString(raw) == expected
