"""The `topic-id` file of a partition directory (storage.files): written
without an fsync, so after a machine crash it may be missing, empty or
zeros. Each of those must read as "no id", and a log opening with such a
file must be adopted with its records, never renamed aside as a deleted
incarnation's: that would drop acknowledged records of the live topic."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog_broker.storage import LogConfig
from tidelog_broker.storage.files import (
    TOPIC_ID_FILE,
    is_renamed_for_deletion,
    read_topic_id,
    write_topic_id,
)
from tidelog_broker.storage.partition_log import PartitionLog

from tests.unit.broker.storage.storage_helpers import append, make_batch

TOPIC_ID = "0123456789abcdef0123456789abcdef"


def test_an_id_written_is_read_back(tmp_path: Path) -> None:
    write_topic_id(tmp_path, TOPIC_ID)
    assert read_topic_id(tmp_path) == TOPIC_ID


def test_a_directory_without_the_file_has_no_id(tmp_path: Path) -> None:
    assert read_topic_id(tmp_path) is None


@pytest.mark.parametrize(
    "torn",
    [b"", b"\x00" * 32, b"\x00\x00\x00\x00", b"\xff\xfe", b"abc def", b"x" * 65],
    ids=["empty", "zeros", "short-zeros", "not-ascii", "space", "too-long"],
)
def test_a_torn_file_has_no_id(tmp_path: Path, torn: bytes) -> None:
    (tmp_path / TOPIC_ID_FILE).write_bytes(torn)
    assert read_topic_id(tmp_path) is None


@pytest.mark.parametrize("torn", [b"", b"\x00" * 32], ids=["empty", "zeros"])
def test_a_log_whose_id_file_was_torn_keeps_its_records(tmp_path: Path, torn: bytes) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, "t", 0, LogConfig(), topic_id=TOPIC_ID)
    for tag in range(3):
        append(log, make_batch(tag=tag))
    end = log.log_end_offset
    log.close()
    (directory / TOPIC_ID_FILE).write_bytes(torn)  # what a crash may leave

    reopened = PartitionLog.open(directory, "t", 0, LogConfig(), topic_id=TOPIC_ID)
    try:
        assert reopened.log_end_offset == end == 3
        assert read_topic_id(directory) == TOPIC_ID  # adopted: the id written again
        assert not any(is_renamed_for_deletion(entry.name) for entry in tmp_path.iterdir())
    finally:
        reopened.close()


def test_a_log_of_another_incarnation_is_renamed_aside(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, "t", 0, LogConfig(), topic_id=TOPIC_ID)
    append(log, make_batch())
    log.close()

    other = "fedcba9876543210fedcba9876543210"
    told: list[Path] = []
    reopened = PartitionLog.open(
        directory, "t", 0, LogConfig(), topic_id=other, on_renamed_aside=told.append
    )
    try:
        assert reopened.log_end_offset == 0
        assert read_topic_id(directory) == other
        # Only renamed: its removal is the LogManager's sweep's (off the
        # event loop), told of it.
        [renamed] = [entry for entry in tmp_path.iterdir() if is_renamed_for_deletion(entry.name)]
        assert told == [renamed]
        assert read_topic_id(renamed) == TOPIC_ID
    finally:
        reopened.close()
