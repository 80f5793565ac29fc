"""What the broker checks and changes inside produced batches.

Every produced batch is checked (`validated_batches`): header, CRC32C, dense
offsets, and a body that decodes into exactly what the header claims, a
compressed one within max.message.bytes uncompressed. That check reads the
body's length columns as arrays and never builds a record, so the broker
still moves bytes without decoding records (ARCHITECTURE invariant 1),
with exactly two exceptions, both opt-in per topic and both here:

- `compression.type` other than `producer`: a batch whose codec differs is
  decoded and re-encoded with the topic's codec, keeping offsets, timestamps,
  keys, values, headers and the producer fields. Batches already in the
  topic's codec are untouched.
- a compacted topic (`cleanup.policy` with compact) refuses records without a
  key, as Kafka does: compaction keeps the latest record per key, and a
  keyless record has none.

Pure functions on bytes; thread-safe.
"""

from __future__ import annotations

from tidelog.compression import CompressionType
from tidelog.errors import InvalidRecordError
from tidelog.records import (
    HEADER_SIZE,
    BatchHeader,
    check_body,
    decode_body,
    encode_batch,
    iter_batches,
)

Batches = list[tuple[int, BatchHeader]]


def validated_batches(buf: bytes | bytearray, max_message_bytes: int) -> Batches:
    """Every batch of one partition's produce, checked before anything is
    written: a batch a consumer cannot decode is never stored.

    Offsets must be dense (last_offset_delta == record_count - 1, as Kafka
    requires of producers: only the cleaner leaves gaps), and a body must
    decode within `max_message_bytes` uncompressed. Raises
    InvalidRecordError, CorruptRecordError or MessageTooLargeError naming
    the batch and the field or limit.
    """
    view = memoryview(buf)
    batches: Batches = []
    for index, (position, header) in enumerate(iter_batches(buf, max_message_bytes)):
        if header.last_offset_delta != header.record_count - 1:
            raise InvalidRecordError(
                f"batch {index}: last_offset_delta {header.last_offset_delta} does not match "
                f"record_count {header.record_count}: a produced batch's offsets are dense "
                "(last_offset_delta = record_count - 1)"
            )
        try:
            check_body(
                header, view[position + HEADER_SIZE : position + header.size], max_message_bytes
            )
        except InvalidRecordError as exc:
            raise InvalidRecordError(f"batch {index}: {exc.message}") from exc
        batches.append((position, header))
    return batches


def needs_recompression(batches: Batches, codec: CompressionType) -> bool:
    """Whether any batch is in another codec than `codec` (headers only)."""
    return any(header.compression != codec for _, header in batches)


def recompress(buf: bytes | bytearray, batches: Batches, codec: CompressionType) -> bytearray:
    """The batches re-encoded with `codec` (those already in it copied)."""
    out = bytearray()
    for position, header in batches:
        raw = buf[position : position + header.size]
        if header.compression == codec:
            out += raw
            continue
        batch = decode_body(header, bytes(raw[HEADER_SIZE:]))
        timestamps = batch.timestamps
        dense = batch.offsets == list(
            range(header.base_offset, header.base_offset + header.record_count)
        )
        out += encode_batch(
            batch.values,
            keys=batch.keys,
            timestamps=timestamps if min(timestamps) != max(timestamps) else None,
            base_timestamp=timestamps[0] if timestamps else header.base_timestamp,
            headers=batch.headers or None,
            offset_deltas=None if dense else [o - header.base_offset for o in batch.offsets],
            codec=codec,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            base_offset=header.base_offset,
            partition_leader_epoch=header.partition_leader_epoch,
            timestamp_type=header.timestamp_type,
        )
    return out


def reject_null_keys(buf: bytes | bytearray, batches: Batches, topic: str) -> None:
    """Raise InvalidRecordError if any record has no key (compacted topics)."""
    for position, header in batches:
        batch = decode_body(header, bytes(buf[position + HEADER_SIZE : position + header.size]))
        if None in batch.keys:
            raise InvalidRecordError(
                f"compacted topic cannot accept message without key: {topic} has "
                "cleanup.policy with compact, which keeps the latest record per key"
            )
