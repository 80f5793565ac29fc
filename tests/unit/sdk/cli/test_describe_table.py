"""The partition table of `tidelog topics describe` (partition_table): a
partition without a leader reads `none` there, as kafka-topics prints
"Leader: none", while the API keeps -1; an empty list of broker ids
(replicas, ISR) reads `-`, as the other empty cells, never a blank cell."""

from __future__ import annotations

from tidelog.cli.topics import partition_table
from tidelog.errors import NotLeaderOrFollowerError
from tidelog.types import PartitionInfo, TopicDescription


def test_a_partition_without_a_leader_reads_none_in_the_leader_column() -> None:
    led = PartitionInfo(0, 2, [2, 1], [2, 1], 0, 5, 5, 100, 1)
    leaderless = PartitionInfo(
        1, -1, [1, 2], [1], -1, -1, -1, -1, -1,
        error=NotLeaderOrFollowerError("t-1 has no leader right now"),
        offline_replicas=[1],
    )  # fmt: skip
    header, *rows = partition_table(TopicDescription("t", [led, leaderless], {}))
    assert header[:2] == ("partition", "leader") and header[-1] == "offline"
    assert [row[:4] for row in rows] == [("0", "2", "2,1", "2,1"), ("1", "none", "1,2", "1")]
    # Its figures unknown, its offline replica named: one cell each, so that
    # the row still splits into its columns.
    assert rows[1][4:] == ("?", "?", "?", "?", "1")
    assert rows[0][6] == "100B"
    assert all(" " not in cell for row in rows for cell in row)


def test_broker_0_leading_is_shown_as_0() -> None:
    # 0 is a broker id like any other, not "no leader".
    (_, row) = partition_table(
        TopicDescription("t", [PartitionInfo(0, 0, [0], [0], 0, 0, 0, 0, 1)], {})
    )
    assert row[1] == "0"


def test_an_empty_isr_or_replica_list_reads_dash_so_the_columns_stay_in_place() -> None:
    # A just-created partition with no state yet: no replicas, no ISR, no
    # leader. Each reads `-` (as the other empty cells), never a blank cell
    # that a line split on spaces would drop, shifting the columns after it.
    fresh = PartitionInfo(
        0, -1, [], [], -1, -1, -1, -1, -1,
        error=NotLeaderOrFollowerError("t-0 has no leader right now"),
    )  # fmt: skip
    isr_lost = PartitionInfo(1, -1, [1, 2], [], 0, 5, 5, 100, 1)
    header, *rows = partition_table(TopicDescription("t", [fresh, isr_lost], {}))
    assert header[2:4] == ("replicas", "isr")
    assert [row[:4] for row in rows] == [("0", "none", "-", "-"), ("1", "none", "1,2", "-")]
    assert all(cell for row in rows for cell in row)
    # What a reader splitting a printed line on spaces gets: every column.
    line = "  ".join(rows[0])
    assert line.split() == ["0", "none", "-", "-", "?", "?", "?", "?"]
