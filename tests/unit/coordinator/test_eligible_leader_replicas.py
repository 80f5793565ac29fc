"""Eligible leader replicas (PartitionState.elr, Kafka's KIP-966) in the
controller's decision (pure), replaying what a 900 s soak lost 2.8 M
acknowledged records to: orders-0, replicas [0, 1, 2], min.insync.replicas
2, leader 0 with ISR [2, 0]. Broker 0 (leader) and broker 2 (follower) are
SIGKILLed; broker 2's log is cut deep and it restarts at once, broker 0
half a second later.

1. The controller sees broker 0's registration gone and broker 2's old one
   still live (its lease outlives the dead process): broker 2 leads, and
   broker 0 leaves the ISR, below min.insync.replicas: it is kept eligible.
2. Broker 2's new process registers with its log listed torn; broker 0 is
   still away: nobody leads (broker 0 may return with more).
3. Broker 0 returns, torn too, holding more: it leads. Before ELR, the ISR
   was [2] alone, back and torn, and broker 2 led: the others truncated to
   its cut.
"""

from __future__ import annotations

from tidelog_coordinator import reassignment
from tidelog_coordinator.leader_election import decide
from tidelog_server.election_rule import LogFigures, next_elr
from tidelog_server.etcd.records import PartitionState

REPLICAS = [0, 1, 2]


def test_the_soak_sequence_keeps_the_removed_leader_eligible_and_elects_it() -> None:
    before = PartitionState(0, 166, (2, 0), version=40)
    # 1. Broker 0 gone; broker 2's stale registration live, not torn.
    first = decide(REPLICAS, before, {1, 2}, False, False, min_isr=2)
    assert first == PartitionState(2, 167, (2,), 41, elr=(0,))
    # 2. Broker 2 restarted (registered after the state), torn; 0 away.
    assert first is not None
    second = decide(REPLICAS, first, {1, 2}, False, False, {2}, torn={2}, min_isr=2)
    assert second == PartitionState(-1, 168, (2,), 42, elr=(0,))
    assert second is not None
    # Still nobody while broker 0 is away (the next pass).
    assert decide(REPLICAS, second, {1, 2}, False, False, {2}, torn={2}, min_isr=2) is None
    # 3. Broker 0 back, torn, holding more than broker 2's cut log.
    figures = {0: LogFigures(166, 3_190_500), 2: LogFigures(166, 393_334)}
    third = decide(
        REPLICAS, second, {0, 1, 2}, False, False, {0, 2}, torn={0, 2}, figures=figures, min_isr=2
    )
    assert third == PartitionState(0, 169, (0, 2), 43)


def test_an_untorn_eligible_leader_replica_leads_when_no_isr_member_can() -> None:
    waiting = PartitionState(-1, 9, (2,), 5, elr=(0,))
    # Broker 0 back whole (a clean restart): it leads and rejoins the ISR;
    # broker 2, away, leaves the ISR below min ISR: eligible in turn.
    new = decide(REPLICAS, waiting, {0, 1}, False, False, {0}, min_isr=2)
    assert new == PartitionState(0, 10, (0,), 6, elr=(2,))
    # An untorn ISR member comes first.
    new = decide(REPLICAS, waiting, {0, 1, 2}, False, False, {0, 2}, min_isr=2)
    assert new is not None and new.leader == 2 and new.isr == (2,) and new.elr == (0,)
    # A replica never in the ISR or ELR does not lead (no unclean election).
    assert decide(REPLICAS, waiting, {1}, False, False, min_isr=2) is None
    # An unclean election clears the ELR.
    unclean = decide(REPLICAS, waiting, {1}, True, False, min_isr=2)
    assert unclean == PartitionState(1, 10, (1,), 6)


def test_the_isr_back_at_min_isr_clears_the_elr_and_dead_members_join_it() -> None:
    # The leader's removal of a dead follower below min ISR keeps it.
    led = PartitionState(1, 4, (1, 2), 7)
    removed = decide(REPLICAS, led, {0, 1}, False, False, min_isr=2)
    assert removed == PartitionState(1, 4, (1,), 8, elr=(2,))
    # min.insync.replicas 1 (the default): nothing kept, as before.
    assert decide(REPLICAS, led, {0, 1}, False, False) == PartitionState(1, 4, (1,), 8)
    assert next_elr((1,), (1, 2), (2,), 2, REPLICAS) == ()
    assert next_elr((0, 1, 2), (0,), (), 3, REPLICAS) == (1, 2)
    assert next_elr((0,), (0,), (1, 2), 3, [0, 1]) == (1,)


def test_a_reassignment_cuts_the_elr_to_its_replicas_and_elects_from_it() -> None:
    moving = PartitionState(3, 6, (3,), 2, elr=(0, 2))
    # Leader 3 stays; the ELR loses broker 2, which leaves.
    cut = reassignment.state_for_replicas([3, 0], moving, {0, 3}, min_isr=2)
    assert cut == PartitionState(3, 6, (3,), 3, elr=(0,))
    # Leader 3 leaves; broker 0 (ELR, untorn) leads.
    away = PartitionState(3, 6, (3,), 2, elr=(0,))
    assert reassignment.state_for_replicas([0, 1], away, {0, 1, 3}, min_isr=2) == PartitionState(
        0, 7, (0,), 3
    )
