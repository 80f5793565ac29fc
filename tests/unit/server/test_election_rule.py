"""tidelog_server.election_rule.elect: who leads a partition without a
leader able to serve, the rule the controller elects by and the describe
path calls a partition offline by (Kafka's: the first in-sync replica that
can serve, in assignment order; with none and unclean election allowed, the
first replica that can serve; else nobody)."""

from __future__ import annotations

import pytest
from tidelog_server.election_rule import Election, elect


def test_the_first_in_sync_replica_in_assignment_order_leads() -> None:
    # Assignment order, not ISR order: the ISR lists 3 first.
    assert elect([2, 1, 3], isr=[3, 1], can_serve={1, 2, 3}, unclean=False) == Election(1, True)


def test_an_in_sync_replica_that_cannot_serve_is_passed_over() -> None:
    assert elect([1, 2, 3], isr=[1, 2, 3], can_serve={3}, unclean=False) == Election(3, True)


def test_a_clean_election_wins_over_an_unclean_one_even_further_down_the_assignment() -> None:
    # 1 could serve but is out of the ISR; 3 is in it.
    assert elect([1, 2, 3], isr=[2, 3], can_serve={1, 3}, unclean=True) == Election(3, True)


def test_an_in_sync_replica_outside_the_assignment_never_leads() -> None:
    assert elect([1, 2], isr=[4], can_serve={1, 2, 4}, unclean=False) is None
    assert elect([1, 2], isr=[4], can_serve={1, 2, 4}, unclean=True) == Election(1, False)


@pytest.mark.parametrize("unclean", [False, True])
def test_without_an_in_sync_replica_that_can_serve_only_an_unclean_election_picks_one(
    unclean: bool,
) -> None:
    got = elect([1, 2, 3], isr=[1], can_serve={3, 2}, unclean=unclean)
    # Unclean: the first replica of the assignment that can serve.
    assert got == (Election(2, False) if unclean else None)


def test_nobody_leads_when_no_replica_can_serve_even_with_unclean_election() -> None:
    assert elect([1, 2, 3], isr=[1, 2], can_serve={4}, unclean=True) is None
    assert elect([], isr=[1], can_serve={1}, unclean=True) is None


def test_an_empty_isr_leads_only_by_an_unclean_election() -> None:
    assert elect([1, 2], isr=[], can_serve={1, 2}, unclean=False) is None
    assert elect([1, 2], isr=[], can_serve={1, 2}, unclean=True) == Election(1, False)
