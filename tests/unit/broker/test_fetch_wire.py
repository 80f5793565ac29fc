"""FetchResponse bytes framed around the records (tidelog_broker.fetch_wire)
parse as the message protobuf would have built."""

from __future__ import annotations

import pytest
from tidelog import _fetch_wire
from tidelog.v1 import common_pb2, log_pb2
from tidelog_broker import fetch_wire


@pytest.mark.parametrize("records_bytes", [0, 1, 127, 128, 300, 16_384, 2_000_000])
def test_framed_response_parses_as_the_protobuf_one(records_bytes: int) -> None:
    records = bytes(range(256)) * (records_bytes // 256) + b"x" * (records_bytes % 256)
    fields = dict(
        topic="orders",
        partition=3,
        fetch_offset=1 << 40,
        next_offset=(1 << 40) + 5,
        high_watermark=(1 << 40) + 9,
        log_start_offset=7,
    )
    failed = log_pb2.PartitionData(
        topic="gone",
        partition=0,
        error=common_pb2.Error(code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION, message="no"),
    )
    pieces = fetch_wire.partition_entry(log_pb2.PartitionData(**fields), records)
    pieces += fetch_wire.partition_entry(failed)
    framed = fetch_wire.serialize(b"".join(pieces))
    expected = log_pb2.FetchResponse(
        partitions=[log_pb2.PartitionData(**fields, records=records), failed]
    )
    assert log_pb2.FetchResponse.FromString(framed) == expected


def test_a_message_is_serialized_as_protobuf_does() -> None:
    message = log_pb2.FetchResponse(partitions=[log_pb2.PartitionData(topic="t")])
    assert fetch_wire.serialize(message) == message.SerializeToString()


def test_an_outgoing_response_serializes_as_its_bytes_until_released() -> None:
    pieces = fetch_wire.partition_entry(log_pb2.PartitionData(topic="t"), b"r" * 1000)
    outgoing = fetch_wire.OutgoingResponse(b"".join(pieces))
    assert outgoing.ByteSize() == len(b"".join(pieces))
    # The authorizer's fetch quota sets throttle_time_ms as on a message.
    outgoing.throttle_time_ms = 250
    parsed = log_pb2.FetchResponse.FromString(fetch_wire.serialize(outgoing))
    assert parsed.throttle_time_ms == 250
    assert parsed.partitions[0].records == b"r" * 1000
    outgoing.release()  # written: nothing of it stays referenced
    assert fetch_wire.serialize(outgoing) == b""


def test_a_serialized_fetch_answer_carries_the_throttle_time() -> None:
    """The broker's Fetch answers go out serialized, in an OutgoingResponse:
    the authorizer's fetch quota sets throttle_time_ms on it as on a message,
    which appends the field, and both protobuf and the SDK's reader see it or
    skip it."""
    answer = log_pb2.FetchResponse(
        partitions=[log_pb2.PartitionData(topic="t", partition=1, records=b"\x01" * 300)]
    )
    outgoing = fetch_wire.OutgoingResponse(answer.SerializeToString())
    outgoing.throttle_time_ms = 1234
    throttled = fetch_wire.serialize(outgoing)
    parsed = log_pb2.FetchResponse.FromString(throttled)
    assert parsed.throttle_time_ms == 1234
    assert parsed.partitions[0].records == b"\x01" * 300
    fetched = _fetch_wire.parse(throttled)
    assert fetched.partitions[0].records == b"\x01" * 300
