"""records_results writes the same RecordsProduceResponse that building
each result with protobuf would: compared field by field over offsets that
cross every varint width, partition 0, shared and per-record timestamps,
acks=0 offsets and errors, in request order whatever the grouping."""

from __future__ import annotations

import pytest
from tidelog.v1 import common_pb2, records_pb2
from tidelog_gateway.records_results import ResponseBuilder, varint

pytestmark = pytest.mark.timeout(30)


def expected(
    correlation_id: int, rows: list[tuple[str, int, int, int]]
) -> records_pb2.RecordsProduceResponse:
    response = records_pb2.RecordsProduceResponse(correlation_id=correlation_id)
    for topic, partition, offset, timestamp in rows:
        response.results.add(
            topic=topic, partition=partition, offset=offset, timestamp_ms=timestamp
        )
    return response


@pytest.mark.parametrize(
    "first_offset",
    [0, 1, 100, 127, 128, 200, 16_383, 16_384, 2**21 - 50, 2**28 + 5, 2**35 - 3, 2**62],
)
@pytest.mark.parametrize("partition", [0, 1, 300])
def test_a_run_of_consecutive_offsets_matches_protobuf(first_offset: int, partition: int) -> None:
    count = 300
    stamp = 1_764_000_000_123
    builder = ResponseBuilder(42, count)
    builder.written(list(range(count)), "orders", partition, first_offset, [stamp] * count)
    rows = [("orders", partition, first_offset + i, stamp) for i in range(count)]
    assert builder.build() == expected(42, rows)


def test_interleaved_groups_errors_and_own_timestamps_keep_request_order() -> None:
    builder = ResponseBuilder(-5, 7)
    # Two groups interleaved in the request: positions 0, 2, 4 and 1, 5.
    builder.written([0, 2, 4], "a", 2, 1_000, [7, 7, 7])
    builder.written([1, 5], "b", 0, 126, [10, 11])  # per-record timestamps
    error = records_pb2.RecordResult(topic="c", offset=-1, timestamp_ms=-1)
    error.error.code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    error.error.message = "no topic c"
    builder.failed(3, error)
    builder.written([6], "a", 1, -1, [0])  # acks=0: no offset
    want = expected(
        -5,
        [("a", 2, 1_000, 7), ("b", 0, 126, 10), ("a", 2, 1_001, 7), ("c", 0, -1, -1),
         ("a", 2, 1_002, 7), ("b", 0, 127, 11), ("a", 1, -1, 0)],
    )  # fmt: skip
    want.results[3].error.CopyFrom(error.error)
    assert builder.build() == want


def test_varint_matches_protobuf_for_int64() -> None:
    assert varint(0) == b"\x00"
    for value in (1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**63)):
        message = records_pb2.RecordResult(offset=value)
        assert message.SerializeToString() == b"\x18" + varint(value)
