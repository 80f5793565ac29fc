"""Descriptors a partition holds at rest (issue 16, item 7): the active
segment's three files, not three per segment; a read of an older segment
opens its files for that read only."""

from __future__ import annotations

import os
from pathlib import Path

from tests.unit.broker.storage.storage_helpers import OpenLog, append, make_batch, read_all


def open_descriptors_under(directory: Path) -> int:
    """How many of this process's descriptors point into `directory`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since listdir
        if target.startswith(str(directory)):
            count += 1
    return count


def test_a_partition_at_rest_holds_the_active_segments_descriptors(
    open_log: OpenLog, log_dir: Path
) -> None:
    log = open_log(segment_bytes=1024)
    for tag in range(40):
        append(log, make_batch(value_bytes=300, tag=tag))
    assert len(log.segments) >= 10
    # A rolled segment lets its descriptors go at once (flush.ms is unset by
    # default, so waiting for a flush would keep them for good)...
    assert open_descriptors_under(log_dir) == 3
    # ...and its flush opens it again to fsync what it owes, then closes it.
    log.flush()
    assert open_descriptors_under(log_dir) == 3

    # Reading the whole log goes through every segment, and leaves none open.
    before = read_all(log)
    assert open_descriptors_under(log_dir) == 3
    assert log.offset_for_timestamp(0) == (0, 1_000)
    assert open_descriptors_under(log_dir) == 3

    # Released descriptors open again for every operation that needs them.
    log.truncate_to(5)
    append(log, make_batch(value_bytes=300, tag=99))
    log.flush()
    assert read_all(log)[: len(before) // 40] == before[: len(before) // 40]
    log.close()
    assert open_descriptors_under(log_dir) == 0

    reopened = open_log(segment_bytes=1024)
    assert open_descriptors_under(log_dir) == 3
    assert reopened.log_end_offset == 6
    reopened.close()
