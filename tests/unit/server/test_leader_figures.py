"""complete_from_leaders on a partition without a live leader: offline (no
replica can lead it until one is back: the error says so, names each
in-sync replica, why it cannot serve and what brings it back) or waiting
for an election (retry), by the controller's rule, unclean election
included. Before, every such partition was described "has no leader right
now ...; retry", which waiting never fixed.

No leader is asked for these partitions (none is live), so `ask` fails the
test if called; the coordinator's placement, offline replicas and configs
are the answer the function completes, built here as the coordinator
builds it.

And a live leader's own answer is taken only when it names itself as the
leader: a placement lagging an election named a follower, whose figures
were shown as the leader's (a real cluster: test_describe_topics_figures)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from tidelog.v1 import admin_pb2, common_pb2
from tidelog_server.leader_figures import (
    HEALTH_RUNBOOK,
    OFFLINE_LOG_RUNBOOK,
    complete_from_leaders,
)

TOPIC = "t"
#: Live brokers and their addresses; 3 and 4 are down (not registered).
LIVE = {0: "127.0.0.1:9000", 1: "127.0.0.1:9001", 2: "127.0.0.1:9002"}
RUNBOOK = '(see docs/operations.md, "A partition\'s log goes offline (STORAGE_ERROR)")'
HEALTH = '(see docs/operations.md, "Is the cluster healthy?")'


async def _never_asked(
    leader: int, address: str, request: admin_pb2.DescribeTopicsRequest
) -> admin_pb2.DescribeTopicsResponse:
    raise AssertionError(f"broker {leader} asked, though it leads none of these partitions")


def _described(
    *,
    leader: int = -1,
    replicas: Sequence[int],
    isr: Sequence[int],
    offline: Sequence[int],
    unclean: str = "false",
    elr: Sequence[int] = (),
    torn: Sequence[int] = (),
) -> admin_pb2.PartitionDescription:
    response = admin_pb2.DescribeTopicsResponse(
        topics=[
            admin_pb2.TopicDescription(
                name=TOPIC,
                partitions=[
                    admin_pb2.PartitionDescription(
                        partition=0,
                        leader_id=leader,
                        replicas=replicas,
                        isr=isr,
                        offline_replicas=offline,
                        eligible_leader_replicas=elr,
                        torn_replicas=torn,
                    )
                ],
                configs={"unclean.leader.election.enable": unclean, "retention.ms": "1"},
            )
        ]
    )
    asyncio.run(complete_from_leaders(response, LIVE.get, _never_asked))
    (partition,) = response.topics[0].partitions
    assert (partition.log_start_offset, partition.log_end_offset, partition.high_watermark) == (
        -1,
        -1,
        -1,
    )
    assert (partition.size_bytes, partition.segment_count) == (-1, -1)
    return partition


def test_a_partition_whose_in_sync_replicas_logs_are_offline_is_offline() -> None:
    p = _described(replicas=[1, 2], isr=[1, 2], offline=[1, 2])
    assert p.error.code == common_pb2.STORAGE_ERROR
    assert p.error.message == (
        f"{TOPIC}-0 is offline: no in-sync replica can serve (broker 1: its log is offline; "
        "broker 2: its log is offline) and no other replica can either, so it has no leader "
        "until one of them is back: fix the disk of brokers 1, 2 and restart them "
        f"{RUNBOOK}; its log figures are unknown"
    )


def test_a_partition_whose_in_sync_replica_is_on_a_down_broker_is_offline() -> None:
    # Its broker leads again once started: not a disk to fix.
    p = _described(replicas=[3], isr=[3], offline=[3])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0 is offline: no in-sync replica can serve (broker 3: down (not "
        "registered)) and no other replica can either, so it has no leader until one of them "
        f"is back: start broker 3 again {HEALTH}; its log figures are unknown"
    )


def test_each_in_sync_replica_is_named_with_its_own_cause_and_remedy() -> None:
    p = _described(replicas=[1, 4, 3], isr=[1, 4, 3], offline=[1, 4, 3])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert "(broker 1: its log is offline; broker 4: down (not registered); broker 3: down" in (
        p.error.message
    )
    assert "fix the disk of broker 1 and restart it; start brokers 3, 4 again " in p.error.message


def test_an_offline_partition_points_at_an_unclean_election_where_one_could_lead() -> None:
    # Broker 0 is live and can serve, but out of the ISR: an unclean
    # election would let it lead.
    p = _described(replicas=[1, 0], isr=[1], offline=[1])
    assert p.error.code == common_pb2.STORAGE_ERROR
    assert p.error.message == (
        f"{TOPIC}-0 is offline: no in-sync replica can serve (broker 1: its log is offline) "
        "and unclean.leader.election.enable is false, so it has no leader until one of them "
        "is back: fix the disk of broker 1 and restart it; or set "
        f"unclean.leader.election.enable=true on topic {TOPIC!r} to let broker 0 lead, "
        f"losing the records only the in-sync replicas have {RUNBOOK}; its log figures are "
        "unknown"
    )


@pytest.mark.parametrize(
    ("replicas", "isr", "offline", "unclean"),
    [
        # An in-sync replica can serve: the controller elects it.
        ([1, 2], [1, 2], [1], "false"),
        # None can, but the topic allows an unclean election of broker 0.
        ([1, 0], [1], [1], "true"),
        # No state yet (a topic just created): its first election is due.
        ([1], [], [], "false"),
        # A server older than offline_replicas lists none.
        ([3], [3], [], "false"),
    ],
)
def test_a_partition_an_election_will_lead_is_to_be_retried(
    replicas: list[int], isr: list[int], offline: list[int], unclean: str
) -> None:
    p = _described(replicas=replicas, isr=isr, offline=offline, unclean=unclean)
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0 has no leader right now (replicas {', '.join(map(str, replicas))}): "
        "its log figures are unknown; retry"
    )


def test_a_live_untorn_eligible_leader_replica_keeps_the_partition_from_being_offline() -> None:
    # ISR [3] is down; broker 1 (eligible, KIP-966) is live: the controller
    # elects it. Before, describe called the partition offline.
    p = _described(replicas=[1, 3], isr=[3], offline=[3], elr=[1])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0 has no leader right now (replicas 1, 3): its log figures are unknown; retry"
    )


def test_eligible_leader_replicas_that_cannot_serve_are_named_in_the_offline_error() -> None:
    p = _described(replicas=[1, 3, 0], isr=[3], offline=[3, 1], elr=[1])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0 is offline: no in-sync or eligible leader replica can serve (broker 3: "
        "down (not registered); broker 1 (eligible leader replica): its log is offline) and "
        "unclean.leader.election.enable is false, so it has no leader until one of them is "
        "back: fix the disk of broker 1 and restart it; start broker 3 again; or set "
        f"unclean.leader.election.enable=true on topic {TOPIC!r} to let broker 0 lead, losing "
        f"the records only the in-sync and eligible leader replicas have {RUNBOOK}; its log "
        "figures are unknown"
    )


@pytest.mark.parametrize(
    ("isr", "elr", "torn", "clause"),
    [
        # The torn ISR member waits for the away eligible one.
        (
            [1],
            [2],
            [1],
            "; in-sync broker 1 may have lost the tail of its log at restart and "
            "is not elected while broker 2 (eligible leader replica) may return (start it again;",
        ),
        # A torn eligible one waits for the away ISR member.
        (
            [3],
            [2],
            [2],
            "; broker 2 (eligible leader replica) may have lost the tail of its "
            "log at restart and is not elected while in-sync broker 3 may return (start it "
            "again;",
        ),
        # Both away: torn ISR members wait for both.
        (
            [1, 3],
            [4],
            [1],
            "; in-sync broker 1 may have lost the tail of its log at restart "
            "and is not elected while in-sync broker 3 and broker 4 (eligible leader replica) "
            "may return (start them again;",
        ),
    ],
)
def test_a_torn_member_waiting_for_others_says_whom_it_waits_for(
    isr: list[int], elr: list[int], torn: list[int], clause: str
) -> None:
    p = _described(replicas=[1, 2, 3, 4], isr=isr, offline=[3, 4], elr=elr, torn=torn)
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message.startswith(
        f"{TOPIC}-0 has no leader right now (replicas 1, 2, 3, 4){clause}"
    ), p.error.message


def test_a_down_leader_without_an_in_sync_replica_that_can_serve_is_offline() -> None:
    # Until the controller writes leader -1, the state still names it.
    p = _described(leader=3, replicas=[3, 1], isr=[3, 1], offline=[3, 1])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message.startswith(
        f"{TOPIC}-0 is offline: no in-sync replica can serve (broker 3: down (not registered); "
        "broker 1: its log is offline) and no other replica can either"
    ), p.error.message


def test_a_down_leader_with_an_in_sync_replica_that_can_serve_is_to_be_retried() -> None:
    p = _described(leader=3, replicas=[3, 1], isr=[3, 1], offline=[3])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0: its leader, broker 3, is not live (not registered): "
        "its log figures are unknown; retry"
    )


def test_the_runbooks_the_errors_point_at_exist() -> None:
    # An operator follows the pointer: a renamed section would leave it dangling.
    headings = (Path(__file__).parents[3] / "docs" / "operations.md").read_text().splitlines()
    for pointer in (OFFLINE_LOG_RUNBOOK, HEALTH_RUNBOOK):
        (section,) = re.findall(r'"(.+)"', pointer)
        assert f"## {section}" in headings, pointer


def _completed_by_own_answer(named_leader: int) -> admin_pb2.PartitionDescription:
    """Partition 0 placed on leader 1, whose own answer (as a broker answers
    with tidelog-local) names `named_leader` as the leader it knows."""

    async def broker_1(
        leader: int, address: str, request: admin_pb2.DescribeTopicsRequest
    ) -> admin_pb2.DescribeTopicsResponse:
        assert (leader, address, list(request.names)) == (1, LIVE[1], [TOPIC])
        answer = admin_pb2.DescribeTopicsResponse()
        answer.topics.add(name=TOPIC).partitions.add(
            partition=0,
            leader_id=named_leader,
            log_start_offset=2,
            log_end_offset=42,
            high_watermark=40,
            size_bytes=4096,
            segment_count=1,
        )
        return answer

    response = admin_pb2.DescribeTopicsResponse()
    response.topics.add(name=TOPIC).partitions.add(
        partition=0, leader_id=1, replicas=[1, 2], isr=[1, 2]
    )
    asyncio.run(complete_from_leaders(response, LIVE.get, broker_1))
    (partition,) = response.topics[0].partitions
    return partition


def test_a_leader_naming_itself_gives_its_figures_as_an_older_broker_always_did() -> None:
    p = _completed_by_own_answer(1)
    assert not p.HasField("error"), p
    assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (2, 42, 40)
    assert (p.size_bytes, p.segment_count) == (4096, 1)


@pytest.mark.parametrize(
    ("named", "knows"), [(2, "it follows broker 2"), (-1, "it knows no leader right now")]
)
def test_a_leader_whose_own_answer_names_another_leader_or_none_gives_no_figures(
    named: int, knows: str
) -> None:
    # The placement lags an election: broker 1's figures are a follower's.
    p = _completed_by_own_answer(named)
    assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (-1, -1, -1)
    assert (p.size_bytes, p.segment_count) == (-1, -1)
    assert p.leader_id == 1  # the placement as it was given
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0: broker 1 at {LIVE[1]}, its leader as known here, does not lead it by its "
        f"own answer ({knows}): the leadership moved, or the broker has not taken it up yet; "
        "its log figures are unknown; retry"
    )


def test_an_in_sync_replica_outside_the_assignment_keeps_the_partition_offline() -> None:
    # The controller never elects broker 0 (not a replica), however live it
    # is: before, the describe path took it for an ISR member that could
    # serve and said "retry", while the partition stayed leaderless.
    p = _described(replicas=[1, 3], isr=[0, 1], offline=[1, 3])
    assert p.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert p.error.message == (
        f"{TOPIC}-0 is offline: no in-sync replica can serve (broker 0: not one of its "
        "replicas, never elected; broker 1: its log is offline) and no other replica can "
        "either, so it has no leader until one of them is back: fix the disk of broker 1 and "
        f"restart it; reassign the partition to include broker 0 {RUNBOOK}; its log figures "
        "are unknown"
    )
