"""The record batch codec (tidelog.records): round trips, the golden vector
that other-language clients check against, and every rejection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog import records
from tidelog.compression import CompressionType
from tidelog.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError

# Two records, a key, a null value, per-record timestamps and a header: the
# layout of docs/record-batch.md, byte for byte. A client in another language
# that encodes the same records must produce exactly these bytes.
GOLDEN_BATCH = bytes.fromhex(
    "000000000000000000000067ffffffff0108e379960000000000010000018bcfe568"
    "000000018bcfe56805ffffffffffffffffffffffffffff00000002060068e5cf8b01"
    "00000568e5cf8b01000001000000ffffffff02000000ffffffff0a00000000000000"
    "6b763101000100680100000078"
)


def test_golden_vector() -> None:
    encoded = records.encode_batch(
        [b"v1", None],
        keys=[b"k", None],
        timestamps=[1_700_000_000_000, 1_700_000_000_005],
        headers=[[("h", b"x")], None],
    )
    assert encoded == GOLDEN_BATCH
    header = records.validate_batch(GOLDEN_BATCH)
    assert (header.record_count, header.last_offset_delta, header.max_timestamp) == (
        2,
        1,
        1_700_000_000_005,
    )
    (batch,) = records.decode_batches(GOLDEN_BATCH)
    assert batch.keys == [b"k", None]
    assert batch.values == [b"v1", None]
    assert batch.timestamps == [1_700_000_000_000, 1_700_000_000_005]
    assert batch.headers == [[("h", b"x")], []]


record_values = st.one_of(st.none(), st.binary(max_size=300))


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(record_values, min_size=1, max_size=40),
    with_keys=st.booleans(),
    codec=st.sampled_from(list(CompressionType)),
    base_offset=st.integers(0, 2**40),
    data=st.data(),
)
def test_round_trip(
    values: list[bytes | None],
    with_keys: bool,
    codec: CompressionType,
    base_offset: int,
    data: st.DataObject,
) -> None:
    count = len(values)
    keys = data.draw(st.lists(record_values, min_size=count, max_size=count)) if with_keys else None
    timestamps = data.draw(
        st.lists(st.integers(0, 2**50), min_size=count, max_size=count) | st.none()
    )
    deltas = data.draw(st.lists(st.integers(0, 50), min_size=count, max_size=count) | st.none())
    offset_deltas = None
    if deltas is not None:
        offset_deltas = [sum(deltas[: i + 1]) + i for i in range(count)]
    encoded = bytearray(
        records.encode_batch(
            values,
            keys=keys,
            timestamps=timestamps,
            base_timestamp=123,
            offset_deltas=offset_deltas,
            codec=codec,
        )
    )
    records.set_base_offset(encoded, 0, base_offset)
    header = records.validate_batch(encoded)  # the CRC survives the patch
    assert header.compression == codec
    (batch,) = records.decode_batches(encoded)
    assert batch.values == values
    assert batch.keys == (keys if keys is not None else [None] * count)
    assert batch.timestamps == (timestamps if timestamps is not None else [123] * count)
    expected_deltas = offset_deltas if offset_deltas is not None else list(range(count))
    assert batch.offsets == [base_offset + d for d in expected_deltas]
    assert header.last_offset == batch.offsets[-1]


def test_builder_matches_encode_batch() -> None:
    builder = records.BatchBuilder()
    for i in range(10):
        builder.append(f"value-{i}".encode(), key=b"k" if i % 2 else None, timestamp_ms=1000 + i)
    (batch,) = records.decode_batches(builder.build())
    assert batch.values == [f"value-{i}".encode() for i in range(10)]
    assert batch.keys == [b"k" if i % 2 else None for i in range(10)]
    assert batch.timestamps == [1000 + i for i in range(10)]


def test_log_append_time_recomputes_the_crc() -> None:
    encoded = bytearray(records.encode_batch([b"a", b"b"], timestamps=[5, 6]))
    records.set_log_append_time(encoded, 0, 99_000)
    header = records.validate_batch(encoded)
    assert header.timestamp_type == records.LOG_APPEND_TIME
    (batch,) = records.decode_batches(encoded)
    assert batch.timestamps == [99_000, 99_000]


def test_batch_boundaries_trims_to_whole_batches() -> None:
    one = records.encode_batch([b"x" * 10])
    two = records.encode_batch([b"y" * 20])
    both = one + two
    assert records.batch_boundaries(both) == len(both)
    assert records.batch_boundaries(both, limit=len(both) - 1) == len(one)
    assert records.batch_boundaries(both[: len(one) + 5]) == len(one)


def test_rejections_name_the_problem() -> None:
    good = records.encode_batch([b"value"])
    with pytest.raises(InvalidRecordError, match="truncated batch"):
        records.validate_batch(good[:-1])
    with pytest.raises(InvalidRecordError, match="truncated batch"):
        records.validate_batch(good[:20])
    with pytest.raises(MessageTooLargeError, match=r"max\.message\.bytes=10"):
        records.validate_batch(good, max_batch_bytes=10)
    corrupt = bytearray(good)
    corrupt[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
        records.validate_batch(corrupt)
    bad_magic = bytearray(good)
    bad_magic[16] = 7
    with pytest.raises(InvalidRecordError, match="magic 7"):
        records.validate_batch(bad_magic)
    with pytest.raises(InvalidRecordError, match="empty"):
        list(records.iter_batches(b""))


def test_malformed_body_is_an_error_not_a_crash() -> None:
    header = records.read_header(records.encode_batch([b"abc"]))
    with pytest.raises(InvalidRecordError):
        records.decode_body(header, b"\x00\x01")
