"""records.first_record_at_or_after, the broker's ListOffsets by timestamp
within one batch: it finds what searching decode_body's offsets and
timestamps finds, refuses what decode_body refuses with the same error
type, and its timestamp search (tidelog._crecords or its Python twin)
gives the same index either way."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import struct
from array import array

import pytest
from tidelog import records
from tidelog.compression import CODEC_MASK, CompressionType, compress, require_available
from tidelog.errors import InvalidRecordError, TidelogError, UnsupportedCodecError
from tidelog.records import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    BatchHeader,
    decode_body,
    encode_batch,
    first_record_at_or_after,
    read_header,
)

from tests.unit.sdk.test_records import HEADER_BLOCK_LIES, lying_header_block

pytestmark = pytest.mark.timeout(60)

SEARCHES = {"python": records._first_at_or_after_py, "c": records._first_at_or_after_c}


def _codecs() -> list[CompressionType]:
    out = []
    for codec in CompressionType:
        with contextlib.suppress(UnsupportedCodecError):
            out.append(require_available(codec))
    return out


CODECS = _codecs()


@pytest.fixture(params=list(SEARCHES))
def search(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with the C search and with the Python one."""
    if request.param == "c" and records._crecords is None:
        pytest.skip("tidelog._crecords is not built (no C compiler at install)")
    monkeypatch.setattr(records, "_first_at_or_after", SEARCHES[request.param])
    return str(request.param)


def decoded_answer(header: BatchHeader, body: bytes, timestamp_ms: int) -> tuple[int, int] | None:
    """What the broker answered before: decode every record, take the first
    whose timestamp reaches the target."""
    return first_decoded(decode_body(header, body), timestamp_ms)


def first_decoded(batch: records.DecodedBatch, timestamp_ms: int) -> tuple[int, int] | None:
    for offset, timestamp in zip(batch.offsets, batch.timestamps, strict=True):
        if timestamp >= timestamp_ms:
            return offset, timestamp
    return None


def outcome(fn: object, *args: object) -> object:
    """The answer, or the type of the error raised (the answer to compare)."""
    try:
        return fn(*args)  # type: ignore[operator]
    except TidelogError as exc:
        return type(exc)


def _payload(rng: random.Random) -> bytes | None:
    if rng.random() < 0.1:
        return None
    return rng.randbytes(rng.choice([0, 1, 10, 100]))


def random_batch(rng: random.Random) -> tuple[BatchHeader, bytes]:
    """One batch of any kind the format allows: timestamps out of order (or
    one for all, or LogAppendTime), sparse offsets, nulls, headers, a codec,
    idempotent producer fields. Returns its header and its body as stored."""
    count = rng.choice([1, 2, rng.randint(3, 50), rng.randint(50, 2_000)])
    base = rng.randint(0, 2**41)
    spread = rng.choice([0, 1, 5, 10_000])
    timestamps = None
    if rng.random() < 0.8:
        timestamps = [base + rng.randint(-spread, spread) for _ in range(count)]
    deltas = sorted(rng.sample(range(count * 3), count)) if rng.random() < 0.3 else None
    headers = None
    if rng.random() < 0.3:
        headers = [[("h", b"v"), ("é", None)] if rng.random() < 0.5 else None for _ in range(count)]
    idempotent = rng.random() < 0.3
    batch = encode_batch(
        [_payload(rng) for _ in range(count)],
        keys=[_payload(rng) for _ in range(count)] if rng.random() < 0.5 else None,
        timestamps=timestamps,
        base_timestamp=base,
        headers=headers,
        offset_deltas=deltas,
        codec=rng.choice(CODECS),
        producer_id=rng.randint(0, 2**40) if idempotent else -1,
        producer_epoch=rng.randint(0, 100) if idempotent else -1,
        base_sequence=rng.randint(0, 2**20) if idempotent else -1,
        base_offset=rng.randint(0, 2**40),
        timestamp_type=LOG_APPEND_TIME if rng.random() < 0.15 else 0,
    )
    return read_header(batch, 0), batch[HEADER_SIZE:]


def targets(rng: random.Random, found: list[int]) -> list[int]:
    """Targets around every kind of answer, given the batch's timestamps:
    records' timestamps and their neighbours, below all, above all, at random."""
    picks = rng.sample(found, min(len(found), 20))
    out = [t + d for t in picks for d in (-1, 0, 1)]
    out += [min(found) - 1, max(found), max(found) + 1, -(2**63), 2**63 - 1]
    out += [rng.randint(min(found) - 10, max(found) + 10) for _ in range(5)]
    return out


def test_it_finds_what_searching_the_decoded_batch_finds(search: str) -> None:
    rng = random.Random(20261128)
    for _ in range(300):
        header, body = random_batch(rng)
        decoded = decode_body(header, body)
        for target in targets(rng, decoded.timestamps):
            assert first_record_at_or_after(header, body, target) == first_decoded(
                decoded, target
            ), (header, target)


def test_the_first_record_reaching_the_target_not_the_nearest(search: str) -> None:
    """CreateTime timestamps need not increase within a batch: the answer is
    the first record in offset order at or above the target, as Kafka's."""
    batch = encode_batch([b"a"] * 5, timestamps=[50, 10, 70, 30, 60], base_offset=100)
    header, body = read_header(batch, 0), batch[HEADER_SIZE:]
    assert first_record_at_or_after(header, body, 20) == (100, 50)
    assert first_record_at_or_after(header, body, 55) == (102, 70)
    assert first_record_at_or_after(header, body, 10) == (100, 50)
    assert first_record_at_or_after(header, body, 71) is None
    sparse = encode_batch([b"a"] * 3, timestamps=[5, 1, 9], offset_deltas=[0, 4, 9])
    header, body = read_header(sparse, 0), sparse[HEADER_SIZE:]
    assert first_record_at_or_after(header, body, 6) == (9, 9)


def test_log_append_time_gives_every_record_the_append_time(search: str) -> None:
    batch = bytearray(encode_batch([b"a"] * 3, timestamps=[5, 1, 9], base_offset=7))
    records.set_log_append_time(batch, 0, 1_000)
    header, body = read_header(batch, 0), bytes(batch[HEADER_SIZE:])
    assert first_record_at_or_after(header, body, 1_000) == (7, 1_000)
    assert first_record_at_or_after(header, body, 1_001) is None


def _lengths_at(header: BatchHeader, body: bytes) -> int:
    """Where the key lengths start in an uncompressed body."""
    flags = body[0]
    return (
        1
        + (4 if flags & 1 else 0) * header.record_count
        + (8 if flags & 2 else 0) * header.record_count
    )


def _plain(count: int = 4, **kwargs: object) -> tuple[BatchHeader, bytes]:
    batch = encode_batch([b"v" * 10] * count, timestamps=list(range(count)), **kwargs)  # type: ignore[arg-type]
    return read_header(batch, 0), batch[HEADER_SIZE:]


def _with_i32(body: bytes, at: int, value: int) -> bytes:
    out = bytearray(body)
    struct.pack_into("<i", out, at, value)
    return bytes(out)


def _lies() -> dict[str, tuple[BatchHeader, bytes]]:
    header, body = _plain()
    lengths = _lengths_at(header, body)
    values = lengths + 4 * header.record_count
    sparse_header, sparse_body = _plain(offset_deltas=[0, 2, 1, 3])
    lies = {
        "record_count past the body": (dataclasses.replace(header, record_count=2**31 - 1), body),
        "record_count zero": (dataclasses.replace(header, record_count=0), body),
        "record_count negative": (dataclasses.replace(header, record_count=-3), body),
        "last_offset_delta past the records": (
            dataclasses.replace(header, last_offset_delta=2**31 - 1),
            body,
        ),
        "a value length past the body": (header, _with_i32(body, values, 2**31 - 1)),
        "a value length short of the body": (header, _with_i32(body, values, 1)),
        "a key length below -1": (header, _with_i32(body, lengths, -7)),
        "a truncated body": (header, body[:-1]),
        "a body cut inside its columns": (header, body[: lengths + 2]),
        "an empty body": (header, b""),
        "unknown body flags": (header, b"\x80" + body[1:]),
        "offset deltas that do not increase": (sparse_header, sparse_body),
        "garbage under a codec": (
            dataclasses.replace(header, attributes=int(CompressionType.GZIP)),
            b"\x1f\x8b not gzip",
        ),
        "an unknown codec": (dataclasses.replace(header, attributes=7), body),
    }
    for codec in CODECS:
        if codec != CompressionType.NONE:
            lies[f"a {codec.name.lower()} body whose value length lies"] = (
                dataclasses.replace(header, attributes=int(codec)),
                compress(codec, _with_i32(body, values, 2**31 - 1)),
            )
    for lie in HEADER_BLOCK_LIES:
        batch = lying_header_block(lie)
        lies[f"a header block: {lie}"] = (read_header(batch, 0), batch[HEADER_SIZE:])
    return lies


LIES = _lies()


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_body_is_refused_as_decode_body_refuses_it(search: str, lie: str) -> None:
    header, body = LIES[lie]
    with pytest.raises(InvalidRecordError) as decoded:
        decode_body(header, body)
    with pytest.raises(type(decoded.value)):
        first_record_at_or_after(header, body, 0)


def uncompressed(header: BatchHeader, body: bytes) -> bytes:
    """The body of a compressed batch, decompressed."""
    return bytes(records.decompress(header.attributes & CODEC_MASK, body))


def test_random_damage_gets_the_answer_or_the_error_decode_body_gets(search: str) -> None:
    """Bytes of the body overwritten and the header's counts changed at
    random: the same answer, or the same error type, as decoding; never an
    exception of another kind."""
    rng = random.Random(11282026)
    for _ in range(400):
        header, body = random_batch(rng)
        if header.attributes & CODEC_MASK:
            # Damaged inside its columns, not its compressed stream.
            body = uncompressed(header, body)
            header = dataclasses.replace(header, attributes=header.attributes & ~CODEC_MASK)
        damaged = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(min(len(damaged), 1 + 24 * header.record_count))
            damaged[at] = rng.randrange(256)
        if rng.random() < 0.3:
            header = dataclasses.replace(
                header, record_count=header.record_count + rng.choice([-1, 1, 1000])
            )
        if rng.random() < 0.2:
            damaged = damaged[: rng.randrange(len(damaged) + 1)]
        target = rng.randint(-(2**41), 2**42)
        expected = outcome(decoded_answer, header, bytes(damaged), target)
        assert outcome(first_record_at_or_after, header, bytes(damaged), target) == expected


def test_the_c_search_and_the_python_one_agree() -> None:
    if records._crecords is None:
        pytest.skip("tidelog._crecords is not built (no C compiler at install)")
    rng = random.Random(7)
    for _ in range(200):
        column = array("q", [rng.randint(-(2**63), 2**63 - 1) for _ in range(rng.randint(0, 30))])
        if column and rng.random() < 0.5:
            column = array("q", [rng.randint(-5, 5) for _ in column])
        for target in [*column, *(t + 1 for t in column), 0, -(2**63), 2**63 - 1, 2**64, -(2**64)]:
            assert records._first_at_or_after_c(column, target) == records._first_at_or_after_py(
                column, target
            )
    with pytest.raises(ValueError, match="whole number"):
        records._crecords.first_at_or_after(b"1234567", 0)
    with pytest.raises(TypeError):
        records._crecords.first_at_or_after(None, 0)
