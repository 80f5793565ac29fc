"""`tidelog topics create --replica-assignment` in kafka-topics' syntax:
partitions separated by commas, the replicas of each by colons."""

from __future__ import annotations

import argparse

import pytest
from tidelog.cli.topics import parse_replica_assignment


def test_the_nth_group_is_partition_n_leader_first() -> None:
    assert parse_replica_assignment("0:1:2,1:2:0") == {0: [0, 1, 2], 1: [1, 2, 0]}
    assert parse_replica_assignment("2") == {0: [2]}


@pytest.mark.parametrize(
    ("text", "message"),
    [("0:1,x:2", "partition 1 is 'x:2'"), ("0:1,", "partition 1 is ''"), ("0;1", "'0;1'")],
)
def test_a_malformed_assignment_names_the_partition(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="broker ids separated by colons") as e:
        parse_replica_assignment(text)
    assert message in str(e.value)
