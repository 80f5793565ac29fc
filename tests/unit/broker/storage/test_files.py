"""File naming: partition directories and segment files."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog_broker.storage import files


def test_names_round_trip_with_dashes_and_dots_in_topic(tmp_path: Path) -> None:
    assert files.log_dir(tmp_path, "a-b.c", 12) == tmp_path / "a-b.c-12"
    assert files.parse_log_dir_name("a-b.c-12") == ("a-b.c", 12)
    assert files.segment_file_name(42, ".log") == "00000000000000000042.log"
    assert files.parse_segment_file_name("00000000000000000042.timeindex") == (42, ".timeindex")
    assert files.parse_segment_file_name("42.log") is None
    assert files.parse_segment_file_name("recovery-point") is None
    with pytest.raises(ValueError, match="not a log directory"):
        files.parse_log_dir_name("orders")
