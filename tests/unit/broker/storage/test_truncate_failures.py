"""`PartitionLog.truncate_to` failing part-way with an OSError while the
broker keeps running, at each step (the faults of `test_reset_failures`):
the log must refuse every read and write with StorageError (its memory may
list segments already deleted, and the recovery point on disk may still
vouch for offsets above the new end, so appends there would be trusted
after a crash), and a new open of the directory must give a prefix of the
old log ending between the truncation's end and the old end, which takes
appends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tidelog.errors import StorageError
from tidelog_broker.storage import PartitionLog

from tests.unit.broker.storage.storage_helpers import make_batch, read_all
from tests.unit.broker.storage.test_reset_crashes import Directory, Seen, _fill, _replicate
from tests.unit.broker.storage.test_reset_failures import (
    CALLS_MAX,
    FAULTS,
    _arm,
    _assert_refuses_everything,
)


def _inside_the_second_segment(log: PartitionLog) -> int:
    return log.segments[1].base_offset + 2


def _at_the_start(log: PartitionLog) -> int:
    return log.log_start_offset


#: Where to truncate a filled log.
CASES: dict[str, Callable[[PartitionLog], int]] = {
    "inside_the_second_segment": _inside_the_second_segment,
    "at_the_start": _at_the_start,
}


def _filled(directory: Directory) -> tuple[PartitionLog, int, Seen]:
    log = directory.open()
    _fill(log, 12)
    return log, log.log_end_offset, Seen.of(log)


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_truncation_that_fails_part_way_takes_the_log_offline_until_it_is_opened_again(
    case: str, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = Directory(tmp_path / "reference" / "orders-3")
    try:
        log, _, _ = _filled(reference)
        log.truncate_to(CASES[case](log))
        truncated_end = log.log_end_offset
    finally:
        reference.close_all()
    failures = 0
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log, old_end, old = _filled(directory)
            offset = CASES[case](log)
            where = f"{case}: os.{FAULTS[fault][0]} call {fail_at} of the truncation failed"
            _arm(monkeypatch, fault, fail_at)
            try:
                log.truncate_to(offset)
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                assert log.log_end_offset == truncated_end, where
                break
            finally:
                monkeypatch.undo()
            failures += 1
            _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            assert truncated_end <= seen.log_end_offset <= old_end, where
            assert old.records.startswith(seen.records), where
            assert seen.log_start_offset == old.log_start_offset, where
            _replicate(reopened, 9, make_batch(record_count=2, tag=77))
            reopened.flush()
            assert reopened.log_end_offset == seen.log_end_offset + 2, where
            assert read_all(reopened).startswith(seen.records), where
        finally:
            directory.close_all()
    else:
        pytest.fail(f"{case}: the truncation never got through within {CALLS_MAX} {fault} calls")
    assert failures, f"{case}: no {fault} call in the truncation"
