"""An acknowledged offset commit is in etcd, even when the coordinator that
acknowledged it (coalescing concurrent commits into shared transactions) is
SIGKILLed right after the acknowledgement: as the answer of a unary call, and
as an answer on a CommitOffsetsStream."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from tidelog.errors import TidelogError
from tidelog.group import GroupMembership, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2, group_pb2, group_pb2_grpc
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.helpers import etcd_client, register_broker
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(120)

COMMITTERS = 32
PARTITIONS = 3
#: Acknowledgements before the kill: enough that commits share transactions.
ACKS_BEFORE_KILL = 400


async def stored(etcd: EtcdProcess, prefix: str) -> dict[tuple[str, int], int]:
    """Committed offsets read from etcd itself: (group, partition) -> offset."""
    keys = Keys(prefix)
    async with etcd_client(etcd.endpoint) as client:
        listing = await client.get_prefix(keys.all_offsets)
    out = {}
    for kv in listing:
        parsed = keys.parse_offset_key(kv.key)
        assert parsed is not None
        group, tp = parsed
        out[(group, tp.partition)] = json.loads(kv.value)["offset"]
    return out


async def create_topic(etcd: EtcdProcess, prefix: str, address: str) -> None:
    async with etcd_client(etcd.endpoint) as client:
        await register_broker(client, prefix, 1, ttl_s=120)
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[admin_pb2.NewTopic(name="t", partitions=PARTITIONS)]
            )
        )
        assert reply.topics[0].error.code == common_pb2.NONE


def test_an_acknowledged_commit_survives_a_coordinator_sigkill_right_after_the_ack(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()
    acked: dict[str, int] = {}
    sent: dict[str, int] = {}

    async def run() -> None:
        await create_topic(etcd, prefix, coordinator.address)
        # One client each: a client that fails over closes its channel, which
        # would cancel the other committers' calls on it.
        clients = [
            OffsetStoreClient(coordinator.address, request_timeout_ms=5_000)
            for _ in range(COMMITTERS)
        ]
        acks = 0
        killed = asyncio.Event()

        async def commit_loop(i: int) -> None:
            nonlocal acks
            group = f"g{i}"
            offset = 0
            while not killed.is_set():
                offset += 1
                sent[group] = offset
                try:
                    await clients[i].alter(
                        group, {TopicPartition("t", p): offset for p in range(PARTITIONS)}
                    )
                except TidelogError:
                    assert killed.is_set(), "a commit failed before the coordinator was killed"
                    return
                acked[group] = offset
                acks += 1
                if acks >= ACKS_BEFORE_KILL and not killed.is_set():
                    # Right after an acknowledgement, with other commits in flight.
                    coordinator.kill()
                    killed.set()

        try:
            await asyncio.gather(*(commit_loop(i) for i in range(COMMITTERS)))
        finally:
            for c in clients:
                await c.close()

    asyncio.run(run())
    assert len(acked) == COMMITTERS

    in_etcd = asyncio.run(stored(etcd, prefix))
    for group, offset in acked.items():
        for p in range(PARTITIONS):
            # At least what was acknowledged; at most what was sent (a commit
            # in flight at the kill may or may not have landed).
            assert offset <= in_etcd[(group, p)] <= sent[group], (group, p)


#: Members committing over the stream (one group each).
STREAM_MEMBERS = 16


def test_an_answer_on_the_commit_stream_survives_a_coordinator_sigkill_right_after_it(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    """Members' commits, all on one CommitOffsetsStream, many in flight; the
    coordinator is SIGKILLed right after an answer without error: every
    answered commit is in etcd."""
    coordinator = coordinators()
    acked: dict[str, int] = {}
    sent: dict[str, int] = {}

    async def run() -> None:
        await create_topic(etcd, prefix, coordinator.address)
        members = [
            GroupMembership(coordinator.address, f"s{i}", topics=["t"], session_timeout_ms=30_000)
            for i in range(STREAM_MEMBERS)
        ]
        try:
            for m in members:
                await m.start()
            for m in members:
                await m.wait_for(lambda m: len(m.assignment) == PARTITIONS, timeout_s=30)
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                await stream_until_killed(channel, members)
        finally:
            for m in members:
                await m.close(leave=False)

    async def stream_until_killed(
        channel: grpc.aio.Channel, members: list[GroupMembership]
    ) -> None:
        requests: asyncio.Queue[group_pb2.CommitOffsetsStreamRequest] = asyncio.Queue()
        waiting: dict[int, tuple[str, int]] = {}
        ids = itertools.count(1)
        acks = 0
        killed = False

        async def write() -> AsyncIterator[group_pb2.CommitOffsetsStreamRequest]:
            while True:
                yield await requests.get()

        def send(member: GroupMembership, offset: int) -> None:
            correlation_id = next(ids)
            waiting[correlation_id] = (member.group_id, offset)
            sent[member.group_id] = offset
            commit = group_pb2.CommitOffsetsRequest(
                group_id=member.group_id,
                member_id=member.member_id,
                member_epoch=member.member_epoch,
                member_token=member.member_token,
                offsets=[
                    group_pb2.OffsetCommit(topic="t", partition=p, offset=offset)
                    for p in range(PARTITIONS)
                ],
            )
            requests.put_nowait(
                group_pb2.CommitOffsetsStreamRequest(
                    commits=[group_pb2.StreamedCommit(correlation_id=correlation_id, commit=commit)]
                )
            )

        by_group = {m.group_id: m for m in members}
        call = group_pb2_grpc.GroupStub(channel).CommitOffsetsStream(write())
        for m in members:  # one commit in flight per group, every group at once
            send(m, 1)
        try:
            async for message in call:
                answered = []
                for answer in message.answers:
                    group, offset = waiting.pop(answer.correlation_id)
                    assert not answer.HasField("error"), answer.error
                    acked[group] = offset
                    answered.append(group)
                    acks += 1
                if acks >= ACKS_BEFORE_KILL:
                    # Right after answers, with the other groups' commits in flight.
                    coordinator.kill()
                    killed = True
                    break
                for group in answered:
                    send(by_group[group], acked[group] + 1)
        except grpc.aio.AioRpcError:
            assert killed, "the stream broke before the coordinator was killed"
        finally:
            call.cancel()
        assert killed

    asyncio.run(run())
    assert len(acked) == STREAM_MEMBERS
    in_etcd = asyncio.run(stored(etcd, prefix))
    for group, offset in acked.items():
        for p in range(PARTITIONS):
            assert offset <= in_etcd[(group, p)] <= sent[group], (group, p)
