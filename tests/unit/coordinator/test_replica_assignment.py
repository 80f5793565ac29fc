"""An explicit replica assignment (NewTopic.replica_assignment, issue 17)
checked before the coordinator uses it instead of its placement."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from tidelog.errors import InvalidRequestError
from tidelog_coordinator.placement import check_assignment

LIVE = (0, 1, 2)


def check(
    pairs: Sequence[tuple[int, Sequence[int]]], partitions: int = -1, factor: int = -1
) -> list[list[int]]:
    return check_assignment("t", pairs, partitions, factor, LIVE, 100)


def test_a_valid_assignment_comes_back_in_partition_order() -> None:
    assert check([(1, [2, 0]), (0, [1, 2])]) == [[1, 2], [2, 0]]
    # Counts that agree with the assignment, or 0 (the wire's "unset"), pass too.
    assert check([(0, [2])], partitions=1, factor=1) == [[2]]
    assert check([(0, [2, 1])], partitions=0, factor=0) == [[2, 1]]


@pytest.mark.parametrize(
    ("pairs", "partitions", "factor", "message"),
    [
        ([(0, [0, 1]), (2, [1, 2])], -1, -1, "names partition 2: with 2 partitions"),
        ([(0, [0, 1]), (0, [1, 2])], -1, -1, "gives partition 0 twice"),
        ([(-1, [0])], -1, -1, "names partition -1"),
        ([(0, [0, 1]), (1, [1])], -1, -1, "partition 1 has 1 replicas, expected 2"),
        ([(0, [0, 1])], -1, 3, "expected 3 (the replication factor asked for)"),
        ([(0, [0, 1])], 2, -1, "asks for 2 partitions but its replica assignment has 1"),
        ([(0, [1, 1])], -1, -1, "lists a broker twice (1:1)"),
        ([(0, [0, 7])], -1, -1, "names broker 7, which is not a live broker (live: 0, 1, 2)"),
        ([(0, [])], -1, -1, "replication factor 0"),
        ([], -1, -1, "has 0 partitions"),
        ([(p, [0]) for p in range(101)], -1, -1, "has 101 partitions: use 1 to 100"),
    ],
)
def test_a_wrong_assignment_is_refused_naming_what_is_wrong(
    pairs: list[tuple[int, list[int]]], partitions: int, factor: int, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=r"replica assignment|asks for") as caught:
        check(pairs, partitions, factor)
    assert message in str(caught.value)
