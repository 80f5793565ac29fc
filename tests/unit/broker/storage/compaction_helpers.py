"""Helpers for the retention and compaction tests: keyed records, cleaning
rounds run inline (the broker runs them in a worker thread), full reads."""

from __future__ import annotations

from tidelog.records import decode_batches, encode_batch, iter_batches
from tidelog_broker.storage import PartitionLog, cleaner
from tidelog_broker.storage.partition_log import unlink_files


def put(log: PartitionLog, key: bytes, value: bytes | None, timestamp_ms: int) -> int:
    """Append one keyed record (value None: a tombstone); return its offset."""
    records = bytearray(encode_batch([value], keys=[key], base_timestamp=timestamp_ms))
    return log.append(records, list(iter_batches(records))).first_offset


def put_many(log: PartitionLog, items: list[tuple[bytes, bytes | None]], timestamp_ms: int) -> int:
    """Append records as one batch; return the first offset."""
    records = bytearray(
        encode_batch([v for _, v in items], keys=[k for k, _ in items], base_timestamp=timestamp_ms)
    )
    return log.append(records, list(iter_batches(records))).first_offset


def clean(
    log: PartitionLog, max_map_entries: int = 1_000_000, force: bool = True
) -> cleaner.CleanResult | None:
    """One cleaning round, inline: plan, clean, swap, unlink."""
    plan = log.plan_cleaning(max_map_entries, force=force)
    if plan is None:
        return None
    result = None
    try:
        result = cleaner.clean(plan)
    finally:
        unlink_files(log.finish_cleaning(result))
    return result


def read_records(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record from the log start."""
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        if not result.records:
            break
        for batch in decode_batches(result.records):
            out.extend(
                (o, k, v, t)
                for o, k, v, t in zip(
                    batch.offsets, batch.keys, batch.values, batch.timestamps, strict=True
                )
                if o >= offset
            )
        offset = result.next_offset
    return out
