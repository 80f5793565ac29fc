"""`tidelog.v1.Group`: heartbeat streams, leave, offsets and group admin.

Commit streams (CommitOffsetsStream) are served by commit_stream.CommitStream
with the same commit function as the unary CommitOffsets.

Validates (every size against group_limits) and maps errors;
GroupCoordinator and OffsetStore do the work.
Errors of the heartbeat stream travel in-band (the response's `error`) and
end the stream; unary calls answer with an in-band error too, so a client
sees the precise ErrorCode either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc

from tidelog_coordinator import group_limits
from tidelog_coordinator.commit_stream import CommitStream
from tidelog_coordinator.errors import abort, error_proto
from tidelog_coordinator.group_coordinator import GroupCoordinator, MemberStream, tp_protos
from tidelog_coordinator.offset_store import OffsetEntry, OffsetStore

log = logging.getLogger("tidelog.coordinator.groups")


def _entries(offsets: Sequence[group_pb2.OffsetCommit]) -> list[OffsetEntry]:
    group_limits.check_offsets(offsets)
    return [
        OffsetEntry(TopicPartition(o.topic, o.partition), o.offset, o.metadata) for o in offsets
    ]


#: Requests of one commit stream in flight at most (see commit_stream.py).
COMMIT_STREAM_IN_FLIGHT_MAX = 1024


class GroupServicer(group_pb2_grpc.GroupServicer):
    def __init__(
        self,
        groups: GroupCoordinator,
        offsets: OffsetStore,
        *,
        commit_stream_in_flight_max: int = COMMIT_STREAM_IN_FLIGHT_MAX,
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.commit_stream_in_flight_max = commit_stream_in_flight_max
        self._commit_streams: set[CommitStream] = set()

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[group_pb2.GroupHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.GroupHeartbeatResponse]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        try:
            stream = await self.groups.join(first)
        except Exception as exc:
            yield group_pb2.GroupHeartbeatResponse(error=error_proto(exc, "joining the group"))
            return
        reader = asyncio.create_task(self._read(stream, request_iterator))
        try:
            while True:
                response = await stream.outbox.get()
                if response is None:
                    break
                yield response
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.groups.detach(stream)

    async def _read(
        self, stream: MemberStream, requests: AsyncIterator[group_pb2.GroupHeartbeatRequest]
    ) -> None:
        try:
            async for request in requests:
                try:
                    await self.groups.heartbeat(stream, request)
                except InvalidRequestError as exc:
                    stream.close(exc)
                    return
                except Exception as exc:
                    # One failed heartbeat (etcd briefly away) is not the end of
                    # the session: the lease outlives it; the member retries.
                    log.info("heartbeat of %s failed: %s", stream.member_id, exc)
        except Exception as exc:
            log.info("heartbeat stream of %s broke: %s", stream.member_id, exc)
        finally:
            stream.close()

    async def LeaveGroup(
        self, request: group_pb2.LeaveGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.LeaveGroupResponse:
        try:
            group_limits.check_member(request.group_id, request.member_id, request.member_token)
            await self.groups.leave(request.group_id, request.member_id, request.member_token)
        except Exception as exc:
            return group_pb2.LeaveGroupResponse(error=error_proto(exc, "leaving the group"))
        return group_pb2.LeaveGroupResponse()

    async def _commit(self, request: group_pb2.CommitOffsetsRequest) -> common_pb2.Error | None:
        """One member's commit (unary or on a stream): None once it is in
        etcd, else the error to answer (nothing was committed)."""
        try:
            group_limits.check_member(request.group_id, request.member_id, request.member_token)
            entries = _entries(request.offsets)
            await self.offsets.commit(
                request.group_id,
                request.member_id,
                request.member_epoch,
                request.member_token,
                entries,
            )
        except Exception as exc:
            return error_proto(exc, "committing offsets")
        return None

    async def CommitOffsets(
        self, request: group_pb2.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.CommitOffsetsResponse:
        return group_pb2.CommitOffsetsResponse(error=await self._commit(request))

    async def CommitOffsetsStream(
        self,
        request_iterator: AsyncIterator[group_pb2.CommitOffsetsStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[group_pb2.CommitOffsetsStreamResponse]:
        stream = CommitStream(self._commit, self.commit_stream_in_flight_max)
        self._commit_streams.add(stream)
        try:
            async with contextlib.aclosing(stream.answers(request_iterator)) as answers:
                async for answer in answers:
                    yield answer
        finally:
            self._commit_streams.discard(stream)
        if stream.refused is not None:
            await abort(context, stream.refused, "committing offsets")

    def drain_commit_streams(self) -> None:
        """Shutdown: every commit stream answers what it has read, then ends
        (its client retries the rest on another replica)."""
        for stream in self._commit_streams:
            stream.drain()

    async def AlterOffsets(
        self, request: group_pb2.AlterOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.AlterOffsetsResponse:
        try:
            group_limits.validate_group_id(request.group_id)
            await self.offsets.alter(request.group_id, _entries(request.offsets))
        except Exception as exc:
            return group_pb2.AlterOffsetsResponse(error=error_proto(exc, "altering offsets"))
        return group_pb2.AlterOffsetsResponse()

    async def FetchOffsets(
        self, request: group_pb2.FetchOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.FetchOffsetsResponse:
        try:
            group_limits.check_fetch(request)
            entries = await self.offsets.fetch(
                request.group_id,
                [TopicPartition(tp.topic, tp.partition) for tp in request.partitions],
            )
        except Exception as exc:
            return group_pb2.FetchOffsetsResponse(error=error_proto(exc, "fetching offsets"))
        return group_pb2.FetchOffsetsResponse(
            offsets=[
                group_pb2.CommittedOffset(
                    topic=e.tp.topic,
                    partition=e.tp.partition,
                    offset=e.offset,
                    metadata=e.metadata,
                    commit_time_ms=e.commit_time_ms,
                )
                for e in entries
            ]
        )

    async def ListGroups(
        self, request: group_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.ListGroupsResponse:
        groups = await self.offsets.list_groups()
        return group_pb2.ListGroupsResponse(
            groups=[
                group_pb2.GroupListing(group_id=g, state=s, member_count=n) for g, s, n in groups
            ]
        )

    async def DescribeGroup(
        self, request: group_pb2.DescribeGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.DescribeGroupResponse:
        try:
            group_limits.validate_group_id(request.group_id)
        except InvalidRequestError as exc:
            # Without the group id: echoing an oversized one is what the limit prevents.
            return group_pb2.DescribeGroupResponse(error=error_proto(exc, "describing the group"))
        try:
            view = await self.offsets.describe_group(request.group_id)
        except Exception as exc:
            return group_pb2.DescribeGroupResponse(
                group_id=request.group_id, error=error_proto(exc, "describing the group")
            )
        target = view.state.target if view.state else {}
        return group_pb2.DescribeGroupResponse(
            group_id=request.group_id,
            state=view.status(),
            group_epoch=view.state.group_epoch if view.state else 0,
            assignor=view.state.assignor if view.state else "",
            members=[
                group_pb2.GroupMemberDescription(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    member_epoch=m.member_epoch,
                    subscribed_topics=list(m.topics),
                    subscribed_topic_regex=m.pattern,
                    owned=tp_protos(m.owned),
                    target=tp_protos(target.get(key, frozenset())),
                )
                for key, m in sorted(view.members.items())
            ],
        )

    async def DeleteGroup(
        self, request: group_pb2.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.DeleteGroupResponse:
        try:
            await self.offsets.delete_group(request.group_id)
        except Exception as exc:
            return group_pb2.DeleteGroupResponse(error=error_proto(exc, "deleting the group"))
        return group_pb2.DeleteGroupResponse()
