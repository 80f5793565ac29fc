"""Hostile clients of the Group service, against a real coordinator on real etcd.

Each test sends what an attacker with raw stubs would (issue 16, items 6
and 9) and checks that the coordinator refuses it precisely and that the
group and the coordinator itself carry on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from tidelog.errors import InvalidRequestError
from tidelog.group import GroupMembership, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc, common_pb2, group_pb2, group_pb2_grpc
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.group_support import setup_topic
from tests.integration.coordinator.helpers import etcd_client, eventually
from tests.integration.coordinator.test_groups import describe
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(90)

SESSION_MS = 2_000
#: The coordinator's own registration lease in these tests (start_coordinator's default).
COORDINATOR_TTL_S = 2
MB = 1 << 20


async def first_response(
    address: str, *requests: group_pb2.GroupHeartbeatRequest
) -> group_pb2.GroupHeartbeatResponse:
    """Open a Heartbeat stream, send `requests`, return the first answer."""

    async def send() -> AsyncIterator[group_pb2.GroupHeartbeatRequest]:
        for request in requests:
            yield request
        await asyncio.sleep(30)  # keep the stream open while we read

    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 8 * MB)]
    ) as channel:
        call = group_pb2_grpc.GroupStub(channel).Heartbeat(send())
        try:
            async for response in call:
                return response
        finally:
            call.cancel()
    raise AssertionError("the stream ended without an answer")


def join_request(**fields: object) -> group_pb2.GroupHeartbeatRequest:
    defaults: dict[str, object] = {
        "group_id": "g",
        "subscribed_topics": ["t"],
        "session_timeout_ms": SESSION_MS,
    }
    return group_pb2.GroupHeartbeatRequest(**{**defaults, **fields})  # type: ignore[arg-type]


async def unary(address: str, method: str, request: object) -> object:
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 8 * MB)]
    ) as channel:
        return await getattr(group_pb2_grpc.GroupStub(channel), method)(request, timeout=10)


# ------------------------------------------------------------------ item 6


def test_backtracking_topic_regex_leaves_the_coordinator_serving(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    """`(a+)+b` against a long topic name backtracks for ever in Python's `re`:
    it held the event loop, the registration expired and nothing answered."""
    coordinator = coordinators()
    long_topic = "a" * 200

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, long_topic, 2)
        hostile = GroupMembership(
            coordinator.address, "hostile", pattern="(a+)+b", session_timeout_ms=SESSION_MS
        )
        honest = GroupMembership(
            coordinator.address, "honest", pattern="a+", session_timeout_ms=SESSION_MS
        )
        try:
            await hostile.start()
            await hostile.wait_for(lambda m: bool(m.member_id), timeout_s=10)
            # Outlive the coordinator's own lease several times over: its
            # registration must still be there, and it must still answer.
            await asyncio.sleep(3 * COORDINATOR_TTL_S)
            async with etcd_client(etcd.endpoint) as client:
                assert await client.get(Keys(prefix).coordinator("c0")) is not None
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                cluster = await cluster_pb2_grpc.ClusterStub(channel).DescribeCluster(
                    cluster_pb2.DescribeClusterRequest(), timeout=10
                )
                assert cluster.controller_id == "c0"
            # Patterns still work: another group's member matching the long
            # topic gets its partitions.
            await honest.start()
            await honest.wait_for(lambda m: len(m.assignment) == 2, timeout_s=10)
            assert hostile.assignment == frozenset()
            assert (await describe(coordinator.address, "hostile")).members
        finally:
            await hostile.close()
            await honest.close()

    asyncio.run(run())


def test_topic_regex_is_bounded_and_must_be_re2(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 1)
        too_long = await first_response(
            coordinator.address,
            join_request(subscribed_topics=[], subscribed_topic_regex="a" * 1001),
        )
        assert too_long.error.code == common_pb2.INVALID_REQUEST
        assert "subscribed_topic_regex" in too_long.error.message
        assert "at most 1000" in too_long.error.message
        backreference = await first_response(
            coordinator.address, join_request(subscribed_topics=[], subscribed_topic_regex=r"(a)\1")
        )
        assert backreference.error.code == common_pb2.INVALID_REQUEST
        assert "RE2" in backreference.error.message
        async with etcd_client(etcd.endpoint) as client:
            assert not await client.get_prefix(Keys(prefix).members("g"))

    asyncio.run(run())


# ------------------------------------------------------------------ item 9


def test_anonymous_commit_is_refused_and_alter_offsets_is_the_admin_path(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()
    tp = TopicPartition("t", 0)

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 2)
        offsets = OffsetStoreClient(coordinator.address)
        member = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=SESSION_MS
        )
        try:
            await offsets.alter("g", {tp: 5})  # an empty group: the admin may
            anonymous = await unary(
                coordinator.address,
                "CommitOffsets",
                group_pb2.CommitOffsetsRequest(
                    group_id="g",
                    member_id="",
                    member_epoch=-1,
                    offsets=[group_pb2.OffsetCommit(topic="t", partition=0, offset=7)],
                ),
            )
            assert isinstance(anonymous, group_pb2.CommitOffsetsResponse)
            assert anonymous.error.code == common_pb2.UNKNOWN_MEMBER_ID
            assert "AlterOffsets" in anonymous.error.message
            assert (await offsets.fetch("g"))[tp].offset == 5
            # With a live member, only the member commits.
            await member.start()
            await member.wait_for(lambda m: len(m.assignment) == 2, timeout_s=10)
            altered = await unary(
                coordinator.address,
                "AlterOffsets",
                group_pb2.AlterOffsetsRequest(
                    group_id="g", offsets=[group_pb2.OffsetCommit(topic="t", partition=0, offset=1)]
                ),
            )
            assert isinstance(altered, group_pb2.AlterOffsetsResponse)
            assert altered.error.code == common_pb2.NON_EMPTY_GROUP
            await member.commit({tp: 9})
            assert (await offsets.fetch("g"))[tp].offset == 9
        finally:
            await member.close()
            await offsets.close()

    asyncio.run(run())


def test_member_id_read_from_describe_neither_takes_over_nor_removes_the_member(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 2)
        member = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=SESSION_MS
        )
        try:
            await member.start()
            await member.wait_for(lambda m: len(m.assignment) == 2, timeout_s=10)
            (seen,) = (await describe(coordinator.address, "g")).members
            assert seen.member_id == member.member_id
            # Re-attaching as the member with what DescribeGroup shows.
            takeover = await first_response(
                coordinator.address,
                join_request(member_id=seen.member_id, member_epoch=seen.member_epoch),
            )
            assert takeover.error.code == common_pb2.UNKNOWN_MEMBER_ID
            assert not takeover.member_token
            # Removing it.
            left = await unary(
                coordinator.address,
                "LeaveGroup",
                group_pb2.LeaveGroupRequest(group_id="g", member_id=seen.member_id),
            )
            assert isinstance(left, group_pb2.LeaveGroupResponse)
            assert left.error.code == common_pb2.UNKNOWN_MEMBER_ID
            # Committing in its name.
            committed = await unary(
                coordinator.address,
                "CommitOffsets",
                group_pb2.CommitOffsetsRequest(
                    group_id="g",
                    member_id=seen.member_id,
                    member_epoch=seen.member_epoch,
                    offsets=[group_pb2.OffsetCommit(topic="t", partition=0, offset=7)],
                ),
            )
            assert isinstance(committed, group_pb2.CommitOffsetsResponse)
            assert committed.error.code == common_pb2.UNKNOWN_MEMBER_ID
            # The member is untouched, keeps its partitions and still commits.
            await asyncio.sleep(SESSION_MS / 1000)
            (after,) = (await describe(coordinator.address, "g")).members
            assert after.member_id == member.member_id and len(after.owned) == 2
            assert len(member.assignment) == 2
            await member.commit({TopicPartition("t", 0): 3})
            # And the member itself can leave (it holds its token).
            await member.leave()
            assert not (await describe(coordinator.address, "g")).members
        finally:
            await member.close()

    asyncio.run(run())


def test_oversized_fields_are_refused_naming_the_limit(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 1)
        cases = {
            "member_id": join_request(member_id="m" * MB),
            "group_instance_id": join_request(group_instance_id="i" * (3 * MB)),
            "client_id": join_request(client_id="c" * MB),
            "subscribed_topics": join_request(subscribed_topics=[f"t{i}" for i in range(100_000)]),
        }
        for field, request in cases.items():
            answer = await first_response(coordinator.address, request)
            assert answer.error.code == common_pb2.INVALID_REQUEST, field
            assert field in answer.error.message and "at most" in answer.error.message
            assert answer.ByteSize() < 1_000, f"{field}: the value came back"
        long_names = [f"{i:03}" + "x" * 246 for i in range(300)]
        answer = await first_response(
            coordinator.address, join_request(subscribed_topics=long_names)
        )
        assert answer.error.code == common_pb2.INVALID_REQUEST
        assert "characters in all: at most 65536" in answer.error.message
        left = await unary(
            coordinator.address,
            "LeaveGroup",
            group_pb2.LeaveGroupRequest(group_id="g", member_id="m" * MB),
        )
        assert isinstance(left, group_pb2.LeaveGroupResponse)
        assert left.error.code == common_pb2.INVALID_REQUEST and left.ByteSize() < 1_000
        described = await unary(
            coordinator.address, "DescribeGroup", group_pb2.DescribeGroupRequest(group_id="g" * MB)
        )
        assert isinstance(described, group_pb2.DescribeGroupResponse)
        assert described.error.code == common_pb2.INVALID_REQUEST
        assert "249" in described.error.message and described.ByteSize() < 1_000
        fetched = await unary(
            coordinator.address,
            "FetchOffsets",
            group_pb2.FetchOffsetsRequest(
                group_id="g",
                partitions=[
                    common_pb2.TopicPartition(topic="t", partition=i) for i in range(20_000)
                ],
            ),
        )
        assert isinstance(fetched, group_pb2.FetchOffsetsResponse)
        assert fetched.error.code == common_pb2.INVALID_REQUEST
        assert "at most 10000" in fetched.error.message
        async with etcd_client(etcd.endpoint) as client:
            assert not await client.get_prefix(Keys(prefix).members("g"))
        # An offset past the documented maximum, even from a real member.
        member = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=SESSION_MS
        )
        try:
            await member.start()
            await member.wait_for(lambda m: len(m.assignment) == 1, timeout_s=10)
            with pytest.raises(InvalidRequestError, match="out of range"):
                await member.commit({TopicPartition("t", 0): 2**63 - 1})
            await member.commit({TopicPartition("t", 0): 2**53})
        finally:
            await member.close()

    asyncio.run(run())


def test_acknowledgement_cannot_claim_partitions_that_were_not_assigned(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    """A member claiming another member's partition in its ack would keep the
    partition from its owner (the coordinator waits for owners to release)."""
    coordinator = coordinators()

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 1)
        await setup_topic(etcd, prefix, coordinator.address, "u", 1)
        honest = GroupMembership(
            coordinator.address, "g", topics=["u"], session_timeout_ms=SESSION_MS
        )
        requests: asyncio.Queue[group_pb2.GroupHeartbeatRequest] = asyncio.Queue()
        requests.put_nowait(join_request(subscribed_topics=["t"]))

        async def send() -> AsyncIterator[group_pb2.GroupHeartbeatRequest]:
            while True:
                yield await requests.get()

        try:
            await honest.start()
            await honest.wait_for(lambda m: len(m.assignment) == 1, timeout_s=10)
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                call = group_pb2_grpc.GroupStub(channel).Heartbeat(send())
                try:
                    async for response in call:
                        assert response.error.code == common_pb2.NONE
                        if response.HasField("assignment"):
                            break
                    claimed = [
                        common_pb2.TopicPartition(topic="t", partition=0),
                        common_pb2.TopicPartition(topic="u", partition=0),
                    ]
                    requests.put_nowait(
                        group_pb2.GroupHeartbeatRequest(
                            ack=group_pb2.AssignmentAck(
                                member_epoch=response.member_epoch, owned=claimed
                            )
                        )
                    )

                    async def acknowledged() -> bool:
                        d = await describe(coordinator.address, "g")
                        hostile = [m for m in d.members if m.member_id == response.member_id]
                        return bool(hostile and hostile[0].owned)

                    await eventually(acknowledged, 10, "the hostile member's ack to be recorded")
                    d = await describe(coordinator.address, "g")
                    (hostile,) = [m for m in d.members if m.member_id == response.member_id]
                    assert [(tp.topic, tp.partition) for tp in hostile.owned] == [("t", 0)]
                finally:
                    call.cancel()
        finally:
            await honest.close()

    asyncio.run(run())


def test_a_full_group_refuses_new_members_but_not_a_static_restart(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators(extra_args=("--group-max-members", "2"))

    async def run() -> None:
        await setup_topic(etcd, prefix, coordinator.address, "t", 2)
        members = [
            GroupMembership(coordinator.address, "g", topics=["t"], session_timeout_ms=5_000,
                            group_instance_id=f"pod-{i}")
            for i in range(2)
        ]  # fmt: skip
        replacement = GroupMembership(
            coordinator.address, "g", topics=["t"], session_timeout_ms=5_000,
            group_instance_id="pod-0",
        )  # fmt: skip
        try:
            for m in members:
                await m.start()
            await members[1].wait_for(lambda m: len(m.assignment) == 1, timeout_s=10)
            await members[0].wait_for(lambda m: len(m.assignment) == 1, timeout_s=10)
            third = await first_response(coordinator.address, join_request())
            assert third.error.code == common_pb2.INVALID_REQUEST
            assert "at most 2" in third.error.message
            async with etcd_client(etcd.endpoint) as client:
                assert len(await client.get_prefix(Keys(prefix).members("g"))) == 2
            mine = members[0].assignment
            await members[0].close()  # static: the session stays
            await replacement.start()
            await replacement.wait_for(lambda m: m.assignment == mine, timeout_s=10)
        finally:
            for m in (*members, replacement):
                await m.close(leave=True)

    asyncio.run(run())
