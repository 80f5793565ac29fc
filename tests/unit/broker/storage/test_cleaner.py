"""Compaction: the cleaner keeps the latest record per key in closed segments,
keeps offsets and order, removes tombstones after delete.retention.ms,
honours the dirty ratio, the compaction lag and the offset-map bound, and a
crash at any step of the swap loses nothing and duplicates nothing. On a
ManualClock, cleaning inline (the broker runs it in a worker thread)."""

from __future__ import annotations

import os
import shutil
import struct
import tracemalloc
from pathlib import Path

import crc32c
import pytest
from tidelog.errors import InvalidRecordError
from tidelog.records import HEADER_SIZE, MAGIC, decode_batches, encode_batch, iter_batches
from tidelog_broker.storage import ManualClock, PartitionLog, cleaner
from tidelog_broker.storage.partition_log import unlink_files

from tests.unit.broker.storage.compaction_helpers import clean, put, put_many, read_records
from tests.unit.broker.storage.storage_helpers import OpenLog, crash

DAY_MS = 86_400_000
COMPACT = {"segment_bytes": 1024, "cleanup_policy": "compact", "min_cleanable_dirty_ratio": 0.0}


def _latest(log: PartitionLog) -> dict[bytes, tuple[int, bytes | None]]:
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value, _ in read_records(log):
        assert key is not None
        out[key] = (offset, value)
    return out


def test_keeps_latest_per_key_with_offsets_and_order(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(**COMPACT)
    expected: dict[bytes, tuple[int, bytes]] = {}
    for i in range(400):
        key = b"k%d" % (i % 13)
        value = b"v%d" % i
        expected[key] = (put(log, key, value, clock.time_ms()), value)
    before = log.log_bytes
    result = clean(log)
    assert result is not None and result.records_removed > 300
    records = read_records(log)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets))  # strictly increasing
    assert _latest(log) == expected
    # Closed segments hold each key at most once; only the active one may repeat.
    active_base = log.segments[-1].base_offset
    closed_keys = [r[1] for r in records if r[0] < active_base]
    assert len(closed_keys) == len(set(closed_keys))
    assert log.log_bytes < before / 5
    assert log.log_end_offset == 400
    # Every surviving offset reads back from its own position.
    for offset, key, value, _ in records:
        first = next(decode_batches(log.read(offset, 1).records))
        assert (key, value) in zip(first.keys, first.values, strict=True)


def test_active_segment_is_never_touched(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(**{**COMPACT, "segment_bytes": 1 << 20})
    for i in range(50):
        put(log, b"same", b"v%d" % i, clock.time_ms())
    assert log.segment_count == 1
    assert clean(log) is None
    assert len(read_records(log)) == 50


def test_tombstones_go_after_delete_retention(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(**COMPACT, delete_retention_ms=DAY_MS)
    for i in range(30):
        put(log, b"k%d" % i, b"v", clock.time_ms())
    for i in range(0, 30, 2):
        put(log, b"k%d" % i, None, clock.time_ms())  # delete the even keys
    for _ in range(40):
        put(log, b"filler", b"x" * 50, clock.time_ms())  # push tombstones out of the active
    clean(log)
    latest = _latest(log)
    # The deletes are still visible: a consumer has a day to see them.
    assert all(latest[b"k%d" % i][1] is None for i in range(0, 30, 2))
    assert all(latest[b"k%d" % i][1] == b"v" for i in range(1, 30, 2))
    clock.advance(DAY_MS + 1)
    # Cleaning is driven by new dirt (as in Kafka): tombstones expire in the
    # next round that runs after their horizon.
    for _ in range(40):
        put(log, b"filler", b"y" * 50, clock.time_ms())
    clean(log)
    latest = _latest(log)
    assert not any(b"k%d" % i in latest for i in range(0, 30, 2))
    assert all(latest[b"k%d" % i][1] == b"v" for i in range(1, 30, 2))


def test_dirty_ratio_and_compaction_lag(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log(**{**COMPACT, "min_cleanable_dirty_ratio": 0.5})
    for i in range(400):
        put(log, b"k%d" % (i % 200), b"v%d" % i, clock.time_ms())
    assert clean(log, force=False) is not None  # all dirty: ratio 1.0
    # A little new dirt over a clean log: below the ratio, nothing to do.
    for i in range(30):
        put(log, b"k%d" % (i % 5), b"w%d" % i, clock.time_ms())
    assert log.segments[-1].base_offset > log.clean_offset  # some dirt is closed
    assert log.plan_cleaning(1000, force=False) is None
    assert clean(log, force=True) is not None
    # min.compaction.lag.ms: records younger than the lag are not cleanable.
    log.update_config(log.config.__class__(**{**COMPACT, "min_compaction_lag_ms": 60_000}))
    for i in range(100):
        put(log, b"k%d" % (i % 5), b"x%d" % i, clock.time_ms())
    assert log.plan_cleaning(1000, force=True) is None
    clock.advance(60_001)
    put(log, b"k0", b"after", clock.time_ms())
    assert clean(log) is not None


def test_offset_map_bound_cleans_what_fits_and_continues(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(**COMPACT)
    for i in range(300):
        put(log, b"k%d" % (i % 100), b"v%d" % i, clock.time_ms())
    result = clean(log, max_map_entries=40)
    assert result is not None
    assert 0 < result.clean_offset < log.segments[-1].base_offset
    assert result.map_entries <= 40
    rounds = 1
    while (result := clean(log, max_map_entries=40)) is not None:
        rounds += 1
    assert rounds > 3
    latest = _latest(log)
    assert latest == {b"k%d" % k: (200 + k, b"v%d" % (200 + k)) for k in range(100)}


def test_compressed_batches_and_multi_record_batches(open_log: OpenLog, clock: ManualClock) -> None:
    from tidelog.compression import CompressionType
    from tidelog.records import encode_batch, iter_batches

    log = open_log(**COMPACT)
    for round_ in range(20):
        records = bytearray(
            encode_batch(
                [b"r%d-%d" % (round_, i) for i in range(10)],
                keys=[b"k%d" % ((round_ * 3 + i) % 17) for i in range(10)],
                base_timestamp=clock.time_ms(),
                codec=CompressionType.ZSTD,
            )
        )
        log.append(records, list(iter_batches(records)))
    expected = {}
    for offset, key, value, _ in read_records(log):
        expected[key] = (offset, value)
    clean(log)
    assert _latest(log) == expected
    for batch in decode_batches(log.read(0, 1 << 20).records):
        assert batch.header.compression == CompressionType.ZSTD


def test_keyless_records_are_kept(open_log: OpenLog, clock: ManualClock) -> None:
    from tidelog.records import encode_batch, iter_batches

    log = open_log(**COMPACT)
    for i in range(60):
        records = bytearray(encode_batch([b"n%d" % i], base_timestamp=clock.time_ms()))
        log.append(records, list(iter_batches(records)))
    clean(log)
    assert len(read_records(log)) == 60


def _cleaned_log(open_log: OpenLog, clock: ManualClock) -> tuple[PartitionLog, dict]:
    log = open_log(**COMPACT)
    for i in range(300):
        put(log, b"k%d" % (i % 7), b"v%d" % i, clock.time_ms())
    expected = {}
    for offset, key, value, _ in read_records(log):
        expected[key] = (offset, value)
    return log, expected


@pytest.mark.parametrize("stop_after", ["cleaned", "checkpoint", "swap", "half_replaced"])
def test_crash_during_swap_loses_and_duplicates_nothing(
    open_log: OpenLog, clock: ManualClock, log_dir: Path, stop_after: str
) -> None:
    """Replays the swap steps by hand up to a point, then reopens as after a crash."""
    from tidelog_broker.storage import checkpoints, files
    from tidelog_broker.storage import cleaning_swap as swap

    log, expected = _cleaned_log(open_log, clock)
    all_offsets = {r[0] for r in read_records(log)}
    plan = log.plan_cleaning(1_000_000, force=True)
    assert plan is not None
    result = cleaner.clean(plan)
    assert result is not None and len(result.groups) > 2
    crash(log)
    if stop_after != "cleaned":
        checkpoints.write_cleaner_checkpoint(log_dir, 0, result.clean_offset)
    if stop_after in ("swap", "half_replaced"):
        for group in result.groups:
            for path in reversed(swap.cleaned_paths(log_dir, group.base_offset)):
                os.replace(path, swap.with_suffix(path, files.CLEANED_SUFFIX, files.SWAP_SUFFIX))
    if stop_after == "half_replaced":
        # The first group fully replaced, the second with its extra segments
        # gone and its index files swapped but not its .log.
        for index, group in enumerate(result.groups[:2]):
            for base in group.replaces[1:]:
                files.delete_segment_files(log_dir, base)
            swaps = swap.swap_paths(log_dir, group.base_offset)
            for path in swaps if index == 0 else swaps[:2]:
                os.replace(path, swap.with_suffix(path, files.SWAP_SUFFIX, ""))
    reopened = PartitionLog.open(log_dir, log.topic, log.partition, log.config, clock)
    records = read_records(reopened)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets))
    assert set(offsets) <= all_offsets
    assert _latest(reopened) == expected
    assert reopened.log_end_offset == 300
    leftovers = [
        n for n in os.listdir(log_dir) if n.endswith((".cleaned", ".swap", ".deleted", ".tmp"))
    ]
    assert leftovers == []
    # The reopened log cleans and reopens again without complaint.
    clean(reopened)
    assert _latest(reopened) == expected
    reopened.close()
    final = PartitionLog.open(log_dir, log.topic, log.partition, log.config, clock)
    assert _latest(final) == expected
    for segment in final.segments:
        segment.close()


def test_gaps_are_allowed_below_the_gap_limit_only(
    open_log: OpenLog, clock: ManualClock, log_dir: Path, tmp_path: Path
) -> None:
    """A compacted log reopens whole (gaps are expected there); the same
    files without the cleaner checkpoint read as damage, as dense logs must."""
    log, expected = _cleaned_log(open_log, clock)
    clean(log)
    crash(log)
    copy = tmp_path / "copy" / log_dir.name
    shutil.copytree(log_dir, copy)
    reopened = PartitionLog.open(log_dir, log.topic, log.partition, log.config, clock)
    assert _latest(reopened) == expected
    for segment in reopened.segments:
        segment.close()
    (copy / "cleaner-checkpoint").unlink()
    damaged = PartitionLog.open(copy, log.topic, log.partition, log.config, clock)
    assert damaged.log_end_offset < 300  # the gap was treated as a lost tail
    for segment in damaged.segments:
        segment.close()


def test_retention_during_cleaning_discards_the_round(
    open_log: OpenLog, clock: ManualClock, log_dir: Path
) -> None:
    log = open_log(**{**COMPACT, "cleanup_policy": "compact,delete", "retention_ms": DAY_MS})
    for i in range(200):
        put_many(log, [(b"k%d" % (i % 9), b"v%d" % i)], clock.time_ms())
    plan = log.plan_cleaning(1_000_000, force=True)
    assert plan is not None
    result = cleaner.clean(plan)
    clock.advance(DAY_MS + 1)
    put(log, b"k0", b"new", clock.time_ms())
    unlink_files(log.delete_old_segments())
    assert log.segment_count == 1
    unlink_files(log.finish_cleaning(result))  # stale: discarded, not swapped in
    records = read_records(log)
    assert records[-1][2] == b"new"
    assert [r[0] for r in records] == list(range(log.log_start_offset, 201))
    assert not [n for n in os.listdir(log_dir) if ".cleaned" in n or ".swap" in n]


def test_a_stored_batch_claiming_more_records_than_it_holds_costs_no_memory(
    open_log: OpenLog, clock: ManualClock
) -> None:
    # Issue 16 item 3: a batch stored before brokers checked bodies claims
    # 20M records in a one-record body. The cleaner refuses it from the
    # body's size, without allocating for the claim (it took ~1 GB).
    log = open_log(**COMPACT)
    body = encode_batch([b"v"], keys=[b"k"])[HEADER_SIZE:]
    tail = struct.pack(">hiqqqhii", 0, 20_000_000 - 1, 0, 0, -1, -1, -1, 20_000_000) + body
    forged = bytearray(
        struct.pack(">qiibI", 0, 9 + len(tail), -1, MAGIC, crc32c.crc32c(tail)) + tail
    )
    log.append(forged, list(iter_batches(forged)))  # the storage layer trusts its caller
    for i in range(60):
        put(log, b"k%d" % i, b"x" * 40, clock.time_ms())
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRecordError, match="record_count 20000000 does not fit"):
            clean(log, max_map_entries=50_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024, f"cleaning allocated {peak} bytes for a claimed count"
