"""The two sparse indexes: offset -> position and timestamp -> offset."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidelog_broker.storage.index import OffsetIndex, TimeIndex


def test_offset_index_finds_largest_entry_at_or_below(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", base_offset=100)
    assert index.lookup(100) == 0  # empty: scan from the segment start
    index.append([(110, 4096), (120, 8192)])
    assert [index.lookup(o) for o in (100, 109, 110, 119, 120, 10**9)] == [
        0,
        0,
        4096,
        4096,
        8192,
        8192,
    ]
    index.close()
    reopened = OffsetIndex(tmp_path / "x.index", base_offset=100)
    assert reopened.intact
    assert reopened.entries() == [(110, 4096), (120, 8192)]
    assert (tmp_path / "x.index").read_bytes() == bytes.fromhex("0000000a00001000 0000001400002000")
    reopened.truncate_to_entries(1)
    assert reopened.entries() == [(110, 4096)]
    assert (tmp_path / "x.index").stat().st_size == 8
    reopened.close()


def test_time_index_scan_starts_after_the_last_older_entry(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", base_offset=100)
    index.append([(1_000, 109), (2_000, 119)])
    assert index.scan_start(500) == 100
    assert index.scan_start(1_000) == 100  # offsets <= 109 may hold exactly 1000
    assert index.scan_start(1_001) == 109
    assert index.scan_start(5_000) == 119
    index.close()
    assert (tmp_path / "x.timeindex").stat().st_size == 24


@pytest.mark.parametrize(
    "content",
    [b"\x00" * 7, bytes.fromhex("0000000a00001000 0000000500002000")],
    ids=["partial-entry", "not-increasing"],
)
def test_malformed_index_file_is_reported_not_trusted(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "x.index").write_bytes(content)
    index = OffsetIndex(tmp_path / "x.index", base_offset=0)
    assert not index.intact
    assert len(index) == 0
    index.close()
