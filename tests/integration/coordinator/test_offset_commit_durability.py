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
from tidelog.v1 import group_pb2, group_pb2_grpc
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.group_support import joined_members, setup_topic
from tests.integration.coordinator.helpers import etcd_client
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(120)

COMMITTERS = 32
PARTITIONS = 3
#: Acknowledgements before the kill: enough that commits share transactions.
ACKS_BEFORE_KILL = 400
#: The stand-in broker's registration outlives every test of the module.
BROKER_TTL_S = 120
#: A commit's deadline: one in flight at the kill fails within it.
REQUEST_TIMEOUT_MS = 5_000


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
    """Topic "t" with PARTITIONS partitions."""
    await setup_topic(etcd, prefix, address, "t", PARTITIONS, broker_ttl_s=BROKER_TTL_S)


def check_stored(
    etcd: EtcdProcess, prefix: str, acked: dict[str, int], sent: dict[str, int]
) -> None:
    """Every partition of each group holds at least what was acknowledged and
    at most what was sent (a commit in flight at the kill may or may not have
    landed)."""
    in_etcd = asyncio.run(stored(etcd, prefix))
    for group, offset in acked.items():
        for p in range(PARTITIONS):
            assert offset <= in_etcd[(group, p)] <= sent[group], (group, p)


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
            OffsetStoreClient(coordinator.address, request_timeout_ms=REQUEST_TIMEOUT_MS)
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
    check_stored(etcd, prefix, acked, sent)


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
        groups = [f"s{i}" for i in range(STREAM_MEMBERS)]
        # leave=False: the coordinator is dead by the end.
        async with (
            joined_members(coordinator.address, groups, PARTITIONS, leave=False) as members,
            grpc.aio.insecure_channel(coordinator.address) as channel,
        ):
            await stream_until_killed(channel, members)

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
    check_stored(etcd, prefix, acked, sent)
