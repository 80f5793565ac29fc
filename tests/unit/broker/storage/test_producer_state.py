"""Idempotent producer state: sequence rules, duplicates, fencing, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog.errors import (
    InvalidProducerEpochError,
    InvalidRequestError,
    OutOfOrderSequenceError,
)
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.storage import PartitionLog
from tidelog_broker.storage.files import parse_snapshot_file_name
from tidelog_broker.storage.producer_state import (
    SEQUENCE_MAX,
    BatchMetadata,
    increment_sequence,
)

from tests.unit.broker.storage.storage_helpers import OpenLog, crash, read_all

PID = 7


def batch(seq: int, count: int = 2, pid: int = PID, epoch: int = 0) -> bytearray:
    values = [f"{pid}:{epoch}:{seq}:{i}".encode() for i in range(count)]
    return bytearray(
        encode_batch(
            values, base_timestamp=1_000, producer_id=pid, producer_epoch=epoch, base_sequence=seq
        )
    )


def produce(log: PartitionLog, *batches: bytearray) -> tuple[int, int, bool]:
    """Append the batches as one request: (first offset, last offset, duplicate)."""
    records = bytearray(b"".join(batches))
    info = log.append(records, list(iter_batches(records)))
    return info.first_offset, info.last_offset, info.duplicate


def snapshots(directory: Path) -> list[int]:
    return sorted(
        o for o in (parse_snapshot_file_name(p.name) for p in directory.iterdir()) if o is not None
    )


def test_sequence_wraps_like_kafka() -> None:
    assert increment_sequence(5, 1) == 6
    assert increment_sequence(SEQUENCE_MAX, 1) == 0
    assert increment_sequence(SEQUENCE_MAX - 1, 3) == 1


def test_sequences_in_order_append_and_gaps_are_rejected(open_log: OpenLog) -> None:
    log = open_log()
    assert produce(log, batch(0)) == (0, 1, False)
    assert produce(log, batch(2, count=3)) == (2, 4, False)
    with pytest.raises(OutOfOrderSequenceError, match="expected 5"):
        produce(log, batch(6))
    with pytest.raises(OutOfOrderSequenceError, match="unknown producer 8"):
        produce(log, batch(3, pid=8))
    assert log.log_end_offset == 5
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 4


def test_duplicates_answer_the_original_offsets_and_write_nothing(open_log: OpenLog) -> None:
    log = open_log()
    for seq in range(0, 12, 2):
        produce(log, batch(seq))  # six batches: offsets 0-11
    before = read_all(log)
    # The last five batches are remembered, in offsets 2-11.
    assert produce(log, batch(10)) == (10, 11, True)
    assert produce(log, batch(2)) == (2, 3, True)
    assert read_all(log) == before
    # The sixth-newest is forgotten: a retry that old is out of order.
    with pytest.raises(OutOfOrderSequenceError):
        produce(log, batch(0))
    # A batch that overlaps a written one without matching it is out of order.
    with pytest.raises(OutOfOrderSequenceError):
        produce(log, batch(10, count=3))


def test_one_request_validates_all_batches_before_writing(open_log: OpenLog) -> None:
    log = open_log()
    plain = bytearray(encode_batch([b"no producer"], base_timestamp=1))
    assert produce(log, batch(0), plain, batch(2), batch(0, pid=9)) == (0, 6, False)
    with pytest.raises(OutOfOrderSequenceError):
        produce(log, batch(4), batch(7))
    assert log.log_end_offset == 7
    # Repeats of two contiguous batches answer both; mixing repeats and new ones is refused.
    assert produce(log, batch(0, pid=9)) == (5, 6, True)
    with pytest.raises(InvalidRequestError, match="repeats"):
        produce(log, batch(2), batch(4))
    assert log.log_end_offset == 7


def test_contiguous_repeats_in_one_request(open_log: OpenLog) -> None:
    log = open_log()
    assert produce(log, batch(0), batch(2)) == (0, 3, False)
    assert produce(log, batch(0), batch(2)) == (0, 3, True)


def test_epochs_fence_older_producers(open_log: OpenLog) -> None:
    log = open_log()
    produce(log, batch(0, epoch=3))
    with pytest.raises(InvalidProducerEpochError, match="fenced"):
        produce(log, batch(2, epoch=2))
    with pytest.raises(OutOfOrderSequenceError, match="new epoch 4"):
        produce(log, batch(2, epoch=4))
    assert produce(log, batch(0, epoch=4)) == (2, 3, False)
    with pytest.raises(InvalidProducerEpochError):
        produce(log, batch(2, epoch=3))
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.epoch == 4


def test_sequence_wrap_around_in_the_log(open_log: OpenLog) -> None:
    log = open_log()
    # A producer whose earlier batches were deleted by retention (state from
    # a snapshot) continues near the top of the sequence range.
    produce(log, batch(0))
    entry = log.producer_state.entry(PID)
    assert entry is not None
    entry.batches[-1] = BatchMetadata(SEQUENCE_MAX - 3, SEQUENCE_MAX - 2, 0, 1)
    assert produce(log, batch(SEQUENCE_MAX - 1, count=3)) == (2, 4, False)
    assert entry.last_seq == 0  # MAX - 1, MAX, 0
    assert produce(log, batch(SEQUENCE_MAX - 1, count=3)) == (2, 4, True)
    assert produce(log, batch(1)) == (5, 6, False)


def test_state_survives_close_and_reopen(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log(segment_bytes=400)
    for seq in range(0, 20, 2):
        produce(log, batch(seq), batch(seq, pid=11))
    assert log.segment_count > 2
    assert snapshots(log_dir)  # written at each roll
    expected = {pid: vars_of(e) for pid, e in log.producer_state.producers.items()}
    log.close()
    reopened = open_log(segment_bytes=400)
    assert {p: vars_of(e) for p, e in reopened.producer_state.producers.items()} == expected
    assert produce(reopened, batch(18)) == (36, 37, True)
    assert produce(reopened, batch(20))[2] is False


def test_state_is_rebuilt_from_headers_after_a_crash(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log(segment_bytes=400)
    for seq in range(0, 20, 2):
        produce(log, batch(seq))
    expected = vars_of(log.producer_state.entry(PID))
    crash(log)
    # The newest snapshot is torn: it is dropped and an older one used.
    newest = snapshots(log_dir)[-1]
    path = log_dir / f"{newest:020d}.snapshot"
    path.write_bytes(path.read_bytes()[:-3])
    reopened = open_log(segment_bytes=400)
    assert vars_of(reopened.producer_state.entry(PID)) == expected
    assert newest not in snapshots(log_dir)
    # With no snapshot at all, the whole log's headers are read.
    for offset in snapshots(log_dir):
        (log_dir / f"{offset:020d}.snapshot").unlink()
    crash(reopened)
    again = open_log(segment_bytes=400)
    assert vars_of(again.producer_state.entry(PID)) == expected
    assert produce(again, batch(20)) == (20, 21, False)


def test_truncate_forgets_truncated_batches(open_log: OpenLog, log_dir: Path) -> None:
    log = open_log(segment_bytes=300)
    for seq in range(0, 20, 2):
        produce(log, batch(seq))
    log.truncate_to(6)
    assert log.log_end_offset == 6
    assert all(offset <= 6 for offset in snapshots(log_dir))
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 5
    assert produce(log, batch(6)) == (6, 7, False)
    assert produce(log, batch(4)) == (4, 5, True)
    log.truncate_to(0)
    assert log.producer_state.entry(PID) is None
    assert produce(log, batch(0)) == (0, 1, False)


def test_retention_drops_old_snapshots_but_keeps_the_newest(
    open_log: OpenLog, log_dir: Path
) -> None:
    log = open_log(segment_bytes=300, retention_bytes=0)
    for seq in range(0, 20, 2):
        produce(log, batch(seq))
    assert len(snapshots(log_dir)) > 2
    log.delete_old_segments()
    assert log.segment_count == 1
    assert snapshots(log_dir) == [s for s in snapshots(log_dir) if s >= log.log_start_offset]
    assert snapshots(log_dir)
    log.close()
    reopened = open_log(segment_bytes=300, retention_bytes=0)
    # The deleted batches' state lives on in the snapshot.
    assert produce(reopened, batch(18)) == (18, 19, True)
    assert produce(reopened, batch(20)) == (20, 21, False)


def vars_of(entry: object) -> tuple[object, ...]:
    assert entry is not None
    return (entry.producer_id, entry.epoch, list(entry.batches))  # type: ignore[attr-defined]


def test_an_epoch_never_handed_out_is_refused_and_fences_nobody(open_log: OpenLog) -> None:
    # Issue 16 item 5: InitProducerId gave PID epoch 0 at most.
    log = open_log()
    handed_out = {PID: 0}

    def append(*batches: bytearray) -> tuple[int, int]:
        records = bytearray(b"".join(batches))
        info = log.append(records, list(iter_batches(records)), handed_out.__getitem__)
        return info.first_offset, info.last_offset

    assert append(batch(0)) == (0, 1)
    with pytest.raises(InvalidProducerEpochError, match="epoch 1 was never handed out"):
        append(batch(0, pid=PID, epoch=1))
    assert log.log_end_offset == 2
    assert append(batch(2)) == (2, 3)  # the real producer carries on
    handed_out[PID] = 1  # a second InitProducerId with the producer's key
    assert append(batch(0, epoch=1)) == (4, 5)
    with pytest.raises(InvalidProducerEpochError, match="fenced"):
        append(batch(4))
