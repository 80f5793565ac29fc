"""The columnar read (tidelog.columnar) against the per-record decoder
(tidelog.records): on many generated fetches of several batches, with every
codec, keys, nulls, timestamps, sparse offsets, LogAppendTime and headers,
both give the same records; ranges and damaged batches behave as poll()."""

from __future__ import annotations

import datetime
import struct
from array import array
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog import columnar, records
from tidelog.compression import CompressionType
from tidelog.errors import InvalidRecordError, UndecodableBatchError
from tidelog.types import ConsumerRecord

payloads = st.one_of(st.none(), st.binary(max_size=200))
header_lists = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
        max_size=3,
    ),
)


@st.composite
def stored_batch(draw: st.DrawFn, base_offset: int) -> bytes:
    count = draw(st.integers(1, 30))
    values = draw(st.lists(payloads, min_size=count, max_size=count))
    keys = draw(st.one_of(st.none(), st.lists(payloads, min_size=count, max_size=count)))
    timestamps = draw(
        st.one_of(st.none(), st.lists(st.integers(0, 2**42), min_size=count, max_size=count))
    )
    headers = draw(st.one_of(st.none(), st.lists(header_lists, min_size=count, max_size=count)))
    gaps = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=count, max_size=count)))
    deltas = None if gaps is None else [sum(gaps[: i + 1]) + i for i in range(count)]
    encoded = bytearray(
        records.encode_batch(
            values,
            keys=keys,
            timestamps=timestamps,
            base_timestamp=draw(st.integers(0, 2**42)),
            headers=headers,
            offset_deltas=deltas,
            codec=draw(st.sampled_from(list(CompressionType))),
        )
    )
    records.set_base_offset(encoded, 0, base_offset)
    if draw(st.booleans()) and draw(st.booleans()):
        records.set_log_append_time(encoded, 0, draw(st.integers(0, 2**42)))
    return bytes(encoded)


@st.composite
def fetches(draw: st.DrawFn) -> bytes:
    offset = draw(st.integers(0, 2**40))
    out = b""
    for _ in range(draw(st.integers(1, 5))):
        batch = draw(stored_batch(offset))
        out += batch
        offset = records.read_header(batch).next_offset + draw(st.integers(0, 5))
    return out


def per_record(buf: bytes, start: int, end: int | None) -> list[ConsumerRecord]:
    """The reference: every record of the fetch decoded one by one."""
    out = []
    for batch in records.decode_batches(buf):
        header = batch.header
        for i, offset in enumerate(batch.offsets):
            if offset < start or (end is not None and offset >= end):
                continue
            headers = batch.headers[i] if batch.headers else []
            out.append(
                ConsumerRecord(
                    "t",
                    3,
                    offset,
                    batch.timestamps[i],
                    header.timestamp_type,
                    batch.keys[i],
                    batch.values[i],
                    headers,
                )
            )
    return out


def as_rows(batch: pa.RecordBatch) -> list[tuple]:
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    rows = []
    for row in batch.to_pylist():
        millis = (row["timestamp"] - epoch) // datetime.timedelta(milliseconds=1)
        headers = [(h["key"], h["value"]) for h in row["headers"] or []]
        rows.append(
            (
                row["topic"],
                row["partition"],
                row["offset"],
                millis,
                row["timestampType"],
                row["key"],
                row["value"],
                headers,
            )
        )
    return rows


def expected_rows(records_: list[ConsumerRecord]) -> list[tuple]:
    return [
        (
            r.topic,
            r.partition,
            r.offset,
            r.timestamp,
            r.timestamp_type,
            r.key,
            r.value,
            list(r.headers),
        )
        for r in records_
    ]


@settings(max_examples=300, deadline=None)
@given(buf=fetches(), data=st.data())
def test_same_records_as_the_per_record_decoder(buf: bytes, data: st.DataObject) -> None:
    first = records.read_header(buf).base_offset
    start = data.draw(st.integers(first - 2, first + 60))
    end = data.draw(st.one_of(st.none(), st.integers(start, start + 80)))
    batch, error = columnar.decode_fetch(buf, "t", 3, start, end, include_headers=True)
    assert error is None
    assert batch.schema == columnar.arrow_schema(True)
    assert as_rows(batch) == expected_rows(per_record(buf, start, end))
    # Without headers: the same rows, one column fewer.
    plain, _ = columnar.decode_fetch(buf, "t", 3, start, end)
    assert plain.schema == columnar.arrow_schema(False)
    assert plain.equals(batch.drop_columns(["headers"]))


@settings(max_examples=100, deadline=None)
@given(buf=fetches())
def test_records_to_arrow_is_the_same_batch(buf: bytes) -> None:
    batch, _ = columnar.decode_fetch(buf, "t", 3, include_headers=True)
    from_records = columnar.records_to_arrow(per_record(buf, 0, None), include_headers=True)
    assert from_records.equals(batch)


def test_null_columns_and_buffers() -> None:
    buf = records.encode_batch([b"a", None, b"ccc"], keys=None, base_timestamp=7)
    batch, _ = columnar.decode_fetch(buf, "topic", 0)
    assert batch.column("key").null_count == 3
    assert batch.column("value").to_pylist() == [b"a", None, b"ccc"]
    assert batch.column("offset").to_pylist() == [0, 1, 2]
    assert batch.column("timestampType").to_pylist() == [0, 0, 0]
    empty, error = columnar.decode_fetch(buf, "topic", 0, start=3)
    assert (empty.num_rows, error) == (0, None)
    assert empty.schema == columnar.arrow_schema()


def test_a_damaged_batch_stops_the_read_after_the_records_before_it() -> None:
    good = records.encode_batch([b"a", b"b"])
    bad = bytearray(records.encode_batch([b"c"]))
    records.set_base_offset(bad, 0, 2)
    bad[-1] ^= 0xFF  # the CRC no longer matches
    after = bytearray(records.encode_batch([b"d"]))
    records.set_base_offset(after, 0, 3)
    batch, error = columnar.decode_fetch(good + bytes(bad) + bytes(after), "t", 0)
    assert batch.column("value").to_pylist() == [b"a", b"b"]
    assert isinstance(error, UndecodableBatchError)
    assert (error.offset, error.next_offset) == (2, 3)
    assert "t-0" in error.message


def test_a_lying_header_block_stops_the_read_at_its_batch() -> None:
    """A header block that claims more headers than it holds is an
    undecodable batch (as in poll()), not a struct.error out of poll_arrow."""
    good = records.encode_batch([b"a", b"b"], headers=[[("k", b"v")], None])
    bad = bytearray(records.encode_batch([b"c", b"d"], headers=[[("k", b"v")], None]))
    records.set_base_offset(bad, 0, 2)
    header = records.read_header(bad)
    columns = records._read_columns(header, memoryview(bad)[records.HEADER_SIZE :])
    blocks_at = records.HEADER_SIZE + columns.payload_start + columns.key_bytes
    struct.pack_into("<H", bad, blocks_at + columns.value_bytes, 9)  # holds 1 header
    buf = good + bytes(bad)
    batch, error = columnar.decode_fetch(buf, "t", 0, include_headers=True, check_crcs=False)
    assert batch.column("value").to_pylist() == [b"a", b"b"]
    assert batch.column("headers").to_pylist() == [[{"key": "k", "value": b"v"}], None]
    assert isinstance(error, UndecodableBatchError)
    assert (error.offset, error.next_offset) == (2, 4)
    assert "malformed record header block" in error.message
    # Without headers asked for, the blocks are not read: all four records.
    plain, error = columnar.decode_fetch(buf, "t", 0, check_crcs=False)
    assert (plain.num_rows, error) == (4, None)


def test_a_batch_over_the_limit_is_not_decompressed() -> None:
    buf = records.encode_batch([b"x" * 10_000], codec=CompressionType.GZIP)
    batch, error = columnar.decode_fetch(buf, "t", 0, max_uncompressed_bytes=1000)
    assert batch.num_rows == 0
    assert error is not None and "1000" in error.message


@pytest.mark.parametrize("include_headers", [False, True])
def test_schema_is_spark_kafka_sources(include_headers: bool) -> None:
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    schema = columnar.arrow_schema(include_headers)
    assert schema.names == names + (["headers"] if include_headers else [])
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(
        st.one_of(st.just(-1), st.integers(-3, 1000), st.integers(0, 2**31 - 1)), max_size=50
    )
)
def test_numpy_length_totals_are_the_per_record_decoders(lengths: list[int]) -> None:
    """The columnar reader totals length columns with numpy: the same bytes,
    the same null kind, the same error as records._payload_bytes."""
    column = array("i", lengths)

    def outcome(total: Callable[[array, str], tuple[int, int]]) -> object:
        try:
            return total(column, "value")
        except InvalidRecordError as exc:
            return exc.message

    assert outcome(columnar._numpy_payload_bytes) == outcome(records._payload_bytes)


def test_one_stored_batch_is_read_in_place_and_several_are_joined() -> None:
    one = records.encode_batch([b"a" * 50, b"b" * 70])
    batch, _ = columnar.decode_fetch(one, "t", 0)
    data = batch.column("value").buffers()[2]
    start = np.frombuffer(one, dtype=np.uint8).ctypes.data
    assert start <= data.address and data.address + data.size <= start + len(one)
    second = bytearray(records.encode_batch([b"c" * 30], keys=[b"k"]))
    records.set_base_offset(second, 0, 2)
    batch, _ = columnar.decode_fetch(one + bytes(second), "t", 0)
    assert batch.column("value").to_pylist() == [b"a" * 50, b"b" * 70, b"c" * 30]
    assert batch.column("key").to_pylist() == [None, None, b"k"]
    assert batch.column("value").buffers()[2].size == 150


@settings(max_examples=100, deadline=None)
@given(
    topic=st.text(max_size=40),
    value=st.integers(-(2**31), 2**31 - 1),
    count=st.integers(1, 3000),
)
def test_constant_columns_are_pyarrows_repeat(topic: str, value: int, count: int) -> None:
    # topic, partition and timestampType are built from buffers, not pa.repeat:
    # the same arrays, valid to the last offset.
    strings = columnar._same_string(topic, count)
    strings.validate(full=True)
    assert strings.equals(pa.repeat(pa.scalar(topic, pa.string()), count))
    ints = columnar._same_int32(value, count)
    ints.validate(full=True)
    assert ints.equals(pa.repeat(pa.scalar(value, pa.int32()), count))


def test_a_fetch_carries_its_topic_partition_and_timestamp_type() -> None:
    buf = records.encode_batch([b"a", b"b", b"c"], keys=None, base_timestamp=7)
    batch, _ = columnar.decode_fetch(buf, "ünïcode.topic-1", 17)
    assert batch.column("topic").to_pylist() == ["ünïcode.topic-1"] * 3
    assert batch.column("partition").to_pylist() == [17] * 3
    assert batch.column("timestampType").to_pylist() == [0] * 3
    tail, _ = columnar.decode_fetch(buf, "t", 2, start=1)
    tail.validate(full=True)
    assert tail.column("topic").to_pylist() == ["t", "t"]
