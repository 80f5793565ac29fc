"""The controller never adds a replica to a partition's ISR within a leader
epoch: only the leader does, by a proposal whose replicas hold its high
watermark until the watch brings the change back (the broker's
replica_state). Every state the controller writes (leader election,
preferred election, unclean election, reassignment start, cancel and
completion) keeps the ISR or cuts it, or starts a new epoch; a new leader
always leads in a new epoch. A controller write that added a replica within
the epoch would let the leader's HW pass that replica's log end until its
watch applied the write, and the controller could then elect the replica,
losing acknowledged records.

(Topic creation and CreatePartitions write epoch-0 states of partitions that
had none, so that no leader exists yet to hold a HW.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tidelog_coordinator import reassignment
from tidelog_coordinator.leader_election import decide
from tidelog_server.etcd.records import PartitionState

BROKERS = st.integers(min_value=0, max_value=5)
BROKER_LISTS = st.lists(BROKERS, max_size=6, unique=True)
BROKER_SETS = st.sets(BROKERS, max_size=6)
STATES = st.builds(
    PartitionState,
    leader=st.integers(min_value=-1, max_value=5),
    leader_epoch=st.integers(min_value=0, max_value=9),
    isr=BROKER_LISTS.map(tuple),
    version=st.integers(min_value=1, max_value=9),
)


def check_no_expansion_within_the_epoch(old: PartitionState, new: PartitionState | None) -> None:
    if new is None or new is old:
        return
    assert new.leader_epoch in (old.leader_epoch, old.leader_epoch + 1)
    if new.leader != old.leader:
        assert new.leader_epoch == old.leader_epoch + 1, "a new leader in the same epoch"
    if new.leader_epoch == old.leader_epoch:
        added = set(new.isr) - set(old.isr)
        assert not added, f"{sorted(added)} added to the ISR within epoch {old.leader_epoch}"


@given(
    replicas=BROKER_LISTS,
    state=STATES,
    live=BROKER_SETS,
    unclean=st.booleans(),
    preferred=st.booleans(),
    restarted=BROKER_SETS,
    offline=BROKER_SETS,
)
def test_leader_election_never_adds_to_the_isr_within_an_epoch(
    replicas: list[int],
    state: PartitionState,
    live: set[int],
    unclean: bool,
    preferred: bool,
    restarted: set[int],
    offline: set[int],
) -> None:
    new = decide(replicas, state, live, unclean, preferred, restarted & live, offline & live)
    check_no_expansion_within_the_epoch(state, new)


@given(
    replicas=BROKER_LISTS,
    state=STATES,
    live=BROKER_SETS,
    unclean=st.booleans(),
    preferred=st.booleans(),
    restarted=BROKER_SETS,
    offline=BROKER_SETS,
)
def test_leader_election_never_leaves_an_offline_replica_leading_or_in_a_led_isr(
    replicas: list[int],
    state: PartitionState,
    live: set[int],
    unclean: bool,
    preferred: bool,
    restarted: set[int],
    offline: set[int],
) -> None:
    """A replica whose log is offline (its broker's registration says so)
    is never elected, and a partition with a live leader keeps none in its
    ISR: the decision moves the leadership and shrinks the ISR, or the
    state it leaves already has neither. (Leaderless, the ISR is kept: its
    members are the ones to wait for.)"""
    offline &= live
    new = decide(replicas, state, live, unclean, preferred, restarted & live, offline)
    after = state if new is None else new
    if after.leader >= 0 and after.leader in live:
        assert after.leader not in offline, (state, new)
        assert not offline & set(after.isr), (state, new)


@given(replicas=BROKER_LISTS, state=STATES, live=BROKER_SETS)
def test_a_reassignment_step_never_adds_to_the_isr_within_an_epoch(
    replicas: list[int], state: PartitionState, live: set[int]
) -> None:
    # Start, cancel and completion all write state_for_replicas(replicas).
    new = reassignment.state_for_replicas(replicas, state, live)
    check_no_expansion_within_the_epoch(state, new)
