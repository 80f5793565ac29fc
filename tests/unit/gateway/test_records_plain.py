"""Records.Produce's fast path (`_plain_records`) takes a request only when
every record is one topic's plain bytes value: any other field, on any
record, sends the request through the field-by-field path."""

from __future__ import annotations

from typing import Any

import pytest
from tidelog.v1 import records_pb2
from tidelog_gateway.records_servicer import _plain_records

pytestmark = pytest.mark.timeout(30)


def records(
    *extra: dict[str, Any], count: int = 5, size: int = 100, keyed: bool = False
) -> list[Any]:
    request = records_pb2.RecordsProduceRequest(
        records=[
            records_pb2.ProduceRecord(
                topic="orders",
                value=b"%03d" % i + b"v" * (size - 3),
                key=b"key-%d" % i if keyed else None,
            )
            for i in range(count)
        ]
    )
    for i, fields in enumerate(extra):
        request.records[i + 1].MergeFrom(records_pb2.ProduceRecord(**fields))
    return list(request.records)


@pytest.mark.parametrize("size", [3, 100, 127, 128, 5000])
def test_plain_records_are_taken_with_their_values(size: int) -> None:
    for keyed in (False, True):
        plain = _plain_records(records(size=size, keyed=keyed))
        assert plain is not None
        assert plain.topic == "orders"
        assert plain.values == [b"%03d" % i + b"v" * (size - 3) for i in range(5)]
        assert plain.keys == ([b"key-%d" % i for i in range(5)] if keyed else None)


@pytest.mark.parametrize(
    "fields",
    [
        {"partition": 0},
        {"partition": 3},
        {"key": b"k"},
        {"key": b""},
        {"key_text": "k"},
        {"timestamp_ms": 0},
        {"timestamp_ms": 5},
        {"headers": [records_pb2.RecordHeader(key="h")]},
        {"topic": "other1"},  # same length, another topic
    ],
)
def test_any_other_field_on_any_record_is_not_plain(fields: dict[str, Any]) -> None:
    assert _plain_records(records(fields)) is None
    if "key" not in fields and "key_text" not in fields:
        assert _plain_records(records(fields, keyed=True)) is None


def test_keys_on_some_records_only_or_not_plain_bytes_are_not_plain() -> None:
    # One record without a key, among keyed ones; a text key; an empty key.
    request = records_pb2.RecordsProduceRequest(
        records=[records_pb2.ProduceRecord(topic="orders", key=b"k", value=b"v")] * 2
    )
    assert _plain_records(list(request.records)) is not None
    for other in ({}, {"key_text": "k"}, {"key": b""}, {"key": b"k" * 200}):
        mixed = records_pb2.RecordsProduceRequest(
            records=[
                records_pb2.ProduceRecord(topic="orders", key=b"k", value=b"v"),
                records_pb2.ProduceRecord(topic="orders", value=b"v", **other),
            ]
        )
        assert _plain_records(list(mixed.records)) is None, other


def test_null_empty_and_text_values_are_not_plain() -> None:
    request = records_pb2.RecordsProduceRequest(
        records=[
            records_pb2.ProduceRecord(topic="orders", value=b"v"),
            # A null value and a two-byte field: the size of an empty value.
            records_pb2.ProduceRecord(topic="orders", partition=3),
        ]
    )
    assert _plain_records(list(request.records)) is None
    for other in ({"value": b""}, {"value_text": "v"}, {}):
        request = records_pb2.RecordsProduceRequest(
            records=[
                records_pb2.ProduceRecord(topic="orders", value=b"v"),
                records_pb2.ProduceRecord(topic="orders", **other),
            ]
        )
        assert _plain_records(list(request.records)) is None
    # Value lengths whose prefixes differ in size: the slow path.
    mixed = records_pb2.RecordsProduceRequest(
        records=[
            records_pb2.ProduceRecord(topic="orders", value=b"v"),
            records_pb2.ProduceRecord(topic="orders", value=b"v" * 200),
        ]
    )
    assert _plain_records(list(mixed.records)) is None
