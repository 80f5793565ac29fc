"""Which partitions `tidelog topics describe`'s filters keep (in_trouble),
offline replicas included: as kafka-topics, an offline replica makes its
partition under-replicated, and a leader whose log is offline leaves it
unavailable."""

from __future__ import annotations

from tidelog.cli.topics import in_trouble
from tidelog.types import PartitionInfo, TopicDescription

UNDER = "--under-replicated-partitions"
UNAVAILABLE = "--unavailable-partitions"
LIVE = {1, 2, 3}


def partition(
    leader: int, isr: list[int], offline: list[int], replicas: tuple[int, ...] = (1, 2, 3)
) -> PartitionInfo:
    return PartitionInfo(0, leader, list(replicas), isr, 0, 0, 0, 0, 1, offline_replicas=offline)


def kept(only: str, info: PartitionInfo) -> bool:
    return in_trouble(only, TopicDescription("t", [info], {}), info, LIVE)


def test_a_full_isr_without_offline_replicas_is_in_no_trouble() -> None:
    healthy = partition(1, [1, 2, 3], [])
    assert not kept(UNDER, healthy) and not kept(UNAVAILABLE, healthy)


def test_an_offline_replica_is_under_replicated_even_before_it_leaves_the_isr() -> None:
    # The controller has not written the smaller ISR yet.
    assert kept(UNDER, partition(1, [1, 2, 3], [3]))
    assert kept(UNDER, partition(1, [1, 2], [3]))
    assert not kept(UNAVAILABLE, partition(1, [1, 2], [3]))


def test_a_leader_whose_log_is_offline_is_unavailable() -> None:
    assert kept(UNAVAILABLE, partition(1, [1, 2, 3], [1]))
    assert kept(UNAVAILABLE, partition(-1, [1], [2]))


def test_a_partition_whose_only_replica_is_down_is_unavailable_not_under_replicated() -> None:
    # Its broker (not live, so offline) is the whole ISR, kept by the
    # controller for its return: as kafka-topics, unavailable only. Also
    # while the dead leader is not fenced yet (leader still 3).
    for leader in (-1, 3):
        alone = partition(leader, [3], [3], replicas=(3,))
        assert not kept(UNDER, alone), leader
        assert kept(UNAVAILABLE, alone), leader


def test_a_dead_follower_still_in_the_isr_is_under_replicated() -> None:
    # Reported offline (its broker is down) before the controller's pass
    # takes it out of the ISR.
    assert kept(UNDER, partition(1, [1, 2, 3], [2]))
    assert not kept(UNAVAILABLE, partition(1, [1, 2, 3], [2]))
