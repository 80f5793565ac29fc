"""Consumer-group administration behind `AdminClient` (asyncio, one event loop).

Groups live on the coordinator, not on brokers: `GroupAdmin` finds the
coordinator replicas through DescribeCluster on the bootstrap servers (as the
consumer does, see `_group_client`), then calls the Group service; once
every replica it knew has failed, it asks for them again. Log offsets (for
lag and offset resets) come from the partition leaders (ListOffsets),
through the same path the consumer uses.

Each call is sent again on retriable errors until default_api_timeout_ms
(`_admin_retry`): reads (list, describe, committed offsets, log offsets)
always; writes (delete_group, alter_offsets) only when surely not carried
out, e.g. no coordinator registered yet (a coordinator starting), or none
reachable. A write cut off mid-way (DEADLINE_EXCEEDED, dropped) is raised
at once: it may have been carried out.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from tidelog._admin_retry import AdminRetry
from tidelog._connection import Cluster
from tidelog._fetcher import EARLIEST, LATEST, Fetcher
from tidelog._group_client import discover_coordinators
from tidelog.config import AdminConfig, ConsumerConfig
from tidelog.errors import (
    CoordinatorNotAvailableError,
    TidelogError,
    error_from_code,
    error_from_rpc,
)
from tidelog.group import OffsetAndMetadata, OffsetStoreClient
from tidelog.group._channels import CoordinatorChannels, is_unavailable, unanswered
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    #: "Empty", "Reconciling" (partitions moving) or "Stable".
    state: str
    member_count: int


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str
    client_id: str
    member_epoch: int
    #: What the member has acknowledged owning.
    owned: list[TopicPartition]
    #: What it will own once the rebalance is done.
    target: list[TopicPartition]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignor: str
    members: list[MemberDescription] = field(default_factory=list)


def _tps(protos: Iterable[common_pb2.TopicPartition]) -> list[TopicPartition]:
    return sorted(TopicPartition(p.topic, p.partition) for p in protos)


def _check(response: Any) -> None:
    if response.HasField("error") and response.error.code != common_pb2.NONE:
        raise error_from_code(response.error.code, response.error.message)


class GroupAdmin:
    """Group calls with failover across coordinator replicas."""

    def __init__(self, cluster: Cluster, config: AdminConfig, retry: AdminRetry) -> None:
        self._cluster = cluster
        self._config = config
        self._retry = retry
        self._timeout_s = config.request_timeout_ms / 1000
        self._channels: CoordinatorChannels | None = None
        self._offsets: OffsetStoreClient | None = None
        self._fetcher: Fetcher | None = None

    async def _discover(self) -> list[str]:
        """The coordinator addresses. Nothing of the call at hand has been
        sent yet, so a failure here says so (`not_carried_out`): a write
        may be sent again once a coordinator is registered."""
        try:
            return await discover_coordinators(self._cluster, self._timeout_s)
        except TidelogError as exc:
            raise exc.surely_not_carried_out() from None

    async def _coordinators(self) -> tuple[CoordinatorChannels, OffsetStoreClient]:
        if self._channels is None or self._offsets is None:
            addresses = await self._discover()
            # After every address has failed, both ask for the list again:
            # a coordinator restarted elsewhere (a new port) is found.
            self._channels = CoordinatorChannels(
                addresses, rediscover=self._discover, security=self._config.security
            )
            self._offsets = OffsetStoreClient(
                addresses,
                request_timeout_ms=self._config.request_timeout_ms,
                rediscover=self._discover,
                security=self._config.security,
            )
        return self._channels, self._offsets

    async def _call(self, method: str, request: Any, *, idempotent: bool) -> Any:
        """`method` of the Group service, retried as the module doc says."""
        return await self._retry.run(
            lambda: self._call_once(method, request), idempotent=idempotent, what=method
        )

    async def _call_once(self, method: str, request: Any) -> Any:
        channels, _ = await self._coordinators()
        last: TidelogError | None = None
        never_sent = True
        for _ in range(max(2, len(channels.addresses) * 2)):
            stub: Any = group_pb2_grpc.GroupStub(channels.channel())
            try:
                return await getattr(stub, method)(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                if not is_unavailable(exc):
                    raise error_from_rpc(exc) from exc
                last = unanswered(exc, channels.address)
                never_sent = never_sent and last.not_carried_out
                await channels.rotate()
                await asyncio.sleep(0.1)
        error = CoordinatorNotAvailableError(f"no coordinator answered: {last}")
        if never_sent:
            error.surely_not_carried_out()
        raise error

    async def list_groups(self) -> list[GroupListing]:
        response = await self._call("ListGroups", group_pb2.ListGroupsRequest(), idempotent=True)
        return sorted(
            (GroupListing(g.group_id, g.state, g.member_count) for g in response.groups),
            key=lambda g: g.group_id,
        )

    async def describe_group(self, group_id: str) -> GroupDescription:
        response = await self._call(
            "DescribeGroup", group_pb2.DescribeGroupRequest(group_id=group_id), idempotent=True
        )
        _check(response)
        return GroupDescription(
            group_id=response.group_id or group_id,
            state=response.state,
            group_epoch=response.group_epoch,
            assignor=response.assignor,
            members=[
                MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.member_epoch,
                    _tps(m.owned),
                    _tps(m.target),
                )
                for m in response.members
            ],
        )

    async def delete_group(self, group_id: str) -> None:
        response = await self._call(
            "DeleteGroup", group_pb2.DeleteGroupRequest(group_id=group_id), idempotent=False
        )
        _check(response)

    async def committed(
        self, group_id: str, partitions: Sequence[TopicPartition] = ()
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        async def fetch() -> dict[TopicPartition, OffsetAndMetadata]:
            _, offsets = await self._coordinators()
            return await offsets.fetch(group_id, partitions)

        return await self._retry.run(fetch, idempotent=True, what="FetchOffsets")

    async def alter_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Commit as an admin (no member): refused (NonEmptyGroupError) while
        the group has live members, so a reset never races a consumer.
        Sent again only when surely not carried out (module doc)."""

        async def alter() -> None:
            _, store = await self._coordinators()
            await store.alter(group_id, offsets)

        await self._retry.run(alter, idempotent=False, what="AlterOffsets")

    async def list_offsets(
        self, query: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets on the leaders: tp -> (offset, timestamp); the query's
        values are -2 (earliest), -1 (latest) or a time in ms."""
        if self._fetcher is None:
            config = ConsumerConfig(
                bootstrap_servers=self._config.bootstrap_servers,
                request_timeout_ms=self._config.request_timeout_ms,
            )
            self._fetcher = Fetcher(self._cluster, config, deque(), lambda: None)
        fetcher = self._fetcher
        return await self._retry.run(
            lambda: fetcher.list_offsets(dict(query)), idempotent=True, what="ListOffsets"
        )

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self.list_offsets(dict.fromkeys(partitions, LATEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self.list_offsets(dict.fromkeys(partitions, EARLIEST))
        return {tp: offset for tp, (offset, _) in found.items()}

    async def close(self) -> None:
        if self._fetcher is not None:
            await self._fetcher.close()
        if self._channels is not None:
            await self._channels.close()
        if self._offsets is not None:
            await self._offsets.close()
