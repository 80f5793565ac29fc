"""Helpers for the storage tests: encoded batches, appends, full reads."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.records import encode_batch, iter_batches, set_base_offset
from tidelog_broker.storage import PartitionLog
from tidelog_broker.storage.segment import AppendedBatch, LogSegment

TOPIC = "orders.eu-west"
PARTITION = 3

#: The `open_log` fixture: LogConfig fields as keywords -> an open log.
OpenLog = Callable[..., PartitionLog]


def make_batch(
    record_count: int = 1, value_bytes: int = 10, timestamp_ms: int = 1_000, tag: int = 0
) -> bytearray:
    """One encoded batch (base offset 0) whose values identify it by `tag`."""
    value = (tag.to_bytes(4, "big") * (value_bytes // 4 + 1))[:value_bytes]
    return bytearray(encode_batch([value] * record_count, base_timestamp=timestamp_ms))


def append(log: PartitionLog, batch: bytes | bytearray) -> tuple[int, bytes]:
    """Append a copy of `batch`; return its first offset and the bytes as stored."""
    records = bytearray(batch)
    info = log.append(records, list(iter_batches(records)))
    return info.first_offset, bytes(records)


def read_all(log: PartitionLog, max_bytes: int = 1 << 20) -> bytes:
    """Every byte of the log from its start, following next_offset."""
    out = bytearray()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes)
        assert result.records, f"no progress at offset {offset}"
        out += result.records
        offset = result.next_offset
    return bytes(out)


def crash(log: PartitionLog) -> None:
    """Drop a log as a crash would: files closed, nothing flushed, no marker."""
    for segment in log.segments:
        segment.close()


def append_to_segment(
    segment: LogSegment, batches: list[bytearray], interval_bytes: int = 0
) -> bytes:
    """Append batches to a segment in one write with dense offsets; return
    the bytes as stored."""
    records = bytearray(b"".join(batches))
    placed = []
    offset = segment.next_offset
    for position, header in iter_batches(records):
        set_base_offset(records, position, offset)
        placed.append(
            AppendedBatch(position, offset, offset + header.last_offset_delta, header.max_timestamp)
        )
        offset += header.last_offset_delta + 1
    segment.append(records, placed, interval_bytes, now_ms=0)
    return bytes(records)
