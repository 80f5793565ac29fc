"""Helpers of the consumer-group and offset-commit tests: a topic created
through a coordinator (with a stand-in broker registered in etcd), members
that have joined and hold their assignment, an offset client, and the
member credentials a commit carries. The context managers close what they
opened, so that each test's body is what it checks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TypedDict

import grpc
from tidelog.group import GroupMembership, OffsetStoreClient
from tidelog.v1 import admin_pb2, admin_pb2_grpc, common_pb2

from tests.integration.coordinator.helpers import etcd_client, register_broker
from tests.support.etcd import EtcdProcess

#: A member's session in these tests: long enough that no test's pause
#: (a SIGSTOPped etcd, a coordinator failing over) expires it.
MEMBER_SESSION_MS = 30_000
#: Until a member holds its assignment (a loaded machine, a rebalance).
ASSIGNMENT_TIMEOUT_S = 30


async def setup_topic(
    etcd: EtcdProcess,
    prefix: str,
    address: str,
    topic: str,
    partitions: int,
    *,
    broker_ttl_s: int = 30,
) -> None:
    """Register a stand-in broker (its lease lasts `broker_ttl_s`, never
    renewed) and create `topic` through the coordinator at `address`."""
    async with etcd_client(etcd.endpoint) as client:
        await register_broker(client, prefix, 1, ttl_s=broker_ttl_s)
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await admin_pb2_grpc.AdminStub(channel).CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[admin_pb2.NewTopic(name=topic, partitions=partitions)]
            )
        )
        assert reply.topics[0].error.code == common_pb2.NONE


@asynccontextmanager
async def joined_members(
    bootstrap: str | list[str],
    groups: Sequence[str],
    partitions: int,
    *,
    topic: str = "t",
    leave: bool | None = None,
) -> AsyncIterator[list[GroupMembership]]:
    """One member per entry of `groups` (each alone in its group, so each is
    assigned all `partitions` of `topic`), all started before any is waited
    for; closed after the block (`leave` as GroupMembership.close takes it:
    False where the coordinator is gone by then)."""
    members = [
        GroupMembership(bootstrap, group, topics=[topic], session_timeout_ms=MEMBER_SESSION_MS)
        for group in groups
    ]
    try:
        for member in members:
            await member.start()
        for member in members:
            await member.wait_for(
                lambda m: len(m.assignment) == partitions, timeout_s=ASSIGNMENT_TIMEOUT_S
            )
        yield members
    finally:
        for member in members:
            await member.close(leave=leave)


@asynccontextmanager
async def joined_member(
    bootstrap: str | list[str], partitions: int, group: str = "g"
) -> AsyncIterator[GroupMembership]:
    """`joined_members` for one member of `group`."""
    async with joined_members(bootstrap, [group], partitions) as (member,):
        yield member


@asynccontextmanager
async def offset_client(
    bootstrap: str | list[str], **options: int
) -> AsyncIterator[OffsetStoreClient]:
    """An OffsetStoreClient (`options` as its constructor takes them), closed after the block."""
    client = OffsetStoreClient(bootstrap, **options)
    try:
        yield client
    finally:
        await client.close()


class Credentials(TypedDict):
    member_id: str
    member_epoch: int
    member_token: str


def credentials(
    member: GroupMembership, *, epoch_delta: int = 0, token: str | None = None
) -> Credentials:
    """What OffsetStoreClient.commit takes to commit as `member`; with an
    epoch `epoch_delta` away from its own, or another `token`."""
    return Credentials(
        member_id=member.member_id,
        member_epoch=member.member_epoch + epoch_delta,
        member_token=member.member_token if token is None else token,
    )
