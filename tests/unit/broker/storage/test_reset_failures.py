"""`PartitionLog.reset_to` failing part-way with an OSError while the broker
keeps running (disk full, EIO), at each step of the reset.

The fault is the crash tests' seam (`test_reset_crashes`: the os-level
calls the storage code makes) turned into an error the call returns: the
n-th `os.fsync` fails with EIO, or the n-th `os.replace` (every rename of
the reset: segment files to `.deleted`, each small file written
atomically) with ENOSPC, or the n-th `os.unlink` with EIO, for every n
until the reset gets through. After each failure the log must refuse every
read, append, flush, truncation and reset with StorageError (its memory
holds part of the old log and part of the new one), do no background work,
and write nothing when closed; a new open of the directory must then give
the fully reset log once the commit point (the `reset-offset` file) was
written, else the old log whole, and take appends.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tidelog.errors import StorageError
from tidelog.records import iter_batches
from tidelog_broker.storage import PartitionLog
from tidelog_broker.storage.files import RESET_OFFSET_FILE

from tests.unit.broker.storage.storage_helpers import make_batch, read_all
from tests.unit.broker.storage.test_reset_crashes import (
    CASES,
    Directory,
    Seen,
    _assert_empty_at,
    _replicate,
)

#: No reset makes this many calls of one kind: the loop ends well before.
CALLS_MAX = 64

#: The os-level call that fails, and the error it fails with.
FAULTS: dict[str, tuple[str, int]] = {
    "fsync": ("fsync", errno.EIO),
    "rename": ("replace", errno.ENOSPC),
    "unlink": ("unlink", errno.EIO),
}


def _arm(monkeypatch: pytest.MonkeyPatch, fault: str, fail_at: int) -> None:
    """Fail the `fail_at`-th call (1 is the next) of the fault's os call."""
    name, code = FAULTS[fault]
    real: Callable[..., Any] = getattr(os, name)
    countdown = [fail_at]

    def failing(*args: Any, **kwargs: Any) -> Any:
        countdown[0] -= 1
        if countdown[0] == 0:
            raise OSError(code, f"{os.strerror(code)} (injected into os.{name})")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, failing)


def _watch_commit(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """[whether the reset's commit point, the `reset-offset` file, was
    written], kept up to date from now on."""
    real = os.replace
    committed = [False]

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real(src, dst, *args, **kwargs)
        if Path(dst).name == RESET_OFFSET_FILE:
            committed[0] = True

    monkeypatch.setattr(os, "replace", replace)
    return committed


def _assert_refuses_everything(log: PartitionLog, where: str) -> None:
    offset = log.log_start_offset
    with pytest.raises(StorageError, match="offline"):
        log.read(offset, 1 << 20)
    with pytest.raises(StorageError, match="offline"):
        log.offset_for_timestamp(0)
    records = make_batch(tag=5)
    with pytest.raises(StorageError, match="offline"):
        log.append(records, list(iter_batches(records)))
    with pytest.raises(StorageError, match="offline"):
        _replicate(log, 9, make_batch(tag=6))
    with pytest.raises(StorageError, match="offline"):
        log.flush()
    with pytest.raises(StorageError, match="offline"):
        log.truncate_to(0)
    with pytest.raises(StorageError, match="offline"):
        log.reset_to(offset)
    with pytest.raises(StorageError, match="offline"):
        log.delete_records_before(offset)
    # The background work leaves it alone (no error every pass).
    assert not log.maybe_flush(1 << 62), where
    assert log.delete_old_segments() == [], where
    assert log.plan_cleaning(1000, force=True) is None, where
    assert log.offline is not None, where


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_reset_that_fails_part_way_takes_the_log_offline_until_it_is_opened_again(
    case: str, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: set[str] = set()
    for fail_at in range(1, CALLS_MAX):
        directory = Directory(tmp_path / str(fail_at) / "orders-3")
        try:
            log = directory.open()
            offset = CASES[case](log)
            log.flush()
            old = Seen.of(log)
            where = f"{case}: os.{FAULTS[fault][0]} call {fail_at} of the reset to {offset} failed"
            commit = _watch_commit(monkeypatch)
            _arm(monkeypatch, fault, fail_at)
            try:
                log.reset_to(offset)
            except StorageError:
                pass
            else:
                assert log.offline is None, where
                break
            finally:
                monkeypatch.undo()
            committed = commit[0]
            _assert_refuses_everything(log, where)
            log.close()
            reopened = directory.open()
            seen = Seen.of(reopened)
            if committed:
                _assert_empty_at(reopened, seen, offset, where)
            else:
                assert seen == old, where
            outcomes.add("new" if committed else "old")
            assert not (directory.path / RESET_OFFSET_FILE).exists(), where
            # Consistent: it takes appends and serves them.
            _replicate(reopened, 9, make_batch(record_count=2, tag=77))
            reopened.flush()
            assert reopened.offline is None, where
            assert reopened.log_end_offset == seen.log_end_offset + 2, where
            tail = reopened.read(seen.log_end_offset, 1 << 20)
            assert tail.next_offset == seen.log_end_offset + 2, where
            assert read_all(reopened).endswith(bytes(tail.records)), where
        finally:
            directory.close_all()
    else:
        pytest.fail(f"{case}: the reset never got through within {CALLS_MAX} {fault} calls")
    # Every fault fails the reset somewhere after its commit point.
    assert "new" in outcomes, outcomes
