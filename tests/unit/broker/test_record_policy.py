"""The broker's opt-in looks inside batches (record_policy): compression.type
recompression and keyless records in compacted topics."""

from __future__ import annotations

import pytest
from tidelog.compression import CompressionType
from tidelog.errors import InvalidRecordError
from tidelog.records import decode_batches, encode_batch, iter_batches
from tidelog_broker import record_policy


def _batches(*encoded: bytes) -> tuple[bytearray, list]:
    buf = bytearray(b"".join(encoded))
    return buf, list(iter_batches(buf))


def test_recompress_keeps_every_field_and_copies_matching_batches() -> None:
    plain = encode_batch(
        [b"a", None, b"c"],
        keys=[b"1", b"2", None],
        timestamps=[10, 12, 11],
        headers=[[("h", b"x")], None, [("n", None)]],
        offset_deltas=[0, 2, 5],
        producer_id=9,
        producer_epoch=2,
        base_sequence=40,
    )
    already = encode_batch([b"z"], codec=CompressionType.LZ4)
    buf, batches = _batches(plain, already)
    assert record_policy.needs_recompression(batches, CompressionType.LZ4)
    out = record_policy.recompress(buf, batches, CompressionType.LZ4)
    first, _ = decode_batches(out)
    original = next(decode_batches(plain))
    assert first.header.compression == CompressionType.LZ4
    for field in ("offsets", "timestamps", "keys", "values"):
        assert getattr(first, field) == getattr(original, field)
    assert first.headers == [[("h", b"x")], [], [("n", None)]]
    h = first.header
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (9, 2, 40, 3)
    assert h.last_offset_delta == 5
    assert bytes(out[len(out) - len(already) :]) == already
    _, lz4_only = _batches(already)
    assert not record_policy.needs_recompression(lz4_only, CompressionType.LZ4)


def test_keyless_records_are_refused() -> None:
    buf, batches = _batches(
        encode_batch([b"v"], keys=[b"k"]), encode_batch([b"v", b"w"], keys=[b"k", None])
    )
    with pytest.raises(InvalidRecordError, match="cannot accept message without key"):
        record_policy.reject_null_keys(buf, batches, "t")
    buf, batches = _batches(encode_batch([b"v"], keys=[b"k"], codec=CompressionType.GZIP))
    record_policy.reject_null_keys(buf, batches, "t")
