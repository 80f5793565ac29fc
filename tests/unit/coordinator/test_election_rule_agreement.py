"""The describe path's verdict on a leaderless partition agrees with the
controller's election: `tidelog topics describe` calls a partition offline
(`offline_partition_error`) exactly when the controller's `decide` would
elect nobody for it. Both apply `tidelog_server.election_rule`; this pins
that neither drifts from it with a caller's own filtering (which replicas
count, what can serve).

A table of every case on three replicas: each broker live, down (not
registered) or live with its log of the partition offline; every ISR,
including one with a broker outside the assignment (a hand-edited state,
or one written around a reassignment); every set of eligible leader
replicas (`PartitionState.elr`, KIP-966) among the brokers outside the ISR,
broker 4 too, which an election takes after the ISR members (an ELR member
that can serve keeps a partition from being offline); no leader or a down one; unclean
election on or off; the live brokers restarted since the state was
written or not. The describe side gets what the coordinator answers
DescribeTopics with (`LiveBrokers.offline_replicas`, the effective
configs), the controller side what its pass reads (`LiveBrokers`).

Not in the table: an empty ISR. The describe path cannot tell it from a
partition whose state is not written yet (a topic being created), whose
first election is due, and calls neither offline; the controller never
writes an empty ISR."""

from __future__ import annotations

import itertools

from tidelog.v1 import admin_pb2
from tidelog_coordinator.leader_election import LiveBrokers, decide
from tidelog_server.etcd.records import PartitionState
from tidelog_server.leader_figures import offline_partition_error

TOPIC = "t"
REPLICAS = (1, 2, 3)
#: Broker 4 hosts no replica of the partition; it only ever shows in an ISR.
BROKERS = (1, 2, 3, 4)
LIVE, DOWN, LOG_OFFLINE = "live", "down", "log offline"


Case = tuple[dict[int, str], tuple[int, ...], tuple[int, ...], int, bool, bool]


def _cases() -> list[Case]:
    cases = []
    for statuses in itertools.product((LIVE, DOWN, LOG_OFFLINE), repeat=len(BROKERS)):
        status = dict(zip(BROKERS, statuses, strict=True))
        for size in range(1, len(BROKERS) + 1):
            for isr in itertools.permutations(BROKERS, size):
                rest = [b for b in BROKERS if b not in isr]
                for elr in _subsets(rest):
                    down = [b for b in isr if status[b] == DOWN]
                    for leader in (-1, *down[:1]):
                        for unclean in (False, True):
                            for restarted in (False, True):
                                cases.append((status, isr, elr, leader, unclean, restarted))
    return cases


def _subsets(ids: list[int]) -> list[tuple[int, ...]]:
    return [s for n in range(len(ids) + 1) for s in itertools.combinations(ids, n)]


def _controller_elects_nobody(
    status: dict[int, str],
    isr: tuple[int, ...],
    elr: tuple[int, ...],
    leader: int,
    unclean: bool,
    restarted: bool,
) -> bool:
    brokers = _live_brokers(status, restarted)
    state = PartitionState(leader, 7, isr, 11, elr)
    live = set(brokers.registered)
    new = decide(
        list(REPLICAS),
        state,
        live,
        unclean,
        preferred=False,
        restarted=live if restarted else set(),
        offline=brokers.offline_of(TOPIC, 0),
    )
    return (new.leader if new is not None else state.leader) < 0


def _describe_says_offline(
    status: dict[int, str], isr: tuple[int, ...], elr: tuple[int, ...], leader: int, unclean: bool
) -> bool:
    brokers = _live_brokers(status, restarted=False)
    topic = admin_pb2.TopicDescription(
        name=TOPIC,
        configs={"unclean.leader.election.enable": "true" if unclean else "false"},
    )
    partition = admin_pb2.PartitionDescription(
        partition=0,
        leader_id=leader,
        replicas=REPLICAS,
        isr=isr,
        eligible_leader_replicas=elr,
        offline_replicas=brokers.offline_replicas(TOPIC, 0, REPLICAS),
    )
    address_of = {b: f"127.0.0.1:{9000 + b}" for b in brokers.registered}.get
    return offline_partition_error(topic, partition, address_of) is not None


def _live_brokers(status: dict[int, str], restarted: bool) -> LiveBrokers:
    # A state written at revision 100; a broker registered after it restarted since.
    revision = 200 if restarted else 50
    return LiveBrokers(
        {b: revision for b, s in status.items() if s != DOWN},
        {(TOPIC, 0): frozenset(b for b, s in status.items() if s == LOG_OFFLINE)},
    )


def test_describe_calls_a_partition_offline_exactly_when_the_controller_elects_nobody() -> None:
    cases = _cases()
    assert len(cases) > 10_000
    assert sum(1 for case in cases if case[2]) > 10_000  # with eligible leader replicas
    disagreements = [
        (status, isr, elr, leader, unclean, restarted, elects_nobody)
        for status, isr, elr, leader, unclean, restarted in cases
        if (
            elects_nobody := _controller_elects_nobody(status, isr, elr, leader, unclean, restarted)
        )
        != _describe_says_offline(status, isr, elr, leader, unclean)
    ]
    assert not disagreements, (
        f"{len(disagreements)} of {len(cases)} disagree, e.g. (statuses, isr, elr, leader, "
        f"unclean, restarted, controller elects nobody): {disagreements[:5]}"
    )
