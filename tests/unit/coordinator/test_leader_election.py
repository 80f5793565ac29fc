"""The controller's per-partition decision (pure)."""

from __future__ import annotations

from tidelog_coordinator.leader_election import decide


def state(leader: int, epoch: int, isr: list[int]) -> dict[str, object]:
    return {"leader": leader, "leader_epoch": epoch, "isr": isr, "version": 3}


def test_dead_leader_is_replaced_by_the_first_live_isr_member() -> None:
    new = decide([0, 1, 2], state(0, 4, [0, 2, 1]), {1, 2}, False, False)
    assert new == {"leader": 1, "leader_epoch": 5, "isr": [2, 1], "version": 4}


def test_no_live_isr_member_leaves_it_leaderless_unless_unclean() -> None:
    assert decide([0, 1, 2], state(0, 4, [0]), {1, 2}, False, False) == {
        "leader": -1, "leader_epoch": 5, "isr": [0], "version": 4,
    }  # fmt: skip
    assert decide([0, 1, 2], state(0, 4, [0]), {1, 2}, True, False) == {
        "leader": 1, "leader_epoch": 5, "isr": [1], "version": 4,
    }  # fmt: skip
    # The ISR member comes back: it leads.
    assert decide([0, 1, 2], state(-1, 5, [0]), {0, 1, 2}, False, False)["leader"] == 0  # type: ignore[index]


def test_dead_followers_leave_the_isr_and_preferred_leader_returns() -> None:
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {1, 2}, False, False) == {
        "leader": 1, "leader_epoch": 2, "isr": [1, 2], "version": 4,
    }  # fmt: skip
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {0, 1, 2}, False, False) is None
    assert decide([0, 1, 2], state(1, 2, [1, 2, 0]), {0, 1, 2}, False, True)["leader"] == 0  # type: ignore[index]


def test_a_restarted_leader_is_replaced_and_restarted_members_leave_the_isr() -> None:
    new = decide([0, 1, 2], state(0, 2, [0, 1, 2]), {0, 1, 2}, False, False, {0, 2})
    assert new == {"leader": 1, "leader_epoch": 3, "isr": [1], "version": 4}
    # Only the restarted leader is left: it leads again in a new epoch.
    again = decide([0, 1, 2], state(0, 2, [0]), {0, 1, 2}, False, False, {0})
    assert again is not None and again["leader"] == 0 and again["leader_epoch"] == 3
