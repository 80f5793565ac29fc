"""The consumer's reading of FetchResponse bytes (tidelog._fetch_wire):
the same fields protobuf would give, records as bytes."""

from __future__ import annotations

import pytest
from tidelog import _fetch_wire
from tidelog.errors import InvalidRecordError
from tidelog.v1 import common_pb2, log_pb2


def _response(records: bytes) -> log_pb2.FetchResponse:
    return log_pb2.FetchResponse(
        partitions=[
            log_pb2.PartitionData(
                topic="orders",
                partition=3,
                fetch_offset=1 << 40,
                next_offset=(1 << 40) + 5,
                high_watermark=(1 << 40) + 9,
                log_start_offset=7,
                records=records,
            ),
            log_pb2.PartitionData(
                topic="gone",
                error=common_pb2.Error(code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION, message="no"),
            ),
        ]
    )


@pytest.mark.parametrize("size", [0, 1, 200, 70_000])
def test_parsed_like_protobuf_with_records_as_bytes(size: int) -> None:
    expected = _response(bytes(range(256)) * (size // 256) + b"r" * (size % 256))
    parsed = _fetch_wire.parse(expected.SerializeToString())
    assert len(parsed.partitions) == 2
    for got, want in zip(parsed.partitions, expected.partitions, strict=True):
        assert type(got.records) is bytes and got.records == want.records
        for field in ("topic", "partition", "fetch_offset", "next_offset", "high_watermark"):
            assert getattr(got, field) == getattr(want, field)
        assert got.error == want.error and got.log_start_offset == want.log_start_offset
    assert parsed.partitions[1].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION


def test_records_in_the_middle_and_unknown_fields_are_read() -> None:
    # Fields in another order than protobuf writes them, and a field this
    # client does not know (number 15): both are valid protobuf.
    head = log_pb2.PartitionData(topic="t", partition=1).SerializeToString()
    tail = log_pb2.PartitionData(next_offset=9).SerializeToString()
    unknown = bytes([15 << 3 | 0, 1])
    entry = head + bytes([8 << 3 | 2, 3]) + b"abc" + unknown + tail
    raw = bytes([1 << 3 | 2, len(entry)]) + entry + bytes([9 << 3 | 0, 5])
    (part,) = _fetch_wire.parse(raw).partitions
    assert (part.topic, part.partition, part.next_offset, part.records) == ("t", 1, 9, b"abc")


def test_a_truncated_response_is_refused() -> None:
    raw = _response(b"x" * 100).SerializeToString()
    with pytest.raises(InvalidRecordError, match="malformed fetch response"):
        _fetch_wire.parse(raw[:-10])


def test_records_view_reads_the_response_without_copying() -> None:
    records = bytes(range(256)) * 800
    raw = _response(records).SerializeToString()
    part = _fetch_wire.parse(raw).partitions[0]
    view = part.records_view()
    assert view.obj is raw  # a window on gRPC's bytes, not a copy
    assert view == records and part.records_size == len(records)
    assert part.records == records and type(part.records) is bytes
    empty = _fetch_wire.parse(raw).partitions[1]
    assert empty.records_size == 0 and empty.records == b"" and len(empty.records_view()) == 0
