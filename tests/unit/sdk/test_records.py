"""The record batch codec (tidelog.records): round trips, the golden vector
that other-language clients check against, and every rejection."""

from __future__ import annotations

import random
import struct

import crc32c
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog import records
from tidelog.compression import CompressionType, compress, decompress
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


# --------------------------------------------------------------------------- bodies
# A broker checks that each produced body decodes into exactly what the header
# claims (issue 16 items 3 and 4), and decompression is bounded (item 8).


def forge(
    body: bytes,
    *,
    record_count: int,
    last_offset_delta: int,
    codec: int = 0,
) -> bytes:
    """A batch with any header counts and body, and a valid CRC32C: what a
    hostile client can send."""
    tail = struct.pack(">hiqqqhii", codec, last_offset_delta, 0, 0, -1, -1, -1, record_count)
    tail += body
    crc = crc32c.crc32c(tail)
    return struct.pack(">qiibI", 0, 4 + 1 + 4 + len(tail), -1, records.MAGIC, crc) + tail


def body_of(batch: bytes) -> bytes:
    return batch[records.HEADER_SIZE :]


def check(batch: bytes, limit: int = 1 << 20) -> int:
    header = records.validate_batch(batch)
    return records.check_body(header, body_of(batch), limit)


def test_check_body_accepts_what_the_encoder_writes() -> None:
    for codec in CompressionType:
        batch = records.encode_batch(
            [b"v1", None, b"v3"],
            keys=[b"k", None, b"kk"],
            timestamps=[1, 5, 3],
            headers=[[("h", b"x"), ("n", None)], None, []],
            offset_deltas=[0, 4, 9],
            codec=codec,
        )
        assert check(batch) > 0


def test_a_claimed_count_the_body_cannot_hold_is_refused_before_any_allocation() -> None:
    # The 72-byte batch claiming 2^31-1 records: refused from the
    # body's size, before a list of 2^31 offsets could be built.
    one = body_of(records.encode_batch([b"xy"]))
    forged = forge(one, record_count=2**31 - 1, last_offset_delta=2**31 - 2)
    assert len(forged) == 72
    header = records.validate_batch(forged)
    with pytest.raises(InvalidRecordError, match=r"record_count 2147483647 does not fit"):
        records.check_body(header, body_of(forged))
    with pytest.raises(InvalidRecordError, match="record_count 2147483647"):
        records.decode_body(header, body_of(forged))
    with pytest.raises(InvalidRecordError, match="record_count 2147483647"):
        list(records.decode_batches(forged))


def test_offsets_must_agree_with_the_count_and_the_deltas() -> None:
    one = body_of(records.encode_batch([b"x"]))
    # Dense body (no delta column): last_offset_delta must be record_count - 1.
    with pytest.raises(
        InvalidRecordError, match=r"last_offset_delta 2147483647 with record_count 1"
    ):
        check(forge(one, record_count=1, last_offset_delta=2**31 - 1))
    sparse = body_of(records.encode_batch([b"a", b"b"], offset_deltas=[0, 7]))
    with pytest.raises(
        InvalidRecordError, match=r"last_offset_delta 9 but the body's last offset delta is 7"
    ):
        check(forge(sparse, record_count=2, last_offset_delta=9))
    backwards = body_of(records.encode_batch([b"a", b"b"], offset_deltas=[7, 7]))
    with pytest.raises(InvalidRecordError, match="do not strictly increase"):
        check(forge(backwards, record_count=2, last_offset_delta=7))


def test_length_columns_must_add_up_to_the_body() -> None:
    body = bytearray(body_of(records.encode_batch([b"abc", b"de"])))
    # flags, two key lengths (-1), two value lengths: make the second claim 9.
    struct.pack_into("<i", body, 1 + 8 + 4, 9)
    with pytest.raises(InvalidRecordError, match="add up to 12 bytes, the body holds 5"):
        check(forge(bytes(body), record_count=2, last_offset_delta=1))
    struct.pack_into("<i", body, 1 + 8 + 4, -5)
    with pytest.raises(InvalidRecordError, match="a value length is -5"):
        check(forge(bytes(body), record_count=2, last_offset_delta=1))
    with pytest.raises(InvalidRecordError, match="unknown body flags 0x80"):
        check(forge(b"\x80" + bytes(body[1:]), record_count=2, last_offset_delta=1))


def test_a_header_block_must_hold_what_it_declares() -> None:
    good = records.encode_batch([b"v"], headers=[[("h", b"x")]])
    header = records.validate_batch(good)
    block_at = len(good) - len(records._encode_headers([("h", b"x")]))
    bad_key = bytearray(body_of(good))
    bad_key[block_at - records.HEADER_SIZE + 4] = 0xFF  # the key "h" -> invalid UTF-8
    with pytest.raises(InvalidRecordError, match="header block"):
        check(forge(bytes(bad_key), record_count=1, last_offset_delta=0))
    # The consumer's decoder fails the same way, as a typed error.
    with pytest.raises(InvalidRecordError):
        records.decode_body(header, bytes(bad_key))


#: The header blocks of `lying_header_block`'s batch: the first record's.
_BLOCK_HEADERS = [("k", b"v"), ("k2", b"w")]


def lying_header_block(lie: str, base_offset: int = 0) -> bytes:
    """Two records, the first with a header block that is well formed but
    lies (CRC recomputed: what a lying broker can serve): "too_few" counts
    one header where two are, "value_past_end" makes the last value's length
    run past the block."""
    batch = bytearray(
        records.encode_batch([b"c", b"d"], headers=[_BLOCK_HEADERS, None], base_offset=base_offset)
    )
    # Header blocks are the body's tail; the second record has none.
    block_at = len(batch) - len(records._encode_headers(_BLOCK_HEADERS))
    if lie == "too_few":
        struct.pack_into("<H", batch, block_at, 1)
    else:
        value_length_at = len(batch) - 1 - 4  # before the last value, b"w"
        struct.pack_into("<i", batch, value_length_at, 6)
    crc = crc32c.crc32c(bytes(batch[records.CRC_START :]))
    struct.pack_into(">I", batch, 17, crc)
    return bytes(batch)


#: What check_body says of each lie, and so what the decoders must say.
HEADER_BLOCK_LIES = {
    "too_few": "malformed record header block: 19 bytes declared, its headers take 10",
    "value_past_end": "malformed record header block: 19 bytes declared, its headers take 24",
}


@pytest.mark.parametrize("lie", list(HEADER_BLOCK_LIES))
def test_a_header_block_that_miscounts_is_refused_by_check_body_and_the_decoders(
    lie: str,
) -> None:
    """The broker refuses such a block at produce time; a consumer's
    decoders refuse a stored one (served by a lying broker) with the same
    message instead of dropping or cutting headers silently."""
    batch = lying_header_block(lie)
    header = records.validate_batch(batch)
    with pytest.raises(InvalidRecordError) as refused:
        check(batch)
    assert refused.value.message == HEADER_BLOCK_LIES[lie]
    with pytest.raises(InvalidRecordError) as decoded:
        records.decode_body(header, body_of(batch))
    assert decoded.value.message == HEADER_BLOCK_LIES[lie]


@pytest.mark.parametrize("codec", [c for c in CompressionType if c != CompressionType.NONE])
def test_a_codec_flag_on_a_raw_body_is_refused(codec: CompressionType) -> None:
    raw = body_of(records.encode_batch([b"plain", b"bytes"]))
    with pytest.raises(InvalidRecordError, match=f"cannot decompress a {codec.name.lower()}"):
        check(forge(raw, record_count=2, last_offset_delta=1, codec=codec))


def test_random_body_bytes_with_a_valid_crc_are_refused() -> None:
    rng = random.Random(16)
    for _ in range(200):
        body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
        count = rng.randrange(1, 5)
        with pytest.raises(InvalidRecordError):
            check(forge(body, record_count=count, last_offset_delta=count - 1))


@pytest.mark.parametrize("codec", [c for c in CompressionType if c != CompressionType.NONE])
def test_decompression_is_bounded_while_decompressing(codec: CompressionType) -> None:
    # 64 MiB of zeros compresses to a few KB: a bomb. The limit stops it with
    # an error naming the limit (and max.message.bytes).
    bomb_body = b"\x00" * (64 << 20)
    small = compress(codec, bomb_body)
    assert len(small) < 4 << 20
    with pytest.raises(MessageTooLargeError, match=r"more than 1048576 bytes.*max\.message\.bytes"):
        decompress(codec, small, 1 << 20)
    batch = forge(small, record_count=1, last_offset_delta=0, codec=codec)
    header = records.validate_batch(batch)
    with pytest.raises(MessageTooLargeError, match="more than 1048576 bytes"):
        records.check_body(header, body_of(batch), 1 << 20)
    with pytest.raises(MessageTooLargeError, match="more than 1048576 bytes"):
        records.decode_body(header, body_of(batch), 1 << 20)


def test_zstd_without_a_declared_size_is_measured_within_the_limit() -> None:
    body = body_of(records.encode_batch([b"v" * 5000]))
    framed = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    assert decompress(CompressionType.ZSTD, framed, len(body)) == body
    with pytest.raises(MessageTooLargeError, match=f"more than {len(body) - 1} bytes"):
        decompress(CompressionType.ZSTD, framed, len(body) - 1)
