"""The controller's per-partition decision (pure)."""

from __future__ import annotations

from tidelog_coordinator.leader_election import decide
from tidelog_server.election_rule import LogFigures
from tidelog_server.etcd.records import PartitionState


def state(leader: int, epoch: int, isr: list[int]) -> PartitionState:
    return PartitionState(leader, epoch, tuple(isr), version=3)


def test_dead_leader_is_replaced_by_the_first_live_isr_member() -> None:
    new = decide([0, 1, 2], state(0, 4, [0, 2, 1]), {1, 2}, False, False)
    assert new == PartitionState(1, 5, (2, 1), 4)


def test_no_live_isr_member_leaves_it_leaderless_unless_unclean() -> None:
    assert decide([0, 1, 2], state(0, 4, [0]), {1, 2}, False, False) == PartitionState(
        -1, 5, (0,), 4
    )
    assert decide([0, 1, 2], state(0, 4, [0]), {1, 2}, True, False) == PartitionState(1, 5, (1,), 4)
    # The ISR member comes back: it leads.
    back = decide([0, 1, 2], state(-1, 5, [0]), {0, 1, 2}, False, False)
    assert back is not None and back.leader == 0


def test_dead_followers_leave_the_isr_and_preferred_leader_returns() -> None:
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {1, 2}, False, False) == PartitionState(
        1, 2, (1, 2), 4
    )
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {0, 1, 2}, False, False) is None
    preferred = decide([0, 1, 2], state(1, 2, [1, 2, 0]), {0, 1, 2}, False, True)
    assert preferred is not None and preferred.leader == 0


def test_a_restarted_leader_is_replaced_and_restarted_members_leave_the_isr() -> None:
    new = decide([0, 1, 2], state(0, 2, [0, 1, 2]), {0, 1, 2}, False, False, {0, 2})
    assert new == PartitionState(1, 3, (1,), 4)
    # Only the restarted leader is left: it leads again in a new epoch.
    again = decide([0, 1, 2], state(0, 2, [0]), {0, 1, 2}, False, False, {0})
    assert again is not None and again.leader == 0 and again.leader_epoch == 3


def test_a_torn_replica_is_not_elected_but_stays_in_the_isr() -> None:
    # ISR [2, 0], both went down; 0 came back with a torn log: no leader yet.
    assert decide([0, 1, 2], state(-1, 8, [2, 0]), {0, 1}, False, False, {0}, torn={0}) is None
    dead_leader = decide([0, 1, 2], state(2, 7, [2, 0]), {0, 1}, False, False, {0}, torn={0})
    assert dead_leader == PartitionState(-1, 8, (2, 0), 4)
    # 2 is back (restarted too, not torn): it leads, 0 stays in the ISR.
    assert decide(
        [0, 1, 2], state(-1, 8, [2, 0]), {0, 1, 2}, False, False, {0, 2}, torn={0}
    ) == PartitionState(2, 9, (2, 0), 4)
    # Nor is a torn preferred replica made leader; an unclean election may.
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {0, 1, 2}, False, True, torn={0}) is None
    unclean = decide([0, 1, 2], state(-1, 8, [2, 0]), {0, 1}, True, False, {0}, torn={0})
    assert unclean == PartitionState(0, 9, (0,), 4)


def test_torn_replicas_lead_when_every_isr_member_is_back_and_torn() -> None:
    # One replica, torn at its restart: nobody else can have more.
    assert decide([0], state(0, 3, [0]), {0}, False, False, {0}, torn={0}) == PartitionState(
        0, 4, (0,), 4
    )
    # Both ISR members back and torn: the first in placement order leads.
    both = decide([0, 1, 2], state(-1, 8, [2, 0]), {0, 1, 2}, False, False, {0, 2}, torn={0, 2})
    assert both == PartitionState(0, 9, (2, 0), 4)


def test_of_torn_isr_members_all_back_the_one_holding_the_most_leads() -> None:
    """Leader 2 and follower 0 crashed together and both cut their tails:
    the longer log of the latest epoch leads, whatever the placement order
    (before, the first in order led, and the other truncated to its cut)."""
    both = state(-1, 8, [2, 0])
    for longer, shorter in ((0, 2), (2, 0)):
        figures = {longer: LogFigures(7, 120), shorter: LogFigures(7, 90)}
        new = decide([0, 1, 2], both, {0, 1, 2}, False, False, {0, 2}, torn={0, 2}, figures=figures)
        assert new == PartitionState(longer, 9, (2, 0), 4)
    # A later epoch holds more than a longer log of an earlier one.
    figures = {0: LogFigures(6, 500), 2: LogFigures(7, 90)}
    new = decide([0, 1, 2], both, {0, 1, 2}, False, False, {0, 2}, torn={0, 2}, figures=figures)
    assert new == PartitionState(2, 9, (2, 0), 4)
    # Equal: placement order.
    figures = {0: LogFigures(7, 90), 2: LogFigures(7, 90)}
    new = decide([0, 1, 2], both, {0, 1, 2}, False, False, {0, 2}, torn={0, 2}, figures=figures)
    assert new is not None and new.leader == 0
    # One of them (an older broker) publishes none: placement order.
    figures = {2: LogFigures(7, 120)}
    new = decide([0, 1, 2], both, {0, 1, 2}, False, False, {0, 2}, torn={0, 2}, figures=figures)
    assert new is not None and new.leader == 0
    # Figures never let a torn replica lead while another ISR member may
    # return (2 is down): the partition still waits.
    figures = {0: LogFigures(7, 120)}
    assert decide([0, 1, 2], both, {0, 1}, False, False, {0}, torn={0}, figures=figures) is None


def test_a_torn_replica_does_not_lead_while_an_untorn_isr_member_restarted() -> None:
    """Leader 2 restarted cleanly (its log whole, so not torn); follower 0,
    back from a crash before the state was last written, is torn. Before,
    0 led at once (2, restarted, was set aside and every ISR member was
    back) and 2 truncated to 0's cut log. Now the leader is fenced and the
    next pass, 2's restart being older than that state, elects 2."""
    fenced = decide([0, 1, 2], state(2, 7, [2, 0]), {0, 1, 2}, False, False, {2}, torn={0})
    assert fenced == PartitionState(-1, 8, (2, 0), 4)
    assert decide([0, 1, 2], fenced, {0, 1, 2}, False, False, torn={0}) == PartitionState(
        2, 9, (2, 0), 5
    )
