"""The rules of a replica move (pure): start, the state once the replicas
change, completion; and the etcd record of a move."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidRequestError
from tidelog_coordinator import reassignment as rules
from tidelog_server.election_rule import Election, LogFigures, elect_in_sync
from tidelog_server.etcd.records import PartitionState, Reassignment, TopicAssignment


def state(leader: int, epoch: int, isr: list[int]) -> PartitionState:
    return PartitionState(leader, epoch, tuple(isr), version=3)


def test_start_keeps_the_original_replicas_of_a_move_in_progress() -> None:
    first = rules.start([0, 1], None, [2, 3], 500, now_ms=10)
    assert first == Reassignment((2, 3), (0, 1), 500, 10)
    assert first.replicas == (2, 3, 0, 1)
    assert first.adding == (2, 3) and first.removing == (0, 1)
    # A new target while moving: still restores (0, 1); the start time stays.
    again = rules.start(first.replicas, first, [2, 0], 0, now_ms=99)
    assert again == Reassignment((2, 0), (0, 1), 0, 10)
    assert again.replicas == (2, 0, 1)
    # Back to the original, or empty: no reassignment (a cancel).
    assert rules.start(first.replicas, first, [0, 1], 0, now_ms=99) is None
    assert rules.start(first.replicas, first, [], 0, now_ms=99) is None


def test_state_for_replicas_cuts_the_isr_and_moves_a_leaving_leader() -> None:
    # The leader stays: same epoch, the ISR cut to the new replicas.
    assert rules.state_for_replicas([2, 3], state(2, 4, [0, 2, 3]), {0, 2, 3}) == PartitionState(
        2, 4, (2, 3), 4
    )
    # Nothing changes: the very same state (nothing to write).
    same = state(2, 4, [2, 3])
    assert rules.state_for_replicas([2, 3], same, {2, 3}) is same
    # The leader leaves: the first new replica alive and in sync leads, new epoch.
    assert rules.state_for_replicas([2, 3], state(0, 4, [0, 3, 2]), {0, 2, 3}) == PartitionState(
        2, 5, (3, 2), 4
    )
    assert rules.state_for_replicas([2, 3], state(0, 4, [0, 3, 2]), {0, 3}) == PartitionState(
        3, 5, (3, 2), 4
    )
    # Nobody in sync among them: no state (the caller refuses or waits).
    assert rules.state_for_replicas([2, 3], state(0, 4, [0, 1]), {0, 1, 2, 3}) is None


def test_a_leaving_leader_is_not_replaced_by_a_torn_one_while_another_may_have_more() -> None:
    # Leader 0 leaves; target 2 is torn (back from a crash, still catching
    # up, its tail maybe cut): 3 leads, not the first in order. Before, 2
    # led and 3 truncated to its cut log (acknowledged records lost).
    moving = state(0, 4, [0, 2, 3])
    assert rules.state_for_replicas([2, 3], moving, {0, 2, 3}, torn={2}) == PartitionState(
        3, 5, (2, 3), 4
    )
    # However much more its broker says its log holds.
    figures = {2: LogFigures(4, 900), 3: LogFigures(4, 100)}
    assert rules.state_for_replicas(
        [2, 3], moving, {0, 2, 3}, torn={2}, figures=figures
    ) == PartitionState(3, 5, (2, 3), 4)
    # Both targets torn, the leader serving: they catch up from it first.
    assert rules.state_for_replicas([2, 3], moving, {0, 2, 3}, torn={2, 3}) is None
    # Both torn and an ISR member down (the leaving leader here): it may
    # return with more, so nobody leads yet.
    assert rules.state_for_replicas([2, 3], moving, {2, 3}, torn={2, 3}) is None
    wider = state(0, 4, [0, 1, 2, 3])
    assert rules.state_for_replicas([2, 3, 1], wider, {0, 2, 3}, torn={0, 2, 3}) is None
    # Every ISR member back and torn: the target holding the most leads.
    assert rules.state_for_replicas(
        [2, 3], moving, {0, 2, 3}, torn={0, 2, 3}, figures=figures
    ) == PartitionState(2, 5, (2, 3), 4)
    # A leader that stays is not moved, torn members or not.
    assert rules.state_for_replicas([0, 2], moving, {0, 2, 3}, torn={2}) == PartitionState(
        0, 4, (0, 2), 4
    )


def test_the_controller_and_a_reassignment_elect_by_one_rule() -> None:
    # election_rule.elect_in_sync: untorn first, in assignment order.
    assert elect_in_sync([1, 2, 3], [3, 2, 1], {1, 2, 3}, {1}) == Election(2, clean=True)
    # All back and torn: the most complete; else nobody.
    figures = {1: LogFigures(3, 10), 2: LogFigures(3, 50)}
    assert elect_in_sync([1, 2], [1, 2], {1, 2}, {1, 2}, figures) == Election(2, clean=True)
    assert elect_in_sync([1, 2], [1, 2, 3], {1, 2}, {1, 2}, figures) is None
    # An untorn ISR member that may not lead here still holds more.
    assert elect_in_sync([1, 2], [1, 2, 3], {1, 2, 3}, {1, 2}, figures) is None
    # `eligible` (the controller's members not restarted) narrows who leads.
    assert elect_in_sync([1, 2], [1, 2], {1, 2}, (), eligible=[2]) == Election(2, clean=True)


def test_complete_only_when_every_target_replica_is_in_sync() -> None:
    move = Reassignment((2, 3), (0, 1))
    assert not rules.is_complete(move, state(0, 1, [0, 1, 2]))
    assert rules.is_complete(move, state(0, 1, [0, 1, 2, 3]))
    assert not rules.is_complete(move, state(-1, 1, [2, 3]))


def test_check_target_names_what_is_wrong() -> None:
    with pytest.raises(InvalidRequestError, match="twice"):
        rules.check_target("t-0", [1, 1], {1})
    with pytest.raises(InvalidRequestError, match="target replica 5 is not a live broker"):
        rules.check_target("t-0", [1, 5], {1, 2})
    with pytest.raises(InvalidRequestError, match="at most 64"):
        rules.check_target("t-0", list(range(65)), set(range(65)))


def test_topic_record_round_trips_a_move_and_omits_none() -> None:
    plain = TopicAssignment("t", "id", ((0, 1),), {}, version=2, created_ms=5)
    assert b"reassignments" not in plain.encode()
    assert TopicAssignment.decode(plain.encode()) == plain
    moving = TopicAssignment(
        "t", "id", ((2, 3, 0, 1),), {}, 3, 5, {0: Reassignment((2, 3), (0, 1), 100, 7)}
    )
    assert TopicAssignment.decode(moving.encode()) == moving
