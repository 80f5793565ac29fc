"""The leader's ISR and high watermark rules (replica_state), alone.

Issue 16 item 2: a follower joins the ISR only while it is registered live
(under the registration its fetches were made with) and it fetched up to the
HW within replica.lag.time.max.ms; its last known LEO alone is not enough.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tidelog_broker.replica_state import (
    FollowerProgress,
    PartitionReplication,
    Role,
    may_join_isr,
)

LEADER = 0
LAG_MS = 3_000


def _leading(isr: list[int], leo: int = 10) -> PartitionReplication:
    state = PartitionReplication("t", 0, Role.LEADER, LEADER, 1, [0, 1, 2], isr, since_ms=0)
    state.start_leading(LEADER, leo)
    return state


def test_a_frozen_follower_whose_last_leo_reached_the_hw_does_not_rejoin() -> None:
    # The sequence: 2 fetched everything, froze, its lease expired and
    # the controller took it out; the HW has not moved since.
    state = _leading([0, 1, 2])
    live = {1: 5, 2: 6}
    state.on_follower_fetch(1, 10, 10, now_ms=100, registration=5)
    state.on_follower_fetch(2, 10, 10, now_ms=100, registration=6)
    del live[2]
    state.isr = [0, 1]
    state.on_follower_fetch(1, 10, 10, now_ms=1_000, registration=5)
    assert state.isr_to_expand(1_000, LAG_MS, live.get) is None
    # Still none once its last fetch is old, even were it registered again.
    live[2] = 6
    assert state.isr_to_expand(100 + LAG_MS + 1, LAG_MS, live.get) is None


def test_a_live_follower_that_fetched_up_to_the_hw_recently_joins() -> None:
    state = _leading([0, 1])
    state.on_follower_fetch(2, 10, 10, now_ms=500, registration=6)
    assert state.isr_to_expand(500, LAG_MS, {1: 5, 2: 6}.get) == [0, 1, 2]


def test_progress_from_an_earlier_registration_does_not_count() -> None:
    # Broker 2 fetched, died, and came back (a new registration, maybe an
    # empty disk): the old incarnation's LEO says nothing about the new one.
    state = _leading([0, 1])
    state.on_follower_fetch(2, 10, 10, now_ms=500, registration=6)
    assert state.isr_to_expand(600, LAG_MS, {1: 5, 2: 9}.get) is None
    state.on_follower_fetch(2, 10, 10, now_ms=700, registration=9)
    assert state.isr_to_expand(700, LAG_MS, {1: 5, 2: 9}.get) == [0, 1, 2]


def test_a_follower_below_the_hw_or_the_epoch_start_does_not_join() -> None:
    progress = FollowerProgress(log_end_offset=9, last_fetch_ms=0, registration=1)
    common = {"now_ms": 0, "lag_ms": LAG_MS, "live_registration": 1}
    assert not may_join_isr(progress, high_watermark=10, epoch_start_offset=0, **common)
    assert not may_join_isr(progress, high_watermark=5, epoch_start_offset=10, **common)
    assert may_join_isr(progress, high_watermark=9, epoch_start_offset=9, **common)


def test_a_replica_that_is_not_assigned_never_joins() -> None:
    state = _leading([0, 1])
    state.on_follower_fetch(99, 10, 10, now_ms=0, registration=1)
    assert state.isr_to_expand(0, LAG_MS, lambda _b: 1) is None


# ------------------------------------------------------------ properties

#: One step of the leader's life: ("append", n) | ("fetch", follower, delta,
#: gap_ms) | ("die", follower) | ("register", follower) | ("shrink",) .
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 50)),
        st.tuples(
            st.just("fetch"), st.sampled_from([1, 2]), st.integers(0, 60), st.integers(0, 1_500)
        ),
        st.tuples(st.just("die"), st.sampled_from([1, 2])),
        st.tuples(st.just("register"), st.sampled_from([1, 2])),
        st.tuples(st.just("shrink"), st.integers(0, 4_000)),
    ),
    max_size=60,
)


@settings(max_examples=1000, deadline=None)
@given(_steps)
def test_hw_and_isr_rules_hold_over_any_history(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    """The HW never goes backwards and never passes an ISR member's LEO (nor
    the leader's); a follower enters the ISR only live, caught up, recently."""
    leo = 0
    now_ms = 0
    next_revision = 10
    live: dict[int, int] = {1: 1, 2: 2}
    follower_leo = {1: 0, 2: 0}
    state = _leading([0, 1, 2], leo)
    last_hw = state.high_watermark

    def check() -> None:
        nonlocal last_hw
        assert state.high_watermark >= last_hw
        last_hw = state.high_watermark
        assert state.high_watermark <= leo
        for member in state.isr:
            if member != LEADER:
                assert state.high_watermark <= state.followers[member].log_end_offset or (
                    # start_leading: a member that has not fetched yet holds the HW.
                    state.high_watermark == 0
                )

    for step in steps:
        kind = step[0]
        if kind == "append":
            leo += step[1]
            state.advance_high_watermark(LEADER, leo)
        elif kind == "fetch":
            _, follower, delta, gap_ms = step
            now_ms += gap_ms
            follower_leo[follower] = min(leo, follower_leo[follower] + delta)
            registration = live.get(follower)
            if registration is None:
                continue  # the servicer refuses a fetch from a dead replica
            state.on_follower_fetch(follower, follower_leo[follower], leo, now_ms, registration)
            state.on_answer(follower, leo)
            state.advance_high_watermark(LEADER, leo)
            expanded = state.isr_to_expand(now_ms, LAG_MS, live.get)
            if expanded is not None:
                for joined in set(expanded) - set(state.isr):
                    progress = state.followers[joined]
                    assert joined in live and progress.registration == live[joined]
                    assert now_ms - progress.last_fetch_ms <= LAG_MS
                    assert progress.log_end_offset >= state.high_watermark
                state.isr = expanded  # the watch brings the written ISR back
        elif kind == "die":
            live.pop(step[1], None)
            # The controller removes a dead broker from the ISR.
            state.isr = [r for r in state.isr if r != step[1]]
        elif kind == "register":
            if step[1] not in live:
                live[step[1]] = next_revision
                next_revision += 1
        else:
            now_ms += step[1]
            shrunk = state.isr_to_shrink(LEADER, now_ms, LAG_MS)
            if shrunk is not None:
                state.isr = shrunk
                state.advance_high_watermark(LEADER, leo)
        check()
